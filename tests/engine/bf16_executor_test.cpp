// The bf16 expert executor (ExpertNumerics::bf16, engine/bf16_executor.cpp) against the exact
// oracle at Kimi-Linear's routed-expert shape (2304 → 1024 → 2304, SiLU): bf16 weights, random
// bf16-valued inputs, tasks of 1, 3, 8 (the GEMV's largest) and 20 tokens (oneDNN), 4 experts.
//
// Tolerance: the bf16 executor rounds at the exact executor's bf16 points and sums in other
// orders, so its distance from the exact executor in bf16 must not exceed the bf16 model's own
// noise: the distance of the exact executor in fp32 from it in bf16 (the yardstick of
// tests/engine/cpu_fast_backend_test.cpp). A wrong row, a missing GLU or a swapped matrix lands
// orders of magnitude above it. Thread count: the kernels split output rows over threads and never
// a sum, so one thread and all threads give the same bits.
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/expert_executor.h"
#include "storage/bf16.h"
#include "storage/error.h"
#include "test_util.h"

using namespace strata;
using namespace strata::engine;
using strata::test::rel_l2;

namespace {

constexpr int64_t kH = 2304, kI = 1024;

struct Fixture {
  std::vector<std::vector<uint16_t>> w;  // per expert: w1, w3, w2 back to back
  MoeWeights moe;
  ModelConfig config;
  ExpertLayer layer;
  std::vector<ExpertTask> tasks;
  std::vector<float> x;
  int64_t T = 0, slots = 0;

  // `experts` experts; expert e gets the first n_e tokens, n_e cycling through 1, 3, 8 (the GEMV's
  // largest), 20 (oneDNN), 2, 5.
  explicit Fixture(int experts = 4) {
    const int kExperts = experts;
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const float ws = 1.0f / std::sqrt(float(kH));
    for (int e = 0; e < kExperts; ++e) {
      std::vector<uint16_t> m(size_t(3 * kH * kI));
      for (auto& v : m) v = f32_to_bf16(nd(rng) * ws);
      w.push_back(std::move(m));
    }
    for (int e = 0; e < kExperts; ++e) {
      const uint16_t* b = w[size_t(e)].data();
      ExpertWeights ew;
      ew.w1 = cpu::ref::WeightView::bf16(b, kI, kH);
      ew.w3 = cpu::ref::WeightView::bf16(b + kH * kI, kI, kH);
      ew.w2 = cpu::ref::WeightView::bf16(b + 2 * kH * kI, kH, kI);
      moe.experts.push_back(ew);
    }
    config.source = "bf16_executor_test";
    config.moe.mxfp4 = false;
    layer.layer = 0;
    layer.weights = &moe;
    layer.config = &config;
    layer.glu.kind = cpu::ref::GluKind::silu;
    layer.in_dim = kH;
    layer.intermediate = kI;
    // Tokens: expert e gets the first n_e of T = 20 tokens; a slot per (token, expert).
    T = 20;
    const int n[6] = {1, 3, 8, 20, 2, 5};
    for (int e = 0; e < kExperts; ++e) {
      ExpertTask t;
      t.expert = e;
      for (int i = 0; i < n[e % 6]; ++i) {
        t.tokens.push_back(i);
        t.slots.push_back(int32_t(slots++));
      }
      tasks.push_back(t);
    }
    x.resize(size_t(T * kH));
    for (float& v : x) v = round_bf16(nd(rng));
  }

  std::vector<float> run(ExpertExecutor& ex, Precision p) const {
    std::vector<float> y(size_t(slots * kH), NAN);
    ex.run(layer, tasks, x.data(), y.data(), p);
    return y;
  }
};

}  // namespace

