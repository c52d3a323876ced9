// AVX-512 (F, BW, VNNI) projection kernels of the CPU expert FFN and the contract GLU; see
// cpu/expert_kernels.h for the scheme and docs/numerics.md for the arithmetic they must reproduce
// bit for bit.
//
// One token (decode, memory-bound; project_tokens_avx512<1>): each row is decoded in registers
// from the packed bytes; per chunk of 16 blocks, 8 vpdpbusd give 4 dwords per block, a
// transpose-add tree and one vpermd the 16 block dots in block order, minus 12·Σq. Two to four
// tokens (project_tokens_t_avx512): the same decode, each 64-byte piece once for all the tokens,
// with the pieces transposed in registers so that the 8 vpdpbusd leave whole block dots.
// More tokens: the register-tiled any-order kernel (cpu/expert_gemm_avx512.cpp) whenever the
// caller passes px, nbias and span (the layer driver always does); otherwise, here, each row is
// decoded once into an L1 buffer in a transposed layout (and each token's activations once per
// call) so that the 8 vpdpbusd of a chunk leave one whole block dot per dword.
// Both then form exact fp64 block terms (vcvtdq2pd, vscalefpd by e_x + s_w − 128) and add them to
// the contract's 32 fp64 lanes held in four zmm registers (block b → lane b mod 32).
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics headers as
// maybe-uninitialized at -O3 (a known false positive); silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/expert_kernels_impl.h"

