// AVX2 row kernel of gemv_bf16 (cpu/bf16_linear.h), for CPUs without AVX-512 BF16: 8 bf16 weights
// widened to fp32 by a 16-bit shift (exact), FMA into one ymm of 8 lanes per (row, token) pair,
// reduced horizontally at the end. 4 rows × up to 2 tokens keep 8 accumulators + 4 weight vectors
// + the activation inside the 16 ymm registers; more tokens take further passes over the rows
// (from L1/L2). The K tail (K mod 8) is summed in scalar code.
#include <immintrin.h>

#include "cpu/bf16_linear.h"
#include "storage/bf16.h"

namespace strata::cpu::detail {

namespace {

inline __m256 widen8(const uint16_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

template <int R, int C>
void block(const GemvArgs& a, int64_t r0, int64_t t0) {
  __m256 acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = _mm256_setzero_ps();
  const uint16_t* w[R];
  for (int i = 0; i < R; ++i) w[i] = a.W + (r0 + i) * a.ldw;
  const uint16_t* x[C];
  for (int c = 0; c < C; ++c) x[c] = a.xb + (t0 + c) * a.ldx;
  const int64_t K = a.K, K8 = K / 8 * 8;
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[R];
    for (int i = 0; i < R; ++i) wv[i] = widen8(w[i] + k);
    for (int c = 0; c < C; ++c) {
      const __m256 xv = widen8(x[c] + k);
      for (int i = 0; i < R; ++i) acc[i][c] = _mm256_fmadd_ps(wv[i], xv, acc[i][c]);
    }
  }
  for (int c = 0; c < C; ++c)
    for (int i = 0; i < R; ++i) {
      float s = hsum(acc[i][c]);
      for (int64_t k = K8; k < K; ++k) s += bf16_to_f32(w[i][k]) * bf16_to_f32(x[c][k]);
      a.y[(t0 + c) * a.ldy + r0 + i] = a.round_out ? round_bf16(s) : s;
    }
}

template <int C>
void rows(const GemvArgs& a, int64_t r0, int64_t r1, int64_t t0) {
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) block<4, C>(a, r, t0);
  for (; r < r1; ++r) block<1, C>(a, r, t0);
}

}  // namespace

void gemv_rows_avx2(const GemvArgs& a, int64_t r0, int64_t r1) {
  int64_t t = 0;
  for (; t + 2 <= a.T; t += 2) rows<2>(a, r0, r1, t);
  if (t < a.T) rows<1>(a, r0, r1, t);
}

}  // namespace strata::cpu::detail
