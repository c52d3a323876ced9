// The integer form of one contract output (docs/numerics.md §3.2): the exact sum S of an output's
// block terms computed as ONE integer dot product over the whole row plus one fp64 scaling,
// instead of one fp64 block term and one fp64 add per 32-block. The grouped GEMM path of
// kernels/moe (intgemm.cu) is built on these primitives; tests/cpu/expert_contract_int_test.cpp
// runs the same primitives on the CPU (an emulation of the kernel's arithmetic) against the scalar
// contract cpu::expert_ffn_contract, bit for bit. Header-only, C++ and CUDA (host and device).
//
// The method. For one output o and one token (activation row) with block exponents e_x(b) and
// weight scale codes s_w(o, b), every block term is d_b · 2^(e_x(b) + s_w(o,b) − 128). Write
//   e_min = min e_x(b) over the token's NONZERO blocks (a zero block has every q = 0),
//   s_min = min s_w(o, b) over all blocks of the row,
//   sx(b) = e_x(b) − e_min ∈ [0, kMaxActShift],   sw(b) = s_w(o, b) − s_min ∈ [0, kMaxWeightShift].
// Then S = 2^(e_min + s_min − 128) · D with the integer D = Σ_i a_i · w'_i over all K columns,
// a_i = q_i · 2^sx(b(i)) (0 in zero blocks), w'_i = w2_i · 2^sw(b(i)).
// Bounds (K ≤ kMaxK = 4096):
//   |w'| ≤ 12 · 2^3 = 96 → int8.
//   |a| ≤ 127 · 2^7 = 16,256 < 2^14 → split a = 128·hi + lo, lo = a & 127 ∈ [0, 127],
//     hi = (a − lo) / 128 ∈ [−127, 127]: two int8 planes.
//   D_hi = Σ hi·w', D_lo = Σ lo·w': |each| ≤ 4096 · 127 · 96 = 49,938,432 < 2^31 → exact int32
//     (every partial sum too, so the int32 accumulation of any order never wraps).
//   D = 128·D_hi + D_lo: |D| ≤ 4096 · 16,256 · 96 < 2^33 < 2^53 → 128.0·D_hi + D_lo is exact in
//     fp64 (two exact conversions, an exact ×128, one addition of integers below 2^53).
//   S = D · 2^(e_min + s_min − 128): the exponent lies in [−155 + 0 − 128, 121 + 254 − 128] =
//     [−283, 247]; |S| < 2^(33+247) — a normal fp64 number, so the multiplication is exact.
// Why S is the contract's value: the nonzero terms of this output have exponents within
// [e_min + s_min − 128, e_min + s_min − 128 + 7 + 3], a span ≤ 10 ≤ exact_span_limit(nb) (30 at
// nb ≤ 176; nb ≤ 128 here), so by the lemma of numerics.md §3.1 the fixed-order reduction returns
// the exact sum S; (float) S is then the contract's output, ±Inf beyond the fp32 range included,
// and a zero sum is +0.0 (D = 0 gives +0.0 · 2^k = +0.0).
// Outside the window — a token whose nonzero blocks span more than 7 binades, or a row whose scale
// codes span more than 3 — the pair takes the strict per-block path; a poisoned token gives the
// canonical NaN.
#pragma once
#include <climits>
#include <cstdint>

#include "storage/expert_contract.h"

