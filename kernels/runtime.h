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
