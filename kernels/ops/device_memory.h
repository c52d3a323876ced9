// Owning device allocations for tests, benchmarks and start-up code, without CUDA types in the
// header: DeviceBuffer (cudaMalloc'd bytes, freed on destruction) with synchronous upload,
// download and fill. Failures throw strata::Error naming the operation and the CUDA error — these
// are used at start-up and in tests, never in the decode loop (STYLE.md §9).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::kernels {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return n_; }

  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;
  void fill(uint8_t byte);

  template <typename T>
  static DeviceBuffer from(const std::vector<T>& v) {
    DeviceBuffer b(v.size() * sizeof(T) + (v.empty() ? 1 : 0));
    if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
    return b;
  }
  template <typename T>
  std::vector<T> to_vector(size_t count) const {
    std::vector<T> v(count);
    if (count) download(v.data(), count * sizeof(T));
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Fills n bytes with pseudo-random values in [lo, hi] (a hash of seed and position) on the GPU —
// synthetic weights for benchmarks (MXFP4 codes: 0..255; E8M0 scales: a narrow band).
void fill_random_bytes(void* p, size_t n, uint64_t seed, uint8_t lo = 0, uint8_t hi = 255);

// cudaDeviceSynchronize; throws strata::Error naming `what` if it (or an earlier async launch)
// failed.
void device_sync(const char* what);

}  // namespace strata::kernels
