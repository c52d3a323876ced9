// AMX-INT8 projection kernel for several tokens (cpu/expert_kernels_impl.h), the any-order form
// of docs/numerics.md §3.1 with the block dots from TDPBSSD.
//
// Per 16 rows × 16 tokens × one 32-element block, one tile product: A = the 16 rows' decoded
// weights (doubled E2M1 as s8, 32 bytes per row: the block's 16 even columns, then its 16 odd
// ones), B = the 16 tokens' s8 activations in the matching order, VNNI-packed (8 rows × 64 bytes,
// prepared once per token set: amx_pack_tokens), C = the 16 × 16 exact int32 block dots. The fp64
// epilogue per C row (one weight row, 16 tokens in lanes): cvt, × 2^e_x per token, FMA by
// 2^(s_w − 128) into one fp64 accumulator per output. (row group, token) pairs that fail the span
// check go through the strict one-token AVX-512 kernel, as in cpu/expert_gemm_avx512.cpp.
// Pipelining: the tile products of blocks b+2, b+3 are issued before the epilogue of blocks b, b+1
// (four C buffers), which loads and stores each fp64 accumulator once per two blocks. With one
// token group (≤ 16 tokens) the weights are decoded a quad at a time into an L1 ring two quads
// ahead of the products; with more, whole rows up front (reused by every token group).
//
// project_amx_impl<true> replaces the three tile instructions by scalar code with their
// semantics, so that everything else (layouts, epilogue, fallback) is tested on CPUs without AMX.
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics headers as
// maybe-uninitialized at -O3 (a known false positive); silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/expert_kernels_impl.h"

namespace strata::cpu::detail {

namespace {

struct AmxScratch {
  std::vector<uint8_t> buf;
};
thread_local AmxScratch tl_amx;

uint8_t* align64(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

// 64 packed bytes (4 blocks of one row) → 128 A bytes: per block 32 bytes, even columns then odd.
inline void decode64(const uint8_t* src, int rem, uint8_t* dst) {
  const __m512i lut = _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i idx01 = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i idx23 = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  const __m512i p = rem >= 64
                        ? _mm512_loadu_si512(src)
                        : _mm512_maskz_loadu_epi8(_cvtu64_mask64((uint64_t(1) << rem) - 1), src);
  const __m512i lo = _mm512_shuffle_epi8(lut, _mm512_and_si512(p, low4));
  const __m512i hi = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(p, 4), low4));
  _mm512_store_si512(dst, _mm512_permutex2var_epi64(lo, idx01, hi));
  _mm512_store_si512(dst + 64, _mm512_permutex2var_epi64(lo, idx23, hi));
}

// Quad g (blocks 4g … 4g+3) of rows o0 … o0+15 into dst + m · stride.
inline void decode_quad16(const ProjArgs& a, int o0, int g, uint8_t* dst, int stride) {
  const int row_bytes = a.K / 2;
  const uint8_t* p0 = a.packed + size_t(o0) * size_t(row_bytes) + size_t(g) * 64;
  for (int m = 0; m < 16; ++m)
    decode64(p0 + size_t(m) * size_t(row_bytes), row_bytes - g * 64, dst + size_t(m) * stride);
}

// Rows o0 … o0+15: if A, A rows (stride rs bytes: per block 32 bytes, even columns then odd);
// always pw[m * nb + b] = 2^(s_w − 128). Returns max − min of the scale codes.
int decode_rows_amx(const ProjArgs& a, int o0, uint8_t* A, int rs, double* pw) {
  const int row_bytes = a.K / 2, nb = a.nb, nq = (nb + 3) / 4;
  const uint8_t* p0 = a.packed + size_t(o0) * size_t(row_bytes);
  for (int m = 0; A && m < 16; ++m) {
    const uint8_t* prow = p0 + size_t(m) * size_t(row_bytes);
    uint8_t* arow = A + size_t(m) * size_t(rs);
    for (int g = 0; g < nq; ++g) {
      _mm_prefetch(reinterpret_cast<const char*>(prow + g * 64 + 512), _MM_HINT_T0);
      decode64(prow + g * 64, row_bytes - g * 64, arow + g * 128);
    }
  }
  const uint8_t* s0 = a.scale + size_t(o0) * size_t(nb);
  __m512i vmin = _mm512_set1_epi32(255), vmax = _mm512_setzero_si512();
  const __m512i bias = _mm512_set1_epi64(1023 - 128);
  for (int m = 0; m < 16; ++m)
    for (int c = 0; c * 16 < nb; ++c) {
      const int rem = nb - c * 16;
      const __mmask16 k = rem >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << rem) - 1);
      const __m512i s = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, s0 + size_t(m) * nb + c * 16));
      vmin = _mm512_mask_min_epu32(vmin, k, vmin, s);
      vmax = _mm512_mask_max_epu32(vmax, k, vmax, s);
      const __m512i lo = _mm512_add_epi64(_mm512_cvtepu32_epi64(_mm512_castsi512_si256(s)), bias);
      const __m512i hi =
          _mm512_add_epi64(_mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64(s, 1)), bias);
      double* d = pw + size_t(m) * size_t(nb) + c * 16;
      _mm512_mask_storeu_pd(d, __mmask8(k), _mm512_castsi512_pd(_mm512_slli_epi64(lo, 52)));
      _mm512_mask_storeu_pd(d + 8, __mmask8(k >> 8),
                            _mm512_castsi512_pd(_mm512_slli_epi64(hi, 52)));
    }
  return int(_mm512_reduce_max_epu32(vmax)) - int(_mm512_reduce_min_epu32(vmin));
}

