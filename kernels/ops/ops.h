// Elementwise and small CUDA ops of the K3 / Kimi-Linear layer (spec/model.md §3, §6.2, §7.1–7.2,
// §8, §9): KimiRMSNorm, the gated per-head RMSNorm of KDA, L2 norm, the AttnRes mix, the router,
// SiTU / SiLU GLUs, embedding gather and bf16 <-> fp32 conversion.
//
// Thin launchers: raw device pointers, sizes, a stream (a cudaStream_t passed as void*, nullptr =
// the default stream); each returns the Status of its launch and never synchronises. Activations
// are fp32 arrays; `round_bf16` reproduces the bf16 model's internal rounding points exactly where
// the fp32 oracle (cpu/ref/ops.h, Precision::bf16) places them, so the CUDA path and the oracle
// differ only by fp32 rounding inside reductions and by libm-vs-CUDA transcendental ulps
// (tests/kernels/ops_gpu.cpp states the tolerance of each op).
//
// Not here: the routed-expert FFN (kernels/moe), dense GEMMs (kernels/gemm), sampling
// (kernels/sample), KDA and MLA.
#pragma once
#include <cstdint>

#include "kernels/runtime.h"

namespace strata::kernels::ops {

// KimiRMSNorm (§3.1): y = x·rsqrt(mean(x²)+eps); round_bf16: out = bf16(w·bf16(y)), else w·y.
// x, out: [rows, D] (may alias); w: [D]. out_bf16 (optional, [rows, D], 8-byte aligned for the
// clustered form): the same values as bf16 bits (RNE; exact with round_bf16), the input of a bf16
// GEMM without a conversion pass.
Status kimi_rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t D, float eps,
                     bool round_bf16, void* stream, uint16_t* out_bf16 = nullptr);
// Rows of ≥ 256 floats (a multiple of 4, 16-byte aligned pointers) run spread over a cluster of up
// to 8 CTAs; otherwise, and always in the _row_blocks form (kept callable for `strata bench
// kernels`' before/after lines and the op-check), one CTA per row. The two differ only in fp32
// summation order; either way a row's result does not depend on the row count.
Status kimi_rms_norm_row_blocks(const float* x, const float* w, float* out, int64_t rows, int64_t D,
                                float eps, bool round_bf16, void* stream,
                                uint16_t* out_bf16 = nullptr);

// L2 norm (§3.3): out = x·rsqrt(Σx² + eps); round_bf16 rounds the output once. [rows, D].
Status l2_norm(const float* x, float* out, int64_t rows, int64_t D, float eps, bool round_bf16,
               void* stream);

// FusedRMSNormGated (§3.2), per head vector: out = o·rsqrt(mean(o²)+eps)·w·sigmoid(gate), fp32,
// one rounding at the end when round_bf16. o, gate, out: [rows, D] (rows = T·H); w: [D].
Status gated_rms_norm(const float* o, const float* gate, const float* w, float* out, int64_t rows,
                      int64_t D, float eps, bool round_bf16, void* stream);

// AttnRes mix (§6.2): n ≤ kMaxAttnResSources sources, each a device pointer to [T, D] raw values.
// key_i = RMSNorm(src_i; eps) (no weight); logit_i = Σ_d key_i[d]·norm_w[d]·proj_w[d];
// p = softmax_i (fp32); out = Σ_i p_i·src_i; round_bf16 rounds out once. out must not alias a
// source.
inline constexpr int kMaxAttnResSources = 16;
struct AttnResSources {
  const float* src[kMaxAttnResSources] = {};
  int n = 0;
};
Status attn_res_mix(const AttnResSources& sources, const float* norm_w, const float* proj_w,
                    float* out, int64_t T, int64_t D, float eps, bool round_bf16, void* stream);
// As kimi_rms_norm: clustered rows where D allows (≥ 256, a multiple of 4, ≤ 16384, aligned
// pointers), else, and always here, one CTA per token.
Status attn_res_mix_row_blocks(const AttnResSources& sources, const float* norm_w,
                               const float* proj_w, float* out, int64_t T, int64_t D, float eps,
                               bool round_bf16, void* stream);

// GLUs (§8), elementwise over n: SiTU out = (β1·tanh(g/β1)·sigmoid(g))·(β2·tanh(u/β2)) (β2 ≤ 0:
// the up factor is u); SiLU out = g·sigmoid(g)·u. round_bf16 rounds out once. out may alias g/u.
enum class GluKind { situ, silu };
struct GluParams {
  GluKind kind = GluKind::silu;
  float beta1 = 4.0f, beta2 = 25.0f;
};
Status glu(const GluParams& act, const float* g, const float* u, float* out, int64_t n,
           bool round_bf16, void* stream);
