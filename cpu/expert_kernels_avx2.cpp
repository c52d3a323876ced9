// AVX2 projection kernel of the CPU expert FFN, for CPUs without AVX-512; same scheme as
// cpu/expert_kernels_avx512.cpp with ymm registers: vpmaddubsw + vpmaddwd instead of vpdpbusd
// (no AVX-VNNI needed: |(w + 12) · q| pairs stay ≤ 2 · 24 · 127 in int16), hadd trees for the
// block dots, block terms built from exponent bits, and the 32 fp64 lanes in eight ymm registers.
#include <immintrin.h>

#include <vector>

#include "cpu/expert_kernels_impl.h"

namespace strata::cpu::detail {

namespace {

struct RowScratch {
  std::vector<uint8_t> w;  // [nbp * 32 + 32]
  std::vector<int32_t> ws;
};
thread_local RowScratch tl_scratch;

inline void decode_row(const ProjArgs& a, int o, uint8_t* w, int32_t* ws) {
  const __m256i lut = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const int row_bytes = a.K / 2;
  const uint8_t* prow = a.packed + size_t(o) * size_t(row_bytes);
  alignas(32) uint8_t tail[32];
  for (int h = 0; h < a.nbp / 2; ++h) {  // 2 blocks (32 packed bytes) at a time
    const int rem = row_bytes - h * 32;
    __m256i p;
    if (rem >= 32) {
      p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(prow + h * 32));
    } else {
      for (int i = 0; i < 32; ++i) tail[i] = i < rem ? prow[h * 32 + i] : 0;
      p = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
    }
    const __m256i lo = _mm256_and_si256(p, low4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(p, 4), low4);
    // Quad g = h / 2 holds [even 64 B][odd 64 B]; half h % 2 is the second 32 B of each.
    uint8_t* dst = w + (h / 2) * 128 + (h % 2) * 32;
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst), _mm256_shuffle_epi8(lut, lo));
    _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 64), _mm256_shuffle_epi8(lut, hi));
  }
  const uint8_t* srow = a.scale + size_t(o) * size_t(a.nb);
  for (int b = 0; b < a.nbp; ++b) ws[b] = b < a.nb ? int32_t(srow[b]) - 128 : -128;
}

// Contract butterfly over L[0..7] (lanes 4i..4i+3).
inline float lane_finish(__m256d* L) {
  for (int i = 0; i < 4; ++i) L[i] = _mm256_add_pd(L[i], L[i + 4]);  // off 16
  L[0] = _mm256_add_pd(L[0], L[2]);                                  // off 8
  L[1] = _mm256_add_pd(L[1], L[3]);
  L[0] = _mm256_add_pd(L[0], L[1]);  // off 4
  __m128d v2 = _mm_add_pd(_mm256_castpd256_pd128(L[0]), _mm256_extractf128_pd(L[0], 1));
  __m128d v1 = _mm_add_sd(v2, _mm_unpackhi_pd(v2, v2));
  return _mm_cvtss_f32(_mm_cvtsd_ss(_mm_setzero_ps(), v1));
}

inline __m256d pow2_pd(__m128i k) {  // exact 2^k, k in [−1022, 1023]
  __m256i b = _mm256_add_epi64(_mm256_cvtepi32_epi64(k), _mm256_set1_epi64x(1023));
  return _mm256_castsi256_pd(_mm256_slli_epi64(b, 52));
}

