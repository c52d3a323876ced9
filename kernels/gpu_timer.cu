// CUDA-event timing (see gpu_timer.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/gpu_timer.h"

namespace strata::kernels {

GpuTimes gpu_time(const std::function<void()>& fn, void* stream, int repeats, int warmup) {
  GpuTimes r;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (int i = 0; i < warmup; i++) fn();
  std::vector<cudaEvent_t> ev(2 * repeats);
  for (auto& e : ev) cudaEventCreate(&e);
  for (int i = 0; i < repeats; i++) {
    cudaEventRecord(ev[2 * i], s);
    fn();
    cudaEventRecord(ev[2 * i + 1], s);
  }
  cudaError_t err = cudaEventSynchronize(ev.back());
  if (err == cudaSuccess) err = cudaGetLastError();
  std::vector<double> t(repeats);
  for (int i = 0; i < repeats; i++) {
    float ms = 0;
    cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]);
    t[i] = ms * 1e-3;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  r.code = int(err);
  if (repeats == 0) return r;
  std::sort(t.begin(), t.end());
  r.repeats = repeats;
  r.min_s = t.front();
  r.max_s = t.back();
  r.median_s = repeats % 2 ? t[repeats / 2] : 0.5 * (t[repeats / 2 - 1] + t[repeats / 2]);
  return r;
}

}  // namespace strata::kernels
