// The cost model (offload/cost_model.h) against numbers worked out by hand: rate-curve
// interpolation, per-expert times, the staging threshold, flat-routing expert counts, a CPU
// decode step summed part by part, the GPU decode overlap rule, the multi-GPU pipeline, the
// prefill head rule, and the peak-only roofline ignoring kernel rates.
#include <catch2/catch.hpp>
#include <cmath>

#include "offload/cost_model.h"
#include "storage/error.h"
#include "storage/synth.h"

using namespace strata;
using namespace strata::offload;

namespace {

// K3's real widths (17,547,264-byte MXFP4 experts, hidden 7168, 896 experts top-16), 4 layers.
ModelConfig k3_slice() {
  SynthOptions o;
  o.preset = "k3-slice";
  o.layers = 4;
  return parse_config(synth_config_json(o), "k3-slice");
}

ModelConfig k3_mini() {
  SynthOptions o;
  o.preset = "k3-mini";
  return parse_config(synth_config_json(o), "k3-mini");
}

RateCurve curve(std::vector<RatePoint> p) {
  RateCurve c;
  c.points = std::move(p);
  c.source = "test";
  return c;
}

// A GPU machine with round numbers.
HardwareProfile gpu_machine(int gpus = 1) {
  HardwareProfile hw;
  hw.description = "test GPU machine";
  hw.gpu.count = gpus;
  hw.gpu.name = "NVIDIA H200";
  hw.gpu.compute_capability = 90;
  hw.gpu.memory_bytes = 140ull << 30;
  hw.gpu.hbm_copy_gbps = Rate(4000);
  hw.gpu.bf16_gemm_tflops = Rate(800);
  hw.gpu.h2d_gbps = Rate(50);
  hw.host.cores = 32;
  hw.host.avx512 = true;
  hw.host.dram_bytes = 2000ull * 1000 * 1000 * 1000;
  hw.host.mem_read_gbps = Rate(400);
  hw.disk.count = 4;
  hw.disk.read_gbps = Rate(10);
  hw.kernels.cpu_expert = curve({{1, 300}, {16, 30}});
  hw.kernels.gpu_expert = curve({{1, 3000}, {64, 100}});
  hw.kernels.gpu_trunk = curve({{1, 3000}, {4096, 200}});
  return hw;
}

}  // namespace

TEST_CASE("rate curves interpolate seconds per byte and extrapolate the compute-bound limit",
          "[cost]") {
  const RateCurve c = curve({{1, 10}, {11, 2}});
  // seconds per byte: 0.1 ns at M=1, 0.5 ns at M=11.
  CHECK(c.seconds_per_byte(1) == Approx(0.1e-9));
  CHECK(c.seconds_per_byte(11) == Approx(0.5e-9));
  CHECK(c.seconds_per_byte(6) == Approx(0.3e-9));   // halfway
  CHECK(c.seconds_per_byte(22) == Approx(1.0e-9));  // ∝ M past the last point
  const RateCurve one = curve({{4, 8}});
  CHECK(one.seconds_per_byte(1) == Approx(0.125e-9));  // below the first point: the first
  CHECK(one.seconds_per_byte(8) == Approx(0.25e-9));
}

TEST_CASE("per-expert times, staging and disk reads of a K3 expert", "[cost]") {
  const ModelConfig cfg = k3_slice();
  const CostModel m(gpu_machine(), cfg);
  const double eb = 17547264;
  REQUIRE(m.costs().bytes_per_routed_expert == uint64_t(eb));
  CHECK(m.cpu_expert_seconds(1) == Approx(eb / 300e9));   // 58.5 µs
  CHECK(m.cpu_expert_seconds(16) == Approx(eb / 30e9));   // 585 µs
  CHECK(m.cpu_expert_seconds(32) == Approx(eb / 15e9));   // compute-bound: twice M=16
  CHECK(m.gpu_expert_seconds(1) == Approx(eb / 3000e9));  // 5.85 µs
  // Staging: the host copy into pinned memory (23 GB/s assumed) is slower than the DMA (50).
  CHECK(m.stage_seconds() == Approx(eb / 23e9));      // 763 µs
  CHECK(m.disk_read_seconds() == Approx(eb / 40e9));  // 4 drives × 10 GB/s
  CHECK(m.distinct_experts(1) == Approx(16));
  // 896·(1 − (880/896)^2) = 31.714…
  CHECK(m.distinct_experts(2) == Approx(896.0 * (1 - std::pow(880.0 / 896.0, 2))));
}

TEST_CASE("CPU experts between the two measured shapes go by expert size", "[cost]") {
  HardwareProfile hw = gpu_machine();
  hw.kernels.cpu_expert = curve({{1, 300}, {16, 30}});        // K3-shaped experts
  hw.kernels.cpu_expert_small = curve({{1, 100}, {16, 10}});  // the small shape
  // K3's experts: the K3 curve alone, as without the small curve.
  const CostModel big(hw, k3_slice());
  CHECK(big.cpu_expert_seconds(16) == Approx(17547264.0 / 30e9));
  // k3-mini's experts (512 → 384 → 512) are the small probe's shape: its curve alone.
  const CostModel small(hw, k3_mini());
  const double sb = double(small.costs().bytes_per_routed_expert);
  REQUIRE(sb == double(kSmallExpertBytes));
  CHECK(small.cpu_expert_seconds(1) == Approx(sb / 100e9));
  CHECK(small.cpu_expert_seconds(16) == Approx(sb / 10e9));
  // Between them: seconds per byte interpolated by log(size), halfway at the geometric mean.
  SynthOptions o;
  o.preset = "k3-mini";
  ModelConfig mid = parse_config(synth_config_json(o), "k3-mini");
  const double target = std::sqrt(double(kSmallExpertBytes) * double(kK3ExpertBytes));
  // Scale the expert's inner width until its size is the geometric mean (within a block row).
  mid.moe.intermediate_size =
      int(std::lround(double(mid.moe.intermediate_size) * target / sb / 32)) * 32;
  const CostModel m(hw, mid);
  const double b = double(m.costs().bytes_per_routed_expert);
  const double f = std::log(b / double(kSmallExpertBytes)) /
                   std::log(double(kK3ExpertBytes) / double(kSmallExpertBytes));
  CHECK(f == Approx(0.5).margin(0.02));
  const double spb16 = 1 / 10e9 + f * (1 / 30e9 - 1 / 10e9);
  CHECK(m.cpu_expert_seconds(16) == Approx(b * spb16));
  CHECK(m.cpu_expert_seconds(16) < b / 10e9);
  CHECK(m.cpu_expert_seconds(16) > b / 30e9);
}

