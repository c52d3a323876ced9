// Small device helpers shared by the KDA and MLA kernels (CUDA only; not a public header).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/runtime.h"

namespace strata::kernels::detail {

inline Status status_of(cudaError_t e) {
  Status s;
  s.code = int(e);
  s.message = e == cudaSuccess ? "ok" : cudaGetErrorString(e);
  return s;
}

inline Status invalid(const char* why) {
  Status s;
  s.code = int(cudaErrorInvalidValue);
  s.message = why;
  return s;
}

// The last launch's error (launch configuration, too much shared memory, ...).
inline Status launch_status() {
  return status_of(cudaGetLastError());
}

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

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace strata::kernels::detail
