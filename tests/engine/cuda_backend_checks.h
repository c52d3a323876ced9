// Checks of the CUDA backend against the CPU reference backend, shared by the k3-mini GPU tests
// (tests/engine/cuda_backend_gpu.cpp, label gpu) and the K3-width runs on a k3-slice
// (tests/engine/cuda_backend_e2e_gpu.cpp, label e2e): issue 18 item 8 (a) layer by layer on the
// same injected input with the routing replayed from the CPU run, (b) end to end with replayed
// routing over a prefill and decode steps, (c) placement invariance — logits bitwise identical and
// the greedy tokens identical for every placement of the routed experts — with (d) the unforced
// greedy agreement with the CPU bf16 path reported, and no device or pinned allocation in decode.
#pragma once
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/cpu_backend.h"
#include "engine/cuda_backend.h"
#include "engine/model.h"
#include "engine/offload_executor.h"
#include "engine/schedule.h"
#include "engine/session.h"
#include "kernels/runtime.h"
#include "test_backend_options.h"

namespace strata::test::cuda_checks {

using namespace strata::engine;

using test::bf16_contract;

inline SessionOptions bf16_session() {
  SessionOptions so;
  so.precision = Precision::bf16;
  so.experts = ExpertNumerics::contract;
  return so;
}

inline double rel_rms(const std::vector<float>& a, const std::vector<float>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - ref[i]) * double(a[i] - ref[i]);
    den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline std::vector<int32_t> prompt(int n, int vocab) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(int32_t((int64_t(i) * 7919 + 13) % vocab));
  return ids;
}

inline int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

inline CudaBackendOptions quiet(double gpu_share = -1, int slots = 1) {
  CudaBackendOptions co;
  co.progress = false;
  co.gpu_expert_share = gpu_share;
  co.slots = slots;
  co.max_context = 1024;
  co.max_step_rows = 256;
  co.stage_threshold = 1 << 30;  // no prefill staging unless a check asks for it
  return co;
}

// (a) Every layer of a prefill of T tokens and one decode token, GPU against the CPU bf16
// reference on the same input (the reference's output of the previous layer), routing replayed.
// Returns the worst relative RMS difference of the residual stream.
inline double check_layers(const Model& model, const std::string& what, int T, double bound) {
  const ModelConfig& c = model.config();
  const std::vector<int32_t> ids = prompt(T, c.vocab_size);
  RoutingLog routing;
  SessionOptions so = bf16_session();
  so.record_routing = &routing;
  Session cpu(model, so);
  CudaBackend gb(model, bf16_contract(), quiet());
  SessionOptions go = bf16_session();
  go.replay_routing = &routing;
  Session gpu(model, gb, 0, go);
  double worst = 0;
  for (std::vector<int32_t> step : {ids, std::vector<int32_t>{4242 % c.vocab_size}}) {
    Stream in = cpu.embed(step);
    for (int l = 0; l < c.num_layers; ++l) {
      Stream a = in, b = in;
      cpu.run_layer(l, a);
      gpu.run_layer(l, b);
      const double e = rel_rms(b.P, a.P);
      worst = std::max(worst, e);
      std::printf("[cuda backend %s] T=%zu layer %d (%s, %s): rel RMS diff %.2e\n", what.c_str(),
                  step.size(), l, c.is_kda(l) ? "kda" : "mla", c.is_moe(l) ? "moe" : "dense", e);
      INFO(what << " T=" << step.size() << " layer " << l);
      CHECK(e < bound);
      in = a;  // the next layer's input: the reference's output
    }
    cpu.advance(int64_t(step.size()));
    gpu.advance(int64_t(step.size()));
  }
  return worst;
}

struct Reference {
  std::vector<int32_t> ids;                // the prompt
  std::vector<std::vector<float>> logits;  // prefill's last row, then one per decode step
  std::vector<int32_t> tokens;             // greedy tokens (inputs of the decode steps)
  RoutingLog routing;
};

// The CPU bf16 reference: prefill + `steps` greedy decode steps, routing recorded.
inline Reference reference_run(const Model& model, int T, int steps) {
  Reference r;
  r.ids = prompt(T, model.config().vocab_size);
  SessionOptions so = bf16_session();
  so.record_routing = &r.routing;
  Session cpu(model, so);
  r.logits.push_back(cpu.forward(r.ids));
  for (int i = 0; i < steps; ++i) {
    r.tokens.push_back(argmax(r.logits.back()));
    r.logits.push_back(cpu.forward(std::span(&r.tokens.back(), 1)));
  }
  return r;
}