TEST_CASE("the prefill staging threshold is the first M where copy + GPU beats the CPU", "[cost]") {
  // Seconds per byte (ns): stage = 1/5 = 0.2; GPU(M) = 0.001 + (M−1)/63·0.009;
  // CPU(M) = 0.1 + (M−1)/15·0.9. M=2: 0.2011 vs 0.16 (CPU wins); M=3: 0.2013 vs 0.22 (GPU wins).
  HardwareProfile hw = gpu_machine();
  hw.gpu.h2d_gbps = Rate(5);
  hw.kernels.cpu_expert = curve({{1, 10}, {16, 1}});
  hw.kernels.gpu_expert = curve({{1, 1000}, {64, 100}});
  CostOptions full;  // the DMA at the measured peak, for the arithmetic above
  full.assumptions.gpu_staging_dma_efficiency = 1.0;
  const CostModel m(hw, k3_slice(), full);
  CHECK(m.prefill_stage_threshold() == 3);
  CHECK(m.stage_seconds() + m.gpu_expert_seconds(3) < m.cpu_expert_seconds(3));
  CHECK(m.stage_seconds() + m.gpu_expert_seconds(2) > m.cpu_expert_seconds(2));
  // Past the last points both times grow ∝ M: a slow copy pays off only at large M. Seconds per
  // byte (ns): stage 1000, GPU 0.001·M, CPU 0.1·M → M > 1000 / 0.099 = 10101.01.
  hw.gpu.h2d_gbps = Rate(0.001);
  hw.kernels.cpu_expert = curve({{1, 10}});
  hw.kernels.gpu_expert = curve({{1, 1000}});
  CHECK(CostModel(hw, k3_slice(), full).prefill_stage_threshold() == 10102);
  // At the engine's staging efficiency (0.9 of the peak) it pays off later: 1000/0.9/0.099.
  CHECK(CostModel(hw, k3_slice()).prefill_stage_threshold() == 11224);
  // A GPU no faster than the CPU per token: never.
  hw.kernels.gpu_expert = curve({{1, 10}});
  CHECK(CostModel(hw, k3_slice()).prefill_stage_threshold() == CostModel::kNever);
  // No GPU: every GPU time is infinite and nothing is staged.
  HardwareProfile cpu = gpu_machine();
  cpu.gpu = GpuSpec{};
  cpu.kernels.cpu_trunk_ref = curve({{1, 2}});
  cpu.kernels.cpu_kda_ref_state_gbps = Rate(1);
  cpu.kernels.cpu_mla_ref_gflops = Rate(1);
  CostOptions co;
  co.trunk = TrunkBackend::cpu_reference;
  const CostModel c(cpu, k3_slice(), co);
  CHECK(std::isinf(c.gpu_expert_seconds(8)));
  CHECK(std::isinf(c.stage_seconds()));
  CHECK(c.prefill_stage_threshold() == CostModel::kNever);
}

TEST_CASE("a fast CPU backend step counts bench hw's linear calls, row ops and mixer rates",
          "[cost]") {
  const ModelConfig cfg = k3_mini();  // 6 KDA + 3 MLA layers, 1 dense + 8 MoE, latent + shared
  HardwareProfile hw;
  hw.host.cores = 16;
  hw.host.mem_read_gbps = Rate(100);
  hw.kernels.cpu_trunk_bf16 = curve({{1, 50}, {8, 25}, {256, 10}});
  hw.kernels.cpu_expert = curve({{1, 40}});
  CostOptions co;
  co.trunk = TrunkBackend::cpu_bf16;
  const Placement host{0, 1, 0};
  const double d0 = CostModel(hw, cfg, co).decode_step(host, 1, 100).step_s;
  const double p0 = CostModel(hw, cfg, co).prefill(host, 256, 256).total_s;
  // Decode fuses one input's projections: per KDA layer q..g | f_b | g_b | o = 4 calls, per MLA
  // layer 3 (q_lora) or 2, the dense MLP 2, a MoE layer 3 (router..shared gate/up | latent up |
  // shared down), the logits 1. Prefill makes one call per matrix.
  const CostModel m0(hw, cfg, co);
  const int kda = cfg.kda.full_rank_output_gate ? 3 : 4, mla = cfg.mla.q_lora_rank > 0 ? 3 : 2;
  CHECK(m0.fast_linear_calls(true) ==
        1 + 6 * kda + 3 * mla + 2 +
            8 * (1 + (cfg.moe.latent_size > 0) + (cfg.moe.num_shared_experts > 0)));
  CHECK(m0.fast_linear_calls(false) > m0.fast_linear_calls(true));
  hw.kernels.cpu_linear_call_us = Rate(10);
  hw.kernels.cpu_row_ops_ns = Rate(1000);
  const CostModel m(hw, cfg, co);
  const double per_token_rows = cfg.num_layers * (cfg.hidden_size / 1024.0) * 1000e-9;
  const double d1 = m.decode_step(host, 1, 100).step_s;
  CHECK(d1 - d0 == Approx(m.fast_linear_calls(true) * 10e-6 + per_token_rows));
  const double p1 = m.prefill(host, 256, 256).total_s;
  CHECK(p1 - p0 == Approx(m.fast_linear_calls(false) * 10e-6 + 256 * per_token_rows));
  // The fast mixers' measured rates replace the host peaks: KDA state at 1 GB/s, MLA at 1 GFLOP/s.
  hw.kernels.cpu_kda_fast_state_gbps = Rate(1);
  hw.kernels.cpu_mla_fast_gflops = Rate(1);
  const CostModel mm(hw, cfg, co);
  CHECK(mm.kda_decode_seconds(2) == Approx(2.0 * 2.0 * double(mm.costs().kda_state_bytes) / 1e9));
  // MLA decode: the cached positions and each query's kv_b absorption (W_UK in, W_UV out).
  const double absorb = 2.0 * cfg.mla.num_heads * cfg.mla.kv_lora_rank *
                        (cfg.mla.qk_nope_head_dim + cfg.mla.v_head_dim);
  CHECK(mm.mla_decode_seconds(1, 100) ==
        Approx((2.0 * cfg.mla.num_heads * (2 * cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim) *
                    100.0 +
                absorb) *
               cfg.num_mla_layers() / 1e9));
  const DecodeEstimate d = mm.decode_step(host, 1, 100);
  bool fixed_part = false;
  for (const auto& t : d.parts) fixed_part |= t.name.find("row ops") != std::string::npos;
  CHECK(fixed_part);
}

