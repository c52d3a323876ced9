// Every ISA path of the layer-level CPU expert kernels (cpu/expert_kernels.h) against the scalar
// contract mode (cpu/expert_contract.h), bit for bit: K3's expert shape, odd shapes, many tokens
// per expert, scale codes over the whole E8M0 range and activation blocks over many binades,
// poisoned tokens. An ISA this CPU lacks is reported as "not supported" (a WARN), never a pass.
#include <catch2/catch.hpp>

#include <tbb/task_arena.h>

#include <bit>
#include <cstring>
#include <limits>
#include <random>

#include "cpu/expert_contract.h"
#include "cpu/expert_kernels.h"
#include "cpu/expert_kernels_impl.h"
#include "expert_test_util.h"
#include "storage/error.h"

using strata::GluParams;
using strata::cpu::ExpertIsa;
using strata::cpu::ExpertTask;
namespace c = strata::contract;

namespace {

const ExpertIsa kIsas[] = {ExpertIsa::scalar, ExpertIsa::avx2, ExpertIsa::avx512, ExpertIsa::amx};

struct Layer {
  std::vector<strata::test::RandomExpert> experts;
  std::vector<std::vector<int>> rows;  // token rows per expert
  std::vector<float> x;                // [T, H]
  int T = 0, H = 0, I = 0;
};

Layer make_layer(int H, int I, int T, const std::vector<std::vector<int>>& rows, bool wide,
                 uint32_t seed) {
  Layer L;
  L.H = H;
  L.I = I;
  L.T = T;
  L.rows = rows;
  for (size_t e = 0; e < rows.size(); ++e)
    L.experts.push_back(wide ? strata::test::random_expert(H, I, seed + uint32_t(e), 0, 254)
                             : strata::test::random_expert(H, I, seed + uint32_t(e)));
  L.x = strata::test::random_activations(T, H, seed * 7 + 1, wide);
  return L;
}

// Runs the layer with `isa` and compares every output bit with expert_ffn_contract.
void check_layer(const Layer& L, const GluParams& glu, ExpertIsa isa) {
  std::vector<std::vector<float>> y(L.experts.size());
  std::vector<ExpertTask> tasks;
  for (size_t e = 0; e < L.experts.size(); ++e) {
    y[e].assign(L.rows[e].size() * size_t(L.H), -1.0f);
    tasks.push_back({L.experts[e].view(), L.rows[e].data(), int(L.rows[e].size()), y[e].data()});
  }
  strata::cpu::CpuExpertOptions opt;
  opt.isa = isa;
  strata::cpu::run_experts_cpu(tasks, L.x.data(), L.T, glu, opt);
  std::vector<float> want(size_t(L.H));
  size_t mismatches = 0, nan_rows = 0;
  for (size_t e = 0; e < L.experts.size(); ++e)
    for (size_t i = 0; i < L.rows[e].size(); ++i) {
      strata::cpu::expert_ffn_contract(
          L.experts[e].view(), L.x.data() + size_t(L.rows[e][i]) * size_t(L.H), want.data(), glu);
      nan_rows += std::isnan(want[0]) ? 1 : 0;
      for (int o = 0; o < L.H; ++o)
        if (std::bit_cast<uint32_t>(want[size_t(o)]) !=
            std::bit_cast<uint32_t>(y[e][i * size_t(L.H) + size_t(o)])) {
          if (mismatches < 5)
            UNSCOPED_INFO("expert " << e << " token " << L.rows[e][i] << " row " << o << ": want "
                                    << want[size_t(o)] << " got "
                                    << y[e][i * size_t(L.H) + size_t(o)]);
          ++mismatches;
        }
    }
  INFO("isa " << strata::cpu::isa_name(isa) << ", shape " << L.H << "->" << L.I << "->" << L.H
              << ", NaN rows " << nan_rows);
  CHECK(mismatches == 0);
}

bool supported_or_warn(ExpertIsa isa) {
  if (strata::cpu::isa_supported(isa)) return true;
  WARN("expert kernels: ISA " << strata::cpu::isa_name(isa) << " not supported on this CPU");
  return false;
}

}  // namespace

TEST_CASE("expert kernels: K3 expert shape, every ISA, bit-identical to the contract", "[expert]") {
  // 3584 → 3072 → 3584; expert 0 gets one token (decode), expert 1 three (one repeated).
  const Layer L = make_layer(3584, 3072, 3, {{1}, {0, 2, 0}}, false, 21);
  for (ExpertIsa isa : kIsas)
    if (supported_or_warn(isa)) check_layer(L, GluParams{true, 4.0, 25.0}, isa);
}

TEST_CASE("expert kernels: odd shapes and token counts, every ISA", "[expert]") {
  struct Shape {
    int H, I;
  };
  const GluParams situ{true, 4.0, 25.0}, silu{false, 0, 0};
  for (Shape s : {Shape{32, 32}, Shape{160, 96}, Shape{1184, 608}, Shape{544, 1056}}) {
    std::vector<std::vector<int>> rows = {{0}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {}, {9, 3, 3, 0, 7}};
    const Layer L = make_layer(s.H, s.I, 10, rows, false, uint32_t(s.H + s.I));
    for (ExpertIsa isa : kIsas)
      if (supported_or_warn(isa)) {
        check_layer(L, situ, isa);
        check_layer(L, silu, isa);
      }
  }
}

