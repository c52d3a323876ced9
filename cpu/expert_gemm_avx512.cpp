// Register-tiled AVX-512 VNNI projection kernel for several tokens (cpu/expert_kernels_impl.h).
//
// Per group of 16 rows, the weights are decoded once into an L2-resident buffer: per block, 8 zmm
// whose dword lane l holds 4 (weight + 12) bytes of row l — so one vpdpbusd with a broadcast
// dword of activations adds a 4-column piece of one block dot for 16 rows at once, and 8 of them
// leave the 16 whole block dots of one token (no horizontal sums). The activation side is the
// quad layout of QuantizedActivations as it is: the 4 bytes a k-step needs are contiguous there.
//
// The fp64 epilogue per (16 rows, token, block) is cvt + mul by 2^(s_w − 128) + fma by 2^e_x into
// one fp64 accumulator per output: blocks summed in plain block order, not the contract's 32-lane
// order. That is exact — hence bit-identical — whenever the exponent span of the output's terms
// is at most exact_span_limit(nb) (docs/numerics.md §3.1). The span is bounded per (row group,
// token) by (max − min of the rows' scale codes) + (max − min of the token's nonzero-block
// exponents); pairs that fail the bound take the strict one-token kernel.
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics headers as
// maybe-uninitialized at -O3 (a known false positive); silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "cpu/expert_kernels_impl.h"

namespace strata::cpu::detail {

namespace {

constexpr int kTok = 8;      // tokens per register tile: 8 int32 + 16 fp64 accumulators
constexpr int kPfQuads = 4;  // software prefetch distance of the row decode, in 64-byte quads

std::atomic<uint64_t> g_fast{0}, g_strict{0};

struct GemmScratch {
  std::vector<uint8_t> buf;
};
thread_local GemmScratch tl_gemm;

// 16×16 dword transpose: r[c] lane l ← r[l] lane c.
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + k], 128-bit lane L: rows 4i … 4i+3 at dword 4L + k.
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i v88 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88);
    const __m512i vdd = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
    const __m512i w88 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88);
    const __m512i wdd = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
    r[k] = _mm512_shuffle_i32x4(v88, w88, 0x88);
    r[8 + k] = _mm512_shuffle_i32x4(v88, w88, 0xDD);
    r[4 + k] = _mm512_shuffle_i32x4(vdd, wdd, 0x88);
    r[12 + k] = _mm512_shuffle_i32x4(vdd, wdd, 0xDD);
  }
}