TEST_CASE("a CPU reference decode step is the sum of its parts", "[cost]") {
  const ModelConfig cfg = k3_mini();
  HardwareProfile hw;
  hw.host.cores = 2;
  hw.host.mem_read_gbps = Rate(10);
  hw.kernels.cpu_trunk_ref = curve({{1, 2}, {32, 0.5}});
  hw.kernels.cpu_expert = curve({{1, 4}});
  hw.kernels.cpu_kda_ref_state_gbps = Rate(1);
  hw.kernels.cpu_mla_ref_gflops = Rate(1);
  CostOptions co;
  co.trunk = TrunkBackend::cpu_reference;
  const CostModel m(hw, cfg, co);
  const ModelCosts& k = m.costs();
  const int64_t ctx = 100;
  // trunk: every non-routed weight except the embedding, at 2 GB/s.
  const double embed = double(cfg.vocab_size) * cfg.hidden_size * 2;
  const double trunk = double(k.total_bytes) - double(k.components[5].bytes) - embed;
  REQUIRE(k.components[5].name == "routed_experts");
  CHECK(double(m.trunk_bytes()) == Approx(trunk));
  const double t_trunk = trunk / 2e9;
  const double t_kda = 2.0 * double(k.kda_state_bytes) / 1e9;
  // MLA: 2·H·(2·kv_lora + rope) FLOPs per cached position and layer, and 2·H·kv_lora·(nope + v)
  // per query for kv_b's absorption, at 1 GFLOP/s.
  const double t_mla =
      2.0 * cfg.mla.num_heads *
      ((2 * cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim) * double(ctx) +
       double(cfg.mla.kv_lora_rank) * (cfg.mla.qk_nope_head_dim + cfg.mla.v_head_dim)) *
      cfg.num_mla_layers() / 1e9;
  // Experts: top-k distinct experts per MoE layer at batch 1, one token each, at 4 GB/s.
  const double t_exp =
      double(cfg.moe.top_k) * cfg.num_moe_layers() * double(k.bytes_per_routed_expert) / 4e9;
  // Fixed costs: 115 linear calls (6 KDA layers × 8 projections, 3 MLA × 5, the dense layer's 3,
  // 8 MoE layers × router, latent down/up and the shared experts' 3, the logits) and 8 CPU expert
  // jobs.
  const CostAssumptions a;
  const double t_fixed = 115 * a.cpu_ref_linear_call_us * 1e-6 + 8 * a.cpu_expert_call_us * 1e-6;
  const DecodeEstimate d = m.decode_step(Placement{0, 1, 0}, 1, ctx);
  CHECK(d.experts_per_layer == Approx(cfg.moe.top_k));
  CHECK(d.tokens_per_expert == Approx(1));
  CHECK(d.step_s == Approx(t_trunk + t_kda + t_mla + t_exp + t_fixed));
  CHECK(d.tokens_per_s == Approx(1.0 / d.step_s));
  CHECK(d.bottleneck.find("dense trunk") == 0);
  // Disk reads overlap the CPU work (router-lookahead prefetch) under moe-layer...
  hw.disk.count = 1;
  hw.disk.read_gbps = Rate(0.001);  // so slow that the disk dominates
  const CostModel md(hw, cfg, co);
  // Half the experts in the host cache: one step touches top_k of E per layer, and an expert
  // survives in the LRU cache floor(ln(1 − 0.5) / ln(1 − top_k / E)) steps.
  const double f = double(cfg.moe.top_k) / cfg.moe.num_experts;
  const double miss = std::pow(1 - f, std::floor(std::log(0.5) / std::log(1 - f)));
  REQUIRE(miss == Approx(0.5).epsilon(0.05));
  const double t_disk =
      miss * cfg.moe.top_k * cfg.num_moe_layers() * double(k.bytes_per_routed_expert) / 1e6;
  const DecodeEstimate dd = md.decode_step(Placement{0, 0.5, 0.5}, 1, ctx);
  CHECK(dd.step_s == Approx(t_disk));
  CHECK(dd.bottleneck.find("disk") != std::string::npos);
  // ...and add to it when serial.
  co.overlap = Overlap::serial;
  const CostModel ms(hw, cfg, co);
  CHECK(ms.decode_step(Placement{0, 0.5, 0.5}, 1, ctx).step_s ==
        Approx(t_trunk + t_kda + t_mla + t_exp + t_fixed + t_disk));
  // Prefill: lm_head only for the last token of the chunk.
  const double head = double(cfg.vocab_size) * cfg.hidden_size * 2;
  CHECK(m.trunk_prefill_seconds(32) == Approx((trunk - head) / 0.5e9 + head / 2e9));
}

ModelConfig k3_slice8() {  // the validation slice: 8 layers (6 KDA, 2 MLA), 64 experts top-16
  SynthOptions o;
  o.preset = "k3-slice";
  o.layers = 8;
  o.experts = 64;
  return parse_config(synth_config_json(o), "k3-slice8");
}

TEST_CASE("GPU engine: a GEMM at the trunk curve's shape takes the curve's time", "[cost]") {
  const CostModel m(gpu_machine(), k3_slice());
  // 12288×7168 bf16 = 176.2 MB at 3000 GB/s (M = 1): the fixed cost is inside the measurement.
  CHECK(m.gpu_gemm_seconds(12288, 7168, 1) == Approx(2.0 * 12288 * 7168 / 3000e9));
  // A small GEMM pays the fixed cost: 96×7168 is 1.4 MB, 0.46 µs of bytes, plus 4 µs.
  const double fixed = CostAssumptions{}.gpu_gemm_fixed_us * 1e-6;
  CHECK(m.gpu_gemm_seconds(96, 7168, 1) > fixed);
  CHECK(m.gpu_gemm_seconds(96, 7168, 1) < fixed + 2.0 * 96 * 7168 / 3000e9);
  // Flat routing: the histogram of tokens per expert covers U(B) experts and B·k pairs.
  for (int64_t T : {1, 8, 512}) {
    double experts = 0, pairs = 0;
    for (auto [mm, n] : m.tokens_per_expert(T)) experts += n, pairs += double(mm) * n;
    CHECK(experts == Approx(m.distinct_experts(double(T))).epsilon(1e-6));
    CHECK(pairs == Approx(double(T) * 16).epsilon(1e-6));
  }
}