// One token (decode): rows decoded in registers straight from the packed bytes.
void project_one_avx2(const ProjArgs& a) {
  const __m256i lut = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i bias128 = _mm256_set1_epi32(128);
  const int row_bytes = a.K / 2, nhalves = a.nbp / 8;
  const int8_t* q = a.q[0];
  const int32_t* e = a.e[0];
  const int32_t* bias = a.bias[0];
  alignas(32) uint8_t tail[32];
  for (int o = a.r0; o < a.r1; ++o) {
    const uint8_t* prow = a.packed + size_t(o) * size_t(row_bytes);
    const uint8_t* srow = a.scale + size_t(o) * size_t(a.nb);
    __m256d L[8];
    for (auto& l : L) l = _mm256_setzero_pd();
    for (int c = 0; c < nhalves; ++c) {
      __m256i acc[4];
      for (int k = 0; k < 4; ++k) {  // blocks 8c + 2k, 8c + 2k + 1
        const int pb = (8 * c + 2 * k) * 16, rem = row_bytes - pb;
        __m256i p;
        if (rem >= 32) {
          p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(prow + pb));
        } else {
          for (int i = 0; i < 32; ++i) tail[i] = i < rem ? prow[pb + i] : 0;
          p = _mm256_load_si256(reinterpret_cast<const __m256i*>(tail));
        }
        const __m256i wl = _mm256_shuffle_epi8(lut, _mm256_and_si256(p, low4));
        const __m256i wh =
            _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(p, 4), low4));
        const int off = (2 * c + k / 2) * 128 + (k % 2) * 32;
        const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + off));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + off + 64));
        acc[k] = _mm256_madd_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(wl, ql), _mm256_maddubs_epi16(wh, qh)), ones);
      }
      const __m256i r =
          _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
      const __m256i d =
          _mm256_sub_epi32(_mm256_permutevar8x32_epi32(r, perm),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + c * 8)));
      const int srem = a.nb - c * 8;
      __m128i sb;
      if (srem >= 8) {
        sb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(srow + c * 8));
      } else {
        alignas(16) uint8_t st[16] = {};
        for (int i = 0; i < srem; ++i) st[i] = srow[c * 8 + i];
        sb = _mm_load_si128(reinterpret_cast<const __m128i*>(st));
      }
      const __m256i ex =
          _mm256_add_epi32(_mm256_sub_epi32(_mm256_cvtepu8_epi32(sb), bias128),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e + c * 8)));
      const __m256d tlo = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(d)),
                                        pow2_pd(_mm256_castsi256_si128(ex)));
      const __m256d thi = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(d, 1)),
                                        pow2_pd(_mm256_extracti128_si256(ex, 1)));
      const int l = (c & 3) * 2;
      L[l] = _mm256_add_pd(L[l], tlo);
      L[l + 1] = _mm256_add_pd(L[l + 1], thi);
    }
    a.out[size_t(o - a.r0)] = lane_finish(L);
  }
}

}  // namespace

void project_avx2(const ProjArgs& a) {
  if (a.n == 1) return project_one_avx2(a);
  RowScratch& sc = tl_scratch;
  const size_t wbytes = size_t(a.nbp) * 32;
  if (sc.w.size() < wbytes + 32) sc.w.resize(wbytes + 32);
  if (sc.ws.size() < size_t(a.nbp)) sc.ws.resize(size_t(a.nbp));
  uint8_t* w =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(sc.w.data()) + 31) & ~uintptr_t(31));
  int32_t* ws = sc.ws.data();
  const __m256i ones = _mm256_set1_epi16(1);
  // After the hadd tree, 128-bit lane 0 holds blocks 0, 2, 4, 6 and lane 1 blocks 1, 3, 5, 7.
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const int nhalves = a.nbp / 8;  // 8 blocks = 256 decoded bytes
  for (int o = a.r0; o < a.r1; ++o) {
    decode_row(a, o, w, ws);
    for (int t = 0; t < a.n; ++t) {
      const int8_t* q = a.q[t];
      const int32_t* e = a.e[t];
      const int32_t* bias = a.bias[t];
      __m256d L[8];
      for (auto& l : L) l = _mm256_setzero_pd();
      for (int c = 0; c < nhalves; ++c) {  // blocks 8c … 8c+7 = quads 2c, 2c+1
        __m256i acc[4];
        for (int k = 0; k < 4; ++k) {  // ymm k: blocks 8c + 2k, 8c + 2k + 1
          const int off = (2 * c + k / 2) * 128 + (k % 2) * 32;
          const __m256i wl = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + off));
          const __m256i wh = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + off + 64));
          const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + off));
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + off + 64));
          const __m256i p16 =
              _mm256_add_epi16(_mm256_maddubs_epi16(wl, ql), _mm256_maddubs_epi16(wh, qh));
          acc[k] = _mm256_madd_epi16(p16, ones);
        }
        // acc[k] lane 0: block 2k (4 partial sums); lane 1: block 2k + 1.
        const __m256i r =
            _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]), _mm256_hadd_epi32(acc[2], acc[3]));
        const __m256i d =
            _mm256_sub_epi32(_mm256_permutevar8x32_epi32(r, perm),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + c * 8)));
        const __m256i ex =
            _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws + c * 8)),
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e + c * 8)));
        const __m256d tlo = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(d)),
                                          pow2_pd(_mm256_castsi256_si128(ex)));
        const __m256d thi = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256(d, 1)),
                                          pow2_pd(_mm256_extracti128_si256(ex, 1)));
        const int l = (c & 3) * 2;  // blocks 8c … → lanes (8c mod 32) …
        L[l] = _mm256_add_pd(L[l], tlo);
        L[l + 1] = _mm256_add_pd(L[l + 1], thi);
      }
      a.out[size_t(t) * size_t(a.out_stride) + size_t(o - a.r0)] = lane_finish(L);
    }
  }
}

}  // namespace strata::cpu::detail
