// Sampler: greedy ties, temperature/top-k/top-p candidate sets, seeded reproducibility, the
// empirical distribution against the softmax, and the stop rules.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/sampler.h"
#include "storage/error.h"

using namespace strata::engine;

TEST_CASE("greedy picks the argmax, ties to the lower id, NaN never wins", "[engine][sampler]") {
  std::vector<float> l{0.5f, 2.0f, 2.0f, -1.0f};
  Sampler s(SamplerConfig{});
  CHECK(s.sample(l) == 1);
  l[0] = NAN;
  CHECK(argmax(l) == 1);
  l[3] = 3.0f;
  CHECK(argmax(l) == 3);
}

TEST_CASE("greedy's vectorised argmax is the first strict improvement of a serial scan",
          "[engine][sampler]") {
  // The serial definition: skip NaN, keep the first element that beats the best so far; 0 when
  // every value is NaN. Against it: widths around the 16 lanes, ties (many equal maxima), NaN,
  // ±Inf, ±0 and all-NaN rows.
  auto serial = [](const std::vector<float>& v) {
    int best = -1;
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isnan(v[i]) && (best < 0 || v[i] > v[size_t(best)])) best = int(i);
    return best < 0 ? 0 : best;
  };
  std::mt19937 rng(11);
  const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f};
  int cases = 0;
  for (size_t n :
       {size_t(1), size_t(15), size_t(16), size_t(17), size_t(33), size_t(1000), size_t(163840)}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> v(n);
      const int levels = 1 + trial % 5;  // few distinct values: ties everywhere
      for (float& x : v) x = float(int(rng() % uint32_t(levels)));
      const int k = trial % 4;  // sprinkle special values
      for (int j = 0; j < k * 3; ++j) v[rng() % n] = specials[rng() % 6];
      if (trial == 7) std::fill(v.begin(), v.end(), NAN);
      if (trial == 8) std::fill(v.begin(), v.end(), -INFINITY), v[n - 1] = NAN;
      if (trial == 9) std::fill(v.begin(), v.end(), -0.0f), v[n / 2] = 0.0f;
      INFO("n=" << n << " trial " << trial);
      CHECK(argmax(v) == serial(v));
      ++cases;
    }
  }
  CHECK(cases == 7 * 40);
}

TEST_CASE("top-k and top-p restrict the candidates", "[engine][sampler]") {
  // Logits whose softmax at T=1 is roughly {0.64, 0.24, 0.09, 0.03}.
  std::vector<float> l{3.0f, 2.0f, 1.0f, 0.0f};
  SamplerConfig k2;
  k2.temperature = 1.0f;
  k2.top_k = 2;
  Sampler a(k2);
  SamplerConfig p70;
  p70.temperature = 1.0f;
  p70.top_p = 0.7f;  // 0.64 < 0.7 ≤ 0.64 + 0.24: ids 0 and 1
  Sampler b(p70);
  SamplerConfig p50;
  p50.temperature = 1.0f;
  p50.top_p = 0.5f;  // the first token alone reaches 0.5
  Sampler c(p50);
  for (int i = 0; i < 2000; ++i) {
    int x = a.sample(l), y = b.sample(l), z = c.sample(l);
    REQUIRE((x == 0 || x == 1));
    REQUIRE((y == 0 || y == 1));
    REQUIRE(z == 0);
  }
}

TEST_CASE("temperature sampling follows the softmax and a seed reproduces it",
          "[engine][sampler]") {
  std::vector<float> l{1.0f, 0.0f, -1.0f};
  SamplerConfig cfg;
  cfg.temperature = 2.0f;
  cfg.seed = 42;
  Sampler s(cfg);
  const int n = 20000;
  std::vector<int> count(3, 0), seq;
  for (int i = 0; i < n; ++i) {
    int id = s.sample(l);
    ++count[size_t(id)];
    if (i < 50) seq.push_back(id);
  }
  double z = std::exp(0.5) + 1.0 + std::exp(-0.5);
  std::vector<double> expect{std::exp(0.5) / z, 1.0 / z, std::exp(-0.5) / z};
  for (int i = 0; i < 3; ++i) {
    // 5 standard deviations of a binomial proportion at n = 20000 (≤ 0.018).
    const double sd = std::sqrt(expect[i] * (1 - expect[i]) / n);
    CHECK(std::fabs(count[size_t(i)] / double(n) - expect[i]) < 5 * sd);
  }
  Sampler again(cfg);
  std::vector<int> seq2;
  for (int i = 0; i < 50; ++i) seq2.push_back(again.sample(l));
  CHECK(seq == seq2);
  cfg.seed = 43;
  Sampler other(cfg);
  std::vector<int> seq3;
  for (int i = 0; i < 50; ++i) seq3.push_back(other.sample(l));
  CHECK(seq3 != seq);
}

TEST_CASE("sampler rejects bad settings with a clear message", "[engine][sampler]") {
  SamplerConfig c;
  c.top_p = 0.0f;
  CHECK_THROWS_WITH(Sampler(c), Catch::Contains("top-p"));
  c = {};
  c.temperature = -1.0f;
  CHECK_THROWS_WITH(Sampler(c), Catch::Contains("temperature"));
  c = {};
  c.top_k = -2;
  CHECK_THROWS_WITH(Sampler(c), Catch::Contains("top-k"));
}

TEST_CASE("stop rules: EOS ids and the earliest stop string", "[engine][sampler]") {
  StopRules r;
  r.eos_ids = {2, 163586};
  r.stop_strings = {"\n\n", "END", ""};
  CHECK(r.is_eos(163586));
  CHECK_FALSE(r.is_eos(3));
  CHECK(r.stop_position("abc") == std::string::npos);
  CHECK(r.stop_position("abcEND x\n\n") == 3);
  CHECK(r.stop_position("a\n\nEND") == 1);
}