TEST_CASE("GPU engine decode: one stream, host round trips where the host groups, CPU beside GPU",
          "[cost]") {
  const ModelConfig cfg = k3_slice8();
  const HardwareProfile hw = gpu_machine();
  const CostModel m(hw, cfg);
  const int moe = cfg.num_moe_layers();
  REQUIRE(moe == 7);
  const CostAssumptions a;
  const double eb = double(m.costs().bytes_per_routed_expert);
  // All experts cached: nothing overlaps; the step is the sum of its parts. B = 1 routes 16
  // experts per MoE layer with one token each, at the engine's share of the GPU curve's M = 1
  // rate; the groups are built on the device (5 small kernels with the grouped launch) and the
  // only host round trip is the logits'.
  const auto all = m.engine_step(Placement{1, 0, 0}, 1, 1, true, 256, true);
  CHECK(all.seconds ==
        Approx(all.gpu_dense_s + all.gpu_attention_s + all.gpu_experts_s + all.host_s));
  const double gpu_rate = 3000e9 * a.gpu_engine_expert_efficiency;  // 16 experts, not bench's 128
  CHECK(all.gpu_experts_s == Approx(moe * (16 * eb / gpu_rate + 5 * a.gpu_kernel_us * 1e-6)));
  CHECK(all.cpu_experts_s == 0);
  CHECK(all.syncs == 1);
  CHECK(all.host_s == Approx(a.gpu_sync_us * 1e-6));
  // The engine before device groups: each MoE layer's routing goes to the host and back (one
  // synchronisation and the host's grouping each), the lists go up with the grouped launch.
  CostOptions host_groups;
  host_groups.assumptions.gpu_device_groups = 0;
  const auto hg =
      CostModel(hw, cfg, host_groups).engine_step(Placement{1, 0, 0}, 1, 1, true, 256, true);
  CHECK(hg.syncs == moe + 1);
  CHECK(hg.host_s == Approx(hg.syncs * a.gpu_sync_us * 1e-6 + moe * a.gpu_moe_host_us * 1e-6));
  CHECK(hg.gpu_experts_s == Approx(moe * (16 * eb / gpu_rate + 8 * a.gpu_kernel_us * 1e-6)));
  CHECK(hg.seconds > all.seconds + moe * a.gpu_sync_us * 1e-6);
  // Past 4096 (token, expert) pairs (a 512-row prefill chunk: 8192) the host groups them.
  CHECK(m.engine_step(Placement{1, 0, 0}, 512, 1, false, 0, true).syncs == moe + 1);
  CHECK(m.decode_step(Placement{1, 0, 0}, 1, 256).step_s == Approx(all.seconds));
  // All in host memory: the CPU computes the 16 experts of each layer at M = 1 (300 GB/s, at the
  // engine's share of the curve) while the GPU waits, then the shared experts run (CUDA graphs:
  // after the join).
  const auto host = m.engine_step(Placement{0, 1, 0}, 1, 1, true, 256, true);
  const double cpu_rate = 300e9 * a.gpu_engine_cpu_expert_efficiency;
  const double cpu_layer = 16 * eb / cpu_rate + a.cpu_expert_call_us * 1e-6;
  CHECK(host.cpu_experts_s == Approx(moe * cpu_layer));
  // The CPU rows go back up: one fp32 row of the latent width per pair, at 50 GB/s.
  const double row_up = 3584 * 4 / 50e9;
  CHECK(host.seconds == Approx(host.gpu_dense_s + host.gpu_attention_s + host.host_s +
                               moe * (cpu_layer + a.gpu_kernel_us * 1e-6 + 16 * row_up)));
  // Half cached: per MoE layer the longer of the two branches, not their sum.
  const auto half = m.engine_step(Placement{0.5, 0.5, 0}, 1, 1, true, 256, true);
  const double g = 8 * eb / gpu_rate + 8 * a.gpu_kernel_us * 1e-6;
  const double c = 8 * eb / cpu_rate + a.cpu_expert_call_us * 1e-6;
  CHECK(half.seconds == Approx(half.gpu_dense_s + half.gpu_attention_s + half.host_s +
                               moe * (std::max(g, c) + a.gpu_kernel_us * 1e-6 + 8 * row_up)));
  // Measured fixed costs in the profile replace the assumptions.
  HardwareProfile hw2 = hw;
  hw2.kernels.gpu_sync_us = Rate(100);
  const auto slow = CostModel(hw2, cfg).engine_step(Placement{1, 0, 0}, 1, 1, true, 256, true);
  CHECK(slow.seconds - all.seconds ==
        Approx(all.syncs * (100 - a.gpu_sync_us) * 1e-6).epsilon(1e-6));
  // Full overlap is never slower than the engine, serial never faster.
  CostOptions full, serial_o;
  full.overlap = Overlap::full;
  serial_o.overlap = Overlap::serial;
  const Placement p{0.25, 0.75, 0};
  const double d = m.decode_step(p, 8, 256).step_s;
  CHECK(CostModel(hw, cfg, full).decode_step(p, 8, 256).step_s <= d);
  CHECK(CostModel(hw, cfg, serial_o).decode_step(p, 8, 256).step_s >= d);
  // A placement with experts in a GPU cache needs the GPU backend.
  HardwareProfile cpu = hw;
  cpu.kernels.cpu_trunk_ref = curve({{1, 2}});
  cpu.kernels.cpu_kda_ref_state_gbps = Rate(1);
  cpu.kernels.cpu_mla_ref_gflops = Rate(1);
  CostOptions co;
  co.trunk = TrunkBackend::cpu_reference;
  CHECK_THROWS_AS(CostModel(cpu, cfg, co).decode_step(p, 1, 10), Error);
  CHECK_THROWS_AS(m.decode_step(Placement{0.5, 0.6, 0}, 1, 10), Error);  // sums to 1.1
}

TEST_CASE(
    "GPU engine: the step's GEMM list covers the trunk, and its model-shape rate replaces "
    "the one-shape curve for that model only",
    "[cost]") {
  const ModelConfig cfg = k3_slice8();
  const HardwareProfile hw = gpu_machine();
  const CostModel m(hw, cfg);
  // Every trunk matrix but kv_b (inside the MLA core), norms, conv weights and biases.
  const auto gemms = gpu_step_gemms(cfg);
  double bytes = 0, shared = 0, head = 0;
  for (const auto& g : gemms) {
    const double b = 2.0 * double(g.out) * double(g.in);
    bytes += b;
    if (g.kind == GpuGemm::Kind::shared) shared += b;
    if (g.kind == GpuGemm::Kind::head) head += b;
  }
  CHECK(head == double(m.head_bytes()));
  CHECK(shared > 0);
  CHECK(bytes <= double(m.trunk_bytes()));
  CHECK(bytes > 0.97 * double(m.trunk_bytes()));
  const auto base = m.engine_step(Placement{1, 0, 0}, 1, 1, true, 256, true);
  CHECK(base.gemms == int(gemms.size()));
  // The same hardware with this model's step timed at 1 and 8 rows: every GEMM of a decode step
  // at up to 8 rows takes that rate (fixed costs inside), larger steps keep the one-shape curve.
  HardwareProfile own = hw;
  own.model_shapes.signature = model_shape_signature(cfg);
  own.model_shapes.model = "k3-slice8";
  own.model_shapes.gpu_trunk = curve({{1, 2500}, {8, 2400}});
  const CostModel mo(own, cfg);
  CHECK(mo.rates_basis().find("this model's shapes") != std::string::npos);
  CHECK(mo.gpu_gemm_seconds(12288, 7168, 1) == Approx(2.0 * 12288 * 7168 / 2500e9));
  CHECK(mo.gpu_gemm_seconds(96, 7168, 8) == Approx(2.0 * 96 * 7168 / 2400e9));
  CHECK(mo.gpu_gemm_seconds(12288, 7168, 512) == m.gpu_gemm_seconds(12288, 7168, 512));
  const auto ownstep = mo.engine_step(Placement{1, 0, 0}, 1, 1, true, 256, true);
  const auto kvb = mo.gpu_gemm_seconds(
      double(cfg.mla.num_heads) * (cfg.mla.qk_nope_head_dim + cfg.mla.v_head_dim),
      cfg.mla.kv_lora_rank, 1);
  // The step's GEMM time moved by exactly the list's bytes at the new rate (the kv_b GEMMs of
  // the MLA layers, part of attention, moved with it).
  CHECK(ownstep.gpu_dense_s - base.gpu_dense_s == Approx(bytes / 2500e9 -
                                                         [&] {
                                                           double t = 0;
                                                           for (const auto& g : gemms)
                                                             t += m.gpu_gemm_seconds(
                                                                 double(g.out), double(g.in), 1);
                                                           return t;
                                                         }())
                                                      .epsilon(1e-6));
  CHECK(ownstep.gpu_attention_s - base.gpu_attention_s ==
        Approx(cfg.num_mla_layers() *
               (kvb - m.gpu_gemm_seconds(double(cfg.mla.num_heads) *
                                             (cfg.mla.qk_nope_head_dim + cfg.mla.v_head_dim),
                                         cfg.mla.kv_lora_rank, 1)))
            .epsilon(1e-6));
  // Another model's rates are set aside, with a note.
  HardwareProfile other = own;
  other.model_shapes.signature = model_shape_signature(k3_mini());
  const CostModel mx(other, cfg);
  CHECK(mx.gpu_gemm_seconds(12288, 7168, 1) == m.gpu_gemm_seconds(12288, 7168, 1));
  CHECK(mx.rates_basis().find("another model") != std::string::npos);
}

