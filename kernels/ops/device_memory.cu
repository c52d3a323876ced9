// DeviceBuffer and device_sync (see kernels/ops/device_memory.h).
#include <cuda_runtime.h>

#include <string>

#include "kernels/ops/device_memory.h"
#include "storage/error.h"

namespace strata::kernels {
namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("CUDA: ") + what + " failed: " + cudaGetErrorString(e));
}
__global__ void fill_random_kernel(uint8_t* p, size_t n, uint64_t seed, uint32_t lo,
                                   uint32_t span) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + i * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = uint8_t(lo + uint32_t(z % span));
  }
}

}  // namespace

void fill_random_bytes(void* p, size_t n, uint64_t seed, uint8_t lo, uint8_t hi) {
  if (n == 0) return;
  if (hi < lo) throw Error("fill_random_bytes: hi < lo");
  fill_random_kernel<<<4096, 256>>>(static_cast<uint8_t*>(p), n, seed, lo, uint32_t(hi - lo) + 1);
  check(cudaGetLastError(), "fill_random_bytes launch");
}

DeviceBuffer::DeviceBuffer(size_t bytes) : n_(bytes) {
  if (bytes) check(cudaMalloc(&p_, bytes), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFree(p_);
    p_ = o.p_, n_ = o.n_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > n_) throw Error("DeviceBuffer::upload: range past the allocation");
  check(cudaMemcpy(static_cast<char*>(p_) + offset, src, bytes, cudaMemcpyHostToDevice),
        "upload (cudaMemcpy H2D)");
}

void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  if (offset + bytes > n_) throw Error("DeviceBuffer::download: range past the allocation");
  check(cudaMemcpy(dst, static_cast<const char*>(p_) + offset, bytes, cudaMemcpyDeviceToHost),
        "download (cudaMemcpy D2H)");
}

void DeviceBuffer::fill(uint8_t byte) {
  if (n_) check(cudaMemset(p_, byte, n_), "cudaMemset");
}

void device_sync(const char* what) {
  check(cudaDeviceSynchronize(), what);
}

}  // namespace strata::kernels
