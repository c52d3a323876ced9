// The reference engine with routed experts served by the tiered expert store (issue 4, item 4):
// a synthetic k3-tiny with a host budget of 30% of its expert bytes gives logits bit-identical to
// the in-memory run, for both expert numerics modes, with and without prefetch, and the store's
// telemetry shows it really streamed (misses, evictions, bytes read, budget respected).
#include <catch2/catch.hpp>
#include <cstring>

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
  const std::vector<float> got = logits(*model, so, ids);
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
  const auto t = rt.telemetry();
  CHECK(t.demand() > 0);
  CHECK(t.disk_misses == 0);  // "100%" holds every expert (slots of 4 KiB-rounded spans)
  CHECK(t.evictions == 0);
  CHECK(t.bytes_read == 0);
  CHECK(t.host_hits == t.demand());
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