TEST_CASE("GPU engine prefill: staged rounds are copied on the host, then computed", "[cost]") {
  const ModelConfig cfg = k3_slice8();
  const HardwareProfile hw = gpu_machine();
  const CostModel m(hw, cfg);
  const int moe = cfg.num_moe_layers();
  const double eb = double(m.costs().bytes_per_routed_expert);
  REQUIRE(m.prefill_stage_threshold() < 100);
  // A 512-token chunk gives every one of the 64 experts ≈ 128 tokens: all of them are staged
  // when none is cached, copied at the slower of the host copy (23 GB/s) and host→device (50).
  const auto st = m.engine_step(Placement{0, 1, 0}, 512, 1, false, 0, true);
  CHECK(st.staged_experts == Approx(64.0 * moe).epsilon(1e-6));
  CHECK(st.cpu_experts == Approx(0).margin(1e-6));
  CHECK(st.stage_copy_s == Approx(64.0 * moe * eb / 23e9).epsilon(1e-6));
  // Two rounds of 32 per layer: the first round's copy is not hidden, so the chunk takes at
  // least the GPU's own work plus 32 copies per layer.
  const auto cached = m.engine_step(Placement{1, 0, 0}, 512, 1, false, 0, true);
  CHECK(st.seconds >= cached.seconds + moe * 32 * eb / 23e9);
  CHECK(st.seconds <= cached.seconds + st.stage_copy_s + st.host_s);
  // The prefill estimate sums its chunks; only the last one computes logits.
  const PrefillEstimate pf = m.prefill(Placement{0, 1, 0}, 1024, 512);
  CHECK(pf.chunks == 2);
  const auto first = m.engine_step(Placement{0, 1, 0}, 512, 1, false, 0, false);
  const auto second = m.engine_step(Placement{0, 1, 0}, 512, 1, false, 512, true);
  CHECK(pf.total_s == Approx(first.seconds + second.seconds));
  CHECK(pf.staged_experts_per_chunk == Approx(64.0 * moe).epsilon(1e-6));
}

TEST_CASE("GPU engine prefill: staging from a page-locked host cache is the DMA alone", "[cost]") {
  const ModelConfig cfg = k3_slice8();
  const HardwareProfile hw = gpu_machine();
  const int moe = cfg.num_moe_layers();
  const CostModel copied(hw, cfg);
  CostOptions co;
  co.staging_dma = true;
  const CostModel direct(hw, cfg, co);
  const double eb = double(direct.costs().bytes_per_routed_expert);
  // host→device at the engine's staging efficiency, no copy
  const double dma = 50e9 * co.assumptions.gpu_staging_dma_efficiency;
  REQUIRE(co.assumptions.gpu_staging_dma_efficiency < 1.0);
  CHECK(direct.stage_seconds() == Approx(eb / dma).epsilon(1e-9));
  CHECK(copied.stage_seconds() == Approx(eb / 23e9).epsilon(1e-9));
  CHECK(direct.prefill_stage_threshold() <= copied.prefill_stage_threshold());
  const auto a = copied.engine_step(Placement{0, 1, 0}, 512, 1, false, 0, true);
  const auto b = direct.engine_step(Placement{0, 1, 0}, 512, 1, false, 0, true);
  REQUIRE(b.staged_experts == Approx(64.0 * moe).epsilon(1e-6));
  CHECK(b.stage_copy_s == 0);
  CHECK(b.stage_dma_s == Approx(64.0 * moe * eb / dma).epsilon(1e-6));
  CHECK(a.stage_dma_s == Approx(b.stage_dma_s));
  // Each layer's 64 experts cross the link in 2 rounds: at least the DMAs, less than the copies.
  const auto cached = direct.engine_step(Placement{1, 0, 0}, 512, 1, false, 0, true);
  CHECK(b.seconds >= cached.seconds + moe * 32 * eb / 50e9);
  CHECK(b.seconds < a.seconds - moe * 32 * eb * (1 / 23e9 - 1 / 50e9));
  // A disk share: the store exists, so its cache is page-locked (DMA) and the staged experts it
  // does not hold are read from disk first, on the step's path: a chunk touching every expert of
  // every layer is a scan, and the 30 % cache keeps what it held but for one layer's reads.
  const Placement disk{0, 0.3, 0.7};
  const auto d = copied.engine_step(disk, 512, 1, false, 0, true);
  CHECK(d.stage_copy_s == 0);
  CHECK(copied.host_miss_share(disk, 64) == Approx(1 - (0.3 - 1.0 / moe)));
  CHECK(d.disk_s ==
        Approx(64.0 * moe * copied.host_miss_share(disk, 64) * copied.disk_read_seconds())
            .epsilon(1e-6));
  CHECK(d.seconds >= d.disk_s);
  CHECK(d.seconds >= b.seconds);  // never faster than staging from the cache alone
}

TEST_CASE("a pipeline of GPUs raises throughput only when there are micro-batches", "[cost]") {
  const ModelConfig cfg = k3_slice();
  const CostModel one(gpu_machine(1), cfg), four(gpu_machine(4), cfg);
  const Placement p{0.2, 0.8, 0};
  // One sequence goes through every layer either way.
  CHECK(four.decode_step(p, 1, 1000).step_s == Approx(one.decode_step(p, 1, 1000).step_s));
  // Eight sequences on four stages: four micro-batches of two; the step is bounded below by a
  // micro-batch's latency and by the host serving all micro-batches' CPU experts.
  const DecodeEstimate d = four.decode_step(p, 8, 1000);
  const DecodeEstimate mb = one.decode_step(p, 2, 1000);
  CHECK(d.step_s >= mb.step_s * 0.999);
  double cpu2 = 0;
  for (auto& t : mb.parts)
    if (t.resource == "cpu") cpu2 += t.seconds;
  CHECK(d.step_s >= 4 * cpu2 * 0.999);
  CHECK(d.tokens_per_s == Approx(8 / d.step_s));
}

