// GPU timing with CUDA events (STYLE.md §15): warm-up runs, then `repeats` timed runs of a
// function that enqueues work on one stream; median, min and max of the per-run device times.
// Shared by the kernel benchmarks (`strata bench kernels`) and the peak measurements.
// Not a profiler: it times whole enqueued sequences, launch gaps included.
#pragma once
#include <functional>

namespace strata::kernels {

struct GpuTimes {
  double median_s = 0, min_s = 0, max_s = 0;
  int repeats = 0;
  int code = 0;  // cudaError_t of the first failing CUDA call; 0 = ok
};

// fn() enqueues the work on `stream` (a cudaStream_t; nullptr = legacy default stream).
GpuTimes gpu_time(const std::function<void()>& fn, void* stream, int repeats = 10, int warmup = 2);

}  // namespace strata::kernels
