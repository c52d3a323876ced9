// Helpers for the KDA / MLA op-check tests on the GPU: device buffers, seeded bf16 data and the
// comparison metrics of STYLE.md §2 for attention-like ops (relative L2, cosine, max abs, NaN/Inf
// positions matched exactly).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "storage/bf16.h"

namespace strata::test {

#define CUDA_REQUIRE(x)                                                \
  do {                                                                 \
    cudaError_t e_ = (x);                                              \
    if (e_ != cudaSuccess) FAIL(#x << ": " << cudaGetErrorString(e_)); \
  } while (0)

// A device allocation freed on scope exit.
template <class T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  DevBuf(const std::vector<T>& host) : DevBuf(host.size()) { upload(host); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<T>& h) {
    if (p) cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    if (p) cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  void fill_bytes(int v) {
    if (p) cudaMemset(p, v, n * sizeof(T));
  }
};

// bf16 data: the bits for the device and the same values widened for the reference.
struct Bf16Data {
  std::vector<uint16_t> bits;
  std::vector<float> f32;
};

inline Bf16Data random_bf16(size_t n, std::mt19937& rng, float stddev, float mean = 0.f) {
  std::normal_distribution<float> nd(mean, stddev);
  Bf16Data d;
  d.bits.resize(n);
  d.f32.resize(n);
  for (size_t i = 0; i < n; i++) {
    d.bits[i] = f32_to_bf16(nd(rng));
    d.f32[i] = bf16_to_f32(d.bits[i]);
  }
  return d;
}

inline std::vector<float> random_uniform(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> ud(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = ud(rng);
  return v;
}

inline std::vector<float> widen(const std::vector<uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); i++) v[i] = bf16_to_f32(bits[i]);
  return v;
}

struct Diff {
  double rel_l2 = 0, cosine = 1, max_abs = 0, ref_max_abs = 0;
  size_t nonfinite_mismatch = 0, n = 0;
  std::string str() const {
    char b[200];
    std::snprintf(b, sizeof b,
                  "n=%zu rel_l2=%.3e cosine=%.8f max_abs=%.3e (ref max %.3e) nonfinite "
                  "mismatches=%zu",
                  n, rel_l2, cosine, max_abs, ref_max_abs, nonfinite_mismatch);
    return b;
  }
};

// got vs ref: NaN/Inf positions must match; the metrics cover the finite pairs.
inline Diff compare(const float* got, const float* ref, size_t n) {
  Diff d;
  d.n = n;
  double num = 0, den = 0, dot = 0, gg = 0;
  for (size_t i = 0; i < n; i++) {
    const bool fg = std::isfinite(got[i]), fr = std::isfinite(ref[i]);
    if (fg != fr) {
      d.nonfinite_mismatch++;
      continue;
    }
    if (!fg) continue;
    const double e = double(got[i]) - double(ref[i]);
    num += e * e;
    den += double(ref[i]) * ref[i];
    gg += double(got[i]) * got[i];
    dot += double(got[i]) * ref[i];
    d.max_abs = std::max(d.max_abs, std::fabs(e));
    d.ref_max_abs = std::max(d.ref_max_abs, std::fabs(double(ref[i])));
  }
  d.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  d.cosine = (gg > 0 && den > 0) ? dot / std::sqrt(gg * den) : (gg == den ? 1.0 : 0.0);
  return d;
}

inline Diff compare(const std::vector<float>& got, const std::vector<float>& ref) {
  return compare(got.data(), ref.data(), std::min(got.size(), ref.size()));
}

}  // namespace strata::test
