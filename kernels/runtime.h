// CUDA runtime queries the rest of strata needs without including CUDA headers: whether a usable
// GPU is present (GPU tests skip cleanly when not), and a status type every launcher returns.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::kernels {

// Number of usable CUDA devices; 0 when there is no driver, no device, or no CUDA build.
int cuda_device_count();

// Name and memory of device `i` ("NVIDIA H200, 139.8 GiB"), for logs.
std::string cuda_device_description(int i);

// Properties of device `i` the planner and hardware profile need. False when it cannot be queried
// (no device, no CUDA build).
struct DeviceProperties {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  uint64_t memory_bytes = 0;
  int sms = 0;
};
bool cuda_device_properties(int i, DeviceProperties* out);

// Page-locks an existing host allocation for DMA (cudaHostRegister, portable). Returns false and
// sets *why when it fails or when this build has no CUDA; the memory stays usable either way.
bool host_register(void* p, size_t bytes, std::string* why);
void host_unregister(void* p);

// What every kernel launcher returns: ok, or the CUDA error string of the failed launch.
struct Status {
  int code = 0;  // cudaError_t value; 0 = success
  const char* message = "ok";
  bool ok() const { return code == 0; }
};

}  // namespace strata::kernels

// Streams, events, copies, pinned and device memory, CUDA graphs — the runtime the engine's CUDA
// backend needs, without CUDA types (cudaStream_t, cudaEvent_t, cudaGraphExec_t travel as void*).
// Builds without CUDA return a Status with code -1 ("no CUDA in this build") / nullptr.
namespace strata::kernels::rt {

// Device `i` current for this thread.
Status set_device(int i);
// Free and total device memory of the current device.
Status mem_info(size_t* free_bytes, size_t* total_bytes);

void* stream_create();  // non-blocking stream; nullptr on failure
void stream_destroy(void* s);
Status stream_sync(void* s);

void* event_create();  // timing-disabled event; nullptr on failure
void event_destroy(void* e);
Status event_record(void* e, void* stream);
Status stream_wait(void* stream, void* e);
Status event_sync(void* e);  // host waits until the event's work is done
// Non-blocking: *done = true when the event's recorded work has completed (cudaEventQuery), false
// while it is still pending; never waits (the engine polls copy-stream work with it).
Status event_query(void* e, bool* done);
// Timing events (profiling only): a timing-enabled event, and the GPU time between two recorded,
// completed events in ms (−1 on error).
void* timing_event_create();
double event_elapsed_ms(void* start, void* end);

// cudaMemcpyAsync with cudaMemcpyDefault (unified addressing decides the direction).
Status copy_async(void* dst, const void* src, size_t bytes, void* stream);
// Synchronous copy (start-up uploads).
Status copy(void* dst, const void* src, size_t bytes);

void* device_alloc(size_t bytes, std::string* why);  // cudaMalloc; nullptr + why on failure
void device_free(void* p);
void* pinned_alloc(size_t bytes, std::string* why);  // cudaMallocHost
void pinned_free(void* p);

// Graph capture of the work a stream receives between begin and end (relaxed capture mode), and
// replay. end_capture returns an executable graph (nullptr on failure, status says why).
Status begin_capture(void* stream);
Status end_capture(void* stream, void** graph_exec);
Status graph_launch(void* graph_exec, void* stream);
void graph_destroy(void* graph_exec);

// cudaProfilerStart/Stop: marks the range an external profiler (ncu --profile-from-start off)
// collects; no effect without one.
void profiler_start();
void profiler_stop();

// Device allocations made through device_alloc / pinned_alloc so far (counted, for the test that
// nothing is allocated in the decode loop).
uint64_t device_allocations();
uint64_t pinned_allocations();

// Lets `kernel` (a __global__ function's address) launch with up to `bytes` of dynamic shared
// memory on the current device. The attribute belongs to a device: it is raised per kernel and
// device when a launch needs more than before (a process-wide `static` would set it only on the
// first caller's GPU; a call per launch costs a driver call each time).
// Thread-safe; for the launchers in kernels/.
Status allow_dynamic_smem(const void* kernel, int bytes);
template <class... Params>
Status allow_dynamic_smem(void (*kernel)(Params...), int bytes) {
  return allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace strata::kernels::rt