// Rows o0 … o0+15 into w (per block 8 × 64 bytes: k-step s = 2j + h holds, in dword lane l, the
// weight + 12 bytes of row l at columns 8j + h, 8j + 2 + h, 8j + 4 + h, 8j + 6 + h) and pw (per
// block 16 fp64 2^(s_w − 128), lane l = row l). Returns max − min of the 16 rows' scale codes.
int decode_rows16(const ProjArgs& a, int o0, uint8_t* w, double* pw) {
  const __m512i lut = _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int row_bytes = a.K / 2, nb = a.nb;
  const uint8_t* p0 = a.packed + size_t(o0) * size_t(row_bytes);
  const uint8_t* s0 = a.scale + size_t(o0) * size_t(nb);
  // 16 strided row streams defeat the hardware prefetchers: request the first kPfQuads quads of
  // every row and the scales up front, then kPfQuads quads ahead.
  const int nq = (nb + 3) / 4;
  for (int l = 0; l < 16; ++l)
    for (int g = 0; g < kPfQuads && g < nq; ++g)
      _mm_prefetch(reinterpret_cast<const char*>(p0 + size_t(l) * row_bytes + g * 64), _MM_HINT_T0);
  for (int i = 0; i < 16 * nb; i += 64)
    _mm_prefetch(reinterpret_cast<const char*>(s0 + i), _MM_HINT_T0);
  __m512i r[16];
  for (int g = 0; g < nq; ++g) {
    if (g + kPfQuads < nq)
      for (int l = 0; l < 16; ++l)
        _mm_prefetch(
            reinterpret_cast<const char*>(p0 + size_t(l) * row_bytes + (g + kPfQuads) * 64),
            _MM_HINT_T0);
    const int rem = row_bytes - g * 64;
    if (rem >= 64) {
      for (int l = 0; l < 16; ++l) r[l] = _mm512_loadu_si512(p0 + size_t(l) * row_bytes + g * 64);
    } else {
      const __mmask64 m = _cvtu64_mask64((uint64_t(1) << rem) - 1);
      for (int l = 0; l < 16; ++l)
        r[l] = _mm512_maskz_loadu_epi8(m, p0 + size_t(l) * row_bytes + g * 64);
    }
    transpose16(r);  // r[c]: packed dword c (block 4g + c/4, columns 8(c%4) … +7) of each row
    for (int c = 0; c < 16; ++c) {
      const int b = 4 * g + c / 4, j = c % 4;
      if (b >= nb) break;
      const __m512i lo = _mm512_and_si512(r[c], low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(r[c], 4), low4);
      _mm512_store_si512(w + size_t(b) * 512 + (2 * j) * 64, _mm512_shuffle_epi8(lut, lo));
      _mm512_store_si512(w + size_t(b) * 512 + (2 * j + 1) * 64, _mm512_shuffle_epi8(lut, hi));
    }
  }
  __m512i vmin = _mm512_set1_epi32(255), vmax = _mm512_setzero_si512();
  const __m512i bias = _mm512_set1_epi64(1023 - 128);
  for (int cc = 0; cc * 16 < nb; ++cc) {
    const int rem = nb - cc * 16;
    const __mmask16 m = rem >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rem) - 1);
    for (int l = 0; l < 16; ++l)
      r[l] = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, s0 + size_t(l) * nb + cc * 16));
    transpose16(r);  // r[k]: scale code of block 16cc + k, lane l = row l
    for (int k = 0; k < 16 && k < rem; ++k) {
      vmin = _mm512_min_epu32(vmin, r[k]);
      vmax = _mm512_max_epu32(vmax, r[k]);
      const int b = cc * 16 + k;
      const __m512i lo =
          _mm512_add_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(r[k])), bias);
      const __m512i hi =
          _mm512_add_epi64(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(r[k], 1)), bias);
      _mm512_store_si512(pw + size_t(b) * 16, _mm512_slli_epi64(lo, 52));
      _mm512_store_si512(pw + size_t(b) * 16 + 8, _mm512_slli_epi64(hi, 52));
    }
  }
  return int(_mm512_reduce_max_epu32(vmax)) - int(_mm512_reduce_min_epu32(vmin));
}

// T tokens × 16 rows: out[t][l] = Σ_b d(l, t, b) · 2^(s_w − 128) · 2^e_x, in block order (exact
// under the span check).
// pf (or null): the next 16 rows' packed bytes (4 lines per block), requested into L2 while this
// tile computes, so that their decode does not wait for DRAM.
template <int T>
void tile16(const uint8_t* w, const double* pw, int nb, const int8_t* const* q,
            const int32_t* const* nbias, const double* const* px, float* const* out,
            const uint8_t* pf) {
  __m512d F[T][2];
  for (int t = 0; t < T; ++t) F[t][0] = F[t][1] = _mm512_setzero_pd();
  for (int b = 0; b < nb; ++b) {
    if (pf)
      for (int i = 0; i < 4; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(pf + size_t(b) * 256 + i * 64), _MM_HINT_T1);
    const uint8_t* wb = w + size_t(b) * 512;
    const int qoff = (b >> 2) * 128 + (b & 3) * 16;
    __m512i acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_set1_epi32(nbias[t][b]);
    for (int s = 0; s < 8; ++s) {
      const __m512i W = _mm512_load_si512(wb + s * 64);
      const int off = qoff + (s & 1) * 64 + (s >> 1) * 4;
      for (int t = 0; t < T; ++t) {
        int32_t x4;
        std::memcpy(&x4, q[t] + off, 4);
        acc[t] = _mm512_dpbusd_epi32(acc[t], W, _mm512_set1_epi32(x4));
      }
    }
    const __m512d P0 = _mm512_load_pd(pw + size_t(b) * 16);
    const __m512d P1 = _mm512_load_pd(pw + size_t(b) * 16 + 8);
    for (int t = 0; t < T; ++t) {
      const __m512d xs = _mm512_set1_pd(px[t][b]);
      const __m512d dlo = _mm512_cvtepi32_pd(_mm512_castsi512_si256(acc[t]));
      const __m512d dhi = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(acc[t], 1));
      F[t][0] = _mm512_fmadd_pd(_mm512_mul_pd(dlo, P0), xs, F[t][0]);
      F[t][1] = _mm512_fmadd_pd(_mm512_mul_pd(dhi, P1), xs, F[t][1]);
    }
  }
  for (int t = 0; t < T; ++t) {
    _mm256_storeu_ps(out[t], _mm512_cvtpd_ps(F[t][0]));
    _mm256_storeu_ps(out[t] + 8, _mm512_cvtpd_ps(F[t][1]));
  }
}