namespace strata::cpu::detail {

// From this many tokens on, the register-tiled kernel (cpu/expert_gemm_avx512.cpp).
constexpr int kGemmMinTokens = 2;

namespace {

// Decoded row buffers (per thread, grown on demand, never shrunk).
struct RowScratch {
  std::vector<uint8_t, std::allocator<uint8_t>> w;  // [nbp * 32 + 64] (64 for alignment slack)
  std::vector<int32_t> ws;                          // [nbp] s_w − 128
  std::vector<int8_t> qt;                           // [n, nbp * 32] transposed activations
  std::vector<int32_t> biasp;                       // [n, nbp] −12·Σq in the transposed order
  std::vector<double> ep;                           // [n, nbp] e_x in the transposed order
};
thread_local RowScratch tl_scratch;

// Dword transpose inside each 128-bit lane: out[j] dword (4L + k) = in[k] dword (4L + j).
inline void transpose4(const __m512i in[4], __m512i out[4]) {
  const __m512i t0 = _mm512_unpacklo_epi32(in[0], in[1]), t1 = _mm512_unpackhi_epi32(in[0], in[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(in[2], in[3]), t3 = _mm512_unpackhi_epi32(in[2], in[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}

// The "transposed" layout of the multi-token kernel: per chunk of 16 blocks, 8 zmm s = 0..7
// whose dword (4L + k) holds 4 bytes of block 4k + L — k-step s (even columns 8s … 8s+6 for
// s < 4, odd columns 8(s−4)+1 … for s ≥ 4). Eight vpdpbusd then give whole block dots, one
// per dword, with no horizontal reduction (dword 4L + k = block 4k + L, as before the vpermd).
// Activations (quad layout): per chunk, the even halves of the 4 quads transposed, then the odd.
inline void transpose_q(const int8_t* q, int nbp, int8_t* qt) {
  for (int c = 0; c < nbp / 16; ++c)
    for (int h = 0; h < 2; ++h) {
      __m512i in[4], out[4];
      for (int k = 0; k < 4; ++k) in[k] = _mm512_loadu_si512(q + c * 512 + k * 128 + h * 64);
      transpose4(in, out);
      for (int j = 0; j < 4; ++j) _mm512_store_si512(qt + c * 512 + (h * 4 + j) * 64, out[j]);
    }
}

// Decodes row o into w (transposed layout, 64-byte aligned) and ws (s_w − 128).
inline void decode_row(const ProjArgs& a, int o, uint8_t* w, int32_t* ws) {
  const __m512i lut = _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int row_bytes = a.K / 2;
  const uint8_t* prow = a.packed + size_t(o) * size_t(row_bytes);
  for (int c = 0; c < a.nbp / 16; ++c) {
    __m512i in[4], out[4];
    for (int k = 0; k < 4; ++k) {
      const int g = c * 4 + k, rem = row_bytes - g * 64;
      if (rem >= 64) {
        in[k] = _mm512_loadu_si512(prow + g * 64);
      } else if (rem > 0) {
        in[k] = _mm512_maskz_loadu_epi8(_cvtu64_mask64((uint64_t(1) << rem) - 1), prow + g * 64);
      } else {
        in[k] = _mm512_setzero_si512();
      }
    }
    transpose4(in, out);  // packed dword j of each block: columns 8j … 8j+7
    for (int j = 0; j < 4; ++j) {
      const __m512i lo = _mm512_and_si512(out[j], low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(out[j], 4), low4);
      _mm512_store_si512(w + c * 512 + j * 64, _mm512_shuffle_epi8(lut, lo));
      _mm512_store_si512(w + c * 512 + (4 + j) * 64, _mm512_shuffle_epi8(lut, hi));
    }
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

// One token (decode): each row is decoded in registers, straight from the packed bytes with no
// trip through the L1 buffer — the path that has to keep up with DRAM — then 8 vpdpbusd per chunk
// of 16 blocks and the transpose-add tree. (Written for 1 to 4 tokens; 2 to 4 take the transposed
// form below, 15-23 % faster on the H100 machine's 16-core host, the same bits.)
template <int NT>
void project_tokens_avx512(const ProjArgs& a) {
  static_assert(NT >= 1 && NT <= 4);
  const __m512i lut = _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i bias128 = _mm512_set1_epi32(128);
  const int row_bytes = a.K / 2, nchunks = a.nbp / 16;
  const int pf = a.prefetch;
  for (int o = a.r0; o < a.r1; ++o) {
    const uint8_t* prow = a.packed + size_t(o) * size_t(row_bytes);
    const uint8_t* srow = a.scale + size_t(o) * size_t(a.nb);
    if (pf > 0) {
      const uint8_t* sp = srow + pf / 16;
      _mm_prefetch(reinterpret_cast<const char*>(sp), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(sp + 64), _MM_HINT_T0);
    }
    __m512d L[NT][4];
    for (int t = 0; t < NT; ++t)
      for (int l = 0; l < 4; ++l) L[t][l] = _mm512_setzero_pd();
    for (int c = 0; c < nchunks; ++c) {
      __m512i wl[4], wh[4];
      for (int k = 0; k < 4; ++k) {
        const int g = c * 4 + k, rem = row_bytes - g * 64;
        __m512i p;
        if (pf > 0) _mm_prefetch(reinterpret_cast<const char*>(prow + g * 64 + pf), _MM_HINT_T0);
        if (rem >= 64) {
          p = _mm512_loadu_si512(prow + g * 64);
        } else if (rem > 0) {
          p = _mm512_maskz_loadu_epi8(_cvtu64_mask64((uint64_t(1) << rem) - 1), prow + g * 64);
        } else {
          p = _mm512_setzero_si512();
        }
        wl[k] = _mm512_shuffle_epi8(lut, _mm512_and_si512(p, low4));
        wh[k] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(p, 4), low4));
      }
      const int srem = a.nb - c * 16;
      __m128i sb;
      if (srem >= 16) {
        sb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(srow + c * 16));
      } else {
        sb = _mm_maskz_loadu_epi8(__mmask16((1u << srem) - 1), srow + c * 16);
      }
      const __m512i sw = _mm512_sub_epi32(_mm512_cvtepu8_epi32(sb), bias128);
      const int l = (c & 1) * 2;
      for (int t = 0; t < NT; ++t) {
        const int8_t* qc = a.q[t] + c * 512;
        __m512i acc[4];
        for (int k = 0; k < 4; ++k)
          acc[k] = _mm512_dpbusd_epi32(
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), wl[k], _mm512_loadu_si512(qc + k * 128)),
              wh[k], _mm512_loadu_si512(qc + k * 128 + 64));
        const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[0], acc[1]),
                                             _mm512_unpackhi_epi32(acc[0], acc[1]));
        const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2], acc[3]),
                                             _mm512_unpackhi_epi32(acc[2], acc[3]));
        const __m512i r =
            _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
        const __m512i d = _mm512_sub_epi32(_mm512_permutexvar_epi32(perm, r),
                                           _mm512_loadu_si512(a.bias[t] + c * 16));
        const __m512i ex = _mm512_add_epi32(sw, _mm512_loadu_si512(a.e[t] + c * 16));
        const __m512d tlo = _mm512_scalef_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(d)),
                                             _mm512_cvtepi32_pd(_mm512_castsi512_si256(ex)));
        const __m512d thi = _mm512_scalef_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(d, 1)),
                                             _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(ex, 1)));
        L[t][l] = _mm512_add_pd(L[t][l], tlo);
        L[t][l + 1] = _mm512_add_pd(L[t][l + 1], thi);
      }
    }
    for (int t = 0; t < NT; ++t)
      a.out[size_t(t) * size_t(a.out_stride) + size_t(o - a.r0)] =
          lane_finish(L[t][0], L[t][1], L[t][2], L[t][3]);
  }
}