TEST_CASE("expert kernels: scales over the whole E8M0 range, blocks over many binades",
          "[expert]") {
  // Scale codes 0..254 and activation blocks scaled by 2^−60 … 2^60 (plus zero and subnormal
  // blocks): block terms span ≈ 2^−280 … 2^240, some projections overflow fp32 (SiLU then
  // gives canonical NaN rows, which must match too).
  const GluParams situ{true, 4.0, 25.0}, silu{false, 0, 0};
  const Layer L = make_layer(1024, 512, 6, {{0, 1, 2}, {3, 4, 5, 0}}, true, 77);
  for (ExpertIsa isa : kIsas)
    if (supported_or_warn(isa)) {
      check_layer(L, situ, isa);
      check_layer(L, silu, isa);
    }
}

TEST_CASE("expert kernels: poisoned tokens give canonical NaN rows and spare the others",
          "[expert]") {
  Layer L = make_layer(256, 128, 4, {{0, 1, 2, 3}, {2}}, false, 5);
  L.x[size_t(2) * 256 + 77] = std::numeric_limits<float>::quiet_NaN();
  for (ExpertIsa isa : kIsas)
    if (supported_or_warn(isa)) check_layer(L, GluParams{true, 4.0, 25.0}, isa);
}

TEST_CASE("expert kernels: results do not depend on the thread count", "[expert]") {
  const Layer L = make_layer(512, 256, 8, {{0, 1, 2, 3, 4, 5, 6, 7}, {1}, {2, 5}}, false, 9);
  auto run = [&](int threads) {
    std::vector<float> y(size_t(11) * 512);
    std::vector<ExpertTask> tasks;
    size_t off = 0;
    for (size_t e = 0; e < L.experts.size(); ++e) {
      tasks.push_back(
          {L.experts[e].view(), L.rows[e].data(), int(L.rows[e].size()), y.data() + off});
      off += L.rows[e].size() * 512;
    }
    tbb::task_arena arena(threads);
    strata::cpu::CpuExpertOptions opt;
    opt.arena = &arena;
    strata::cpu::run_experts_cpu(tasks, L.x.data(), L.T, GluParams{}, opt);
    return y;
  };
  const auto y1 = run(1), y2 = run(2);
  CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0);
}

TEST_CASE("expert kernels: quantized activation layout matches the contract quantization",
          "[expert]") {
  const int T = 3, K = 608;  // 19 blocks: padded to 32
  const auto x = strata::test::random_activations(T, K, 3, true);
  strata::cpu::QuantizedActivations xq;
  xq.quantize(x.data(), T, K);
  CHECK(xq.padded_blocks() == 32);
  for (int t = 0; t < T; ++t) {
    const auto ref = strata::cpu::quantize_activation(x.data() + size_t(t) * K, K);
    CHECK(xq.poisoned(t) == ref.poisoned);
    for (int b = 0; b < xq.padded_blocks(); ++b) {
      int32_t sum = 0;
      for (int i = 0; i < 32; ++i) {
        const int8_t got = xq.q(t)[(b / 4) * 128 + (i % 2) * 64 + (b % 4) * 16 + i / 2];
        const int8_t want = b < K / 32 ? ref.q[size_t(b) * 32 + size_t(i)] : 0;
        REQUIRE(got == want);
        sum += want;
      }
      REQUIRE(xq.exponents(t)[b] == (b < K / 32 ? ref.e[size_t(b)] : 0));
      REQUIRE(xq.block_bias(t)[b] == 12 * sum);
    }
  }
}

TEST_CASE("expert kernels: ISA names and unsupported choices", "[expert]") {
  CHECK(strata::cpu::parse_isa("avx2") == ExpertIsa::avx2);
  CHECK(strata::cpu::parse_isa("auto") == ExpertIsa::automatic);
  CHECK_THROWS_AS(strata::cpu::parse_isa("sse9", "--isa"), strata::Error);
  CHECK(strata::cpu::isa_supported(strata::cpu::best_isa()));
  for (ExpertIsa isa : kIsas)
    if (!strata::cpu::isa_supported(isa))
      CHECK_THROWS_AS(strata::cpu::resolve_isa(isa), strata::Error);
}

TEST_CASE("expert kernels: vectorised GLU has the contract GLU's bits", "[expert]") {
  if (!supported_or_warn(ExpertIsa::avx512)) return;
  // Random values over many binades plus the branch points of det_exp / det_expm1 / det_tanh and
  // the special values.
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> ex(-30, 12);
  std::normal_distribution<float> nd;
  std::vector<float> g, u;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const float special[] = {0.0f,    -0.0f,   inf,     -inf,    nan,     0.35f * 4, -0.35f * 4,
                           0.175f,  -0.175f, 80.0f,   -80.0f,  40.0f,   -40.0f,    709.7f,
                           -709.7f, 745.0f,  -745.0f, 1e-30f,  -1e-30f, 3e38f,     -3e38f,
                           250.0f,  -250.0f, 500.0f,  -500.0f, 87.5f,   -1490.0f,  1490.0f};
  for (float a : special)
    for (float b : special) g.push_back(a), u.push_back(b);
  for (int i = 0; i < 200000; ++i) {
    g.push_back(std::ldexp(nd(rng), ex(rng)));
    u.push_back(std::ldexp(nd(rng), ex(rng)));
  }
  std::vector<float> h(g.size());
  for (const GluParams& p :
       {GluParams{true, 4.0, 25.0}, GluParams{true, 4.0, 0.0}, GluParams{false, 0, 0}}) {
    strata::cpu::detail::glu_avx512(g.data(), u.data(), h.data(), int(g.size()), p);
    size_t bad = 0;
    for (size_t i = 0; i < g.size(); ++i)
      if (std::bit_cast<uint32_t>(h[i]) != std::bit_cast<uint32_t>(c::glu(g[i], u[i], p))) {
        if (bad++ < 5)
          UNSCOPED_INFO("g " << g[i] << " u " << u[i] << ": got " << h[i] << " want "
                             << c::glu(g[i], u[i], p));
      }
    CHECK(bad == 0);
  }
}
