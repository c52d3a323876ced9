// Dispatch of the vectorised row ops (cpu/row_ops.h): AVX-512 where the CPU and the shapes allow,
// the reference ops (bf16 mode) otherwise.
#include "cpu/row_ops.h"

#include <tbb/parallel_for.h>

#include <algorithm>

#include "storage/bf16.h"

namespace strata::cpu {

namespace {
constexpr ref::Precision kBf16 = ref::Precision::bf16;
}

bool row_ops_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return ok;
}

void glu_fast(const ref::Glu& act, const float* g, const float* u, float* out, int64_t n) {
  if (row_ops_avx512()) return detail::glu_avx512(act, g, u, out, n);
  ref::glu(act, g, u, out, n, kBf16);
}

void add_round_fast(float* a, const float* b, int64_t n) {
  if (row_ops_avx512()) return detail::add_round_avx512(a, b, n);
  for (int64_t i = 0; i < n; ++i) a[i] = round_bf16(a[i] + b[i]);
}

void round_bf16_fast(float* x, int64_t n) {
  if (row_ops_avx512()) return detail::round_bf16_avx512(x, n);
  ref::round_bf16_inplace(x, n);
}

void merge_routed_fast(const float* y, const float* w, float* acc, int64_t T, int64_t K,
                       int64_t D) {
  tbb::parallel_for(int64_t(0), T, [&](int64_t t) {
    float* a = acc + t * D;
    std::fill(a, a + D, 0.0f);
    for (int64_t j = 0; j < K; ++j)
      ref::accumulate_weighted(a, y + (t * K + j) * D, w[t * K + j], D);
    round_bf16_fast(a, D);
  });
}

void sigmoid_gate_fast(float* o, const float* g, int64_t n) {
  if (row_ops_avx512()) return detail::sigmoid_gate_avx512(o, g, n);
  ref::sigmoid_gate_inplace(o, g, n, kBf16);
}

void kimi_rms_norm_fast(const float* x, const float* w, float* out, int64_t rows, int64_t D,
                        float eps) {
  if (row_ops_avx512() && D % 16 == 0) return detail::kimi_rms_norm_avx512(x, w, out, rows, D, eps);
  ref::kimi_rms_norm(x, w, out, rows, D, eps, kBf16);
}

void l2_norm_fast(const float* x, float* out, int64_t rows, int64_t D, float eps, bool round) {
  if (row_ops_avx512() && D % 16 == 0) return detail::l2_norm_avx512(x, out, rows, D, eps, round);
  ref::l2_norm(x, out, rows, D, eps, round ? kBf16 : ref::Precision::fp32);
}

void gated_rms_norm_fast(const float* o, const float* gate, const float* w, float* out,
                         int64_t rows, int64_t D, float eps) {
  if (row_ops_avx512() && D % 16 == 0)
    return detail::gated_rms_norm_avx512(o, gate, w, out, rows, D, eps);
  ref::gated_rms_norm(o, gate, w, out, rows, D, eps, kBf16);
}

void short_conv_silu_fast(const float* x, const float* w, float* state, float* y, int64_t T,
                          int64_t C, int64_t W) {
  const ConvSeq one{x, state, y, T};
  short_conv_silu_seqs_fast(&one, 1, w, C, W);
}

void short_conv_silu_seqs_fast(const ConvSeq* seqs, int64_t n, const float* w, int64_t C,
                               int64_t W) {
  if (row_ops_avx512() && C % 16 == 0 && W >= 1 && W <= 8)
    return detail::short_conv_silu_avx512(seqs, n, w, C, W);
  for (int64_t i = 0; i < n; ++i)
    ref::short_conv_silu(seqs[i].x, w, seqs[i].state, seqs[i].y, seqs[i].T, C, W, kBf16);
}

void kda_gate_fast(const ref::KdaGate& gate, const float* z, float* g, int64_t T, int64_t H,
                   int64_t K) {
  if (row_ops_avx512() && gate.form == ref::KdaGateForm::bounded && K % 16 == 0)
    return detail::kda_gate_bounded_avx512(gate, z, g, T, H, K);
  ref::kda_gate(gate, z, g, T, H, K);
}

void attn_res_mix_fast(const float* const* sources, int64_t n, const float* norm_w,
                       const float* proj_w, float* out, int64_t T, int64_t D, float eps) {
  if (row_ops_avx512() && D % 16 == 0 && n <= 64)
    return detail::attn_res_mix_avx512(sources, n, norm_w, proj_w, out, T, D, eps);
  ref::attn_res_mix(sources, n, norm_w, proj_w, out, T, D, eps, kBf16);
}

}  // namespace strata::cpu
