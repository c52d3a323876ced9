// Dispatch of the fast token-mixer cores (cpu/mixer_kernels.h): the AVX-512 kernels where the CPU
// and the shapes allow, the reference ops otherwise.
#include "cpu/mixer_kernels.h"

#include <vector>

#include "storage/error.h"

namespace strata::cpu {

bool mixer_kernels_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return ok;
}

void kda_recurrent_fast(const float* q, const float* k, const float* v, const float* g,
                        const float* beta, float* state, float* o, int64_t T, int64_t H, int64_t K,
                        int64_t V, float scale) {
  const KdaSeq one{q, k, v, g, beta, state, o, T};
  kda_recurrent_seqs_fast(&one, 1, H, K, V, scale);
}

void kda_recurrent_seqs_fast(const KdaSeq* seqs, int64_t n, int64_t H, int64_t K, int64_t V,
                             float scale) {
  if (mixer_kernels_avx512() && (K == 64 || K == 128)) {
    detail::kda_recurrent_avx512(seqs, n, H, K, V, scale);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const KdaSeq& s = seqs[i];
    ref::kda_recurrent(s.q, s.k, s.v, s.g, s.beta, s.state, s.o, s.T, H, K, V, scale);
  }
}

void kda_chunked_fast(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* state, float* o, int64_t T, int64_t H, int64_t K,
                      int64_t V, float scale) {
  if (mixer_kernels_avx512() && K % 16 == 0 && V % 16 == 0 && K <= 128 && V <= 128)
    detail::kda_chunked_avx512(q, k, v, g, beta, state, o, T, H, K, V, scale);
  else
    ref::kda_chunked(q, k, v, g, beta, state, o, T, H, K, V, scale);
}

namespace {
bool mla_vectorisable(const ref::WeightView& kv_b, const ref::MlaDims& d) {
  return mixer_kernels_avx512() && kv_b.format == ref::WeightFormat::bf16 &&
         kv_b.rows == d.H * (d.nope + d.v) && kv_b.cols == d.kv_lora && d.kv_lora % 16 == 0 &&
         d.nope % 16 == 0 && d.rope % 16 == 0 && d.v % 16 == 0 && d.v <= 256;
}
}  // namespace

void mla_attention_absorbed_fast(const float* q, const float* cache, int64_t S,
                                 const ref::WeightView& kv_b, const ref::MlaDims& d, float* out,
                                 int64_t T, ref::Precision p) {
  if (!mla_vectorisable(kv_b, d))
    return ref::mla_attention_absorbed(q, cache, S, kv_b, d, out, T, p);
  // Query t of the T new tokens sees positions 0 … S − T + t (causal).
  STRATA_ASSERT(T <= S);
  std::vector<MlaDecodeQuery> qs(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    qs[size_t(t)] = {q + t * d.H * d.q_dim(), cache, S - T + t + 1, out + t * d.H * d.v};
  detail::mla_absorbed_avx512(qs.data(), T, static_cast<const uint16_t*>(kv_b.data), d,
                              p == ref::Precision::bf16);
}

void mla_attention_absorbed_batch_fast(const MlaDecodeQuery* qs, int64_t n,
                                       const ref::WeightView& kv_b, const ref::MlaDims& d,
                                       ref::Precision p) {
  if (!mla_vectorisable(kv_b, d)) {
    for (int64_t j = 0; j < n; ++j)
      ref::mla_attention_absorbed(qs[j].q, qs[j].cache, qs[j].len, kv_b, d, qs[j].out, 1, p);
    return;
  }
  detail::mla_absorbed_avx512(qs, n, static_cast<const uint16_t*>(kv_b.data), d,
                              p == ref::Precision::bf16);
}

void mla_attention_expanded_fast(const float* q, const float* cache, int64_t S,
                                 const ref::WeightView& kv_b, const ref::MlaDims& d, float* out,
                                 int64_t T, ref::Precision p, Bf16Linear& lin) {
  // The expansion GEMM takes bf16 activations: the bf16 model's latents are bf16 values.
  if (!mla_vectorisable(kv_b, d) || p != ref::Precision::bf16)
    return ref::mla_attention_expanded(q, cache, S, kv_b, d, out, T, p);
  STRATA_ASSERT(T <= S);
  // k_nope, v = ĉ·kv_bᵀ for every cached position [S, H, nope + v] (a bf16 GEMM output in HF).
  const int64_t R = d.cache_dim(), C = d.kv_lora;
  std::vector<float> lat(size_t(S * C)), kv(size_t(S * kv_b.rows));
  for (int64_t s = 0; s < S; ++s) std::copy(cache + s * R, cache + s * R + C, lat.begin() + s * C);
  lin(lat.data(), S, kv_b, kv.data(), true);
  detail::mla_expanded_attention_avx512(q, cache, S, kv.data(), d, out, T, true);
}

}  // namespace strata::cpu
