// Capacity plans (offload/plan.h) for full K3 (the k3-slice preset at 93 layers is K3's config):
// budgets that add up and never exceed a tier, placements that cover every expert, refusals
// with their reasons (unsupported GPUs, too little GPU memory, DRAM too small without a disk), and
// suggestions that actually help.
#include <catch2/catch.hpp>

#include "offload/plan.h"
#include "storage/error.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
using namespace strata::offload;

namespace {

ModelConfig k3() {
  SynthOptions o;
  o.preset = "k3-slice";
  o.layers = 93;
  return parse_config(synth_config_json(o), "k3");
}

HardwareProfile reference(const char* name) {
  return load_hardware(test::source_dir() / "docs" / "hardware" / name);
}

}  // namespace

TEST_CASE("K3 on 8 x H200 + 2 TB: budgets add up, every expert has a tier", "[plan]") {
  const ModelConfig cfg = k3();
  REQUIRE(cfg.num_moe_layers() == 92);
  Workload w;
  w.context = 32768;
  const Plan p = make_plan(reference("8xH200-2TB.json"), cfg, w);
  REQUIRE(p.refusal.empty());
  CHECK(p.backend == TrunkBackend::gpu);
  CHECK(p.gpus == 8);
  CHECK(p.experts_total == 82432);
  CHECK(p.experts_gpu + p.experts_host + p.experts_disk == p.experts_total);
  CHECK(p.experts_disk == 0);  // 2 TB holds the 1.45 TB of experts
  CHECK(p.placement.gpu + p.placement.host + p.placement.disk == Approx(1));
  for (const TierBudget& b : p.budgets)
    if (b.capacity) CHECK(b.used() <= b.capacity);
  // Per GPU: a 1/8 share of the 113.5 GB trunk + embedding, and a cache filling what is left.
  CHECK(double(p.trunk_bytes_per_gpu) == Approx(113.5e9 / 8).epsilon(0.01));
  CHECK(p.experts_gpu % 8 == 0);
  CHECK(p.decode.tokens_per_s > 0);
  CHECK(p.prefill.tokens_per_s > 0);
  CHECK(p.decode_roofline.tokens_per_s >= p.decode.tokens_per_s);  // a roofline bounds the model
  // State per sequence: 414 MiB KDA + 14.6 MiB conv + 27,648 B per token of MLA cache.
  CHECK(p.state_bytes_per_sequence ==
        69ull * 96 * 128 * 128 * 4 + 69ull * 3 * 3 * 12288 * 2 + 27648ull * 32768);
  CHECK(!p.suggestions.empty());
}

TEST_CASE("refusals name the reason", "[plan][errors]") {
  const ModelConfig cfg = k3();
  // One H100-80GB cannot hold K3's 113.5 GB of bf16 dense weights.
  HardwareProfile one = reference("4xH100-1TB.json");
  one.gpu.count = 1;
  Plan p = make_plan(one, cfg, Workload{});
  CHECK(p.refusal.rfind("GPU memory too small: each of the 1 GPUs needs", 0) == 0);
  CHECK(p.refusal.find("such GPUs would hold it") != std::string::npos);
  // The changed machines are evaluated: another GPU makes it runnable.
  bool gpu_helps = false;
  for (auto& s : p.suggestions)
    if (s.change.find("add one") == 0) gpu_helps = s.refusal.empty() && s.decode_tokens_per_s > 0;
  CHECK(gpu_helps);
  // GPUs this build does not run on.
  HardwareProfile a100 = reference("4xH100-1TB.json");
  a100.gpu.name = "NVIDIA A100-SXM4-80GB";
  a100.gpu.compute_capability = 80;
  CHECK(make_plan(a100, cfg, Workload{}).refusal.find("is sm_80; this build targets sm_90") !=
        std::string::npos);
  // DRAM too small for the experts and no disk to read the rest from.
  HardwareProfile nodisk = reference("4xH100-1TB.json");
  nodisk.disk = DiskSpec{};
  CHECK(make_plan(nodisk, cfg, Workload{}).refusal.find("states no disk read rate") !=
        std::string::npos);
  // With the disks, the same machine runs, reading the overflow from them.
  const Plan c = make_plan(reference("4xH100-1TB.json"), cfg, Workload{});
  REQUIRE(c.refusal.empty());
  CHECK(c.experts_disk > 0);
  CHECK(c.decode.bottleneck.find("disk") != std::string::npos);
  // The best suggestion there is more DRAM, and it helps.
  REQUIRE(!c.suggestions.empty());
  CHECK(c.suggestions.front().change.find("DRAM") != std::string::npos);
  CHECK(c.suggestions.front().decode_gain > 1.5);
  // The CPU reference backend keeps the trunk in DRAM: 64 GB cannot hold K3's.
  HardwareProfile small = reference("1xH100-64GB.json");
  small.kernels.cpu_trunk_ref.points = {{1, 5}};
  small.kernels.cpu_kda_ref_state_gbps = Rate(1);
  small.kernels.cpu_mla_ref_gflops = Rate(1);
  PlanOptions po;
  po.backend = BackendChoice::cpu_reference;
  CHECK(make_plan(small, cfg, Workload{}, po).refusal.rfind("host DRAM too small", 0) == 0);
  // A workload out of range is bad input, not a refusal.
  Workload bad;
  bad.concurrency = 0;
  CHECK_THROWS_AS(make_plan(reference("8xH200-2TB.json"), cfg, bad), Error);
}

TEST_CASE("multi-node: each node's DRAM holds its layers' experts", "[plan]") {
  const Plan p = make_plan(reference("4node-2xH100-512GB.json"), k3(), Workload{});
  REQUIRE(p.refusal.empty());
  CHECK(p.gpus == 8);
  CHECK(p.experts_disk == 0);  // 4 × 512 GB together hold the 1.45 TB
  bool hop = false;
  for (auto& t : p.decode.parts) hop = hop || t.resource == "network";
  CHECK(hop);
}
