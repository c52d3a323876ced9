// Vectorised row ops of the fast CPU backend, in the bf16 model's form (spec §12.2 rounding
// points, as the references in cpu/ref/ops.h place them in Precision::bf16): GLUs, residual adds,
// the MLA output gate, KimiRMSNorm, the KDA short convolution + SiLU, decay gate, L2 and gated
// norms, and the AttnRes mix. AVX-512 where the CPU has it (TBB over rows or element chunks), the
// reference ops otherwise.
//
// Numerics: the references' formulas in other summation orders, with the vector exp / sigmoid /
// tanh of cpu/vec_math_avx512.h (≤ 3 ulp from std::) and FMA; sums of squares in fp64 as the
// references do. Results differ from the references by fp32 rounding, so a bf16 rounding can land
// on the neighbouring value now and then; tests/cpu/row_ops_test.cpp bounds it.
// Not here: the linear layers (cpu/bf16_linear.h), the KDA/MLA cores (cpu/mixer_kernels.h).
#pragma once
#include <cstdint>

#include "cpu/ref/ops.h"

namespace strata::cpu {

bool row_ops_avx512();

// out = round(glu(g, u)) (ref::glu in bf16 mode). out may alias g or u.
void glu_fast(const ref::Glu& act, const float* g, const float* u, float* out, int64_t n);
// a = round_bf16(a + b): the bf16 residual add.
void add_round_fast(float* a, const float* b, int64_t n);
// x = round_bf16(x).
void round_bf16_fast(float* x, int64_t n);
// o = round(o · round(sigmoid(g))) (ref::sigmoid_gate_inplace, bf16).
void sigmoid_gate_fast(float* o, const float* g, int64_t n);
// ref::kimi_rms_norm in bf16 mode. x, out: [rows, D] (may alias).
void kimi_rms_norm_fast(const float* x, const float* w, float* out, int64_t rows, int64_t D,
                        float eps);
// ref::l2_norm (round: its bf16 mode).
void l2_norm_fast(const float* x, float* out, int64_t rows, int64_t D, float eps, bool round);
// ref::gated_rms_norm in bf16 mode.
void gated_rms_norm_fast(const float* o, const float* gate, const float* w, float* out,
                         int64_t rows, int64_t D, float eps);
// ref::short_conv_silu in bf16 mode (state may be nullptr).
void short_conv_silu_fast(const float* x, const float* w, float* state, float* y, int64_t T,
                          int64_t C, int64_t W);
// One sequence's part of a batched short conv: x, y [T, C], its conv state [C, W − 1] (nullptr:
// zeros, discarded).
struct ConvSeq {
  const float* x;
  float* state;
  float* y;
  int64_t T;
};
// short_conv_silu_fast of n sequences with their own states in one call (one parallel loop
// instead of n): each sequence's outputs and state are the bits of its call alone.
void short_conv_silu_seqs_fast(const ConvSeq* seqs, int64_t n, const float* w, int64_t C,
                               int64_t W);
// ref::kda_gate (the bounded form vectorised; the softplus form is the reference op).
void kda_gate_fast(const ref::KdaGate& gate, const float* z, float* g, int64_t T, int64_t H,
                   int64_t K);
// The routed experts' merge of the fast backend: acc[t] = round(Σ_j w[t·K + j] · y[t·K + j]) over
// j in order (ref::accumulate_weighted from zero, then round_bf16_fast), tokens in parallel —
// each token's bits those of one thread's loop. y: [T·K, D], w: [T·K], acc: [T, D].
void merge_routed_fast(const float* y, const float* w, float* acc, int64_t T, int64_t K, int64_t D);
// ref::attn_res_mix in bf16 mode.
void attn_res_mix_fast(const float* const* sources, int64_t n, const float* norm_w,
                       const float* proj_w, float* out, int64_t T, int64_t D, float eps);

namespace detail {
void glu_avx512(const ref::Glu& act, const float* g, const float* u, float* out, int64_t n);
void add_round_avx512(float* a, const float* b, int64_t n);
void round_bf16_avx512(float* x, int64_t n);
void sigmoid_gate_avx512(float* o, const float* g, int64_t n);
void kimi_rms_norm_avx512(const float* x, const float* w, float* out, int64_t rows, int64_t D,
                          float eps);
void l2_norm_avx512(const float* x, float* out, int64_t rows, int64_t D, float eps, bool round);
void gated_rms_norm_avx512(const float* o, const float* gate, const float* w, float* out,
                           int64_t rows, int64_t D, float eps);
void short_conv_silu_avx512(const ConvSeq* seqs, int64_t n, const float* w, int64_t C, int64_t W);
void kda_gate_bounded_avx512(const ref::KdaGate& gate, const float* z, float* g, int64_t T,
                             int64_t H, int64_t K);
void attn_res_mix_avx512(const float* const* sources, int64_t n, const float* norm_w,
                         const float* proj_w, float* out, int64_t T, int64_t D, float eps);
}  // namespace detail

}  // namespace strata::cpu