// (b) The GPU with the reference's tokens and forced routing: logits within `bound` (relative
// RMS) at every step. Returns the worst.
inline double check_replay(const Model& model, const std::string& what, const Reference& ref,
                           double bound) {
  CudaBackend gb(model, bf16_contract(), quiet());
  SessionOptions go = bf16_session();
  go.replay_routing = &ref.routing;
  Session gpu(model, gb, 0, go);
  double worst = 0;
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    std::vector<float> l =
        i == 0 ? gpu.forward(ref.ids) : gpu.forward(std::span(&ref.tokens[i - 1], 1));
    const double e = rel_rms(l, ref.logits[i]);
    worst = std::max(worst, e);
    INFO(what << " step " << i);
    CHECK(e < bound);
  }
  std::printf("[cuda backend %s] replayed routing: worst logits rel RMS diff %.2e over %zu steps\n",
              what.c_str(), worst, ref.logits.size());
  return worst;
}

// (c) + (d): every placement gives the same logits bit for bit and the same `n` greedy tokens;
// nothing is allocated on the device or pinned during decode.
inline void check_placements(const Model& model, const std::string& what, const Reference& ref,
                             int n) {
  struct Placement {
    const char* name;
    double gpu_share;
    std::string host_mem;      // empty: experts in the mmapped checkpoint (host memory)
    int stage_threshold = 0;   // > 0: prefill staging forced at this many tokens per expert
    bool host_groups = false;  // all resident, but the routing goes through the host path
  };
  // Staging is forced for every expert with ≥ 1 token in the last three placements, through
  // 3-expert rounds (several rounds per layer, both halves of the staging slots in use).
  const Placement placements[] = {{"all GPU", 1.0, "", 0},
                                  {"all GPU, expert groups built on the host", 1.0, "", 0, true},
                                  {"10% GPU, rest host", 0.1, "", 0},
                                  {"10% GPU, 30% host, rest disk", 0.1, "30%", 0},
                                  {"all host", 0.0, "", 0},
                                  {"all host, prefill staged to the GPU", 0.0, "", 1},
                                  // staged through the store: by DMA from its page-locked cache
                                  {"all host in a 100% host cache, prefill staged", 0.0, "100%", 1},
                                  {"10% GPU, 30% host, rest disk, prefill staged", 0.1, "30%", 1}};
  std::vector<std::vector<float>> first_logits;
  std::vector<int32_t> first_tokens;
  for (const Placement& pl : placements) {
    if (!pl.host_mem.empty() && model.experts_quantized()) {
      // The disk tier reads the checkpoint's bf16 experts: refused with --experts-quantize.
      std::printf("[cuda backend %s] %s: not run (experts quantized at load stay in host memory)\n",
                  what.c_str(), pl.name);
      continue;
    }
    OffloadOptions oo;
    oo.host_mem = pl.host_mem;
    OffloadRuntime offload(model, oo);
    SessionOptions go = bf16_session();
    offload.install(go);
    CudaBackendOptions co = quiet(pl.gpu_share);
    co.stage_threshold = pl.stage_threshold ? pl.stage_threshold : 1 << 30;  // else: no staging
    co.stage_slots = 3;
    co.device_groups = !pl.host_groups;
    CudaBackend gb(model, go.backend(), co);
    Session gpu(model, gb, 0, go);
    std::vector<std::vector<float>> logits;
    std::vector<int32_t> tokens;
    logits.push_back(gpu.forward(ref.ids));
    const uint64_t dev0 = kernels::rt::device_allocations(),
                   pin0 = kernels::rt::pinned_allocations();
    for (int i = 0; i < n; ++i) {
      tokens.push_back(argmax(logits.back()));
      logits.push_back(gpu.forward(std::span(&tokens.back(), 1)));
    }
    INFO(what << ": " << pl.name);
    CHECK(kernels::rt::device_allocations() == dev0);  // nothing allocated in the decode loop
    CHECK(kernels::rt::pinned_allocations() == pin0);
    const auto& t = gb.telemetry();
    std::printf(
        "[cuda backend %s] %s: %lld of %lld experts resident; pairs GPU %llu, CPU %llu; "
        "staged %llu experts\n",
        what.c_str(), pl.name, (long long)gb.gpu_resident_experts(), (long long)gb.routed_experts(),
        (unsigned long long)t.gpu_expert_pairs, (unsigned long long)t.cpu_expert_pairs,
        (unsigned long long)t.staged_experts);
    if (pl.gpu_share == 1.0) CHECK(t.cpu_expert_pairs == 0);
    // All resident: groups built on the device unless forced through the host.
    CHECK((t.device_group_layers > 0) == (pl.gpu_share == 1.0 && !pl.host_groups));
    if (pl.gpu_share == 0.0 && !pl.stage_threshold) CHECK(t.gpu_expert_pairs == 0);
    if (pl.stage_threshold) CHECK(t.staged_experts > 3);  // several rounds
    // From the store's cache (page-locked where there is a GPU), never from the checkpoint's pages.
    CHECK(t.staged_direct == (pl.host_mem.empty() ? 0 : t.staged_experts));
    if (!pl.stage_threshold) CHECK(t.staged_experts == 0);
    if (pl.gpu_share == 0.1) CHECK((t.cpu_expert_pairs > 0 && t.gpu_expert_pairs > 0));
    if (first_logits.empty()) {
      first_logits = logits;
      first_tokens = tokens;
      int agree = 0;
      for (size_t i = 0; i < ref.tokens.size() && tokens[i] == ref.tokens[i]; ++i) ++agree;
      std::printf(
          "[cuda backend %s] unforced greedy: first %d of %zu tokens equal to the CPU "
          "bf16 path\n",
          what.c_str(), agree, ref.tokens.size());
    } else {
      CHECK(tokens == first_tokens);
      size_t same = 0;
      for (size_t i = 0; i < logits.size(); ++i) same += logits[i] == first_logits[i] ? 1 : 0;
      CHECK(same == logits.size());  // bit for bit at every step
    }
  }
}

