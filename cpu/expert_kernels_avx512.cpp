// AVX-512 (F, BW, VNNI) projection kernel of the CPU expert FFN; see cpu/expert_kernels.h for the
// scheme and docs/numerics.md for the arithmetic it must reproduce bit for bit.
//
// Per output row: the MXFP4 row is decoded once into an L1 buffer of u8 (doubled E2M1 + 12) in the
// activations' quad layout; then per token, per chunk of 16 blocks: 8 vpdpbusd give 4 dwords per
// block, a transpose-add tree and one vpermd give the 16 block dots in block order, minus 12·Σq;
// they become exact fp64 block terms (vcvtdq2pd, vscalefpd by e_x + s_w − 128) added to the
// contract's 32 fp64 lanes held in four zmm registers (block b → lane b mod 32).
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics headers as
// maybe-uninitialized at -O3 (a known false positive); silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <vector>

#include "cpu/expert_kernels_impl.h"

namespace strata::cpu::detail {

namespace {

// Decoded row buffers (per thread, grown on demand, never shrunk).
struct RowScratch {
  std::vector<uint8_t, std::allocator<uint8_t>> w;  // [nbp * 32 + 64] (64 for alignment slack)
  std::vector<int32_t> ws;                          // [nbp] s_w − 128
};
thread_local RowScratch tl_scratch;

// Decodes row o into w (quad layout, 64-byte aligned) and ws.
inline void decode_row(const ProjArgs& a, int o, uint8_t* w, int32_t* ws) {
  const __m512i lut = _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int row_bytes = a.K / 2;
  const uint8_t* prow = a.packed + size_t(o) * size_t(row_bytes);
  for (int g = 0; g < a.nbp / 4; ++g) {
    const int rem = row_bytes - g * 64;
    __m512i p;
    if (rem >= 64) {
      p = _mm512_loadu_si512(prow + g * 64);
    } else if (rem > 0) {
      p = _mm512_maskz_loadu_epi8(_cvtu64_mask64((uint64_t(1) << rem) - 1), prow + g * 64);
    } else {
      p = _mm512_setzero_si512();
    }
    const __m512i lo = _mm512_and_si512(p, low4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), low4);
    _mm512_store_si512(w + g * 128, _mm512_shuffle_epi8(lut, lo));
    _mm512_store_si512(w + g * 128 + 64, _mm512_shuffle_epi8(lut, hi));
  }
  const uint8_t* srow = a.scale + size_t(o) * size_t(a.nb);
  const __m512i bias128 = _mm512_set1_epi32(128);
  for (int c = 0; c < a.nbp / 16; ++c) {
    const int rem = a.nb - c * 16;
    __m128i s;
    if (rem >= 16) {
      s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(srow + c * 16));
    } else if (rem > 0) {
      s = _mm_maskz_loadu_epi8(__mmask16((1u << rem) - 1), srow + c * 16);
    } else {
      s = _mm_setzero_si128();
    }
    _mm512_storeu_si512(ws + c * 16, _mm512_sub_epi32(_mm512_cvtepu8_epi32(s), bias128));
  }
}

// Contract butterfly (off 16, 8, 4, 2, 1) over lanes L0..L3 = lanes 0–7, 8–15, 16–23, 24–31.
inline float lane_finish(__m512d L0, __m512d L1, __m512d L2, __m512d L3) {
  L0 = _mm512_add_pd(L0, L2);
  L1 = _mm512_add_pd(L1, L3);
  L0 = _mm512_add_pd(L0, L1);
  __m256d v4 = _mm256_add_pd(_mm512_castpd512_pd256(L0), _mm512_extractf64x4_pd(L0, 1));
  __m128d v2 = _mm_add_pd(_mm256_castpd256_pd128(v4), _mm256_extractf128_pd(v4, 1));
  __m128d v1 = _mm_add_sd(v2, _mm_unpackhi_pd(v2, v2));
  return _mm_cvtss_f32(_mm_cvtsd_ss(_mm_setzero_ps(), v1));
}

}  // namespace

void project_avx512(const ProjArgs& a) {
  RowScratch& sc = tl_scratch;
  const size_t wbytes = size_t(a.nbp) * 32;
  if (sc.w.size() < wbytes + 64) sc.w.resize(wbytes + 64);
  if (sc.ws.size() < size_t(a.nbp)) sc.ws.resize(size_t(a.nbp));
  uint8_t* w =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(sc.w.data()) + 63) & ~uintptr_t(63));
  int32_t* ws = sc.ws.data();
  // Block i of a chunk sits at dword 4·(i mod 4) + i/4 after the transpose-add tree.
  const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const int nchunks = a.nbp / 16;
  for (int o = a.r0; o < a.r1; ++o) {
    decode_row(a, o, w, ws);
    for (int t = 0; t < a.n; ++t) {
      const int8_t* q = a.q[t];
      const int32_t* e = a.e[t];
      const int32_t* bias = a.bias[t];
      __m512d L[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(),
                      _mm512_setzero_pd()};
      for (int c = 0; c < nchunks; ++c) {
        const uint8_t* wc = w + c * 512;
        const int8_t* qc = q + c * 512;
        __m512i acc[4];
        for (int k = 0; k < 4; ++k) {
          __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_load_si512(wc + k * 128),
                                          _mm512_loadu_si512(qc + k * 128));
          acc[k] = _mm512_dpbusd_epi32(s, _mm512_load_si512(wc + k * 128 + 64),
                                       _mm512_loadu_si512(qc + k * 128 + 64));
        }
        const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[0], acc[1]),
                                             _mm512_unpackhi_epi32(acc[0], acc[1]));
        const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2], acc[3]),
                                             _mm512_unpackhi_epi32(acc[2], acc[3]));
        const __m512i r =
            _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
        const __m512i d =
            _mm512_sub_epi32(_mm512_permutexvar_epi32(perm, r), _mm512_loadu_si512(bias + c * 16));
        const __m512i ex =
            _mm512_add_epi32(_mm512_loadu_si512(ws + c * 16), _mm512_loadu_si512(e + c * 16));
        const __m512d tlo = _mm512_scalef_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(d)),
                                             _mm512_cvtepi32_pd(_mm512_castsi512_si256(ex)));
        const __m512d thi = _mm512_scalef_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(d, 1)),
                                             _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(ex, 1)));
        const int l = (c & 1) * 2;  // chunk c covers lanes 16·(c mod 2) … +15
        L[l] = _mm512_add_pd(L[l], tlo);
        L[l + 1] = _mm512_add_pd(L[l + 1], thi);
      }
      a.out[size_t(t) * size_t(a.out_stride) + size_t(o - a.r0)] =
          lane_finish(L[0], L[1], L[2], L[3]);
    }
  }
}

uint64_t stream_read_avx512(const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(b + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(b + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(b + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(b + i + 192));
  }
  a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  return uint64_t(_mm512_reduce_add_epi64(a0));
}

}  // namespace strata::cpu::detail
