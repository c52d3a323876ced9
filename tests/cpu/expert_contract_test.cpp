// Tests of the scalar contract mode (cpu/expert_contract.h): its error against the exact fp64
// expert, poisoning, and its agreement with the contract primitives composed by hand.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>

#include "cpu/expert_contract.h"
#include "expert_test_util.h"

using strata::GluParams;
namespace c = strata::contract;

namespace {
double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}
}  // namespace

TEST_CASE("expert contract: projection error against the exact dot product", "[expert]") {
  // One projection quantizes x to 8 bits per 32-block: the per-element step is ≤ 2^−6 of the
  // block max, so for Gaussian blocks the relative L2 error of a long dot product is about
  // step/√12 / rms(x) ≈ 0.5 %; bound it at 1.5 %.
  const int K = 3584, rows = 256;
  auto e = strata::test::random_expert(K, rows, 1);
  auto x = strata::test::random_activations(1, K, 2, false);
  auto xq = strata::cpu::quantize_activation(x.data(), K);
  std::vector<float> out(rows);
  strata::cpu::project_contract(e.w1p.data(), e.w1s.data(), rows, K, xq, out.data());
  std::vector<double> exact(rows);
  for (int o = 0; o < rows; ++o)
    for (int k = 0; k < K; ++k)
      exact[size_t(o)] += strata::test::mxfp4_value(e.w1p.data(), e.w1s.data(), K, o, k) * x[k];
  const double err = rel_l2(out, exact);
  std::printf("contract projection K=%d: relative L2 error vs exact %.3e\n", K, err);
  CHECK(err < 0.015);
  CHECK(err > 0.0);  // activations are quantized: the contract is not the exact product
}

TEST_CASE("expert contract: whole expert against the exact fp64 expert", "[expert]") {
  // Two quantizations (x and h) and the GLU: bound the relative L2 error at 3 %.
  struct Case {
    int H, I;
    GluParams glu;
  };
  for (const Case& k :
       {Case{3584, 3072, GluParams{true, 4.0, 25.0}}, Case{160, 96, GluParams{false, 0, 0}},
        Case{64, 32, GluParams{true, 4.0, 0}}}) {
    auto e = strata::test::random_expert(k.H, k.I, 5);
    auto x = strata::test::random_activations(1, k.H, 6, false);
    std::vector<float> y(size_t(k.H));
    strata::cpu::expert_ffn_contract(e.view(), x.data(), y.data(), k.glu);
    auto exact = strata::test::expert_exact(e, x.data(), k.glu);
    const double err = rel_l2(y, exact);
    std::printf("contract expert %d->%d->%d (%s): relative L2 error vs exact %.3e\n", k.H, k.I, k.H,
                k.glu.situ ? "situ" : "silu", err);
    CHECK(err < 0.03);
  }
}

TEST_CASE("expert contract: composition of the primitives", "[expert]") {
  const int H = 96, I = 64;
  auto e = strata::test::random_expert(H, I, 8, 100, 150);
  auto x = strata::test::random_activations(1, H, 9, true);
  const GluParams glu{true, 4.0, 25.0};
  std::vector<float> y(H);
  strata::cpu::expert_ffn_contract(e.view(), x.data(), y.data(), glu);
  // Recompute with the primitives directly (quantize_block, weight_x2, reduce_row, glu).
  auto proj = [](const uint8_t* p, const uint8_t* s, int rows, int K, const float* in, float* out) {
    std::vector<int8_t> q(static_cast<size_t>(K));
    std::vector<int> ex(static_cast<size_t>(K / 32));
    for (int b = 0; b < K / 32; ++b) REQUIRE(c::quantize_block(in + 32 * b, &q[32 * b], &ex[b]));
    for (int o = 0; o < rows; ++o) {
      std::vector<int32_t> d(static_cast<size_t>(K / 32));
      for (int col = 0; col < K; ++col)
        d[size_t(col / 32)] += q[size_t(col)] * c::weight_x2(p + size_t(o) * (K / 2), col);
      out[o] = c::reduce_row(d.data(), ex.data(), s + size_t(o) * (K / 32), K / 32);
    }
  };
  std::vector<float> g(I), u(I), h(I), y2(H);
  proj(e.w1p.data(), e.w1s.data(), I, H, x.data(), g.data());
  proj(e.w3p.data(), e.w3s.data(), I, H, x.data(), u.data());
  for (int i = 0; i < I; ++i) h[i] = c::glu(g[i], u[i], glu);
  proj(e.w2p.data(), e.w2s.data(), H, I, h.data(), y2.data());
  for (int o = 0; o < H; ++o)
    REQUIRE(std::bit_cast<uint32_t>(y[o]) == std::bit_cast<uint32_t>(y2[o]));
}

TEST_CASE("expert contract: a poisoned activation block gives canonical NaN rows", "[expert]") {
  const int H = 64, I = 32;
  auto e = strata::test::random_expert(H, I, 3);
  auto x = strata::test::random_activations(1, H, 4, false);
  x[40] = std::numeric_limits<float>::infinity();
  std::vector<float> y(H);
  strata::cpu::expert_ffn_contract(e.view(), x.data(), y.data(), GluParams{});
  for (float v : y) CHECK(std::bit_cast<uint32_t>(v) == c::kNaNBits);
}
