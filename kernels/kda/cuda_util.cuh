// Small device helpers shared by the KDA and MLA kernels (CUDA only; not a public header).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops/launch.cuh"  // status_of, invalid, launch_status, warp_sum, warp_max
#include "kernels/runtime.h"

namespace strata::kernels::detail {

__device__ __forceinline__ float bf(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}

// Round to nearest even, NaN kept quiet (same as storage/bf16.h).
__device__ __forceinline__ uint16_t to_bf(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__device__ __forceinline__ float round_bf(float f) {
  return bf(to_bf(f));
}

__device__ __forceinline__ float sigmoidf_(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__device__ __forceinline__ float siluf_(float x) {
  return x * sigmoidf_(x);
}

// torch softplus with threshold 20.
__device__ __forceinline__ float softplusf_(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

}  // namespace strata::kernels::detail
