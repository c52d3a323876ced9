// Residual add with the bf16 rounding point, in-place bf16 rounding, the MLA sigmoid output
// gate and the engine's non-finite scan (kernels/ops/ops.h). Grid-stride loops, explicit
// round-to-nearest intrinsics (no FMA contraction), so the results equal the fp32 oracle's
// (cpu/ref) bit for bit except sigmoid's expf (≤ 2 ulp from libm; tests/kernels/ops_gpu.cpp states
// the tolerance).
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

// Each thread keeps the first bad index of its own stride and makes at most one atomic, so a
// clean scan costs one read of x and no atomics.
__global__ void finite_scan_kernel(const float* x, int64_t n, uint64_t site, uint64_t* record) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t b = __float_as_uint(x[i]);
    if ((b & 0x7F800000u) != 0x7F800000u) continue;
    const uint64_t cls = (b & 0x007FFFFFu) ? 0 : (b >> 31) ? 2 : 1;
    atomicMin(reinterpret_cast<unsigned long long*>(record),
              static_cast<unsigned long long>(finite_key(site, uint64_t(i), cls)));
    return;
  }
}

// add_kernel reading b through the scan above: the same sums, and the record lowered to b's first
// NaN/Inf (one atomic per thread at most).
__global__ void add_scan_kernel(float* acc, const float* b, int64_t n, bool rb, uint64_t site,
                                uint64_t* record) {
  bool seen = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float bv = b[i];
    const uint32_t bits = __float_as_uint(bv);
    if (!seen && (bits & 0x7F800000u) == 0x7F800000u) {
      seen = true;
      const uint64_t cls = (bits & 0x007FFFFFu) ? 0 : (bits >> 31) ? 2 : 1;
      atomicMin(reinterpret_cast<unsigned long long*>(record),
                static_cast<unsigned long long>(finite_key(site, uint64_t(i), cls)));
    }
    const float s = __fadd_rn(acc[i], bv);
    acc[i] = rb ? ::strata::round_bf16(s) : s;
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

Status add_inplace_scan(float* acc, const float* b, int64_t n, bool round_bf16, uint32_t site,
                        uint64_t* record, void* stream) {
  if (n < 0 || n >= (int64_t(1) << kFiniteIndexBits) || site >= (1u << 20))
    return detail::invalid("add_inplace_scan: n or site out of range");
  if (n == 0) return {};
  add_scan_kernel<<<grid_of(n), 256, 0, detail::as_stream(stream)>>>(acc, b, n, round_bf16, site,
                                                                     record);
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

Status finite_scan(const float* x, int64_t n, uint32_t site, uint64_t* record, void* stream) {
  if (n < 0 || n >= (int64_t(1) << kFiniteIndexBits) || site >= (1u << 20))
    return detail::invalid("finite_scan: n or site out of range");
  if (n == 0) return {};
  finite_scan_kernel<<<grid_of(n), 256, 0, detail::as_stream(stream)>>>(x, n, site, record);
  return detail::launch_status();
}

}  // namespace strata::kernels::ops