using TileFn = void (*)(const uint8_t*, const double*, int, const int8_t* const*,
                        const int32_t* const*, const double* const*, float* const*, const uint8_t*);
constexpr TileFn kTiles[kTok + 1] = {nullptr,   tile16<1>, tile16<2>, tile16<3>, tile16<4>,
                                     tile16<5>, tile16<6>, tile16<7>, tile16<8>};

}  // namespace

GemmCounts gemm_counts() {
  return {g_fast.load(std::memory_order_relaxed), g_strict.load(std::memory_order_relaxed)};
}

void project_strict_pair(const ProjArgs& a, int o0, int rows, int t) {
  ProjArgs b = a;
  b.r0 = o0;
  b.r1 = o0 + rows;
  b.n = 1;
  b.q = a.q + t;
  b.e = a.e + t;
  b.bias = a.bias + t;
  b.out = a.out + size_t(t) * size_t(a.out_stride) + size_t(o0 - a.r0);
  b.prefetch = 0;
  project_one_avx512(b);
}

void project_gemm_avx512(const ProjArgs& a) {
  const int nb = a.nb, n = a.n;
  GemmScratch& sc = tl_gemm;
  const size_t wbytes = size_t(nb) * 512, pbytes = size_t(nb) * 16 * sizeof(double);
  if (sc.buf.size() < wbytes + pbytes + 128) sc.buf.resize(wbytes + pbytes + 128);
  uint8_t* w = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(sc.buf.data()) + 63) &
                                          ~uintptr_t(63));
  double* pw = reinterpret_cast<double*>(w + wbytes);
  const int limit = exact_span_limit(nb);
  std::vector<int> fast(size_t(n), 0);
  uint64_t nfast = 0, nstrict = 0;
  for (int o0 = a.r0; o0 < a.r1; o0 += 16) {
    const int rows = std::min(16, a.r1 - o0);
    const int span_w = rows == 16 ? decode_rows16(a, o0, w, pw) : 0;
    int nf = 0;
    for (int t = 0; t < n; ++t) {
      if (rows == 16 && limit >= 0 && span_w + a.span[t] <= limit) {
        fast[size_t(nf++)] = t;
        continue;
      }
      project_strict_pair(a, o0, rows, t);
      ++nstrict;
    }
    nfast += uint64_t(nf);
    for (int i = 0; i < nf; i += kTok) {
      const int k = std::min(kTok, nf - i);
      const int8_t* q[kTok];
      const int32_t* nbias[kTok];
      const double* px[kTok];
      float* out[kTok];
      for (int j = 0; j < k; ++j) {
        const int t = fast[size_t(i + j)];
        q[j] = a.q[t];
        nbias[j] = a.nbias[t];
        px[j] = a.px[t];
        out[j] = a.out + size_t(t) * size_t(a.out_stride) + size_t(o0 - a.r0);
      }
      const uint8_t* pf =
          i == 0 && o0 + 32 <= a.r1 ? a.packed + size_t(o0 + 16) * size_t(a.K / 2) : nullptr;
      kTiles[k](w, pw, nb, q, nbias, px, out, pf);
    }
  }
  gemm_count_add(nfast, nstrict);
}

void gemm_count_add(uint64_t fast, uint64_t strict) {
  g_fast.fetch_add(fast, std::memory_order_relaxed);
  g_strict.fetch_add(strict, std::memory_order_relaxed);
}

}  // namespace strata::cpu::detail
