// The reference engine with routed experts served by the tiered expert store (issue 4, item 4):
// a synthetic k3-tiny with a host budget of 30% of its expert bytes gives logits bit-identical to
// the in-memory run, for both expert numerics modes, with and without prefetch, and the store's
// telemetry shows it really streamed (misses, evictions, bytes read, budget respected).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <deque>

#include "engine/offload_executor.h"
#include "engine/session.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
using namespace strata::engine;

namespace {

std::filesystem::path tiny_model() {
  static std::filesystem::path dir;
  if (dir.empty()) {
    dir = test::scratch_dir("offload_logits") / "k3-tiny";
    SynthOptions o;
    o.preset = "k3-tiny";
    o.seed = 3;
    o.threads = 2;
    synth_checkpoint(o, dir);
  }
  return dir;
}

std::vector<float> logits(const Model& m, SessionOptions so, const std::vector<int32_t>& ids) {
  Session s(m, so);
  auto out = s.forward(std::span<const int32_t>(ids.data(), 5), true);  // prefill 5
  for (size_t i = 5; i < ids.size(); i++) {                             // then decode
    auto row = s.forward(std::span<const int32_t>(&ids[i], 1), false);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

}  // namespace

TEST_CASE("offload: k3-tiny at a 30% host budget gives the in-memory logits", "[offload]") {
  auto model = Model::load(tiny_model());
  const ModelConfig& c = model->config();
  std::vector<int32_t> ids;
  for (int i = 0; i < 9; i++) ids.push_back(int32_t((i * 37 + 11) % c.vocab_size));
  for (auto numerics : {ExpertNumerics::exact, ExpertNumerics::contract}) {
    if (numerics == ExpertNumerics::contract && !c.moe.mxfp4) continue;
    SessionOptions base;
    base.experts = numerics;
    const std::vector<float> want = logits(*model, base, ids);
    for (int depth : {0, 2}) {
      INFO("numerics " << expert_numerics_name(numerics) << ", prefetch depth " << depth);
      OffloadOptions oo;
      oo.host_mem = "30%";
      oo.prefetch_depth = depth;
      OffloadRuntime rt(*model, oo);
      REQUIRE(rt.active());
      SessionOptions so = base;
      rt.install(so);
      const std::vector<float> got = logits(*model, so, ids);
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
      auto t = rt.telemetry();
      CHECK(t.demand() > 0);
      CHECK(t.disk_misses > 0);
      CHECK(t.evictions > 0);  // 30% cannot hold every expert the run touches
      CHECK(t.bytes_read > 0);
      CHECK(t.read_errors == 0);
      CHECK(t.host_peak_bytes <= t.host_budget_bytes);
      if (depth > 0) {
        REQUIRE(t.recall_total.size() == 2);
        CHECK(t.recall_total[0] > 0);
      }
      auto d = rt.describe();
      REQUIRE_FALSE(d.empty());
      CHECK_THAT(d[0], Catch::Contains("host expert cache: budget"));
    }
  }
}

TEST_CASE("offload: a filled cache of 100% serves every expert from host memory, same logits",
          "[offload]") {
  auto model = Model::load(tiny_model());
  const ModelConfig& c = model->config();
  std::vector<int32_t> ids;
  for (int i = 0; i < 9; i++) ids.push_back(int32_t((i * 53 + 7) % c.vocab_size));
  const std::vector<float> want = logits(*model, SessionOptions{}, ids);
  OffloadOptions oo;
  oo.host_mem = "100%";
  oo.host_fill = true;
  OffloadRuntime rt(*model, oo);
  REQUIRE(rt.active());
  const auto t0 = rt.telemetry();
  CHECK(t0.fill_bytes > 0);
  SessionOptions so;
  rt.install(so);
  // Nothing can miss: no router lookahead (no host copy of each MoE input for it), and it says so.
  CHECK_FALSE(so.on_moe_input);
  const std::vector<std::string> lines = rt.describe();
  CHECK(std::find(lines.begin(), lines.end(), "prefetch: off (every expert in the host cache)") !=
        lines.end());
  const std::vector<float> got = logits(*model, so, ids);
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
  const auto t = rt.telemetry();
  CHECK(t.demand() > 0);
  CHECK(t.disk_misses == 0);  // "100%" holds every expert (slots of 4 KiB-rounded spans)
  CHECK(t.evictions == 0);
  CHECK(t.bytes_read == 0);
  CHECK(t.host_hits == t.demand());
  // A filled cache that cannot hold them all keeps the lookahead.
  OffloadOptions part = oo;
  part.host_mem = "30%";
  OffloadRuntime rt30(*model, part);
  SessionOptions so30;
  rt30.install(so30);
  CHECK(so30.on_moe_input);
}

// The store as the GPU backend's source of staged experts (HostExpertSource): held experts carry
// the checkpoint's bytes from the cache's slots, several at once up to slots(), and a cancelled
// claim leaves the store usable (the executor runs every expert afterwards).
TEST_CASE("offload: the store as a host expert source hands out the checkpoint's bytes",
          "[offload]") {
  auto model = Model::load(tiny_model());
  const ModelConfig& c = model->config();
  OffloadOptions oo;
  oo.host_mem = "30%";
  oo.prefetch_depth = 0;
  OffloadRuntime rt(*model, oo);
  SessionOptions so;
  rt.install(so);
  REQUIRE(so.wrap_executor);
  auto ex = so.wrap_executor(make_expert_executor(ExpertNumerics::exact, c));
  HostExpertSource* src = ex->host_source();
  REQUIRE(src != nullptr);
  CHECK(make_expert_executor(ExpertNumerics::exact, c)->host_source() == nullptr);
  const uint64_t slots = src->slots();
  REQUIRE(slots >= 2);
  auto same = [](const WeightView& a, const WeightView& b) {
    REQUIRE(a.format == b.format);
    REQUIRE(a.rows == b.rows);
    REQUIRE(a.cols == b.cols);
    REQUIRE(a.data != b.data);  // from a cache slot, not the checkpoint's mapping
    const bool fp4 = a.format == cpu::ref::WeightFormat::mxfp4;
    const size_t n = size_t(a.rows * a.cols);
    const size_t nb = fp4 ? n / 2 : a.format == cpu::ref::WeightFormat::bf16 ? n * 2 : n * 4;
    CHECK(std::memcmp(a.data, b.data, nb) == 0);
    if (fp4) CHECK(std::memcmp(a.scale, b.scale, size_t(a.rows * a.cols / 32)) == 0);
  };
  // Every expert of every MoE layer, at most slots() − 1 held at once, oldest released first.
  std::deque<HeldExpert> held;
  uint64_t total = 0;
  int last = -1;
  for (int l = 0; l < c.num_layers; ++l) {
    if (!model->weights().layers[size_t(l)].moe) continue;
    const MoeWeights& mw = *model->weights().layers[size_t(l)].moe;
    const int E = int(mw.experts.size());
    std::vector<int> all(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) all[size_t(e)] = e;
    src->require(l, all, int(all.size()));
    for (int e = 0; e < E; ++e) {
      while (held.size() >= slots - 1) held.pop_front();
      held.push_back(src->acquire(l, e, mw.experts[size_t(e)]));
      INFO("layer " << l << " expert " << e);
      same(held.back().weights.w1, mw.experts[size_t(e)].w1);
      same(held.back().weights.w3, mw.experts[size_t(e)].w3);
      same(held.back().weights.w2, mw.experts[size_t(e)].w2);
    }
    total += uint64_t(E);
    last = l;
  }
  REQUIRE(total > slots);  // 30%: not every expert fits, so slots were reused
  held.clear();
  // Claims dropped part-way: the executor still gets every expert.
  const MoeWeights& mw = *model->weights().layers[size_t(last)].moe;
  std::vector<int> all(mw.experts.size());
  for (size_t e = 0; e < all.size(); ++e) all[e] = int(e);
  src->require(last, all, int(all.size()));
  { HeldExpert h = src->acquire(last, 0, mw.experts[0]); }
  for (size_t e = 1; e < all.size(); ++e) src->cancel(last, int(e));
  const auto t = rt.telemetry();
  CHECK(t.disk_misses > 0);
  CHECK(t.read_errors == 0);
  std::vector<int32_t> ids;
  for (int i = 0; i < 9; i++) ids.push_back(int32_t((i * 37 + 11) % c.vocab_size));
  SessionOptions base;
  base.experts = ExpertNumerics::exact;
  SessionOptions via = base;
  via.wrap_executor = so.wrap_executor;
  CHECK(logits(*model, via, ids) == logits(*model, base, ids));
}

TEST_CASE("offload: --host-mem parsing", "[offload]") {
  CHECK(parse_host_mem("512MiB", 0) == 512ull << 20);
  CHECK(parse_host_mem("2GiB", 0) == 2ull << 30);
  CHECK(parse_host_mem("1.5GB", 0) == 1500000000ull);
  CHECK(parse_host_mem("4096", 0) == 4096);
  CHECK(parse_host_mem("30%", 1000) == 300);
  CHECK_THROWS_WITH(parse_host_mem("lots", 0), Catch::Contains("--host-mem 'lots'"));
  CHECK_THROWS_WITH(parse_host_mem("5 parsecs", 0), Catch::Contains("--host-mem"));
  CHECK_THROWS(parse_host_mem("-1GiB", 0));
}
