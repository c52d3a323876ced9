// Deterministic test data shared by the tests: Gaussian vectors (std::mt19937, for the CPU
// reference tests) and a splitmix64 generator (for the GPU op-checks), plus bf16 packing.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "storage/bf16.h"

namespace strata::test {

inline std::vector<float> randn(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = strata::f32_to_bf16(v[i]);
  return o;
}

// Largest |a[i] - b[i]|. A NaN on either side (or inf - inf) returns NaN, which fails every
// `<= bound` check; vectors of different lengths give +inf.
inline float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}
inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<float>::infinity();
  return max_abs_diff(a.data(), b.data(), a.size());
}

// splitmix64: cheap, seedable, identical on every platform.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }
  float normal() {  // Box-Muller
    float u = std::max(uniform(), 1e-7f), v = uniform();
    return std::sqrt(-2.0f * std::log(u)) * std::cos(6.2831853f * v);
  }
  std::vector<float> normals(size_t n, float scale = 1.0f, bool bf16 = false) {
    std::vector<float> v(n);
    for (float& x : v) x = bf16 ? strata::round_bf16(normal() * scale) : normal() * scale;
    return v;
  }
};

}  // namespace strata::test