TEST_CASE("bf16 experts: the fast executor within the bf16 noise of the exact one", "[engine]") {
  const Fixture f;
  auto exact = make_expert_executor(ExpertNumerics::exact, f.config);
  auto fast = make_expert_executor(ExpertNumerics::bf16, f.config);
  CHECK(std::string(fast->name()) == "bf16");
  const std::vector<float> e16 = f.run(*exact, Precision::bf16),
                           e32 = f.run(*exact, Precision::fp32);
  const std::vector<float> b16 = f.run(*fast, Precision::bf16);
  bool finite = true, rounded = true;
  for (float v : b16) finite &= std::isfinite(v), rounded &= round_bf16(v) == v;
  CHECK(finite);
  CHECK(rounded);  // expert outputs are GEMM outputs of the bf16 model
  // Per task (1, 3, 8 and 20 tokens: GEMV and oneDNN), against the yardstick.
  int64_t s0 = 0;
  for (const ExpertTask& t : f.tasks) {
    const size_t a = size_t(s0 * kH), b = size_t((s0 + int64_t(t.slots.size())) * kH);
    const std::vector<float> fb(b16.begin() + long(a), b16.begin() + long(b)),
        fe(e16.begin() + long(a), e16.begin() + long(b)),
        f32(e32.begin() + long(a), e32.begin() + long(b));
    const double d = rel_l2(fb, fe), d32 = rel_l2(f32, fe);
    INFO("expert " << t.expert << ", " << t.tokens.size() << " tokens: bf16 executor vs exact bf16 "
                   << d << ", exact fp32 vs exact bf16 " << d32);
    CHECK(d <= d32);
    CHECK(d32 > 0);
    s0 += int64_t(t.slots.size());
  }
  // A wrong matrix is far outside: w1 and w3 swapped changes every output.
  Fixture g;
  std::swap(g.moe.experts[0].w1, g.moe.experts[0].w3);
  const std::vector<float> swapped = g.run(*fast, Precision::bf16);
  const std::vector<float> s(swapped.begin(), swapped.begin() + kH),
      r(e16.begin(), e16.begin() + kH);
  CHECK(rel_l2(s, r) > 10 * rel_l2(std::vector<float>(e32.begin(), e32.begin() + kH), r));
}

TEST_CASE("bf16 experts: the fast executor's bits do not depend on the thread count", "[engine]") {
  const Fixture f;
  auto fast = make_expert_executor(ExpertNumerics::bf16, f.config);
  const std::vector<float> all = f.run(*fast, Precision::bf16);
  std::vector<float> one;
  {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 1);
    one = f.run(*fast, Precision::bf16);
  }
  CHECK(std::memcmp(all.data(), one.data(), all.size() * 4) == 0);
  // More experts than threads: a thread waiting inside one expert's row-parallel linear may pick
  // up another expert meanwhile; its per-thread buffers (the bf16 activations) must not be the
  // ones the first expert's rows are still reading. 24 experts over 4 threads, repeatedly.
  const Fixture many(24);
  std::vector<float> ref;
  {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, 1);
    ref = many.run(*fast, Precision::bf16);
  }
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, 4);
  tbb::task_arena four(4);
  for (int rep = 0; rep < 12; ++rep) {
    std::vector<float> got;
    four.execute([&] { got = many.run(*fast, Precision::bf16); });
    INFO("repeat " << rep);
    CHECK(std::memcmp(got.data(), ref.data(), got.size() * 4) == 0);
  }
}

TEST_CASE("bf16 experts: the numerics mode refuses MXFP4 experts and names the choices",
          "[engine]") {
  ModelConfig c;
  c.source = "k3/config.json";
  c.moe.mxfp4 = true;
  CHECK_THROWS_WITH(make_expert_executor(ExpertNumerics::bf16, c),
                    Catch::Contains("has MXFP4 experts (use contract or exact)"));
  c.moe.mxfp4 = false;
  CHECK_THROWS_WITH(make_expert_executor(ExpertNumerics::contract, c),
                    Catch::Contains("has bf16 experts (use bf16 or exact)"));
  CHECK(parse_expert_numerics("bf16") == ExpertNumerics::bf16);
  CHECK_THROWS_WITH(parse_expert_numerics("fast"),
                    Catch::Contains("expected exact, contract or bf16, got 'fast'"));
}