TEST_CASE("the roofline uses hardware peaks only", "[cost]") {
  const ModelConfig cfg = k3_slice();
  HardwareProfile hw = gpu_machine();
  const Placement p{0.1, 0.9, 0};
  const Roofline a = CostModel(hw, cfg).decode_roofline(p, 1, 1000);
  // Slower kernels do not move it...
  hw.kernels.cpu_expert = curve({{1, 1}});
  hw.kernels.gpu_trunk = curve({{1, 1}});
  const Roofline b = CostModel(hw, cfg).decode_roofline(p, 1, 1000);
  CHECK(a.seconds == Approx(b.seconds));
  // ...and at B = 1 it is the step's dependencies at the peaks: the GPU's serial work (trunk but
  // the shared experts, attention state) at 4000 GB/s, then per MoE layer the larger of the GPU's
  // experts (shared, 10% of the routed) and the host reading 90% of 16 experts at 400 GB/s.
  const CostModel cm(hw, cfg);
  const double routed = 16.0 * cfg.num_moe_layers() * 17547264.0;
  double shared = 0;
  for (const auto& c : cm.costs().components)
    if (c.name == "shared_experts") shared = double(c.bytes);
  const double host = 0.9 * routed / 400e9;
  const double attn = 2.0 * double(cm.costs().kda_state_bytes) +
                      1000.0 * double(cm.costs().mla_cache_bytes_per_token);
  const double serial = (double(cm.trunk_bytes()) - shared + attn) / 4000e9;
  const double gpu_moe = (shared + 0.1 * routed) / 4000e9;
  CHECK(shared > 0);
  CHECK(a.seconds == Approx(serial + std::max(host, gpu_moe)));
  // All experts on the GPU: one resource, the step's bytes at the copy peak.
  const Roofline g = cm.decode_roofline({1, 0, 0}, 1, 1000);
  CHECK(g.seconds == Approx((double(cm.trunk_bytes()) + routed + attn) / 4000e9));
  // With 8 sequences the roofline is the faster of layer after layer and micro-batches that
  // overlap the CPU and the GPU: never above the layer-serial bound, never below full overlap.
  const Roofline b8 = cm.decode_roofline(p, 8, 1000);
  const double n8 = cm.distinct_experts(8) * cfg.num_moe_layers() * 17547264.0;
  const double attn8 = 2.0 * 8 * double(cm.costs().kda_state_bytes) +
                       8000.0 * double(cm.costs().mla_cache_bytes_per_token);
  const double serial8 = (double(cm.trunk_bytes()) - shared + attn8) / 4000e9;
  const double layers8 = serial8 + std::max(0.9 * n8 / 400e9, (shared + 0.1 * n8) / 4000e9);
  CHECK(b8.seconds <= layers8 * 1.000001);
  CHECK(b8.seconds >= std::max(0.9 * n8 / 400e9, serial8) * 0.999999);
  // Unknown peaks are named, not zero.
  hw.host.mem_read_gbps = Rate();
  hw.kernels.cpu_expert = curve({{1, 300}});
  const Roofline c = CostModel(hw, cfg).decode_roofline(p, 1, 1000);
  REQUIRE(c.missing.size() == 1);
  CHECK(c.missing[0] == "host.mem_read_gbps");
}

TEST_CASE("missing rates are refused with the field named", "[cost][errors]") {
  const ModelConfig cfg = k3_slice();
  HardwareProfile hw = gpu_machine();
  hw.source = "hw.json";
  hw.gpu.count = 0;
  try {
    CostModel m(hw, cfg);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "hw.json: gpu.count: not measured or stated; the GPU backend "
          "needs a GPU");
  }
  CostOptions co;
  co.trunk = TrunkBackend::cpu_reference;
  try {
    CostModel m(hw, cfg, co);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("kernels.cpu_trunk_ref") != std::string::npos);
  }
}

namespace {
// A fast-CPU-backend profile with K3-shaped probes only (round numbers).
HardwareProfile k3_shaped_cpu() {
  HardwareProfile hw;
  hw.source = "k3.json";
  hw.host.cores = 16;
  hw.host.mem_read_gbps = Rate(100);
  hw.kernels.cpu_trunk_bf16 = curve({{1, 50}, {8, 25}, {256, 10}});
  hw.kernels.cpu_expert = curve({{1, 40}, {16, 20}});
  hw.kernels.cpu_linear_call_us = Rate(5);
  hw.kernels.cpu_row_ops_ns = Rate(1000);
  hw.kernels.cpu_kda_fast_state_gbps = Rate(50);
  hw.kernels.cpu_kda_fast_prefill_gflops = Rate(200);
  hw.kernels.cpu_mla_fast_gflops = Rate(100);
  hw.kernels.cpu_mla_fast_prefill_gflops = Rate(400);
  return hw;
}
// Model-shape rates for `cfg`, each `slow` times slower than k3_shaped_cpu()'s (a small model's
// shapes run below the K3-shaped probes), row ops and call cost `slow` times higher.
ModelShapeRates shapes_for(const ModelConfig& cfg, double slow) {
  ModelShapeRates ms;
  ms.signature = model_shape_signature(cfg);
  ms.model = "test model";
  ms.threads = 16;
  ms.trunk = curve({{1, 50 / slow}, {8, 25 / slow}, {256, 10 / slow}});
  ms.linear_call_us = Rate(5 * slow);
  ms.expert = curve({{1, 40 / slow}, {16, 20 / slow}});
  ms.kda_decode_gbps = curve({{1, 50 / slow}, {8, 100 / slow}});
  ms.kda_prefill_gflops = curve({{256, 200 / slow}});
  ms.mla_decode_gflops = curve({{1, 100 / slow}});
  ms.mla_prefill_gflops = curve({{256, 400 / slow}});
  ms.row_ops_ns = curve({{1, 1000 * slow}});
  return ms;
}
// k3-mini on the fast CPU backend with the K3-shaped probes.
struct FastCpu {
  ModelConfig cfg = k3_mini();
  CostOptions co = [] {
    CostOptions o;
    o.trunk = TrunkBackend::cpu_bf16;
    return o;
  }();
  HardwareProfile hw = k3_shaped_cpu();
  Placement host{0, 1, 0};
  CostModel model() const { return CostModel(hw, cfg, co); }
};
}  // namespace

