// The model-shape probes (offload/hw_measure.h measure_model_shapes) on a tiny model: every piece
// of the fast CPU backend is timed at the model's shapes and token counts, the result carries the
// model's signature, and the cost model then uses it for that model. Timing-free: the values are
// only required to be positive; the token counts, signature and sources are checked exactly.
#include <tbb/task_arena.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <thread>

#include "cpu/topology.h"
#include "offload/cost_model.h"
#include "offload/hw_measure.h"
#include "storage/synth.h"

using namespace strata;
using namespace strata::offload;

TEST_CASE("model-shape probes time every piece at the model's token counts", "[hardware]") {
  SynthOptions so;
  so.preset = "k3-tiny";  // 256 wide, vocab 1024, 16 experts: each probe takes milliseconds
  const ModelConfig cfg = parse_config(synth_config_json(so), "k3-tiny");
  MeasureOptions o;
  o.quick = true;
  o.model = &cfg;
  o.model_name = "k3-tiny";
  o.model_tokens = {16, 1, 2};  // any order; sorted
  o.model_context = 24;
  int lines = 0;
  o.line = [&](const MeasuredLine& l) {
    CHECK(l.name.rfind("hw/model ", 0) == 0);
    ++lines;
  };
  cpu::Topology topo;
  const int threads = std::min(2, topo.cores());
  tbb::task_arena arena(threads);
  const ModelShapeRates ms = measure_model_shapes(cfg, o, arena, topo, threads);
  CHECK(ms.signature == model_shape_signature(cfg));
  CHECK(ms.model.rfind("k3-tiny: ", 0) == 0);
  CHECK(ms.threads == threads);
  CHECK(ms.context == 24);
  auto tokens = [](const RateCurve& c) {
    std::vector<int> t;
    for (const RatePoint& p : c.points) {
      CHECK(p.gbps > 0);
      t.push_back(p.tokens);
    }
    return t;
  };
  // Decode-sized M (≤ 8) and prompt-sized M (> 8) go to their own curves.
  CHECK(tokens(ms.trunk) == std::vector<int>{1, 2, 16});
  // Experts: tokens per expert, the mean of each step (k3-tiny: 16 experts top-4, so a 16-token
  // prompt gives 4 per expert) and 2.
  CHECK(tokens(ms.expert) == std::vector<int>{1, 2, 4});
  // The routed step at each decode batch (B ≤ 8 of the token counts).
  CHECK(tokens(ms.expert_decode) == std::vector<int>{1, 2});
  CHECK(ms.expert_decode.source.find("by decode batch") != std::string::npos);
  CHECK(tokens(ms.row_ops_ns) == std::vector<int>{1, 2, 16});
  CHECK(tokens(ms.kda_decode_gbps) == std::vector<int>{1, 2});
  CHECK(tokens(ms.mla_decode_gflops) == std::vector<int>{1, 2});
  CHECK(tokens(ms.kda_prefill_gflops) == std::vector<int>{16});
  CHECK(tokens(ms.mla_prefill_gflops) == std::vector<int>{16});
  // The parts together as a step at every token count: a ratio of two measured times, so positive
  // and finite (its value is a timing: under a busy machine k3-tiny's millisecond parts swing it
  // 0.2–5×, so no bound on it is asserted here).
  CHECK(tokens(ms.step_factor) == std::vector<int>{1, 2, 16});
  for (const RatePoint& q : ms.step_factor.points) {
    CHECK(q.gbps > 0);
    CHECK(std::isfinite(q.gbps));
  }
  CHECK(ms.step_factor.source.find("the step's time over the parts' sum") != std::string::npos);
  CHECK(ms.linear_call_us.value() > 0);
  CHECK(ms.trunk.source.find("one call's fixed cost taken out") != std::string::npos);
  // call, trunk, experts, decode experts, KDA, MLA, row ops, steps
  CHECK(lines == 1 + 3 + 3 + 2 + 3 + 3 + 3 + 3);
  // The cost model takes them for this model.
  HardwareProfile hw;
  hw.host.cores = threads;
  hw.host.mem_read_gbps = Rate(10);
  hw.model_shapes = ms;
  CostOptions co;
  co.trunk = TrunkBackend::cpu_bf16;
  CHECK(CostModel(hw, cfg, co).uses_model_shapes());
}

TEST_CASE("time_repeats runs `before` ahead of every timed call, outside the timing",
          "[hardware]") {
  int before = 0, calls = 0;
  std::vector<int> order;
  const RateSample s = time_repeats(
      [&] {
        ++calls;
        order.push_back(1);
      },
      5, 2,
      [&] {
        ++before;
        order.push_back(0);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      });
  CHECK(calls == 7);   // 2 warm-up + 5 timed
  CHECK(before == 5);  // only the timed ones
  CHECK(order == std::vector<int>{1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1});
  CHECK(s.repeats == 5);
  CHECK(s.max_s < 0.010);  // the 20 ms sleeps are not in it
}

TEST_CASE("model-shape probes with --model-cold sweep the caches before each timed repeat",
          "[hardware]") {
  SynthOptions so;
  so.preset = "k3-tiny";
  const ModelConfig cfg = parse_config(synth_config_json(so), "k3-tiny");
  MeasureOptions o;
  o.quick = true;
  o.model = &cfg;
  o.model_tokens = {1};
  o.model_cold_bytes = size_t(3) << 20;
  cpu::Topology topo;
  const int threads = std::min(2, topo.cores());
  tbb::task_arena arena(threads);
  const ModelShapeRates ms = measure_model_shapes(cfg, o, arena, topo, threads);
  for (const RateCurve* c : {&ms.trunk, &ms.expert, &ms.row_ops_ns}) {
    INFO(c->source);
    CHECK(c->source.find("caches swept (3 MiB written) before each repeat") != std::string::npos);
    REQUIRE_FALSE(c->points.empty());  // the expert curve adds its 1 and 2 tokens per expert
    for (const RatePoint& q : c->points) CHECK(q.gbps > 0);
  }
}
