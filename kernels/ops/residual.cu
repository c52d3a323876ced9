// Residual add with the bf16 rounding point, in-place bf16 rounding, and the MLA sigmoid output
// gate (kernels/ops/ops.h). Grid-stride loops, explicit round-to-nearest intrinsics (no FMA
// contraction), so the results equal the fp32 oracle's (cpu/ref) bit for bit except sigmoid's
// expf (≤ 2 ulp from libm; tests/kernels/ops_gpu.cpp states the tolerance).
#include <cuda_runtime.h>

#include "kernels/ops/launch.cuh"
#include "kernels/ops/ops.h"
#include "storage/bf16.h"

namespace strata::kernels::ops {
namespace {

__global__ void add_kernel(float* acc, const float* b, int64_t n, bool rb) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float s = __fadd_rn(acc[i], b[i]);
    acc[i] = rb ? ::strata::round_bf16(s) : s;
  }
}

__global__ void round_kernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = ::strata::round_bf16(x[i]);
}

__global__ void sigmoid_gate_kernel(uint16_t* o, const uint16_t* g, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float gv = ::strata::bf16_to_f32(g[i]);
    const float s = ::strata::round_bf16(__fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gv))));
    o[i] = ::strata::f32_to_bf16(__fmul_rn(::strata::bf16_to_f32(o[i]), s));
  }
}

unsigned grid_of(int64_t n) {
  int64_t b = (n + 255) / 256;
  return unsigned(b < 4096 ? (b < 1 ? 1 : b) : 4096);
}

}  // namespace

Status add_inplace(float* acc, const float* b, int64_t n, bool round_bf16, void* stream) {
  if (n < 0) return detail::invalid("add_inplace: n < 0");
  if (n == 0) return {};
  add_kernel<<<grid_of(n), 256, 0, detail::as_stream(stream)>>>(acc, b, n, round_bf16);
  return detail::launch_status();
}

Status round_bf16_inplace(float* x, int64_t n, void* stream) {
  if (n < 0) return detail::invalid("round_bf16_inplace: n < 0");
  if (n == 0) return {};
  round_kernel<<<grid_of(n), 256, 0, detail::as_stream(stream)>>>(x, n);
  return detail::launch_status();
}

Status sigmoid_gate_bf16(uint16_t* o, const uint16_t* g, int64_t n, void* stream) {
  if (n < 0) return detail::invalid("sigmoid_gate_bf16: n < 0");
  if (n == 0) return {};
  sigmoid_gate_kernel<<<grid_of(n), 256, 0, detail::as_stream(stream)>>>(o, g, n);
  return detail::launch_status();
}

}  // namespace strata::kernels::ops