TEST_CASE("the fast backend's step calls cover the trunk and identify the model", "[cost]") {
  const ModelConfig cfg = k3_mini();
  HardwareProfile hw = k3_shaped_cpu();
  CostOptions co;
  co.trunk = TrunkBackend::cpu_bf16;
  const CostModel m(hw, cfg, co);
  // The probe times these calls: the same count the model charges, every trunk matrix but kv_b
  // (inside the MLA core), norms and conv weights, i.e. nearly all of the trunk's bytes.
  for (bool fused : {true, false}) {
    const auto calls = fast_step_linears(cfg, fused);
    CHECK(int(calls.size()) + 1 == m.fast_linear_calls(fused));
    double bytes = double(m.head_bytes());
    for (const auto& c : calls)
      for (auto [r, k] : c.matrices) {
        CHECK(k == c.matrices[0].second);  // one input per call
        bytes += 2.0 * double(r) * double(k);
      }
    CHECK(bytes <= double(m.trunk_bytes()));
    CHECK(bytes > 0.97 * double(m.trunk_bytes()));
  }
  // The signature changes with any shape the pieces depend on, not with anything else.
  ModelConfig more = cfg;
  more.moe.num_experts = 128;
  ModelConfig wider = cfg;
  wider.kda.num_heads = 16;
  ModelConfig renamed = cfg;
  renamed.source = "elsewhere/config.json";
  CHECK(model_shape_signature(more) != model_shape_signature(cfg));
  CHECK(model_shape_signature(wider) != model_shape_signature(cfg));
  CHECK(model_shape_signature(renamed) == model_shape_signature(cfg));
  CHECK(model_shape_signature(k3_slice()) != model_shape_signature(cfg));
}

TEST_CASE("model-shape rates replace the K3-shaped probes for their model, in the same formulas",
          "[cost]") {
  FastCpu f;
  const ModelConfig& cfg = f.cfg;
  HardwareProfile& hw = f.hw;
  const CostModel k3 = f.model();
  CHECK(!k3.uses_model_shapes());
  CHECK(k3.rates_basis().find("K3-shaped probes (the profile has no model-shape rates") !=
        std::string::npos);
  // Rates measured at this model's shapes: 3× slower than the K3-shaped ones.
  hw.model_shapes = shapes_for(cfg, 3);
  const CostModel ms(hw, cfg, f.co);
  REQUIRE(ms.uses_model_shapes());
  CHECK(ms.rates_basis().find("model-shape probes measured for this model (test model") !=
        std::string::npos);
  CHECK(ms.describe_rates().front() == ms.rates_basis());
  // Every piece reads its model-shape input through the same formula: 3× the time.
  CHECK(ms.trunk_seconds(1) == Approx(3 * k3.trunk_seconds(1)));
  CHECK(ms.trunk_prefill_seconds(256) == Approx(3 * k3.trunk_prefill_seconds(256)));
  CHECK(ms.cpu_expert_seconds(4) == Approx(3 * k3.cpu_expert_seconds(4)));
  CHECK(ms.kda_decode_seconds(1) == Approx(3 * k3.kda_decode_seconds(1)));
  CHECK(ms.kda_prefill_seconds(256) == Approx(3 * k3.kda_prefill_seconds(256)));
  CHECK(ms.mla_decode_seconds(1, 80) == Approx(3 * k3.mla_decode_seconds(1, 80)));
  CHECK(ms.mla_prefill_seconds(256, 0) == Approx(3 * k3.mla_prefill_seconds(256, 0)));
  // Fixed costs: the call cost and row ops 3×, the CPU expert jobs (assumed) unchanged.
  const double jobs = cfg.num_moe_layers() * CostAssumptions{}.cpu_expert_call_us * 1e-6;
  CHECK(ms.fast_fixed_seconds(1, true) - jobs ==
        Approx(3 * (k3.fast_fixed_seconds(1, true) - jobs)));
  // So the whole predictions are 3× slower, decode and prefill alike.
  const double k3_d1 = k3.decode_step(f.host, 1, 80).step_s,
               k3_d8 = k3.decode_step(f.host, 8, 80).step_s;
  CHECK(ms.decode_step(f.host, 1, 80).step_s == Approx(3 * k3_d1 - 2 * jobs));
  CHECK(ms.decode_step(f.host, 8, 80).step_s > 1.5 * k3_d8);  // its KDA curve is faster at B = 8
  CHECK(ms.prefill(f.host, 256, 256).tokens_per_s <
        k3.prefill(f.host, 256, 256).tokens_per_s / 2.5);
  // Rates that depend on the step: KDA decode at 8 sequences reads its curve's B = 8 point.
  CHECK(ms.kda_decode_seconds(8) ==
        Approx(2.0 * 8 * double(ms.costs().kda_state_bytes) / (100.0 / 3 * 1e9)));
  // The routed step timed per decode batch (expert_decode) sets the decode step's experts: the
  // touched experts' bytes at its rate for B, in place of the expert curve at B·k / U(B).
  auto experts_s = [&](const CostModel& m, int B) {
    for (const auto& part : m.decode_step(f.host, B, 80).parts)
      if (part.name == "routed experts on the CPU (host memory)") return part.seconds;
    FAIL("no routed experts part");
    return 0.0;
  };
  const double eb = double(ms.costs().bytes_per_routed_expert), L = cfg.num_moe_layers();
  CHECK(experts_s(ms, 8) == Approx(ms.distinct_experts(8) * L * eb *
                                   ms.hardware().model_shapes.expert.seconds_per_byte(
                                       8.0 * cfg.moe.top_k / ms.distinct_experts(8))));
  hw.model_shapes.expert_decode = curve({{1, 10}, {8, 30}});
  const CostModel dec(hw, cfg, f.co);
  CHECK(experts_s(dec, 8) == Approx(dec.distinct_experts(8) * L * eb / 30e9));
  CHECK(experts_s(dec, 1) == Approx(cfg.moe.top_k * L * eb / 10e9));
  CHECK(experts_s(dec, 4) == Approx(dec.distinct_experts(4) * L * eb /
                                    (hw.model_shapes.expert_decode.value_at(4) * 1e9)));
  // Faster model-shape rates give a faster prediction: the direction follows the input.
  hw.model_shapes = shapes_for(cfg, 0.5);
  CHECK(CostModel(hw, cfg, f.co).decode_step(f.host, 1, 80).step_s < k3_d1);
  // The other backends do not read them (they are the fast CPU backend's pieces).
  f.co.trunk = TrunkBackend::cpu_reference;
  hw.kernels.cpu_trunk_ref = curve({{1, 2}});
  hw.kernels.cpu_kda_ref_state_gbps = Rate(1);
  hw.kernels.cpu_mla_ref_gflops = Rate(1);
  const CostModel ref(hw, cfg, f.co);
  CHECK(!ref.uses_model_shapes());
  CHECK(ref.rates_basis().empty());
}