constexpr int kRingQuads = 4;
// The tile instructions: real, or emulated by scalar code of the same semantics (tests).
enum class TileMode { real, emulated };

// Row groups (of 16) decoded per pass when the tokens are split into passes.
constexpr int kPassRowGroups = 4;

// Blocks per epilogue step: their products are issued one step (kU blocks) ahead, each output's
// fp64 accumulator is loaded and stored once per step (C ring of 2 kU buffers). 4 was measured on
// the H200 host and was no faster (M=16 7.53 vs 6.86 ms, M=256 102.0 vs 99.7 ms).
constexpr int kU = 2;
static_assert(kU >= 1 && 4 % kU == 0, "one ring quad per step at most");

template <TileMode kMode>
void project_amx_impl(const ProjArgs& a) {
  constexpr bool kEmu = kMode == TileMode::emulated;
  const int nb = a.nb, n = a.n, nq = (nb + 3) / 4, rs = nq * 128, row_bytes = a.K / 2;
  const int ntg = (n + 15) / 16;
  // One token group: the weights are decoded a quad at a time into an L1 ring (kRingQuads
  // quads, row stride kRingQuads · 128 bytes), two quads ahead of the tile products, instead
  // of 16 whole rows (16 · K bytes, more than L1) up front.
  const bool ring = ntg == 1;
  // Token groups per pass (pg) over rgs decoded row groups. With every group in one pass, one row
  // group at a time (rgs = 1): its decoded rows are reused by all token groups, but the packed
  // tokens of every group (57 KB each at K = 3584, plus 14 KB of 2^e_x) are streamed once per 16
  // rows — 1.1 MB at 256 tokens, half an L2. With passes of pg groups over kPassRowGroups row
  // groups, a pass touches pg groups of tokens and 4 × 57 KB of decoded rows, and each is reused
  // 4 (rows) or pg (tokens) times before it is dropped.
  const int pg = a.amx_pass_groups > 0 && a.amx_pass_groups < ntg ? a.amx_pass_groups : ntg;
  const int rgs = ring || pg == ntg ? 1 : kPassRowGroups;
  AmxScratch& sc = tl_amx;
  const size_t abytes = size_t(rgs) * 16 * size_t(rs), pbytes = size_t(rgs) * 16 * size_t(nb) * 8;
  const size_t need = abytes + pbytes + 2048 + 2 * kU * 1024 + 16 * kRingQuads * 128 + 256;
  if (sc.buf.size() < need) sc.buf.resize(need);
  uint8_t* A = align64(sc.buf.data());
  double* pw = reinterpret_cast<double*>(A + abytes);
  double* F = reinterpret_cast<double*>(align64(reinterpret_cast<uint8_t*>(pw + rgs * 16 * nb)));
  int32_t* C = reinterpret_cast<int32_t*>(F + 256);           // four 16 × 16 int32 buffers
  uint8_t* R = reinterpret_cast<uint8_t*>(C + 2 * kU * 256);  // the ring: 16 × kRingQuads × 128
  const int limit = exact_span_limit(nb);
  if constexpr (!kEmu) {
    TileConfig cfg;
    cfg.palette = 1;
    cfg.rows[0] = 16, cfg.colsb[0] = 32;  // A: 16 rows × 32 s8
    cfg.rows[1] = 8, cfg.colsb[1] = 64;   // B: 8 × (16 tokens × 4 s8)
    cfg.rows[2] = 16, cfg.colsb[2] = 64;  // C: 16 × 16 int32
    cfg.rows[3] = 16, cfg.colsb[3] = 32;  // tiles 3, 4, 5: the same for odd blocks
    cfg.rows[4] = 8, cfg.colsb[4] = 64;
    cfg.rows[5] = 16, cfg.colsb[5] = 64;
    _tile_loadconfig(&cfg);
  }
  std::vector<uint8_t> pass(size_t(rgs) * size_t(n));
  uint64_t nfast = 0, nstrict = 0;

  // Rows o0 … o0+15 (decoded at Ag / pwg, or through the ring) × token group tg, every block;
  // pf / pfs (or null): packed bytes (16 rows) and scales requested into L2 meanwhile.
  auto tile = [&](int o0, const uint8_t* Ag, const double* pwg, const uint8_t* passg, int tg,
                  const uint8_t* pf, const uint8_t* pfs) {
    const int8_t* B = a.tb + size_t(tg) * size_t(nb) * 512;
    const double* PX = a.tpx + size_t(tg) * size_t(nb) * 16;
    for (int i = 0; i < 256; i += 8) _mm512_store_pd(F + i, _mm512_setzero_pd());
    if (pfs)
      for (int i = 0; i < 16 * nb; i += 64)
        _mm_prefetch(reinterpret_cast<const char*>(pfs + i), _MM_HINT_T1);
    // Block b's tile product into C buffer b % 4 (tiles 0–2 for even b, 3–5 for odd b): the
    // product of block b + 2 is issued before the epilogue of block b, so the tile unit works
    // while the vector units convert and accumulate, two blocks ahead.
    const int ars = ring ? kRingQuads * 128 : rs;
    auto tile_op = [&](int b) {
      const int8_t* Bb = B + size_t(b) * 512;
      const uint8_t* Ab = ring ? R + size_t(b % (4 * kRingQuads)) * 32 : Ag + size_t(b) * 32;
      int32_t* Cb = C + (b % (2 * kU)) * 256;
      if constexpr (kEmu) {
        for (int m = 0; m < 16; ++m)
          for (int j = 0; j < 16; ++j) {
            int32_t s = 0;
            for (int kk = 0; kk < 32; ++kk)
              s += int32_t(int8_t(Ab[size_t(m) * ars + kk])) *
                   int32_t(Bb[(kk / 4) * 64 + 4 * j + kk % 4]);
            Cb[m * 16 + j] = s;
          }
      } else if (b & 1) {
        // GCC's tile asm declares no memory operands: keep the A and B stores before the loads
        // and the C loads after the store.
        __asm__ volatile("" ::: "memory");
        _tile_loadd(3, Ab, ars);
        _tile_loadd(4, Bb, 64);
        _tile_zero(5);
        _tile_dpbssd(5, 3, 4);
        _tile_stored(5, Cb, 64);
        __asm__ volatile("" ::: "memory");
      } else {
        __asm__ volatile("" ::: "memory");
        _tile_loadd(0, Ab, ars);
        _tile_loadd(1, Bb, 64);
        _tile_zero(2);
        _tile_dpbssd(2, 0, 1);
        _tile_stored(2, Cb, 64);
        __asm__ volatile("" ::: "memory");
      }
    };
    auto ring_quad = [&](int g) {
      if (ring && g < nq) decode_quad16(a, o0, g, R + (g % kRingQuads) * 128, ars);
    };
    ring_quad(0);
    ring_quad(1);
    for (int b = 0; b < kU && b < nb; ++b) tile_op(b);
    for (int b = 0; b < nb; b += kU) {
      // Quad b/4 + 2 into the slot of quad b/4 − 2, whose tile products are all issued; its
      // first block's product is issued after this.
      if ((b & 3) == 0) ring_quad(b / 4 + 2);
      // Blocks b … b+kU−1: their products were issued one step ago; the next kU now.
      for (int k = 0; k < kU; ++k)
        if (b + kU + k < nb) tile_op(b + kU + k);
      const int nbu = std::min(kU, nb - b);
      if (pf)
        for (int i = 0; i < 4 * nbu; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(pf + size_t(b) * 256 + i * 64), _MM_HINT_T1);
      __m512d P0[kU], P1[kU];
      for (int k = 0; k < kU; ++k) {
        const int bk = std::min(b + k, nb - 1);
        P0[k] = _mm512_loadu_pd(PX + size_t(bk) * 16);
        P1[k] = _mm512_loadu_pd(PX + size_t(bk) * 16 + 8);
      }
      for (int m = 0; m < 16; ++m) {
        __m512d f0 = _mm512_load_pd(F + m * 16), f1 = _mm512_load_pd(F + m * 16 + 8);
        const double* pwm = pwg + size_t(m) * size_t(nb) + size_t(b);
        for (int k = 0; k < kU; ++k) {
          if (k >= nbu) break;
          // Each half of the C row converted straight from memory (vcvtdq2pd zmm, m256): no
          // 512-bit load and no lane extract.
          const int32_t* cm = C + ((b + k) % (2 * kU)) * 256 + m * 16;
          const __m512d w = _mm512_set1_pd(pwm[k]);
          const __m512d dlo =
              _mm512_cvtepi32_pd(_mm256_load_si256(reinterpret_cast<const __m256i*>(cm)));
          const __m512d dhi =
              _mm512_cvtepi32_pd(_mm256_load_si256(reinterpret_cast<const __m256i*>(cm + 8)));
          f0 = _mm512_fmadd_pd(_mm512_mul_pd(dlo, P0[k]), w, f0);
          f1 = _mm512_fmadd_pd(_mm512_mul_pd(dhi, P1[k]), w, f1);
        }
        _mm512_store_pd(F + m * 16, f0);
        _mm512_store_pd(F + m * 16 + 8, f1);
      }
    }
    for (int j = 0; j < 16 && tg * 16 + j < n; ++j) {
      const int t = tg * 16 + j;
      if (!passg[size_t(t)]) continue;
      float* out = a.out + size_t(t) * size_t(a.out_stride) + size_t(o0 - a.r0);
      for (int m = 0; m < 16; ++m) out[m] = float(F[m * 16 + j]);
    }
  };

  const int last_tg0 = (ntg - 1) / pg * pg;
  for (int s0 = a.r0; s0 < a.r1; s0 += 16 * rgs) {
    const int nrg = std::min(rgs, (a.r1 - s0 + 15) / 16);
    // Decode the pass's row groups and sort their (row group, token) pairs: any order (pass) or
    // the strict kernel now.
    for (int rg = 0; rg < nrg; ++rg) {
      const int o0 = s0 + 16 * rg, rows = std::min(16, a.r1 - o0);
      uint8_t* passg = pass.data() + size_t(rg) * size_t(n);
      const int span_w = rows == 16 ? decode_rows_amx(a, o0, ring ? nullptr : A + rg * 16 * rs, rs,
                                                      pw + size_t(rg) * 16 * size_t(nb))
                                    : 0;
      for (int t = 0; t < n; ++t) {
        passg[size_t(t)] = rows == 16 && limit >= 0 && span_w + a.span[t] <= limit;
        if (passg[size_t(t)]) {
          ++nfast;
          continue;
        }
        project_strict_pair(a, o0, rows, t);
        ++nstrict;
      }
    }
    for (int tg0 = 0; tg0 < ntg; tg0 += pg)
      for (int rg = 0; rg < nrg; ++rg) {
        const int o0 = s0 + 16 * rg;
        if (a.r1 - o0 < 16) continue;
        const uint8_t* passg = pass.data() + size_t(rg) * size_t(n);
        for (int tg = tg0; tg < std::min(ntg, tg0 + pg); ++tg) {
          bool any = false;
          for (int j = 0; j < 16 && tg * 16 + j < n; ++j) any |= passg[size_t(tg * 16 + j)] != 0;
          if (!any) continue;
          // While the first tile of a row group in the last pass computes: the packed bytes
          // (4 lines per block) and scales of the row group one pass of rows ahead — of this
          // call, or after its last rows the first rows of the next call.
          const uint8_t* pf = nullptr;
          const uint8_t* pfs = nullptr;
          if (tg == last_tg0) {
            const int on = o0 + 16 * rgs;
            if (on + 16 <= a.r1) {
              pf = a.packed + size_t(on) * size_t(row_bytes);
              pfs = a.scale + size_t(on) * size_t(nb);
            } else if (s0 + 16 * rgs >= a.r1 && a.next_packed && (rgs > 1 || rg == 0)) {
              pf = a.next_packed + size_t(rg) * 16 * size_t(row_bytes);
              pfs = a.next_scale + size_t(rg) * 16 * size_t(nb);
            }
          }
          tile(o0, A + rg * 16 * rs, pw + size_t(rg) * 16 * size_t(nb), passg, tg, pf, pfs);
        }
      }
  }
  if constexpr (!kEmu) _tile_release();
  gemm_count_add(nfast, nstrict);
}

}  // namespace

void project_amx(const ProjArgs& a) {
  if (a.n < kAmxMinTokens || !a.tb || !a.tpx || !a.span) return project_avx512(a);
  project_amx_impl<TileMode::real>(a);
}

void project_amx_emulated(const ProjArgs& a) {
  if (a.n < kAmxMinTokens || !a.tb || !a.tpx || !a.span) return project_avx512(a);
  project_amx_impl<TileMode::emulated>(a);
}

}  // namespace strata::cpu::detail
