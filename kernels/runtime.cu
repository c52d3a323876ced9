// CUDA runtime queries (see runtime.h).
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/runtime.h"

namespace strata::kernels {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string cuda_device_description(int i) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, i) != cudaSuccess) return "unknown CUDA device";
  char buf[400];  // the name field alone is 256 bytes
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor,
                p.multiProcessorCount, p.totalGlobalMem / 1073741824.0);
  return buf;
}

bool cuda_device_properties(int i, DeviceProperties* out) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  out->name = p.name;
  out->major = p.major;
  out->minor = p.minor;
  out->memory_bytes = uint64_t(p.totalGlobalMem);
  out->sms = p.multiProcessorCount;
  return true;
}

bool host_register(void* p, size_t bytes, std::string* why) {
  cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
  if (e == cudaSuccess) return true;
  cudaGetLastError();  // not sticky: clear it so later launches do not report it
  if (why) *why = cudaGetErrorString(e);
  return false;
}

void host_unregister(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

}  // namespace strata::kernels
