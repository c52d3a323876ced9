// The CUDA backend against the CPU reference backend on k3-mini (issue 18 item 8, at k3-mini's
// widths; the K3-width runs carry the label e2e): (a) layer by layer on the same injected input
// with the routing replayed from the CPU run, (b) end to end with replayed routing, prefill and 16
// decode steps, (c) placement invariance: logits bitwise identical and 64 greedy tokens identical
// for every placement of the routed experts (all in the GPU cache; 10% GPU + host; 10% GPU + 30%
// host cache + disk; all in host memory), (d) unforced greedy agreement with the CPU bf16 path,
// reported. Also: nothing is allocated on the device or pinned during decode.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "engine/cpu_backend.h"
#include "engine/cuda_backend.h"
#include "engine/model.h"
#include "engine/offload_executor.h"
#include "engine/session.h"
#include "kernels/runtime.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
using namespace strata::engine;

namespace {

const std::filesystem::path& mini() {
  static std::filesystem::path dir = [] {
    std::filesystem::path d = test::scratch_dir("gpu_k3_mini");
    SynthOptions o;
    o.preset = "k3-mini";
    o.tokenizer = false;
    synth_checkpoint(o, d);
    return d;
  }();
  return dir;
}

bool have_gpu() {
  if (kernels::cuda_device_count() > 0) return true;
  WARN("no CUDA device: skipping");
  return false;
}

BackendOptions bf16_contract() {
  BackendOptions b;
  b.precision = Precision::bf16;
  b.experts = ExpertNumerics::contract;
  return b;
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - ref[i]) * double(a[i] - ref[i]);
    den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<int32_t> prompt(int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int32_t((i * 7919 + 13) % 163000));
  return ids;
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

}  // namespace

TEST_CASE("cuda backend: every layer matches the CPU bf16 reference on the same input",
          "[gpu][engine]") {
  if (!have_gpu()) return;
  auto model = Model::load(mini());
  const ModelConfig& c = model->config();
  const std::vector<int32_t> ids = prompt(24);
  RoutingLog routing;
  SessionOptions so;
  so.precision = Precision::bf16;
  so.experts = ExpertNumerics::contract;
  so.record_routing = &routing;
  Session cpu(*model, so);
  CudaBackendOptions co;
  co.progress = false;
  CudaBackend gb(*model, bf16_contract(), co);
  SessionOptions go = so;
  go.record_routing = nullptr;
  go.replay_routing = &routing;
  Session gpu(*model, gb, 0, go);
  // Prefill (T = 24) and one decode token (T = 1: the recurrent KDA and absorbed MLA kernels).
  for (std::vector<int32_t> step : {ids, std::vector<int32_t>{4242}}) {
    Stream in = cpu.embed(step);
    for (int l = 0; l < c.num_layers; ++l) {
      Stream a = in, b = in;
      cpu.run_layer(l, a);
      gpu.run_layer(l, b);
      const double e = rel_rms(b.P, a.P);
      std::printf("[cuda backend] T=%zu layer %d (%s, %s): rel RMS diff %.2e\n", step.size(), l,
                  c.is_kda(l) ? "kda" : "mla", c.is_moe(l) ? "moe" : "dense", e);
      // bf16 rounding points on both sides; the GEMM and KDA/MLA reductions run in other orders,
      // so single elements differ by a bf16 ulp (2^-8 relative) where a sum lands near a rounding
      // boundary (dense layer 0: 3.5e-3 measured on the H200). MoE layers add the contract's int8
      // activation quantization: a one-ulp change of an expert input can move its int8 level
      // (1/127 relative), so they measure 0.6-1.6e-2; 3e-2 bounds them with room, and a wrong
      // op (a missing rounding, a mis-indexed slot) gives O(1).
      CHECK(e < 3e-2);
      in = a;  // the next layer's input: the reference's output
    }
    cpu.advance(int64_t(step.size()));
    gpu.advance(int64_t(step.size()));
  }
}