// Two to four tokens, transposed form: the tokens' activations are transposed once per call
// (transpose_q), and each 64-byte-piece quartet of a row is transposed in registers before it is
// decoded, so that per token 8 vpdpbusd leave whole block dots (dword 4L + k = block 4k + L) with
// no reduction tree and no vpermd. The block order stays permuted through the fp64 terms: the
// token's bias and e_x and the row's scale codes are read in the same order, so each accumulator
// position always receives the same contract lane; the lanes are put back in block order once per
// row, before the butterfly. Same terms, same lanes, same order: the same bits as the one-token
// kernel.
template <int NT>
void project_tokens_t_avx512(const ProjArgs& a) {
  static_assert(NT >= 2 && NT <= 4);
  const __m512i lut = _mm512_broadcast_i32x4(
      _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // perm[p] = π(p) = 4·(p mod 4) + p/4: the block at dword p (an involution).
  const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i bias128 = _mm512_set1_epi32(128);
  const int row_bytes = a.K / 2, nchunks = a.nbp / 16, nbp = a.nbp;
  const int pf = a.prefetch;
  RowScratch& sc = tl_scratch;
  const size_t wbytes = size_t(nbp) * 32;
  if (sc.qt.size() < wbytes * NT + 64) sc.qt.resize(wbytes * NT + 64);
  if (sc.biasp.size() < size_t(nbp) * NT) sc.biasp.resize(size_t(nbp) * NT);
  if (sc.ep.size() < size_t(nbp) * NT) sc.ep.resize(size_t(nbp) * NT);
  int8_t* qt =
      reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(sc.qt.data()) + 63) & ~uintptr_t(63));
  for (int t = 0; t < NT; ++t) {
    transpose_q(a.q[t], nbp, qt + size_t(t) * wbytes);
    int32_t* bp = sc.biasp.data() + size_t(t) * size_t(nbp);
    double* ep = sc.ep.data() + size_t(t) * size_t(nbp);
    for (int c = 0; c < nchunks; ++c) {
      _mm512_storeu_si512(bp + c * 16,
                          _mm512_permutexvar_epi32(perm, _mm512_loadu_si512(a.bias[t] + c * 16)));
      const __m512i ev = _mm512_permutexvar_epi32(perm, _mm512_loadu_si512(a.e[t] + c * 16));
      _mm512_storeu_pd(ep + c * 16, _mm512_cvtepi32_pd(_mm512_castsi512_si256(ev)));
      _mm512_storeu_pd(ep + c * 16 + 8, _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(ev, 1)));
    }
  }
  // Lanes back in block order: L0 = positions π(0..7) of [A0 | A1], L1 = π(8..15).
  const __m512i back0 = _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13);
  const __m512i back1 = _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
  for (int o = a.r0; o < a.r1; ++o) {
    const uint8_t* prow = a.packed + size_t(o) * size_t(row_bytes);
    const uint8_t* srow = a.scale + size_t(o) * size_t(a.nb);
    if (pf > 0) {
      const uint8_t* sp = srow + pf / 16;
      _mm_prefetch(reinterpret_cast<const char*>(sp), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(sp + 64), _MM_HINT_T0);
    }
    __m512d A[NT][4];
    for (int t = 0; t < NT; ++t)
      for (int l = 0; l < 4; ++l) A[t][l] = _mm512_setzero_pd();
    for (int c = 0; c < nchunks; ++c) {
      __m512i in[4], tr[4], wl[4], wh[4];
      for (int k = 0; k < 4; ++k) {
        const int g = c * 4 + k, rem = row_bytes - g * 64;
        if (pf > 0) _mm_prefetch(reinterpret_cast<const char*>(prow + g * 64 + pf), _MM_HINT_T0);
        if (rem >= 64) {
          in[k] = _mm512_loadu_si512(prow + g * 64);
        } else if (rem > 0) {
          in[k] = _mm512_maskz_loadu_epi8(_cvtu64_mask64((uint64_t(1) << rem) - 1), prow + g * 64);
        } else {
          in[k] = _mm512_setzero_si512();
        }
      }
      transpose4(in, tr);
      for (int j = 0; j < 4; ++j) {
        wl[j] = _mm512_shuffle_epi8(lut, _mm512_and_si512(tr[j], low4));
        wh[j] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(tr[j], 4), low4));
      }
      const int srem = a.nb - c * 16;
      __m128i sb;
      if (srem >= 16) {
        sb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(srow + c * 16));
      } else {
        sb = _mm_maskz_loadu_epi8(__mmask16((1u << srem) - 1), srow + c * 16);
      }
      const __m512i sw =
          _mm512_permutexvar_epi32(perm, _mm512_sub_epi32(_mm512_cvtepu8_epi32(sb), bias128));
      const __m512d swlo = _mm512_cvtepi32_pd(_mm512_castsi512_si256(sw));
      const __m512d swhi = _mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(sw, 1));
      const int l = (c & 1) * 2;
      for (int t = 0; t < NT; ++t) {
        const int8_t* qc = qt + size_t(t) * wbytes + size_t(c) * 512;
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int j = 0; j < 4; ++j) {
          s0 = _mm512_dpbusd_epi32(s0, wl[j], _mm512_load_si512(qc + j * 64));
          s1 = _mm512_dpbusd_epi32(s1, wh[j], _mm512_load_si512(qc + (4 + j) * 64));
        }
        const __m512i d =
            _mm512_sub_epi32(_mm512_add_epi32(s0, s1),
                             _mm512_loadu_si512(sc.biasp.data() + size_t(t) * nbp + c * 16));
        const double* ep = sc.ep.data() + size_t(t) * size_t(nbp) + c * 16;
        const __m512d tlo = _mm512_scalef_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(d)),
                                             _mm512_add_pd(swlo, _mm512_loadu_pd(ep)));
        const __m512d thi = _mm512_scalef_pd(_mm512_cvtepi32_pd(_mm512_extracti64x4_epi64(d, 1)),
                                             _mm512_add_pd(swhi, _mm512_loadu_pd(ep + 8)));
        A[t][l] = _mm512_add_pd(A[t][l], tlo);
        A[t][l + 1] = _mm512_add_pd(A[t][l + 1], thi);
      }
    }
    for (int t = 0; t < NT; ++t)
      a.out[size_t(t) * size_t(a.out_stride) + size_t(o - a.r0)] =
          lane_finish(_mm512_permutex2var_pd(A[t][0], back0, A[t][1]),
                      _mm512_permutex2var_pd(A[t][0], back1, A[t][1]),
                      _mm512_permutex2var_pd(A[t][2], back0, A[t][3]),
                      _mm512_permutex2var_pd(A[t][2], back1, A[t][3]));
  }
}