// The same GLU on one [T, 2·I] buffer holding [gate | up] per row (a fused gate_up GEMM output).
// out: [T, I].
Status glu_fused(const GluParams& act, const float* gate_up, float* out, int64_t T, int64_t I,
                 bool round_bf16, void* stream);
// The bf16 model's MLP middle in one pass: gate|up read rounded to bf16 (the GEMM output's
// rounding point), the GLU, its output rounded and stored as bf16 bits (the next GEMM's input) —
// the bits of round_bf16_inplace, glu_fused(round) and f32_to_bf16 in three passes.
Status glu_fused_bf16(const GluParams& act, const float* gate_up, uint16_t* out, int64_t T,
                      int64_t I, void* stream);

// Router (§7.1, §7.2). logits: [T, E] fp32. Selection: top-k of sigmoid(logit) + bias (ties → the
// lower expert id). Weights: unbiased (K3) = sigmoid of the selected; biased_in_place
// (Kimi-Linear) = sigmoid + bias of the selected; renormalize: w / (Σw + 1e-20); times scaling.
// ids: [T, topk] sorted by increasing expert id; weights: [T, topk] aligned with ids.
// E ≤ kMaxRouterExperts, topk ≤ 32.
inline constexpr int kMaxRouterExperts = 1024;
enum class RouterForm { unbiased, biased_in_place };
struct RouterParams {
  int E = 0, topk = 0;
  RouterForm form = RouterForm::unbiased;
  bool renormalize = true;
  float scaling = 1.0f;
  const float* bias = nullptr;  // device [E], nullptr = none
};
Status route(const float* logits, const RouterParams& rp, int32_t* ids, float* weights, int64_t T,
             void* stream);

// Embedding gather (§9): out[t, :] = table[ids[t], :] widened to fp32 (exact). table: bf16 bits
// [vocab, D]. An id outside [0, vocab) writes a NaN row (poison; the engine validates ids first).
Status embedding_gather(const uint16_t* table, int64_t vocab, int64_t D, const int32_t* ids,
                        int64_t T, float* out, void* stream);

// Conversions (RNE, NaN kept quiet — storage/bf16.h).
Status f32_to_bf16(const float* in, uint16_t* out, int64_t n, void* stream);
// out[i, :] = bf16(in[rows[i], :]) for i < n (row width `cols`): a group's tokens gathered for a
// bf16 GEMM (Kimi-Linear's bf16 experts). rows: device memory.
Status gather_rows_bf16(const float* in, const int32_t* rows, int64_t n, int64_t cols,
                        uint16_t* out, void* stream);
Status bf16_to_f32(const uint16_t* in, float* out, int64_t n, void* stream);

}  // namespace strata::kernels::ops

namespace strata::kernels::ops {

// Residual add (spec §2.2): acc = acc + b, fp32; round_bf16 rounds the sum (the bf16 model's
// residual stream is bf16). acc, b: [n].
Status add_inplace(float* acc, const float* b, int64_t n, bool round_bf16, void* stream);
// x = bf16(x) in place (a bf16 GEMM output taken in fp32).
Status round_bf16_inplace(float* x, int64_t n, void* stream);
// MLA output gate (spec §5.2 step 6) in the bf16 model: o = bf16(o · bf16(sigmoid(g))).
// o: [n] bf16 bits (in/out), g: [n] bf16 bits (g_proj output).
Status sigmoid_gate_bf16(uint16_t* o, const uint16_t* g, int64_t n, void* stream);

// The engine's non-finite guard without a host round trip (engine/finite_check.h): scans x[0..n)
// and lowers *record (atomicMin) to finite_key(site, i, class) of its first NaN/Inf, so after any
// number of scans of one step the record names the first site in call order, and in it the first
// element. The caller sets *record to kFiniteClean (all ones) before the step's first scan and
// reads it at a synchronisation it makes anyway. class: 0 NaN, 1 +Inf, 2 −Inf.
inline constexpr uint64_t kFiniteClean = ~uint64_t(0);
inline constexpr int kFiniteIndexBits = 40;  // elements per scan < 2^40
constexpr uint64_t finite_key(uint64_t site, uint64_t i, uint64_t cls) {
  return (site << (kFiniteIndexBits + 2)) | (i << 2) | cls;
}
Status finite_scan(const float* x, int64_t n, uint32_t site, uint64_t* record, void* stream);
// add_inplace with finite_scan of b in the same pass (the engine's check of a sublayer output
// followed by its residual add: one launch instead of two). The same sums and the same record.
Status add_inplace_scan(float* acc, const float* b, int64_t n, bool round_bf16, uint32_t site,
                        uint64_t* record, void* stream);

}  // namespace strata::kernels::ops