TEST_CASE("cuda backend: end to end with replayed routing, and placement invariance",
          "[gpu][engine]") {
  if (!have_gpu()) return;
  auto model = Model::load(mini());
  const ModelConfig& c = model->config();
  const std::vector<int32_t> ids = prompt(40);
  // CPU bf16 reference: prefill + 16 greedy steps, routing recorded.
  RoutingLog routing;
  SessionOptions so;
  so.precision = Precision::bf16;
  so.experts = ExpertNumerics::contract;
  so.record_routing = &routing;
  Session cpu(*model, so);
  std::vector<std::vector<float>> ref;
  std::vector<int32_t> ref_tokens;
  ref.push_back(cpu.forward(ids));
  for (int i = 0; i < 16; ++i) {
    ref_tokens.push_back(argmax(ref.back()));
    ref.push_back(cpu.forward(std::span(&ref_tokens.back(), 1)));
  }
  // (b) GPU with the same tokens and forced routing.
  {
    CudaBackendOptions co;
    co.progress = false;
    CudaBackend gb(*model, bf16_contract(), co);
    SessionOptions go;
    go.replay_routing = &routing;
    Session gpu(*model, gb, 0, go);
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      std::vector<float> l =
          i == 0 ? gpu.forward(ids) : gpu.forward(std::span(&ref_tokens[i - 1], 1));
      REQUIRE(l.size() == ref[i].size());
      const double e = rel_rms(l, ref[i]);
      worst = std::max(worst, e);
      // The per-layer noise above, carried through 9 layers whose AttnRes mixes amplify it
      // (DESIGN "Comparing numerics paths"): 7.9e-2 worst on the H200 over 17 steps.
      CHECK(e < 0.15);
    }
    std::printf("[cuda backend] replayed routing: worst logits rel RMS diff %.2e over %zu steps\n",
                worst, ref.size());
  }
  // (c) placements: bitwise identical logits and 64 greedy tokens.
  struct Placement {
    const char* name;
    double gpu_share;
    std::string host_mem;  // empty: experts in the mmapped checkpoint (host memory)
  };
  const Placement placements[] = {{"all GPU", 1.0, ""},
                                  {"10% GPU, rest host", 0.1, ""},
                                  {"10% GPU, 30% host, rest disk", 0.1, "30%"},
                                  {"all host", 0.0, ""}};
  std::vector<std::vector<float>> first_logits;
  std::vector<int32_t> first_tokens;
  for (const Placement& pl : placements) {
    OffloadOptions oo;
    oo.host_mem = pl.host_mem;
    OffloadRuntime offload(*model, oo);
    SessionOptions go;
    go.precision = Precision::bf16;
    go.experts = ExpertNumerics::contract;
    offload.install(go);
    CudaBackendOptions co;
    co.progress = false;
    co.gpu_expert_share = pl.gpu_share;
    CudaBackend gb(*model, go.backend(), co);
    Session gpu(*model, gb, 0, go);
    std::vector<std::vector<float>> logits;
    std::vector<int32_t> tokens;
    logits.push_back(gpu.forward(ids));
    const uint64_t dev0 = kernels::rt::device_allocations(),
                   pin0 = kernels::rt::pinned_allocations();
    for (int i = 0; i < 64; ++i) {
      tokens.push_back(argmax(logits.back()));
      logits.push_back(gpu.forward(std::span(&tokens.back(), 1)));
    }
    CHECK(kernels::rt::device_allocations() == dev0);  // nothing allocated in the decode loop
    CHECK(kernels::rt::pinned_allocations() == pin0);
    const auto& t = gb.telemetry();
    std::printf("[cuda backend] %s: %lld of %lld experts resident; pairs GPU %llu, CPU %llu\n",
                pl.name, (long long)gb.gpu_resident_experts(), (long long)gb.routed_experts(),
                (unsigned long long)t.gpu_expert_pairs, (unsigned long long)t.cpu_expert_pairs);
    if (pl.gpu_share == 1.0) CHECK(t.cpu_expert_pairs == 0);
    if (pl.gpu_share == 0.0) CHECK(t.gpu_expert_pairs == 0);
    if (first_logits.empty()) {
      first_logits = logits;
      first_tokens = tokens;
      // (d) unforced greedy agreement with the CPU bf16 path, reported.
      int agree = 0;
      for (size_t i = 0; i < ref_tokens.size() && tokens[i] == ref_tokens[i]; ++i) ++agree;
      std::printf(
          "[cuda backend] unforced greedy: first %d of %zu tokens equal to the CPU bf16 "
          "path\n",
          agree, ref_tokens.size());
    } else {
      INFO(pl.name);
      CHECK(tokens == first_tokens);
      bool same = true;
      for (size_t i = 0; i < logits.size(); ++i) same = same && logits[i] == first_logits[i];
      CHECK(same);
    }
  }
  (void)c;
}

TEST_CASE("cuda backend: several sequences per step give each sequence its own logits",
          "[gpu][engine]") {
  if (!have_gpu()) return;
  auto model = Model::load(mini());
  CudaBackendOptions co;
  co.progress = false;
  co.slots = 3;
  CudaBackend gb(*model, bf16_contract(), co);
  Schedule s(gb, model->config());
  const std::vector<int32_t> a = prompt(9), b = prompt(5);
  SeqChunk ca{0, a, true, false};
  const std::vector<float> a_alone = s.step(std::span(&ca, 1))[0];
  gb.reset_slot(0);
  std::vector<SeqChunk> both = {{1, b, true, false}, {0, a, true, false}};
  const auto out = s.step(both);
  // Batch-size-dependent GEMM tilings may change low bits; the sequences must not mix.
  CHECK(rel_rms(out[1], a_alone) < 1e-2);
  // Decode of two consecutive slots in one step (the batched KDA/MLA decode path).
  const int32_t t0 = 11, t1 = 12;
  std::vector<SeqChunk> dec = {{0, std::span(&t0, 1), true, false},
                               {1, std::span(&t1, 1), true, false}};
  const auto d = s.step(dec);
  REQUIRE(d[0].size() == size_t(model->config().vocab_size));
  REQUIRE(d[1].size() == size_t(model->config().vocab_size));
  CHECK(gb.position(0) == 10);
  CHECK(gb.position(1) == 6);
}

TEST_CASE("cuda backend: refusals name the reason", "[gpu][engine]") {
  if (!have_gpu()) return;
  auto model = Model::load(mini());
  BackendOptions fp32;
  CHECK_THROWS_WITH(CudaBackend(*model, fp32, CudaBackendOptions{}),
                    Catch::Contains("CPU reference"));
  CudaBackendOptions tiny;
  tiny.gpu_mem_bytes = 64ull << 20;
  CHECK_THROWS_WITH(CudaBackend(*model, bf16_contract(), tiny), Catch::Contains("--gpu-mem"));
}