void project_one_avx512(const ProjArgs& a) {
  project_tokens_avx512<1>(a);
}

void project_avx512(const ProjArgs& a) {
  if (a.n == 1) return project_one_avx512(a);
  if (a.few && a.n >= 2 && a.n <= 4) {
    if (a.n == 2) return project_tokens_t_avx512<2>(a);
    if (a.n == 3) return project_tokens_t_avx512<3>(a);
    return project_tokens_t_avx512<4>(a);
  }
  if (a.n >= kGemmMinTokens && a.px && a.nbias && a.span) return project_gemm_avx512(a);
  RowScratch& sc = tl_scratch;
  const size_t wbytes = size_t(a.nbp) * 32;
  if (sc.w.size() < wbytes + 64) sc.w.resize(wbytes + 64);
  if (sc.ws.size() < size_t(a.nbp)) sc.ws.resize(size_t(a.nbp));
  if (sc.qt.size() < wbytes * size_t(a.n) + 64) sc.qt.resize(wbytes * size_t(a.n) + 64);
  uint8_t* w =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(sc.w.data()) + 63) & ~uintptr_t(63));
  int8_t* qt =
      reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(sc.qt.data()) + 63) & ~uintptr_t(63));
  int32_t* ws = sc.ws.data();
  // The tokens' activations in the transposed layout, once per call (reused by every row).
  for (int t = 0; t < a.n; ++t) transpose_q(a.q[t], a.nbp, qt + size_t(t) * wbytes);
  // Block i of a chunk sits at dword 4·(i mod 4) + i/4.
  const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const int nchunks = a.nbp / 16;
  for (int o = a.r0; o < a.r1; ++o) {
    decode_row(a, o, w, ws);
    for (int t = 0; t < a.n; ++t) {
      const int8_t* q = qt + size_t(t) * wbytes;
      const int32_t* e = a.e[t];
      const int32_t* bias = a.bias[t];
      __m512d L[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(),
                      _mm512_setzero_pd()};
      for (int c = 0; c < nchunks; ++c) {
        const uint8_t* wc = w + c * 512;
        const int8_t* qc = q + c * 512;
        // Two chains of four (latency), summed: exact int32 either way.
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int k = 0; k < 4; ++k) {
          s0 = _mm512_dpbusd_epi32(s0, _mm512_load_si512(wc + k * 64),
                                   _mm512_load_si512(qc + k * 64));
          s1 = _mm512_dpbusd_epi32(s1, _mm512_load_si512(wc + (4 + k) * 64),
                                   _mm512_load_si512(qc + (4 + k) * 64));
        }
        const __m512i d = _mm512_sub_epi32(_mm512_permutexvar_epi32(perm, _mm512_add_epi32(s0, s1)),
                                           _mm512_loadu_si512(bias + c * 16));
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

int quantize_block_avx512(const float* x, int8_t* even, int* e_out, int32_t* sum) {
  const __m512i x0 = _mm512_loadu_si512(x), x1 = _mm512_loadu_si512(x + 16);
  const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512i a0 = _mm512_and_si512(x0, absm), a1 = _mm512_and_si512(x1, absm);
  const uint32_t amax = _mm512_reduce_max_epu32(_mm512_max_epu32(a0, a1));
  if (amax == 0 || amax >= 0x7F800000u) {  // zero block, or an Inf / NaN: q = 0, e = 0
    std::memset(even, 0, 16);
    std::memset(even + 64, 0, 16);
    *e_out = 0;
    *sum = 0;
    return amax == 0 ? 0 : 2;
  }
  float fa;
  std::memcpy(&fa, &amax, 4);
  const int e = contract::block_exponent(fa);
  const __m512d f = _mm512_set1_pd(contract::pow2(-e));
  const __m512d magic = _mm512_set1_pd(6755399441055744.0);  // 1.5 · 2^52: contract::rne
  const __m512d lim = _mm512_set1_pd(127.0), nlim = _mm512_set1_pd(-127.0);
  auto q8 = [&](__m256 v) {
    __m512d d = _mm512_mul_pd(_mm512_cvtps_pd(v), f);
    d = _mm512_sub_pd(_mm512_add_pd(d, magic), magic);
    d = _mm512_max_pd(_mm512_min_pd(d, lim), nlim);
    return _mm512_cvtpd_epi32(d);  // an integer: exact
  };
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512 xe = _mm512_castsi512_ps(_mm512_permutex2var_epi32(x0, ie, x1));
  const __m512 xo = _mm512_castsi512_ps(_mm512_permutex2var_epi32(x0, io, x1));
  const __m512i qe = _mm512_inserti64x4(_mm512_castsi256_si512(q8(_mm512_castps512_ps256(xe))),
                                        q8(_mm512_extractf32x8_ps(xe, 1)), 1);
  const __m512i qo = _mm512_inserti64x4(_mm512_castsi256_si512(q8(_mm512_castps512_ps256(xo))),
                                        q8(_mm512_extractf32x8_ps(xo, 1)), 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(even), _mm512_cvtepi32_epi8(qe));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(even + 64), _mm512_cvtepi32_epi8(qo));
  *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qe, qo));
  *e_out = e;
  return 1;  // amax > 0: its element quantizes to ≥ 64
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
  // Folded as unsigned: GCC's _mm512_reduce_add_epi64 adds the lanes as signed long long, which
  // overflows (undefined; UBSan stops) on random data.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, a0);
  uint64_t s = 0;
  for (uint64_t v : lanes) s ^= v;
  return s;
}

}  // namespace strata::cpu::detail

