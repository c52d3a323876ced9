// Fallback for builds without CUDA (-DSTRATA_CUDA=OFF): no devices.
#ifndef STRATA_HAVE_CUDA
#include "kernels/runtime.h"
namespace strata::kernels {
int cuda_device_count() {
  return 0;
}
std::string cuda_device_description(int) {
  return "no CUDA in this build";
}
bool cuda_device_properties(int, DeviceProperties*) {
  return false;
}
bool host_register(void*, size_t, std::string* why) {
  if (why) *why = "no CUDA in this build";
  return false;
}
void host_unregister(void*) {}
namespace rt {
namespace {
Status none() {
  return {-1, "no CUDA in this build"};
}
}  // namespace
Status set_device(int) {
  return none();
}
Status mem_info(size_t*, size_t*) {
  return none();
}
void* stream_create() {
  return nullptr;
}
void stream_destroy(void*) {}
Status stream_sync(void*) {
  return none();
}
void* event_create() {
  return nullptr;
}
void* timing_event_create() {
  return nullptr;
}
double event_elapsed_ms(void*, void*) {
  return -1;
}
void event_destroy(void*) {}
Status event_record(void*, void*) {
  return none();
}
Status stream_wait(void*, void*) {
  return none();
}
Status event_sync(void*) {
  return none();
}
Status event_query(void*, bool* done) {
  *done = false;
  return none();
}
Status copy_async(void*, const void*, size_t, void*) {
  return none();
}
Status copy(void*, const void*, size_t) {
  return none();
}
void* device_alloc(size_t, std::string* why) {
  if (why) *why = "no CUDA in this build";
  return nullptr;
}
void device_free(void*) {}
void* pinned_alloc(size_t, std::string* why) {
  if (why) *why = "no CUDA in this build";
  return nullptr;
}
void pinned_free(void*) {}
Status begin_capture(void*) {
  return none();
}
Status end_capture(void*, void** exec) {
  *exec = nullptr;
  return none();
}
Status graph_launch(void*, void*) {
  return none();
}
void graph_destroy(void*) {}
void profiler_start() {}
void profiler_stop() {}
uint64_t device_allocations() {
  return 0;
}
uint64_t pinned_allocations() {
  return 0;
}
Status allow_dynamic_smem(const void*, int) {
  return none();
}
}  // namespace rt
}  // namespace strata::kernels
#endif
