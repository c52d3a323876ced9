// KimiRMSNorm, L2 norm and the gated per-head RMSNorm (spec/model.md §3) — see kernels/ops/ops.h.
// One thread block per row; the block size follows D (32 threads for head vectors of 128, 256 for
// hidden rows of 7168), so short rows do not idle a large block.
#include <cuda_runtime.h>

#include "kernels/ops/launch.cuh"
#include "kernels/ops/ops.h"
#include "storage/bf16.h"

namespace strata::kernels::ops {
namespace {

using detail::block_sum;

int threads_for(int64_t D) {
  if (D <= 256) return 32;
  if (D <= 2048) return 128;
  return 256;
}

__device__ __forceinline__ float row_sum_sq(const float* x, int64_t D, float* scratch) {
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s = __fadd_rn(s, __fmul_rn(x[i], x[i]));
  return block_sum(s, scratch);
}

__device__ __forceinline__ float sigmoidf_ref(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

__global__ void kimi_rms_norm_kernel(const float* x, const float* w, float* out, int64_t D,
                                     float eps, bool rb) {
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * D;
  float* yr = out + blockIdx.x * D;
  float ss = row_sum_sq(xr, D, scratch);
  float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(D)), eps)));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float y = __fmul_rn(xr[i], r);
    yr[i] = rb ? round_bf16(__fmul_rn(w[i], round_bf16(y))) : __fmul_rn(w[i], y);
  }
}

__global__ void l2_norm_kernel(const float* x, float* out, int64_t D, float eps, bool rb) {
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * D;
  float* yr = out + blockIdx.x * D;
  float ss = row_sum_sq(xr, D, scratch);
  float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss, eps)));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float y = __fmul_rn(xr[i], r);
    yr[i] = rb ? round_bf16(y) : y;
  }
}

__global__ void gated_rms_norm_kernel(const float* o, const float* gate, const float* w, float* out,
                                      int64_t D, float eps, bool rb) {
  __shared__ float scratch[32];
  const float* orow = o + blockIdx.x * D;
  const float* grow = gate + blockIdx.x * D;
  float* yr = out + blockIdx.x * D;
  float ss = row_sum_sq(orow, D, scratch);
  float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(D)), eps)));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float y = __fmul_rn(__fmul_rn(__fmul_rn(orow[i], r), w[i]), sigmoidf_ref(grow[i]));
    yr[i] = rb ? round_bf16(y) : y;
  }
}

Status check_rows(int64_t rows, int64_t D) {
  if (rows < 0 || D <= 0 || rows > 0x7fffffff) return detail::invalid("norm: bad rows or D");
  return {};
}

}  // namespace

Status kimi_rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t D, float eps,
                     bool round_bf16, void* stream) {
  if (Status s = check_rows(rows, D); !s.ok()) return s;
  if (rows == 0) return {};
  kimi_rms_norm_kernel<<<unsigned(rows), threads_for(D), 0, detail::as_stream(stream)>>>(
      x, w, out, D, eps, round_bf16);
  return detail::launch_status();
}

Status l2_norm(const float* x, float* out, int64_t rows, int64_t D, float eps, bool round_bf16,
               void* stream) {
  if (Status s = check_rows(rows, D); !s.ok()) return s;
  if (rows == 0) return {};
  l2_norm_kernel<<<unsigned(rows), threads_for(D), 0, detail::as_stream(stream)>>>(x, out, D, eps,
                                                                                   round_bf16);
  return detail::launch_status();
}

Status gated_rms_norm(const float* o, const float* gate, const float* w, float* out, int64_t rows,
                      int64_t D, float eps, bool round_bf16, void* stream) {
  if (Status s = check_rows(rows, D); !s.ok()) return s;
  if (rows == 0) return {};
  gated_rms_norm_kernel<<<unsigned(rows), threads_for(D), 0, detail::as_stream(stream)>>>(
      o, gate, w, out, D, eps, round_bf16);
  return detail::launch_status();
}

}  // namespace strata::kernels::ops