// CUDA graphs (decode steps captured per shape and replayed) change nothing: the same kernels in
// the same order, so the logits of 16 decode steps of one sequence, and of two sequences sharing
// each step, are bitwise those of eager launches; and the graphs were used.
inline void check_graphs(const Model& model, const std::string& what, const Reference& ref,
                         double gpu_share) {
  std::vector<std::vector<float>> runs[2];
  uint64_t launches[2] = {0, 0}, captures[2] = {0, 0};
  // A decode step's segments: one per MoE layer's host round trip and the head, at most.
  const uint64_t segments_per_step_bound = uint64_t(model.config().num_layers) + 2;
  for (int graphs = 0; graphs < 2; ++graphs) {
    CudaBackendOptions co = quiet(gpu_share, 2);
    co.cuda_graphs = graphs == 1;
    CudaBackend gb(model, bf16_contract(), co);
    Schedule sched(gb, model.config());
    for (int seq = 0; seq < 2; ++seq) {  // a step each: prompts up to max_step_rows
      SeqChunk pre{seq, ref.ids, true, false, nullptr};
      runs[graphs].push_back(sched.step_logits(std::span(&pre, 1))[0]);
    }
    for (size_t i = 0; i < ref.tokens.size(); ++i) {
      SeqChunk one{0, std::span(&ref.tokens[i], 1), true, false, nullptr};
      runs[graphs].push_back(sched.step_logits(std::span(&one, 1))[0]);
      std::vector<SeqChunk> two = {{0, std::span(&ref.tokens[i], 1), true, false, nullptr},
                                   {1, std::span(&ref.tokens[i], 1), true, false, nullptr}};
      for (auto& l : sched.step_logits(two)) runs[graphs].push_back(l);
    }
    launches[graphs] = gb.telemetry().graph_launches;
    captures[graphs] = gb.telemetry().graph_captures;
  }
  INFO(what << ": CUDA graphs against eager launches");
  CHECK(captures[0] == 0);
  // Each step shape is captured once per MLA decode bucket it reaches (mla_decode_cap: 256, 512,
  // …), then replayed.
  const size_t longest = ref.ids.size() + ref.tokens.size();
  const uint64_t buckets = longest > 256 && model.config().num_mla_layers() > 0 ? 2 : 1;
  CHECK(captures[1] <= 2 * buckets * segments_per_step_bound);
  CHECK(launches[0] == 0);
  CHECK(launches[1] >= 2 * ref.tokens.size());  // every decode step ran from graph segments
  // Every expert in the GPU cache: no host round trip inside a step (routing grouped on the
  // device, MLA's positions read from the device), so a decode step is one graph.
  if (gpu_share >= 1.0) CHECK(launches[1] == 2 * ref.tokens.size());
  REQUIRE(runs[0].size() == runs[1].size());
  size_t same = 0;
  for (size_t i = 0; i < runs[0].size(); ++i) same += runs[0][i] == runs[1][i] ? 1 : 0;
  CHECK(same == runs[0].size());
  std::printf(
      "[cuda backend %s] CUDA graphs: %llu captures, %llu segment launches (%.1f per decode "
      "step), %zu of %zu logits rows bitwise equal to eager\n",
      what.c_str(), (unsigned long long)captures[1], (unsigned long long)launches[1],
      double(launches[1]) / double(2 * ref.tokens.size()), same, runs[0].size());
}

}  // namespace strata::test::cuda_checks