TEST_CASE("the step probe's factor scales the fast CPU step and is a part of its own", "[cost]") {
  FastCpu f;
  f.hw.model_shapes = shapes_for(f.cfg, 1);
  const CostModel alone = f.model();
  CHECK(alone.step_factor(8) == 1);  // no step probe: the parts' sum
  // 1.2× at 1 token, 1.5× from 8 (linear between, flat past the ends).
  f.hw.model_shapes.step_factor = curve({{1, 1.2}, {8, 1.5}});
  const CostModel together = f.model();
  CHECK(together.step_factor(1) == Approx(1.2));
  CHECK(together.step_factor(4) == Approx(1.2 + 0.3 * 3 / 7));
  CHECK(together.step_factor(1024) == Approx(1.5));
  auto part = [](const auto& parts) {
    for (const auto& p : parts)
      if (p.name.rfind("the parts together in one step", 0) == 0) return p.seconds;
    return 0.0;
  };
  for (int B : {1, 8}) {
    const DecodeEstimate a = alone.decode_step(f.host, B, 80),
                         t = together.decode_step(f.host, B, 80);
    CHECK(t.step_s == Approx(a.step_s * together.step_factor(B)));
    CHECK(part(t.parts) == Approx(t.step_s - a.step_s));
    CHECK(part(a.parts) == 0);
  }
  // Prefill: each chunk at its own width (two chunks of 512 and one of 256 here).
  const PrefillEstimate a = alone.prefill(f.host, 1280, 512),
                        t = together.prefill(f.host, 1280, 512);
  CHECK(t.total_s == Approx(1.5 * a.total_s));
  CHECK(part(t.parts) == Approx(0.5 * a.total_s));
  // Faster together (a factor below 1) is a negative part, not dropped.
  f.hw.model_shapes.step_factor = curve({{1, 0.9}});
  const DecodeEstimate faster = f.model().decode_step(f.host, 1, 80);
  CHECK(faster.step_s == Approx(0.9 * alone.decode_step(f.host, 1, 80).step_s));
  CHECK(part(faster.parts) < 0);
  // The rates name it; the other backends never read it.
  bool named = false;
  for (const std::string& r : together.describe_rates())
    named = named || r.find("the parts together in a step: x(M) 1:1.20 8:1.50") == 0;
  CHECK(named);
  f.co.trunk = TrunkBackend::cpu_reference;
  f.hw.kernels.cpu_trunk_ref = curve({{1, 2}});
  f.hw.kernels.cpu_kda_ref_state_gbps = Rate(1);
  f.hw.kernels.cpu_mla_ref_gflops = Rate(1);
  CHECK(f.model().step_factor(8) == 1);
}

TEST_CASE("model-shape rates of another model fall back to the K3-shaped probes with a note",
          "[cost]") {
  FastCpu f;
  const CostModel k3 = f.model();
  const ModelConfig& cfg = f.cfg;
  ModelConfig other = cfg;
  other.num_layers = 8;  // another model: same widths, one layer fewer
  other.layer_kinds.pop_back();
  f.hw.model_shapes = shapes_for(other, 3);
  f.hw.model_shapes.model = "the 8-layer one";
  const CostModel m(f.hw, cfg, f.co);
  CHECK(!m.uses_model_shapes());
  const std::string& note = m.rates_basis();
  CHECK(note.rfind("rates: K3-shaped probes — note: k3.json's model-shape rates were measured "
                   "for another model (the 8-layer one)",
                   0) == 0);
  CHECK(note.find(model_shape_signature(other)) != std::string::npos);
  CHECK(note.find(model_shape_signature(cfg)) != std::string::npos);
  CHECK(m.describe_rates().front() == note);
  // The prediction is the K3-shaped one, bit for bit.
  CHECK(m.decode_step(f.host, 1, 80).step_s == k3.decode_step(f.host, 1, 80).step_s);
  CHECK(m.decode_step(f.host, 8, 80).step_s == k3.decode_step(f.host, 8, 80).step_s);
  CHECK(m.prefill(f.host, 1024, 1024).total_s == k3.prefill(f.host, 1024, 1024).total_s);
}

// The host cache's misses under its LRU (offload/expert_store.h): what a step's touches leave in
// it.
TEST_CASE(
    "host cache misses: a scan keeps the cache but one layer's reads, narrow steps about "
    "the share",
    "[cost]") {
  const ModelConfig cfg = k3_slice8();  // 64 experts per MoE layer, top-16, 7 MoE layers
  const CostModel m(gpu_machine(), cfg);
  const double E = cfg.moe.num_experts, L = cfg.num_moe_layers();
  REQUIRE(L == 7);
  // No disk share, or a cache that holds every expert outside the GPU cache: nothing misses.
  CHECK(m.host_miss_share(Placement{0.1, 0.9, 0}, 16) == 0);
  CHECK(m.host_miss_share(Placement{0, 1, 0}, E) == 0);
  // A prefill chunk (every expert of each layer) or a step touching 90 % of them (decode at B = 8)
  // needs more than the cache holds: a scan. The store evicts the scan's reads first, so the
  // cache keeps what it held but for one layer's reads: hits c − f/L, c = 0.3 / 0.9 of the
  // experts outside the GPU cache (an LRU would miss every one).
  const Placement slice{0.1, 0.3, 0.6};
  const double c = 0.3 / 0.9;
  CHECK(m.host_miss_share(slice, E) == Approx(1 - (c - 1 / L)));
  CHECK(m.host_miss_share(slice, 0.9 * E) == Approx(1 - (c - 0.9 / L)));
  // A cache too small to keep anything beside one layer's reads misses every one.
  CHECK(m.host_miss_share(Placement{0, 0.1, 0.9}, E) == 1);
  // Decode at B = 1 (16 of 64 per layer): the cache holds a third of the experts outside the GPU
  // cache, so an expert used at one step survives to the next (ln(2/3) / ln(3/4) = 1.4 steps):
  // misses 3/4 — the engine's store reported 30 % host hits on the 8-layer slice (bench e2e,
  // H100 machine, 2026-12-06), with the lookahead's prefetches among them.
  CHECK(m.host_miss_share(slice, 16) == Approx(0.75));
  // Narrow steps over many experts (K3: 16 of 896): misses near the share outside the cache.
  ModelConfig k3 = cfg;
  k3.moe.num_experts = 896;
  const CostModel mk(gpu_machine(), k3);
  CHECK(mk.host_miss_share(Placement{0, 0.3, 0.7}, 16) == Approx(0.7).epsilon(0.02));
  // More cache never misses more.
  double last = 1;
  for (double h : {0.1, 0.2, 0.4, 0.6, 0.8}) {
    const double miss = mk.host_miss_share(Placement{0, h, 1 - h}, 64);
    CHECK(miss <= last);
    last = miss;
  }
  // Narrow steps: the misses lie between the share outside the cache and that over the survival
  // of one step less (steps are whole): 1 − c ≤ miss ≤ (1 − c) / (1 − f). Scans: 1 − c + f/L.
  for (double t : {1.0, 16.0, 64.0, 256.0, 448.0, 600.0, 895.0, 896.0}) {
    const double miss = mk.host_miss_share(Placement{0, 0.5, 0.5}, t), f = t / 896;
    INFO("touched " << t);
    CHECK(miss >= 0.5 - 1e-12);
    if (f <= 0.5)
      CHECK(miss <= 0.5 / (1 - f) + 1e-12);
    else
      CHECK(miss == Approx(0.5 + f / L));
  }
}
