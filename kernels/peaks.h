// The H200's measured ceilings, taken in the same run as the kernel benchmarks (STYLE.md §14):
// device-to-device copy bandwidth and the dense bf16 GEMM rate of cuBLASLt. Every kernel
// benchmark line states its percentage of one of these.
//
// Conventions: copy bandwidth counts the bytes read plus the bytes written (a copy of N bytes moves
// 2N), the convention under which an H200 reaches ≈ 4.3 TB/s. GEMM FLOPs = 2·M·N·K, bf16 inputs,
// fp32 accumulation, bf16 output.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/runtime.h"

namespace strata::kernels {

struct PeakMeasurement {
  double value = 0;     // GB/s for copy, TFLOP/s for GEMM
  double median_s = 0;  // median time of one operation
  std::string what;     // "cudaMemcpyAsync D2D 1.00 GiB" / "cuBLASLt bf16 8192x8192x8192"
  Status status;
};

// Median of `repeats` device-to-device copies of `bytes` (on device 0's current context).
PeakMeasurement measure_copy_bandwidth(int64_t bytes = int64_t(1) << 30, int repeats = 10);

// Median of `repeats` cuBLASLt bf16 GEMMs D[M,N] = A[M,K]·B[K,N] (fp32 accumulate, bf16 out).
PeakMeasurement measure_bf16_gemm(int64_t M = 8192, int64_t N = 8192, int64_t K = 8192,
                                  int repeats = 10);

// Median of `repeats` copies of `bytes` between pinned host memory (cudaMallocHost) and device 0,
// host → device when `to_device`, else device → host. GB/s counts the bytes copied once (the PCIe
// link carries them once).
PeakMeasurement measure_host_copy(bool to_device, int64_t bytes = int64_t(256) << 20,
                                  int repeats = 10);

}  // namespace strata::kernels
