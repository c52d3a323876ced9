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
