// AVX-512 BF16 row kernels of gemv_bf16 (cpu/bf16_linear.h): vdpbf16ps multiplies 32 bf16 pairs
// into 16 fp32 lanes (lane j sums the products of columns 2j, 2j+1 of every 32-column step); each
// (row, token) accumulates in its own zmm registers, reduced horizontally once at the end. One
// token: a row at a time with 4 accumulators (one sequential stream per thread). Several tokens:
// 4 rows × C tokens, each loaded weight vector feeding C instructions, each row prefetched 512
// bytes ahead; 5 to 8 tokens, 2 rows × C tokens in one pass. The K tail (K mod 32) is a masked load
// of the weights against the zero padding of the bf16 activations.

// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics headers as
// (maybe-)uninitialized at -O3 (a known false positive); silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>

#include "cpu/bf16_linear.h"
#include "storage/bf16.h"

namespace strata::cpu::detail {

namespace {

inline float finish(__m512 acc, bool round_out) {
  // Not _mm512_reduce_add_ps: GCC 12's version trips -Wuninitialized inside its own header.
  const __m256 h =
      _mm256_add_ps(_mm512_castps512_ps256(acc),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  const float s = _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
  return round_out ? round_bf16(s) : s;
}

template <int R, int C>
void block(const GemvArgs& a, int64_t r0, int64_t t0) {
  __m512 acc[R][C];
  for (int i = 0; i < R; ++i)
    for (int c = 0; c < C; ++c) acc[i][c] = _mm512_setzero_ps();
  const uint16_t* w[R];
  for (int i = 0; i < R; ++i) w[i] = a.W + (r0 + i) * a.ldw;
  const uint16_t* x[C];
  for (int c = 0; c < C; ++c) x[c] = a.xb + (t0 + c) * a.ldx;
  const int64_t K = a.K, K32 = K / 32 * 32;
  int64_t k = 0;
  for (; k < K32; k += 32) {
    __m512i wv[R];
    for (int i = 0; i < R; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(w[i] + k) + 512, _MM_HINT_T0);
      wv[i] = _mm512_loadu_si512(w[i] + k);
    }
    for (int c = 0; c < C; ++c) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x[c] + k);
      for (int i = 0; i < R; ++i) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], (__m512bh)wv[i], xv);
    }
  }
  if (k < K) {
    const __mmask32 m = __mmask32((1ull << (K - k)) - 1);
    __m512i wv[R];
    for (int i = 0; i < R; ++i) wv[i] = _mm512_maskz_loadu_epi16(m, w[i] + k);
    for (int c = 0; c < C; ++c) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x[c] + k);  // zero padded to ldx
      for (int i = 0; i < R; ++i) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], (__m512bh)wv[i], xv);
    }
  }
  for (int c = 0; c < C; ++c)
    for (int i = 0; i < R; ++i) a.y[(t0 + c) * a.ldy + r0 + i] = finish(acc[i][c], a.round_out);
}

// One token (decode): one row at a time, 4 accumulators over K, so each thread reads its rows as
// one sequential stream, prefetched 2 KiB ahead (into the next rows at the end of a row). On a
// k3-mini-like decode step this read 91-92% of the interleaved memory read against 87-90% for
// 8 rows side by side with 512 B prefetch (a 2-core VM, tools: strata bench cpu-trunk).
void row_t1(const GemvArgs& a, int64_t r, int64_t t0) {
  const uint16_t* w = a.W + r * a.ldw;
  const uint16_t* x = a.xb + t0 * a.ldx;
  const int64_t K = a.K;
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  int64_t k = 0;
  for (; k + 128 <= K; k += 128)
    for (int i = 0; i < 4; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(w + k + 32 * i) + 2048, _MM_HINT_T0);
      acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_loadu_si512(w + k + 32 * i),
                                (__m512bh)_mm512_loadu_si512(x + k + 32 * i));
    }
  for (; k + 32 <= K; k += 32)
    acc[0] = _mm512_dpbf16_ps(acc[0], (__m512bh)_mm512_loadu_si512(w + k),
                              (__m512bh)_mm512_loadu_si512(x + k));
  if (k < K) {
    const __mmask32 m = __mmask32((1ull << (K - k)) - 1);
    acc[1] = _mm512_dpbf16_ps(acc[1], (__m512bh)_mm512_maskz_loadu_epi16(m, w + k),
                              (__m512bh)_mm512_loadu_si512(x + k));  // zero padded to ldx
  }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
  a.y[t0 * a.ldy + r] = finish(s, a.round_out);
}

// Rows [r0, r1) for C tokens from t0. Several tokens: R rows × C tokens (≤ 16 accumulators)
// share each loaded weight vector — 4 rows up to 4 tokens, 2 rows for 5 to 8, so 5 to 8 tokens
// read the rows once instead of once per group of 4. Every (row, token) sees the same vdpbf16ps
// sequence whatever R, so the same bits. Dev VM (2 threads, `strata bench cpu-trunk --tokens 8`):
// KDA q|k|v|g T=8 10.57 / 11.02 → 9.55 / 10.84 ms with 2 × 8 against two passes of 4 × 4;
// vdpbf16ps issue bounds T = 8 there (≈ 0.5 per cycle), not the weight stream.
template <int C>
void rows(const GemvArgs& a, int64_t r0, int64_t r1, int64_t t0) {
  if constexpr (C == 1) {
    for (int64_t r = r0; r < r1; ++r) row_t1(a, r, t0);
  } else {
    constexpr int R = C <= 4 ? 4 : 2;
    int64_t r = r0;
    for (; r + R <= r1; r += R) block<R, C>(a, r, t0);
    for (; r < r1; ++r) block<1, C>(a, r, t0);
  }
}

using RowsFn = void (*)(const GemvArgs&, int64_t, int64_t, int64_t);
constexpr RowsFn kRows[9] = {nullptr, rows<1>, rows<2>, rows<3>, rows<4>,
                             rows<5>, rows<6>, rows<7>, rows<8>};

}  // namespace

// Groups of up to 8 tokens, each one pass over the rows.
void gemv_rows_avx512bf16(const GemvArgs& a, int64_t r0, int64_t r1) {
  for (int64_t t = 0; t < a.T; t += 8) kRows[std::min<int64_t>(8, a.T - t)](a, r0, r1, t);
}

void to_bf16_avx512bf16(const float* x, uint16_t* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)v);
  }
  for (; i < n; ++i) out[i] = f32_to_bf16(x[i]);
}

}  // namespace strata::cpu::detail
