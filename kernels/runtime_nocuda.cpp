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
}  // namespace strata::kernels
#endif
