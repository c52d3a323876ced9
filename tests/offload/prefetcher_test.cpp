// Prefetcher on synthetic routers: predictions equal a brute-force top-k (bias affects selection,
// weights are unbiased scores, highest first), recall per distance is exactly |P ∩ A| / |A| of
// what was predicted, and predictions turn into prefetch hits in the store.
#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <set>
#include <thread>

#include "offload/expert_store.h"
#include "offload/prefetcher.h"
#include "store_fixture.h"

using namespace strata;
using namespace strata::offload;
namespace ref = strata::cpu::ref;

namespace {

constexpr int E = 32, D = 16, K = 4;

struct Routers {
  std::vector<std::vector<float>> w, bias;
  std::vector<ref::WeightView> views;
  // Layer 0 dense; layers 1..L-1 MoE. similar: every router is base + small noise; else random.
  Routers(int L, bool similar, uint32_t seed) : w(size_t(L)), bias(size_t(L)), views(size_t(L)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> base(size_t(E * D));
    for (auto& v : base) v = N(rng);
    for (int l = 1; l < L; l++) {
      w[size_t(l)].resize(size_t(E * D));
      for (size_t i = 0; i < base.size(); i++)
        w[size_t(l)][i] = similar ? base[i] + 0.05f * N(rng) : N(rng);
      bias[size_t(l)].resize(E);
      for (auto& b : bias[size_t(l)]) b = 0.1f * N(rng);
      views[size_t(l)] = ref::WeightView::f32(w[size_t(l)].data(), E, D);
    }
  }
  std::vector<LayerRouter> layer_routers() const {
    std::vector<LayerRouter> r(views.size());
    for (size_t l = 1; l < views.size(); l++) r[l] = {&views[l], bias[l].data()};
    return r;
  }
  // Brute force: scores and the top-K selection of one token.
  std::vector<int> route(int l, const float* x, std::vector<float>* scores = nullptr) const {
    std::vector<std::pair<float, int>> sel;
    std::vector<float> s(E);
    for (int e = 0; e < E; e++) {
      float acc = 0;
      for (int d = 0; d < D; d++) acc += x[d] * w[size_t(l)][size_t(e * D + d)];
      s[size_t(e)] = ref::sigmoid(acc);
      sel.push_back({s[size_t(e)] + bias[size_t(l)][size_t(e)], e});
    }
    std::sort(sel.begin(), sel.end(), [](auto& a, auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    std::vector<int> ids;
    for (int j = 0; j < K; j++) ids.push_back(sel[size_t(j)].second);
    if (scores) *scores = s;
    return ids;
  }
};

std::vector<float> random_x(std::mt19937& rng, int T) {
  std::normal_distribution<float> N(0, 1);
  std::vector<float> x(size_t(T * D));
  for (auto& v : x) v = N(rng);
  return x;
}

}  // namespace

TEST_CASE("prefetcher: prediction is the router's top-k, highest score first", "[prefetch]") {
  Routers R(4, false, 1);
  PrefetcherConfig pc;
  pc.top_k = K;
  pc.async = false;
  Prefetcher P(R.layer_routers(), E, pc, nullptr);
  std::mt19937 rng(5);
  auto x = random_x(rng, 2);
  // One token: exactly the brute-force selection, weights = unbiased scores, sorted.
  std::vector<float> s;
  auto ids = R.route(2, x.data(), &s);
  auto p1 = P.predict(2, x.data(), 1);
  REQUIRE(p1.size() == K);
  std::set<int> got, want(ids.begin(), ids.end());
  for (size_t j = 0; j < p1.size(); j++) {
    got.insert(p1[j].first);
    CHECK(p1[j].second == s[size_t(p1[j].first)]);
    if (j) CHECK(p1[j - 1].second >= p1[j].second);
  }
  CHECK(got == want);
  // Two tokens: the union of both selections.
  auto ids2 = R.route(2, x.data() + D);
  want.insert(ids2.begin(), ids2.end());
  auto p2 = P.predict(2, x.data(), 2);
  got.clear();
  for (auto& [e, w] : p2) got.insert(e);
  CHECK(got == want);
  // A layer without a router predicts nothing.
  CHECK(P.predict(0, x.data(), 1).empty());
}

TEST_CASE("prefetcher: recall per distance is measured exactly", "[prefetch]") {
  const int L = 6;
  for (bool similar : {true, false}) {
    INFO("similar routers: " << similar);
    Routers R(L, similar, 3);
    PrefetcherConfig pc;
    pc.top_k = K;
    pc.depth = 2;
    pc.async = false;
    Prefetcher P(R.layer_routers(), E, pc, nullptr);
    std::mt19937 rng(9);
    std::vector<uint64_t> hits(2, 0), total(2, 0);
    for (int token = 0; token < 20; token++) {
      // The hidden state drifts a little from layer to layer.
      auto x = random_x(rng, 1);
      std::vector<std::vector<float>> xs(L);
      for (int l = 1; l < L; l++) {
        std::normal_distribution<float> N(0, 0.1f);
        for (auto& v : x) v += N(rng);
        xs[size_t(l)] = x;
      }
      for (int l = 1; l < L; l++) {
        auto actual = R.route(l, xs[size_t(l)].data());
        P.on_routing(l, actual);
        for (int d = 1; d <= 2; d++) {
          int src = l - d;
          if (src < 1) continue;  // layer 0 (dense) gives no prediction in this test
          auto pred = R.route(l, xs[size_t(src)].data());
          std::set<int> a(actual.begin(), actual.end());
          for (int e : pred) hits[size_t(d - 1)] += a.count(e);
          total[size_t(d - 1)] += actual.size();
        }
        P.on_layer_input(l, xs[size_t(l)].data(), 1);
      }
    }
    TierTelemetry t;
    P.fill(t);
    REQUIRE(t.recall_total.size() == 2);
    CHECK(t.recall_hits == hits);
    CHECK(t.recall_total == total);
    CHECK(t.predictions_late == 0);
    if (similar) CHECK(t.recall(1) > 0.6);  // similar routers, small drift: mostly right
  }
}

TEST_CASE("prefetcher: predictions become prefetch hits in the store", "[prefetch][store]") {
  const int L = 4;
  Routers R(L, true, 4);
  test::SyntheticExperts sx("prefetch", L, E, 6000, 2000);
  StoreConfig sc;
  sc.host_budget_bytes = sx.slot_bytes() * 40;
  sc.gpu = -1;
  sc.poison_freed_slots = true;
  ExpertStore st(sx.layout, sc);
  PrefetcherConfig pc;
  pc.top_k = K;
  pc.depth = 2;
  pc.async = GENERATE(false, true);
  Prefetcher P(R.layer_routers(), E, pc, &st);
  std::mt19937 rng(2);
  auto x = random_x(rng, 1);
  // Layer 1's input is known: layers 2 and 3 are predicted and prefetched.
  P.on_layer_input(1, x.data(), 1);
  P.flush();
  st.reader().drain();
  for (int l = 2; l <= 3; l++) {
    auto ids = R.route(l, x.data());
    for (int e : ids) CHECK(st.residency(l, e) == Residency::host);
    st.require(l, ids);
    for (int e : ids) CHECK(sx.verify(st.acquire(l, e)));
    P.on_routing(l, ids);
  }
  auto t = st.telemetry();
  CHECK(t.prefetch_hits == 2 * K);
  CHECK(t.disk_misses == 0);
  P.fill(t);
  CHECK(t.recall(1) == 1.0);
  CHECK(t.recall(2) == 1.0);
}

// bench e2e reads each line's tier activity as a difference of two snapshots.
TEST_CASE("tier telemetry: since() subtracts counters and keeps the host tier's gauges") {
  TierTelemetry a, b;
  a.host_hits = 10, a.disk_misses = 4, a.prefetch_hits = 3, a.bytes_read = 1000;
  a.read_busy_s = 2.0, a.blocked_s = 0.5, a.evictions = 7, a.prefetch_issued = 9;
  a.recall_hits = {3, 1}, a.recall_total = {8, 8};
  a.host_budget_bytes = 1 << 20, a.slots = 5, a.io_backend = "io_uring";
  b = a;
  b.host_hits = 25, b.disk_misses = 6, b.prefetch_hits = 11, b.bytes_read = 4000;
  b.read_busy_s = 3.5, b.blocked_s = 0.75, b.evictions = 9, b.prefetch_issued = 20;
  b.recall_hits = {10, 4}, b.recall_total = {16, 16};
  b.host_peak_bytes = 1 << 19;
  const TierTelemetry d = b.since(a);
  CHECK(d.host_hits == 15);
  CHECK(d.disk_misses == 2);
  CHECK(d.prefetch_hits == 8);
  CHECK(d.demand() == 17);
  CHECK(d.bytes_read == 3000);
  CHECK(d.read_busy_s == Approx(1.5));
  CHECK(d.read_gbps() == Approx(3000 / 1.5 / 1e9));
  CHECK(d.blocked_s == Approx(0.25));
  CHECK(d.evictions == 2);
  CHECK(d.prefetch_issued == 11);
  CHECK(d.recall(1) == Approx(7.0 / 8));
  CHECK(d.recall(2) == Approx(3.0 / 8));
  CHECK(d.host_budget_bytes == (1u << 20));
  CHECK(d.host_peak_bytes == (1u << 19));
  CHECK(d.slots == 5);
  CHECK(d.io_backend == "io_uring");
  // A snapshot taken before counters existed (no recall yet) subtracts as zeros.
  const TierTelemetry e = b.since(TierTelemetry{});
  CHECK(e.host_hits == 25);
  CHECK(e.recall(1) == Approx(10.0 / 16));
}
