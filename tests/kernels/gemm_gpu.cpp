// Op-check of the cuBLASLt bf16 GEMM wrapper (kernels/gemm/gemm.h) against the fp32 oracle's
// linear (cpu/ref/ops.h, bf16 weight view) at K3 trunk shapes and odd small shapes.
// Tolerance: relative L2 error. fp32 output: both sides accumulate exact bf16 products in fp32,
// in different orders (tensor-core adders vs the oracle's blocked sum): ≈ 2^-24·√K relative,
// bounded here by 2^-24·√K·8. bf16 output: one RNE rounding (≤ 2^-9 relative per element), so a
// relative L2 ≤ 2^-8.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "cpu/ref/ops.h"
#include "gpu_test.h"
#include "kernels/gemm/gemm.h"
#include "kernels/ops/device_memory.h"
#include "kernels/runtime.h"
#include "storage/bf16.h"

namespace {

namespace ref = strata::cpu::ref;
namespace gemm = strata::kernels::gemm;
using strata::kernels::DeviceBuffer;

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float scale) {
  std::vector<uint16_t> v(n);
  uint64_t s = seed;
  for (auto& b : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float u = float(int32_t(s >> 32)) * (1.0f / 2147483648.0f);  // [-1, 1)
    b = strata::f32_to_bf16(u * scale);
  }
  return v;
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("gemm gpu: cuBLASLt bf16 linear matches the oracle at trunk shapes", "[gpu]") {
  strata::test::skip_without_gpu();
  struct S {
    const char* what;
    int64_t T, N, K;
  };
  const S shapes[] = {{"KDA q_proj", 3, 12288, 7168},
                      {"KDA f_b_proj", 4, 12288, 128},
                      {"MLA kv_a_proj_with_mqa", 2, 576, 7168},
                      {"MLA q_b_proj", 5, 18432, 1536},
                      {"router gate", 3, 896, 7168},
                      {"latent down", 64, 3584, 7168},
                      {"dense layer-0 down", 2, 7168, 33792},
                      {"lm_head", 1, 163840, 7168},
                      {"odd small", 5, 40, 24},
                      {"odd small 2", 1, 8, 8}};
  gemm::Gemm g;
  for (const S& s : shapes) {
    INFO(s.what << " T=" << s.T << " N=" << s.N << " K=" << s.K);
    auto x = random_bf16(size_t(s.T * s.K), uint64_t(s.N + s.K), 1.0f);
    auto W = random_bf16(size_t(s.N * s.K), uint64_t(s.N * 3 + 1), 1.0f / std::sqrt(float(s.K)));
    std::vector<float> xf(x.size());
    for (size_t i = 0; i < x.size(); i++) xf[i] = strata::bf16_to_f32(x[i]);
    std::vector<float> want(size_t(s.T * s.N));
    ref::linear(xf.data(), ref::WeightView::bf16(W.data(), s.N, s.K), want.data(), s.T);

    DeviceBuffer dx = DeviceBuffer::from(x), dW = DeviceBuffer::from(W), dy(want.size() * 4),
                 dyb(want.size() * 2);
    REQUIRE(g.linear(dx.as<uint16_t>(), dW.as<uint16_t>(), dy.get(), gemm::OutType::f32, s.T, s.N,
                     s.K, nullptr)
                .ok());
    REQUIRE(g.linear(dx.as<uint16_t>(), dW.as<uint16_t>(), dyb.get(), gemm::OutType::bf16, s.T, s.N,
                     s.K, nullptr)
                .ok());
    const double tol = std::ldexp(1.0, -24) * std::sqrt(double(s.K)) * 8;
    CHECK(rel_l2(dy.to_vector<float>(want.size()), want) <= tol);
    auto yb = dyb.to_vector<uint16_t>(want.size());
    std::vector<float> ybf(yb.size());
    for (size_t i = 0; i < yb.size(); i++) ybf[i] = strata::bf16_to_f32(yb[i]);
    CHECK(rel_l2(ybf, want) <= std::ldexp(1.0, -8));
  }
  const size_t planned = g.plans();
  CHECK(planned == 2 * (sizeof shapes / sizeof shapes[0]));
  // A repeated shape reuses its plan.
  {
    auto x = random_bf16(3 * 128, 1, 1.0f), W = random_bf16(12288 * 128, 2, 0.1f);
    DeviceBuffer dx = DeviceBuffer::from(x), dW = DeviceBuffer::from(W), dy(4 * 12288 * 4);
    REQUIRE(g.linear(dx.as<uint16_t>(), dW.as<uint16_t>(), dy.get(), gemm::OutType::f32, 3, 12288,
                     128, nullptr)
                .ok());
    CHECK(g.plans() == planned + 1);
    REQUIRE(g.linear(dx.as<uint16_t>(), dW.as<uint16_t>(), dy.get(), gemm::OutType::f32, 3, 12288,
                     128, nullptr)
                .ok());
    CHECK(g.plans() == planned + 1);
  }
  CHECK_FALSE(g.linear(nullptr, nullptr, nullptr, gemm::OutType::f32, 1, 0, 8, nullptr).ok());
}
