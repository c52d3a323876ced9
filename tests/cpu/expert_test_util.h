// Test fixtures for the routed-expert tests: random MXFP4 experts in the released layout (with a
// chosen scale-code range, so blocks can span a wide exponent range), activations whose blocks
// span many binades (zero and subnormal blocks included), and the exact fp64 oracle of one expert
// (weights decoded exactly, no activation quantization, libm GLU).
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "storage/expert_contract.h"

namespace strata::test {

struct RandomExpert {
  std::vector<uint8_t> w1p, w1s, w3p, w3s, w2p, w2s;
  Mxfp4ExpertView view() const {
    return {w1p.data(), w1s.data(), w3p.data(), w3s.data(), w2p.data(), w2s.data(), H, I};
  }
  int H = 0, I = 0;
};

// Scale codes uniform in [s_lo, s_hi]; packed nibbles uniform. Expert `id` seeds the generator so
// each expert's weights are its own.
inline RandomExpert random_expert(int H, int I, uint32_t id, int s_lo = 118, int s_hi = 126) {
  RandomExpert e;
  e.H = H;
  e.I = I;
  std::mt19937 rng(1000 + id);
  std::uniform_int_distribution<int> byte(0, 255), sc(s_lo, s_hi);
  auto fill = [&](std::vector<uint8_t>& v, size_t n, bool scale) {
    v.resize(n);
    for (auto& b : v) b = uint8_t(scale ? sc(rng) : byte(rng));
  };
  fill(e.w1p, size_t(I) * H / 2, false);
  fill(e.w1s, size_t(I) * H / 32, true);
  fill(e.w3p, size_t(I) * H / 2, false);
  fill(e.w3s, size_t(I) * H / 32, true);
  fill(e.w2p, size_t(H) * I / 2, false);
  fill(e.w2s, size_t(H) * I / 32, true);
  return e;
}

// [T, K] activations; with `wide`, each 32-block is scaled by 2^k, k in [−60, 60], and some
// blocks are zero or subnormal.
inline std::vector<float> random_activations(int T, int K, uint32_t seed, bool wide) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> ex(-60, 60), kind(0, 15);
  std::vector<float> x(size_t(T) * K);
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < K / 32; ++b) {
      const int k = kind(rng);
      const int scale = wide ? ex(rng) : 0;
      for (int i = 0; i < 32; ++i) {
        float v = nd(rng);
        if (wide && k == 0) v = 0.0f;
        if (wide && k == 1) v = float(std::ldexp(double(v), -140));  // subnormal block
        if (wide && k > 1) v = float(std::ldexp(double(v), scale));
        x[size_t(t) * K + size_t(b) * 32 + i] = v;
      }
    }
  return x;
}

inline double mxfp4_value(const uint8_t* packed, const uint8_t* scale, int K, int o, int col) {
  const int w2 = contract::weight_x2(packed + size_t(o) * (K / 2), col);
  return std::ldexp(double(w2), int(scale[size_t(o) * (K / 32) + col / 32]) - 128);
}

// The exact expert in fp64: y = W2 · glu(W1 x, W3 x) with exact weights, unquantized x and h.
inline std::vector<double> expert_exact(const RandomExpert& e, const float* x, const GluParams& p) {
  const int H = e.H, I = e.I;
  std::vector<double> h(static_cast<size_t>(I)), y(static_cast<size_t>(H));
  for (int o = 0; o < I; ++o) {
    double g = 0, u = 0;
    for (int k = 0; k < H; ++k) {
      g += mxfp4_value(e.w1p.data(), e.w1s.data(), H, o, k) * double(x[k]);
      u += mxfp4_value(e.w3p.data(), e.w3s.data(), H, o, k) * double(x[k]);
    }
    const double sg = 1.0 / (1.0 + std::exp(-g));
    if (p.situ) {
      const double b = p.beta2 > 0 ? p.beta2 * std::tanh(u / p.beta2) : u;
      h[size_t(o)] = p.beta1 * std::tanh(g / p.beta1) * sg * b;
    } else {
      h[size_t(o)] = g * sg * u;
    }
  }
  for (int o = 0; o < H; ++o) {
    double s = 0;
    for (int k = 0; k < I; ++k)
      s += mxfp4_value(e.w2p.data(), e.w2s.data(), I, o, k) * h[size_t(k)];
    y[size_t(o)] = s;
  }
  return y;
}

}  // namespace strata::test