namespace strata::contract::intsum {

inline constexpr int kMaxActShift = 7;     // sx ≤ 7: |q · 2^sx| < 2^14
inline constexpr int kMaxWeightShift = 3;  // sw ≤ 3: |12 · 2^sw| ≤ 96
inline constexpr int kMaxK = 4096;         // D_hi, D_lo fit int32 (see bounds above)

// Status of an activation row (token) for the integer method.
enum TokenStatus : int32_t {
  kTokenOk = 0,        // all nonzero blocks within kMaxActShift of e_min
  kTokenSpan = 1,      // span too wide: the strict path
  kTokenPoisoned = 2,  // an Inf/NaN block: every output the canonical NaN
};

struct TokenMeta {
  int32_t e_min = 0;  // min e_x over nonzero blocks (0 if none)
  int32_t status = kTokenOk;
};

// Whether block b of a quantized row is nonzero (some q ≠ 0; for a finite block with amax > 0 the
// largest element quantizes to |q| ≥ 64, so this is amax > 0).
STRATA_XC bool block_nonzero(const int8_t* qb) {
  for (int i = 0; i < kBlock; ++i)
    if (qb[i] != 0) return true;
  return false;
}

// Folds block b (exponent e, nonzero?, poisoned?) into the running min/max of a row's nonzero
// blocks; finish with token_meta_finish. Order-free (min, max, or), so a warp can split it.
struct TokenScan {
  int32_t mn = INT32_MAX, mx = INT32_MIN;
  bool poisoned = false;
};
STRATA_XC void token_scan_add(TokenScan& s, int32_t e, bool nonzero, bool poisoned) {
  if (poisoned) {
    s.poisoned = true;
    return;
  }
  if (!nonzero) return;
  if (e < s.mn) s.mn = e;
  if (e > s.mx) s.mx = e;
}
STRATA_XC TokenMeta token_meta_finish(const TokenScan& s) {
  TokenMeta m;
  if (s.poisoned) {
    m.status = kTokenPoisoned;
  } else if (s.mn != INT32_MAX) {  // some nonzero block
    m.e_min = s.mn;
    m.status = s.mx - s.mn > kMaxActShift ? kTokenSpan : kTokenOk;
  }
  return m;
}

// a = q · 2^sx split into the two int8 planes: a = 128·hi + lo, lo ∈ [0, 127].
STRATA_XC void split_plane(int q, int sx, int8_t& hi, int8_t& lo) {
  const int a = q * (1 << sx);  // |a| ≤ 16,256
  lo = int8_t(a & 127);
  hi = int8_t((a - (a & 127)) / 128);  // exact: a − lo is a multiple of 128
}

// The weight window of one row: s_min and whether every code is within kMaxWeightShift of it.
struct RowWindow {
  int32_t s_min = 0;
  bool ok = true;
};
STRATA_XC RowWindow row_window(const uint8_t* scale_row, int nb) {
  int mn = 255, mx = 0;
  for (int b = 0; b < nb; ++b) {
    const int s = scale_row[b];
    if (s < mn) mn = s;
    if (s > mx) mx = s;
  }
  RowWindow w;
  w.s_min = mn;
  w.ok = mx - mn <= kMaxWeightShift;
  return w;
}

// Byte tables of the doubled E2M1 magnitudes shifted by sw ∈ [0, 3], as the GPU's byte-permute
// decode reads them: pos0/pos1 hold codes 0..3 / 4..7 → {0,1,2,3} / {4,6,8,12} · 2^sw (each
// byte ≤ 96, so the word shift moves no bit across a byte), neg0/neg1 the same magnitudes negated
// bytewise (two's complement; code 8, −0, stays 0). The negation adds 1 to ~byte, which carries
// out of a byte only for a zero byte — only byte 0 of pos0 — so that byte is masked to 0 first.
struct ShiftedTables {
  uint32_t pos0, pos1, neg0, neg1;
};
STRATA_XC ShiftedTables shifted_tables(int sw) {
  ShiftedTables t;
  t.pos0 = 0x03020100u << sw;
  t.pos1 = 0x0C080604u << sw;
  t.neg0 = ((~t.pos0) & 0xFFFFFF00u) + 0x01010100u;
  t.neg1 = (~t.pos1) + 0x01010101u;
  return t;
}

// The shifted doubled weight w' of one E2M1 code from the tables (the host form of the GPU's
// decode4: byte `code & 7` of pos or neg by the sign bit).
STRATA_XC int shifted_weight(const ShiftedTables& t, unsigned code) {
  const unsigned i = code & 7u;
  const uint32_t word = (code & 8u) ? (i < 4 ? t.neg0 : t.neg1) : (i < 4 ? t.pos0 : t.pos1);
  return int(int8_t(uint8_t(word >> (8 * (i & 3)))));
}

// The output from the two plane sums: (float)((128·D_hi + D_lo) · 2^(e_min + s_min − 128)).
STRATA_XC float finish(int32_t d_hi, int32_t d_lo, int e_min, int s_min) {
  const double d = dadd(dmul(128.0, double(d_hi)), double(d_lo));
  return float(dmul(d, pow2(e_min + s_min - 128)));
}

// Host emulation of the GPU path for one projection of one token (the kernel's arithmetic,
// element by element): rows [rows] of an MXFP4 matrix (packed [rows, K/2], scale [rows, K/32])
// against a quantized row q [K], e [K/32] (poisoned: some block had an Inf/NaN). A row whose window
// and the token both pass takes the integer method (D_hi, D_lo accumulated in int64 and checked
// against the int32 range the tensor cores accumulate in: `max_abs_d` receives the largest
// |D_hi|, |D_lo| seen); the others the strict per-block contract. Returns the rows that took the
// integer method.
#if !defined(__CUDA_ARCH__)
inline int project_emulated(const uint8_t* packed, const uint8_t* scale, int rows, int K,
                            const int8_t* q, const int32_t* e, bool poisoned, float* out,
                            int64_t* max_abs_d = nullptr) {
  const int nb = K / kBlock;
  TokenScan scan;
  for (int b = 0; b < nb; ++b) token_scan_add(scan, e[b], block_nonzero(q + b * kBlock), poisoned);
  const TokenMeta tm = token_meta_finish(scan);
  int fast = 0;
  for (int o = 0; o < rows; ++o) {
    const uint8_t* pr = packed + size_t(o) * size_t(K / 2);
    const uint8_t* sr = scale + size_t(o) * size_t(nb);
    if (tm.status == kTokenPoisoned) {
      out[o] = canonical_nan();
      continue;
    }
    const RowWindow w = row_window(sr, nb);
    if (tm.status == kTokenOk && w.ok && K <= kMaxK) {
      int64_t d_hi = 0, d_lo = 0;
      for (int b = 0; b < nb; ++b) {
        if (!block_nonzero(q + b * kBlock)) continue;  // a = 0 in a zero block
        const ShiftedTables t = shifted_tables(sr[b] - w.s_min);
        for (int i = 0; i < kBlock; ++i) {
          const int c = b * kBlock + i;
          const unsigned code = (c & 1) ? (pr[c >> 1] >> 4) : (pr[c >> 1] & 0xFu);
          int8_t hi, lo;
          split_plane(q[c], e[b] - tm.e_min, hi, lo);
          const int wq = shifted_weight(t, code);
          d_hi += int64_t(hi) * wq, d_lo += int64_t(lo) * wq;
          if (max_abs_d) {
            const int64_t m = d_hi < 0 ? -d_hi : d_hi, l = d_lo < 0 ? -d_lo : d_lo;
            if (m > *max_abs_d) *max_abs_d = m;
            if (l > *max_abs_d) *max_abs_d = l;
          }
        }
      }
      out[o] = finish(int32_t(d_hi), int32_t(d_lo), tm.e_min, w.s_min);
      ++fast;
    } else {
      int32_t d[kMaxK / kBlock * 2];  // strict path: block dots, then §3's fixed order
      int ex[kMaxK / kBlock * 2];
      if (nb > kMaxK / kBlock * 2) return -1;
      for (int b = 0; b < nb; ++b) {
        int32_t s = 0;
        for (int i = 0; i < kBlock; ++i)
          s += int32_t(q[b * kBlock + i]) * weight_x2(pr, b * kBlock + i);
        d[b] = s, ex[b] = e[b];
      }
      out[o] = reduce_row(d, ex, sr, nb);
    }
  }
  return fast;
}
#endif

}  // namespace strata::contract::intsum
