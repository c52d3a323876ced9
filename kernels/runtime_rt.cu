// The engine-facing CUDA runtime wrappers of kernels/runtime.h (namespace rt).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/runtime.h"

namespace strata::kernels::rt {
namespace {
Status st(cudaError_t e) {
  if (e == cudaSuccess) return {};
  cudaGetLastError();
  return {static_cast<int>(e), cudaGetErrorString(e)};
}
cudaStream_t S(void* s) {
  return static_cast<cudaStream_t>(s);
}
std::atomic<uint64_t> g_device_allocs{0}, g_pinned_allocs{0};
}  // namespace

Status set_device(int i) {
  return st(cudaSetDevice(i));
}
Status mem_info(size_t* f, size_t* t) {
  return st(cudaMemGetInfo(f, t));
}

void* stream_create() {
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return s;
}
void stream_destroy(void* s) {
  if (s) cudaStreamDestroy(S(s));
}
Status stream_sync(void* s) {
  return st(cudaStreamSynchronize(S(s)));
}

void* event_create() {
  cudaEvent_t e = nullptr;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return e;
}
void* timing_event_create() {
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return e;
}
double event_elapsed_ms(void* a, void* b) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)) !=
      cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return ms;
}
void event_destroy(void* e) {
  if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}
Status event_record(void* e, void* s) {
  return st(cudaEventRecord(static_cast<cudaEvent_t>(e), S(s)));
}
Status event_sync(void* e) {
  return st(cudaEventSynchronize(static_cast<cudaEvent_t>(e)));
}
Status event_query(void* e, bool* done) {
  const cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e));
  *done = r == cudaSuccess;
  if (r == cudaErrorNotReady) return {};  // pending, not an error (nothing sticky is set)
  return st(r);
}
Status stream_wait(void* s, void* e) {
  return st(cudaStreamWaitEvent(S(s), static_cast<cudaEvent_t>(e), 0));
}

Status copy_async(void* dst, const void* src, size_t bytes, void* s) {
  if (bytes == 0) return {};
  return st(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(s)));
}
Status copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return {};
  return st(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void* device_alloc(size_t bytes, std::string* why) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = cudaGetErrorString(e);
    return nullptr;
  }
  ++g_device_allocs;
  return p;
}
void device_free(void* p) {
  if (p) cudaFree(p);
}
void* pinned_alloc(size_t bytes, std::string* why) {
  void* p = nullptr;
  cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = cudaGetErrorString(e);
    return nullptr;
  }
  ++g_pinned_allocs;
  return p;
}
void pinned_free(void* p) {
  if (p) cudaFreeHost(p);
}

Status begin_capture(void* s) {
  return st(cudaStreamBeginCapture(S(s), cudaStreamCaptureModeRelaxed));
}
Status end_capture(void* s, void** exec) {
  *exec = nullptr;
  cudaGraph_t g = nullptr;
  Status r = st(cudaStreamEndCapture(S(s), &g));
  if (!r.ok()) return r;
  cudaGraphExec_t x = nullptr;
  r = st(cudaGraphInstantiate(&x, g, 0));
  cudaGraphDestroy(g);
  if (r.ok()) *exec = x;
  return r;
}
Status graph_launch(void* exec, void* s) {
  return st(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), S(s)));
}
void graph_destroy(void* exec) {
  if (exec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
}

void profiler_start() {
  cudaProfilerStart();
}
void profiler_stop() {
  cudaProfilerStop();
}

uint64_t device_allocations() {
  return g_device_allocs.load();
}
uint64_t pinned_allocations() {
  return g_pinned_allocs.load();
}

Status allow_dynamic_smem(const void* kernel, int bytes) {
  int dev = 0;
  if (Status s = st(cudaGetDevice(&dev)); !s.ok()) return s;
  // The attribute is a maximum: raised when a launch needs more than the kernel's largest so far
  // on this device, never lowered (a kernel launched at several sizes — the grouped GEMM's tiles
  // at K = 3584 and 3072 — would otherwise fail at the larger after setting the smaller).
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> max_set;
  const std::lock_guard<std::mutex> lock(mu);
  int& have = max_set[{kernel, dev}];
  if (bytes <= have) return {};
  if (Status s =
          st(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      !s.ok())
    return s;
  have = bytes;
  return {};
}

}  // namespace strata::kernels::rt
