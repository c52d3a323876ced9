// bfloat16 <-> float conversion (round to nearest even, NaN kept quiet). Header-only and usable
// from CUDA host and device code; the one definition of bf16 rounding in strata.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__ __forceinline__
#else
#define STRATA_HD inline
#endif

namespace strata {

STRATA_HD float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

STRATA_HD uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Round a float to the nearest bf16 value, returned as float.
STRATA_HD float round_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

}  // namespace strata