// ------------------------------------------------------------------------------------------------
// The contract GLU, eight elements at a time: the same operation sequence as
// storage/expert_contract.h (det_exp, det_expm1, det_tanh, det_sigmoid, glu), branches replaced by
// computing both sides and selecting, so every lane has the scalar function's bits.

namespace strata::cpu::detail {

namespace {

// N independent vectors per call, their operations interleaved step by step: the Horner chains
// are long (17 dependent mul+add pairs), so N chains in flight hide their latency. Lane for lane
// the same operations as N = 1.
template <int N>
struct Vd {
  __m512d v[N];
};

template <int N>
inline Vd<N> v_expm1_small(const Vd<N>& x) {
  const contract::Expm1Taylor t = contract::expm1_taylor();
  Vd<N> p;
  for (int i = 0; i < N; ++i) p.v[i] = _mm512_set1_pd(t.c[0]);
  for (int k = 1; k < 17; ++k)
    for (int i = 0; i < N; ++i)
      p.v[i] = _mm512_add_pd(_mm512_mul_pd(p.v[i], x.v[i]), _mm512_set1_pd(t.c[k]));
  for (int i = 0; i < N; ++i) p.v[i] = _mm512_mul_pd(p.v[i], x.v[i]);
  return p;
}

inline __m512d v_pow2(__m256i k) {  // exact 2^k per lane, k in [−1022, 1024]
  __m512i b = _mm512_add_epi64(_mm512_cvtepi32_epi64(k), _mm512_set1_epi64(1023));
  return _mm512_castsi512_pd(_mm512_slli_epi64(b, 52));
}

template <int N>
inline Vd<N> v_exp(const Vd<N>& x) {
  __mmask8 nan[N], big[N], small[N];
  Vd<N> r, res;
  __m512d n[N];
  for (int i = 0; i < N; ++i) {
    nan[i] = _mm512_cmp_pd_mask(x.v[i], x.v[i], _CMP_UNORD_Q);
    big[i] = _mm512_cmp_pd_mask(x.v[i], _mm512_set1_pd(709.782712893384), _CMP_GT_OQ);
    small[i] = _mm512_cmp_pd_mask(x.v[i], _mm512_set1_pd(-745.2), _CMP_LT_OQ);
    // Out-of-range and NaN lanes compute on 0 (their result is selected below).
    const __m512d xs =
        _mm512_mask_blend_pd(nan[i] | big[i] | small[i], x.v[i], _mm512_setzero_pd());
    const __m512d magic = _mm512_set1_pd(6755399441055744.0);
    n[i] = _mm512_sub_pd(
        _mm512_add_pd(_mm512_mul_pd(xs, _mm512_set1_pd(1.4426950408889634)), magic), magic);
    r.v[i] = _mm512_sub_pd(
        _mm512_sub_pd(xs, _mm512_mul_pd(n[i], _mm512_set1_pd(6.93147180369123816490e-01))),
        _mm512_mul_pd(n[i], _mm512_set1_pd(1.90821492927058770002e-10)));
  }
  const Vd<N> q = v_expm1_small(r);
  for (int i = 0; i < N; ++i) {
    const __m512d p = _mm512_add_pd(q.v[i], _mm512_set1_pd(1.0));
    const __m256i k = _mm512_cvtpd_epi32(n[i]);  // n is an integer: exact
    // k / 2 truncated toward zero, as C++ division.
    const __m256i k1 = _mm256_srai_epi32(_mm256_add_epi32(k, _mm256_srli_epi32(k, 31)), 1);
    __m512d v = _mm512_mul_pd(_mm512_mul_pd(p, v_pow2(k1)), v_pow2(_mm256_sub_epi32(k, k1)));
    v = _mm512_mask_blend_pd(big[i], v, _mm512_set1_pd(__builtin_inf()));
    v = _mm512_mask_blend_pd(small[i], v, _mm512_setzero_pd());
    res.v[i] = _mm512_mask_blend_pd(nan[i], v, x.v[i]);
  }
  return res;
}

template <int N>
inline Vd<N> v_expm1(const Vd<N>& x) {
  __mmask8 in[N];
  bool all_in = true, none_in = true;
  for (int i = 0; i < N; ++i) {
    in[i] = _mm512_cmp_pd_mask(x.v[i], _mm512_set1_pd(-0.35), _CMP_GT_OQ) &
            _mm512_cmp_pd_mask(x.v[i], _mm512_set1_pd(0.35), _CMP_LT_OQ);
    all_in &= in[i] == 0xFF;
    none_in &= in[i] == 0;
  }
  // All lanes on one side: only that side's polynomial (the other would be blended away).
  if (all_in) return v_expm1_small(x);
  Vd<N> e = v_exp(x);
  for (int i = 0; i < N; ++i) e.v[i] = _mm512_sub_pd(e.v[i], _mm512_set1_pd(1.0));
  if (none_in) return e;
  const Vd<N> s = v_expm1_small(x);
  for (int i = 0; i < N; ++i) e.v[i] = _mm512_mask_blend_pd(in[i], e.v[i], s.v[i]);
  return e;
}

template <int N>
inline Vd<N> v_tanh(const Vd<N>& x) {
  __mmask8 nan[N], neg[N], sat[N];
  Vd<N> m2a;
  const __m512d negzero = _mm512_set1_pd(-0.0);
  for (int i = 0; i < N; ++i) {
    nan[i] = _mm512_cmp_pd_mask(x.v[i], x.v[i], _CMP_UNORD_Q);
    neg[i] = _mm512_cmp_pd_mask(x.v[i], _mm512_setzero_pd(), _CMP_LT_OQ);
    // a = x < 0 ? −x : x, as the scalar code (not |x|: −0 stays −0 and gives tanh(−0) = −0).
    const __m512d a = _mm512_mask_blend_pd(neg[i], x.v[i], _mm512_xor_pd(x.v[i], negzero));
    sat[i] = _mm512_cmp_pd_mask(a, _mm512_set1_pd(20.0), _CMP_GE_OQ);
    const __m512d as = _mm512_mask_blend_pd(sat[i] | nan[i], a, _mm512_setzero_pd());
    m2a.v[i] = _mm512_mul_pd(_mm512_set1_pd(-2.0), as);
  }
  const Vd<N> e = v_expm1(m2a);
  Vd<N> res;
  for (int i = 0; i < N; ++i) {
    __m512d t =
        _mm512_div_pd(_mm512_xor_pd(e.v[i], negzero), _mm512_add_pd(_mm512_set1_pd(2.0), e.v[i]));
    t = _mm512_mask_blend_pd(sat[i], t, _mm512_set1_pd(1.0));
    t = _mm512_mask_blend_pd(neg[i], t, _mm512_xor_pd(t, negzero));
    res.v[i] = _mm512_mask_blend_pd(nan[i], t, x.v[i]);
  }
  return res;
}

template <int N>
inline Vd<N> v_sigmoid(const Vd<N>& x) {
  Vd<N> mx;
  for (int i = 0; i < N; ++i) mx.v[i] = _mm512_xor_pd(x.v[i], _mm512_set1_pd(-0.0));
  const Vd<N> e = v_exp(mx);
  Vd<N> res;
  for (int i = 0; i < N; ++i) {
    const __mmask8 nan = _mm512_cmp_pd_mask(x.v[i], x.v[i], _CMP_UNORD_Q);
    const __m512d s =
        _mm512_div_pd(_mm512_set1_pd(1.0), _mm512_add_pd(_mm512_set1_pd(1.0), e.v[i]));
    res.v[i] = _mm512_mask_blend_pd(nan, s, x.v[i]);
  }
  return res;
}

// h[i … i + 8N) of glu_avx512.
template <int N>
inline void glu_vec(const float* g, const float* u, float* h, const GluParams& p, bool b1_pow2,
                    __m512d inv_b1) {
  const __m256 canon = _mm256_castsi256_ps(_mm256_set1_epi32(int(contract::kNaNBits)));
  Vd<N> gd, ud, hd;
  for (int i = 0; i < N; ++i) {
    gd.v[i] = _mm512_cvtps_pd(_mm256_loadu_ps(g + 8 * i));
    ud.v[i] = _mm512_cvtps_pd(_mm256_loadu_ps(u + 8 * i));
  }
  if (p.situ) {
    const __m512d b1 = _mm512_set1_pd(p.beta1);
    Vd<N> gb;
    for (int i = 0; i < N; ++i)
      gb.v[i] = b1_pow2 ? _mm512_mul_pd(gd.v[i], inv_b1) : _mm512_div_pd(gd.v[i], b1);
    const Vd<N> tg = v_tanh(gb), sg = v_sigmoid(gd);
    Vd<N> b = ud;
    if (p.beta2 > 0.0) {
      const __m512d b2 = _mm512_set1_pd(p.beta2);
      Vd<N> ub;
      for (int i = 0; i < N; ++i) ub.v[i] = _mm512_div_pd(ud.v[i], b2);
      const Vd<N> tu = v_tanh(ub);
      for (int i = 0; i < N; ++i) b.v[i] = _mm512_mul_pd(b2, tu.v[i]);
    }
    for (int i = 0; i < N; ++i)
      hd.v[i] = _mm512_mul_pd(_mm512_mul_pd(_mm512_mul_pd(b1, tg.v[i]), sg.v[i]), b.v[i]);
  } else {
    const Vd<N> sg = v_sigmoid(gd);
    for (int i = 0; i < N; ++i) hd.v[i] = _mm512_mul_pd(_mm512_mul_pd(gd.v[i], sg.v[i]), ud.v[i]);
  }
  for (int i = 0; i < N; ++i) {
    const __mmask8 nan = _mm512_cmp_pd_mask(hd.v[i], hd.v[i], _CMP_UNORD_Q);
    _mm256_storeu_ps(h + 8 * i, _mm256_mask_blend_ps(nan, _mm512_cvtpd_ps(hd.v[i]), canon));
  }
}

}  // namespace

void glu_avx512(const float* g, const float* u, float* h, int n, const GluParams& p) {
  // g / β1 as g · (1/β1) when β1 is a power of two: the same correctly rounded quotient.
  int ex = 0;
  const bool b1_pow2 = p.beta1 > 0.0 && p.beta1 < 1e300 && std::frexp(p.beta1, &ex) == 0.5;
  const __m512d inv_b1 = _mm512_set1_pd(b1_pow2 ? 1.0 / p.beta1 : 0.0);
  constexpr int kWays = 4;
  int i = 0;
  for (; i + 8 * kWays <= n; i += 8 * kWays)
    glu_vec<kWays>(g + i, u + i, h + i, p, b1_pow2, inv_b1);
  for (; i + 8 <= n; i += 8) glu_vec<1>(g + i, u + i, h + i, p, b1_pow2, inv_b1);
  for (; i < n; ++i) h[i] = contract::glu(g[i], u[i], p);
}

}  // namespace strata::cpu::detail
