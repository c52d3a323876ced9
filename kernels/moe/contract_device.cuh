// Device helpers of the MXFP4 expert kernels: E2M1 nibbles decoded to doubled int8 in registers
// with byte permutes (no table in memory, no widened weights), and the exact int32 block dot of
// numerics.md §3. Included by kernels/moe/*.cu only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "storage/expert_contract.h"

namespace strata::kernels::moe::detail {

// Doubled E2M1 values as byte tables: codes 0..7 → {0,1,2,3,4,6,8,12}, codes 8..15 → negatives.
constexpr uint32_t kPos0 = 0x03020100u, kPos1 = 0x0C080604u;
constexpr uint32_t kNeg0 = 0xFDFEFF00u, kNeg1 = 0xF4F8FAFCu;

// Four E2M1 codes in the low 16 bits of `codes` (nibble k = element k, the released nibble order
// read as a little-endian word) → four int8 doubled values, byte k = element k.
__device__ __forceinline__ uint32_t decode4(uint32_t codes) {
  const uint32_t idx = codes & 0x7777u;
  const uint32_t pos = __byte_perm(kPos0, kPos1, idx);
  const uint32_t neg = __byte_perm(kNeg0, kNeg1, idx);
  // Byte k from pos (selector k) or from neg (selector 4 + k) by the sign bit of nibble k.
  const uint32_t pick = 0x3210u | ((codes & 0x8888u) >> 1);
  return __byte_perm(pos, neg, pick);
}

// Eight codes of one packed word → two int8x4 words (elements 0..3, 4..7).
__device__ __forceinline__ void decode8(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = decode4(w);
  hi = decode4(w >> 16);
}

// Exact block dot d = Σ_{i<32} q_i · w2_i: 16 packed weight bytes (32 codes) against 32 int8
// activations (qa = elements 0..15, qb = 16..31).
__device__ __forceinline__ int dot_block(uint4 w, uint4 qa, uint4 qb) {
  uint32_t a, b;
  int d = 0;
  decode8(w.x, a, b);
  d = __dp4a(int(a), int(qa.x), d);
  d = __dp4a(int(b), int(qa.y), d);
  decode8(w.y, a, b);
  d = __dp4a(int(a), int(qa.z), d);
  d = __dp4a(int(b), int(qa.w), d);
  decode8(w.z, a, b);
  d = __dp4a(int(a), int(qb.x), d);
  d = __dp4a(int(b), int(qb.y), d);
  decode8(w.w, a, b);
  d = __dp4a(int(a), int(qb.z), d);
  d = __dp4a(int(b), int(qb.w), d);
  return d;
}

}  // namespace strata::kernels::moe::detail

namespace strata::kernels::moe::detail {

// The contract's block term t = d · 2^(e_x + s_w − 128) (contract::block_term), with the int → fp64
// conversion done by bits and one fp64 subtraction instead of the slower conversion instruction:
// 1.5·2^52 + 2^31 + d is built exactly from its bit pattern, then the constant is subtracted
// (exact). Same bits as contract::block_term for every |d| < 2^31.
__device__ __forceinline__ double block_term_fast(int d, int e_x, int s_w) {
  const double biased = __hiloint2double(0x43380000, int(uint32_t(d) ^ 0x80000000u));
  const double dd = __dsub_rn(biased, 6755401588539392.0);  // 1.5·2^52 + 2^31
  return __dmul_rn(dd, strata::contract::pow2(e_x + s_w - 128));
}

}  // namespace strata::kernels::moe::detail

namespace strata::kernels::moe::detail {

// The decode GEMV's leaner form of the same dot (numerics.md §3). PRMT's selector nibble is a
// 3-bit byte index plus a mode bit, and the mode bit (here the E2M1 sign bit) makes it emit the
// selected byte's sign replicated — 0x00, as every doubled magnitude {0,1,2,3,4,6,8,12} is
// positive. So one PRMT of the magnitude table by four raw codes gives the positive weights with
// the negative ones zeroed (P), and one by the codes with their sign bits flipped gives the
// negative weights' magnitudes (N): Σ w·q = Σ P·q − Σ N·q, exact in int32. 4 PRMT + 3 helpers +
// 4 dp4a per 8 weights instead of a signed table lookup and a per-byte select.
__device__ __forceinline__ uint32_t prmt(uint32_t lo, uint32_t hi, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(sel));
  return r;
}

// Eight codes of one packed word (nibble k = element k) against activations qa (elements 0..3)
// and qb (4..7): adds Σ P·q to pos and Σ N·q to neg (both wrap mod 2^32, like the hardware).
__device__ __forceinline__ void dot8_split(uint32_t w, uint32_t qa, uint32_t qb, int& pos,
                                           int& neg) {
  const uint32_t wn = w ^ 0x88888888u;
  pos = __dp4a(int(prmt(kPos0, kPos1, w)), int(qa), pos);
  pos = __dp4a(int(prmt(kPos0, kPos1, w >> 16)), int(qb), pos);
  neg = __dp4a(int(prmt(kPos0, kPos1, wn)), int(qa), neg);
  neg = __dp4a(int(prmt(kPos0, kPos1, wn >> 16)), int(qb), neg);
}

// Exact block dot d (numerics.md §3) of 16 packed weight bytes against 32 int8 activations,
// returned biased: the bits of d + 2^31 (= d ^ 0x80000000), the low word block_term_bits wants.
__device__ __forceinline__ uint32_t dot_block_biased(uint4 w, uint4 qa, uint4 qb) {
  int pos = int(0x80000000u), neg = 0;
  dot8_split(w.x, qa.x, qa.y, pos, neg);
  dot8_split(w.y, qa.z, qa.w, pos, neg);
  dot8_split(w.z, qb.x, qb.y, pos, neg);
  dot8_split(w.w, qb.z, qb.w, pos, neg);
  return uint32_t(pos) - uint32_t(neg);
}

// The contract's block term t = d · 2^k, k = e_x + s_w − 128 (contract::block_term), from the
// biased dot by bits: the fp64 number with high word hi = (1075 + k) << 20 | 0x80000 and low word
// d + 2^31 is exactly (1.5·2^52 + 2^31 + d)·2^k; minus the same with d = 0 it is d·2^k, exact
// (both share one exponent and the difference fits in 17 bits), +0 for d = 0 — the bits of
// contract::block_term for every e_x in [−155, 121] and s_w in [0, 254] (1075 + k stays within
// [792, 1322]). A poisoned e_x (INT32_MIN) gives a finite, meaningless term; the caller outputs
// NaN for it anyway.
__device__ __forceinline__ double block_term_bits(uint32_t biased_dot, int e_x, int s_w) {
  const uint32_t hi = ((uint32_t(e_x) + uint32_t(s_w) + 947u) << 20) | 0x80000u;
  return __dsub_rn(__hiloint2double(int(hi), int(biased_dot)),
                   __hiloint2double(int(hi), int(0x80000000u)));
}

}  // namespace strata::kernels::moe::detail
