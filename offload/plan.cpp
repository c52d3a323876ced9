// Capacity planning (see plan.h).
#include "offload/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "offload/format.h"
#include "storage/error.h"

namespace strata::offload {

using nlohmann::json;

namespace {

std::string gb(double bytes) {
  return format_bytes(bytes);
}

uint64_t ceil_div(uint64_t a, uint64_t b) {
  return (a + b - 1) / b;
}

std::string tps(double t) {
  if (t >= 100) return fmt("%.0f", t);
  if (t >= 10) return fmt("%.1f", t);
  return fmt("%.2f", t);
}

}  // namespace

BackendChoice parse_backend(const std::string& s, const std::string& what) {
  if (s == "auto") return BackendChoice::automatic;
  if (s == "gpu") return BackendChoice::gpu;
  if (s == "cpu-reference") return BackendChoice::cpu_reference;
  if (s == "cpu-bf16") return BackendChoice::cpu_bf16;
  throw Error(what + " '" + s + "': expected auto, gpu, cpu-reference or cpu-bf16");
}

double engine_gpu_share(double share, int num_experts) {
  if (num_experts <= 0) return share;
  return double(std::llround(share * num_experts)) / num_experts;
}

std::vector<BenchPlacement> bench_e2e_placements(bool gpu, int num_experts) {
  if (!gpu) return {{"all host", {0, 1, 0}, "", ""}, {"30% host + disk", {0, 0.3, 0.7}, "", "30%"}};
  const double g = engine_gpu_share(0.1, num_experts);
  // The host cache holds 30% of all experts' bytes; the GPU-cached ones are not excluded from it
  // (the prefetcher may fetch them), so it serves 30% whatever the GPU holds.
  return {{"all GPU", {1, 0, 0}, "100%", ""},
          {"10% GPU + host", {g, 1 - g, 0}, "10%", ""},
          {"10% GPU + 30% host + disk", {g, 0.3, 0.7 - g}, "10%", "30%"},
          {"all host", {0, 1, 0}, "0%", ""}};
}

uint64_t TierBudget::used() const {
  uint64_t u = 0;
  for (auto& i : items) u += i.bytes;
  return u;
}

Plan make_plan_core(const HardwareProfile& hw, const ModelConfig& cfg, const Workload& w,
                    const PlanOptions& o) {
  if (w.context < 1 || w.concurrency < 1 || w.prompt_len < 1 || w.gen_len < 0 || w.chunk < 0)
    throw Error("workload: context, concurrency and prompt length must be ≥ 1");
  if (o.force_placement) {
    const std::string why = o.placement.validate();
    if (!why.empty()) throw Error("--placement: " + why);
  }
  Plan p;
  p.model = describe_config(cfg);
  p.hardware = hw.description;
  p.workload = w;
  const std::string src = hw.source.empty() ? std::string("hardware") : hw.source;

  // Backend.
  TrunkBackend backend = TrunkBackend::cpu_reference;
  switch (o.backend) {
    case BackendChoice::automatic:
      backend = hw.gpu.count > 0 ? TrunkBackend::gpu : TrunkBackend::cpu_reference;
      break;
    case BackendChoice::gpu:
      if (hw.gpu.count == 0) {
        p.refusal = "the GPU backend was asked for, but " + src + " lists no GPU";
        return p;
      }
      backend = TrunkBackend::gpu;
      break;
    case BackendChoice::cpu_reference:
      backend = TrunkBackend::cpu_reference;
      break;
    case BackendChoice::cpu_bf16:
      backend = TrunkBackend::cpu_bf16;
      break;
  }
  p.backend = backend;
  if (backend == TrunkBackend::gpu) {
    const std::string why = gpu_unsupported_reason(hw.gpu);
    if (!why.empty()) {
      p.refusal = why;
      return p;
    }
    if (hw.gpu.memory_bytes == 0) throw Error(src + ": gpu.memory: not stated");
  }
  if (hw.host.dram_bytes == 0) throw Error(src + ": host.dram: not stated");

  CostOptions co;
  co.trunk = backend;
  co.overlap = o.overlap;
  co.assumptions = o.assumptions;
  const CostModel cm(hw, cfg, co);
  const ModelCosts& k = cm.costs();
  const uint64_t eb = k.bytes_per_routed_expert;
  const uint64_t N = k.num_routed_experts_total;
  const uint64_t embed = uint64_t(cfg.vocab_size) * uint64_t(cfg.hidden_size) * 2;
  const uint64_t trunk = cm.trunk_bytes();
  const bool gpu = backend == TrunkBackend::gpu;
  const int nodes = std::max(1, hw.nodes);
  p.expert_bytes = eb;
  p.experts_total = N;
  p.state_bytes_per_sequence =
      k.kda_state_bytes + k.conv_state_bytes + k.mla_cache_bytes_per_token * uint64_t(w.context);
  const uint64_t state_all = p.state_bytes_per_sequence * uint64_t(w.concurrency);
  const int64_t chunk = w.chunk > 0 ? w.chunk
                        : gpu       ? std::min<int64_t>(w.prompt_len, 8192)
                                    : w.prompt_len;
  p.workload.chunk = chunk;
  const uint64_t workspace = uint64_t(chunk) * o.workspace_bytes_per_chunk_token;
  p.assumptions.push_back(fmt("prefill workspace: %.1f MB per chunk token (activations, assumed)",
                              double(o.workspace_bytes_per_chunk_token) / 1e6));

  // GPUs.
  uint64_t gpu_slots_total = 0;
  if (gpu) {
    const int G = cm.gpus();
    p.gpus = G;
    p.layers_per_gpu = (cfg.num_layers + G - 1) / G;
    const uint64_t cap = hw.gpu.memory_bytes;
    TierBudget b;
    b.tier = "GPU memory, each of " + std::to_string(G) + " × " + hw.gpu.name;
    b.capacity = cap;
    p.trunk_bytes_per_gpu = ceil_div(trunk + embed, uint64_t(G));
    b.items.push_back({"dense trunk (bf16; 1/" + std::to_string(G) + " of " +
                           gb(double(trunk + embed)) + ", embedding included)",
                       p.trunk_bytes_per_gpu});
    b.items.push_back({"sequence state (KDA + conv + MLA cache at the context) × " +
                           std::to_string(w.concurrency) + (G > 1 ? ", layers split" : ""),
                       ceil_div(state_all, uint64_t(G))});
    b.items.push_back({"prefill workspace (chunk " + std::to_string(chunk) + ")", workspace});
    const uint64_t stage_slots =
        2 * uint64_t(std::min(kStageSlotsPerRound, std::max(1, cfg.moe.num_experts)));
    b.items.push_back({"prefill staging: 2 rounds × " + std::to_string(stage_slots / 2) +
                           " expert slots (engine/cuda_backend.cpp)",
                       stage_slots * eb});
    b.items.push_back({"CUDA context, cuBLASLt workspace, graphs (assumed)", o.gpu_context_bytes});
    b.items.push_back({fmt("headroom (%.0f%%)", o.gpu_headroom_share * 100),
                       uint64_t(o.gpu_headroom_share * double(cap))});
    const uint64_t fixed = b.used();
    if (fixed > cap) {
      // How many GPUs the trunk would need with this GPU's other items.
      const uint64_t other = fixed - p.trunk_bytes_per_gpu;
      std::string need;
      if (other < cap)
        need = "; at least " + std::to_string(ceil_div(trunk + embed, cap - other)) +
               " such GPUs would hold it";
      p.refusal = "GPU memory too small: each of the " + std::to_string(G) + " GPUs needs " +
                  gb(double(fixed)) + " (dense trunk share " + gb(double(p.trunk_bytes_per_gpu)) +
                  ", state " + gb(double(ceil_div(state_all, uint64_t(G)))) + ", workspace " +
                  gb(double(workspace)) + ", headroom) but has " + gb(double(cap)) + need;
      p.budgets.push_back(b);
      return p;
    }
    const uint64_t slots = (cap - fixed) / eb;
    gpu_slots_total = std::min<uint64_t>(N, slots * uint64_t(G));
    if (o.force_placement) {
      const uint64_t want = uint64_t(std::llround(o.placement.gpu * double(N)));
      if (want > gpu_slots_total) {
        p.refusal = "the given placement puts " + std::to_string(want) +
                    " experts in GPU caches; the GPUs hold " + std::to_string(gpu_slots_total);
        p.budgets.push_back(b);
        return p;
      }
      gpu_slots_total = want;
    }
    b.items.push_back(
        {"routed expert cache (" + std::to_string(gpu_slots_total / uint64_t(G)) + " experts)",
         gpu_slots_total / uint64_t(G) * eb});
    p.budgets.push_back(b);
    p.assumptions.push_back(
        "layers split evenly over the GPUs (pipeline); each GPU caches experts of its own layers");
  }
  p.experts_gpu = gpu_slots_total;

  // Host DRAM, per node.
  {
    const uint64_t cap = hw.host.dram_bytes;
    TierBudget b;
    b.tier =
        "host DRAM" + std::string(nodes > 1 ? ", each of " + std::to_string(nodes) + " nodes" : "");
    b.capacity = cap;
    b.items.push_back(
        {fmt("headroom (OS, page cache; %.0f%%, ≥ ", o.host_headroom_share * 100) +
             gb(double(o.host_headroom_min_bytes)) + ")",
         std::max(uint64_t(o.host_headroom_share * double(cap)), o.host_headroom_min_bytes)});
    if (gpu) {
      b.items.push_back(
          {"pinned staging buffers (" + std::to_string(o.staging_pinned_slots) + " per GPU)",
           uint64_t(o.staging_pinned_slots) * eb * ceil_div(uint64_t(p.gpus), nodes)});
    } else {
      b.items.push_back({"dense trunk + embedding (bf16, mmapped)", trunk + embed});
      b.items.push_back({"sequence state × " + std::to_string(w.concurrency), state_all});
      b.items.push_back({"prefill workspace (chunk " + std::to_string(chunk) + ")", workspace});
    }
    const uint64_t fixed = b.used();
    if (fixed > cap) {
      p.refusal = "host DRAM too small: " + gb(double(fixed)) + " needed before any routed expert" +
                  (gpu ? std::string() : " (the CPU backend keeps the dense trunk in DRAM)") +
                  ", the host has " + gb(double(cap));
      p.budgets.push_back(b);
      return p;
    }
    const uint64_t fit = (cap - fixed) / eb * uint64_t(nodes);
    p.experts_host = std::min<uint64_t>(N - p.experts_gpu, fit);
    if (o.force_placement) {
      const uint64_t want = std::min<uint64_t>(
          N - p.experts_gpu, uint64_t(std::llround(o.placement.host * double(N))));
      if (want > fit) {
        p.refusal = "the given placement puts " + std::to_string(want) +
                    " experts in host DRAM; it holds " + std::to_string(fit);
        p.budgets.push_back(b);
        return p;
      }
      p.experts_host = want;
    }
    b.items.push_back(
        {"routed experts (host tier: " + std::to_string(p.experts_host / nodes) + " experts)",
         p.experts_host / nodes * eb});
    p.budgets.push_back(b);
  }
  p.experts_disk = N - p.experts_gpu - p.experts_host;
  {
    TierBudget d;
    d.tier = "disk";
    d.items.push_back(
        {"checkpoint (" + std::to_string(p.experts_disk) + " routed experts served from here)",
         k.total_bytes});
    p.budgets.push_back(d);
  }
  if (p.experts_disk > 0 && !hw.disk.total_read_gbps().known()) {
    p.refusal = "host DRAM holds " + std::to_string(p.experts_host) + " of the " +
                std::to_string(N - p.experts_gpu) +
                " routed experts not cached on a GPU; the rest must be read from disk, and " + src +
                " states no disk read rate (disk.count, disk.read_gbps)";
    return p;
  }
  if (N > 0) {
    p.placement.gpu = double(p.experts_gpu) / double(N);
    p.placement.disk = double(p.experts_disk) / double(N);
    p.placement.host = 1.0 - p.placement.gpu - p.placement.disk;
  }
  p.assumptions.push_back(
      "flat routing (Quantile Balancing): a tier holding x% of the experts serves x% of the "
      "expert reads; popularity caching would do better on the GPU cache");

  p.decode = cm.decode_step(p.placement, w.concurrency, w.context);
  p.prefill = cm.prefill(p.placement, w.prompt_len, chunk);
  p.decode_roofline = cm.decode_roofline(p.placement, w.concurrency, w.context);
  p.prefill_roofline = cm.prefill_roofline(p.placement, w.prompt_len, chunk);
  const double step1 =
      w.concurrency == 1 ? p.decode.step_s : cm.decode_step(p.placement, 1, w.context).step_s;
  p.request_seconds = p.prefill.total_s + double(w.gen_len) * step1;
  p.rates = cm.describe_rates();
  return p;
}

Plan make_plan(const HardwareProfile& hw, const ModelConfig& cfg, const Workload& w,
               const PlanOptions& o) {
  Plan p = make_plan_core(hw, cfg, w, o);
  const double base = p.refusal.empty() ? p.decode.tokens_per_s : 0;
  auto try_variant = [&](const std::string& change, const HardwareProfile& v) {
    Suggestion s;
    s.change = change;
    try {
      Plan q = make_plan_core(v, cfg, w, o);
      if (!q.refusal.empty()) {
        s.refusal = q.refusal;
      } else {
        s.decode_tokens_per_s = q.decode.tokens_per_s;
        s.prefill_tokens_per_s = q.prefill.tokens_per_s;
        s.decode_gain = base > 0 ? q.decode.tokens_per_s / base : 0;
      }
    } catch (const Error& e) {
      s.refusal = e.what();
    }
    p.suggestions.push_back(s);
  };
  {
    HardwareProfile v = hw;
    v.host.dram_bytes *= 2;
    try_variant("double the DRAM to " + gb(double(v.host.dram_bytes)) + " per node", v);
  }
  if (hw.gpu.count > 0 && p.backend == TrunkBackend::gpu) {
    HardwareProfile v = hw;
    v.gpu.count += 1;
    try_variant(
        "add one " + hw.gpu.name + " per node (" + std::to_string(v.gpu.count) + " per node)", v);
  }
  if (hw.disk.read_gbps.known() && p.experts_disk > 0) {
    HardwareProfile v = hw;
    v.disk.count = std::max(1, hw.disk.count) * 2;
    try_variant("double the disks to " + std::to_string(v.disk.count) + " per node (striped)", v);
  }
  if (hw.host.mem_read_gbps.known()) {
    HardwareProfile v = hw;
    const double f = 1.5;
    v.host.mem_read_gbps = Rate(hw.host.mem_read_gbps.value() * f, "1.5 × measured");
    for (auto& pt : v.kernels.cpu_expert.points) pt.gbps *= f;
    try_variant(
        "1.5× the host memory bandwidth (more channels or faster DIMMs; the CPU expert "
        "kernel assumed to keep its share of it)",
        v);
  }
  std::stable_sort(p.suggestions.begin(), p.suggestions.end(),
                   [](const Suggestion& a, const Suggestion& b) {
                     return a.decode_tokens_per_s > b.decode_tokens_per_s;
                   });
  return p;
}

// ------------------------------------------------------------------------------------------------
// Output

namespace {

json parts_json(const std::vector<TimePart>& parts) {
  json a = json::array();
  for (auto& t : parts)
    a.push_back({{"name", t.name}, {"resource", t.resource}, {"seconds", t.seconds}});
  return a;
}

}  // namespace

json plan_json(const Plan& p) {
  json j;
  j["format"] = "strata-plan-1";
  j["model"] = p.model;
  j["hardware"] = p.hardware;
  j["runnable"] = p.refusal.empty();
  if (!p.refusal.empty()) j["refusal"] = p.refusal;
  j["workload"] = {{"context", p.workload.context},
                   {"concurrency", p.workload.concurrency},
                   {"prompt_len", p.workload.prompt_len},
                   {"gen_len", p.workload.gen_len},
                   {"chunk", p.workload.chunk}};
  json budgets = json::array();
  for (auto& b : p.budgets) {
    json items = json::array();
    for (auto& i : b.items) items.push_back({{"name", i.name}, {"bytes", i.bytes}});
    budgets.push_back({{"tier", b.tier}, {"capacity_bytes", b.capacity}, {"items", items}});
  }
  j["budgets"] = budgets;
  if (!p.refusal.empty()) return j;
  j["backend"] = trunk_backend_name(p.backend);
  j["gpus"] = p.gpus;
  j["layers_per_gpu"] = p.layers_per_gpu;
  j["placement"] = {{"gpu", p.placement.gpu},
                    {"host", p.placement.host},
                    {"disk", p.placement.disk},
                    {"experts_total", p.experts_total},
                    {"experts_gpu", p.experts_gpu},
                    {"experts_host", p.experts_host},
                    {"experts_disk", p.experts_disk},
                    {"expert_bytes", p.expert_bytes},
                    {"trunk_bytes_per_gpu", p.trunk_bytes_per_gpu},
                    {"state_bytes_per_sequence", p.state_bytes_per_sequence}};
  j["decode"] = {{"batch", p.decode.batch},
                 {"context", p.decode.context},
                 {"step_s", p.decode.step_s},
                 {"tokens_per_s", p.decode.tokens_per_s},
                 {"tokens_per_s_per_sequence", p.decode.step_s > 0 ? 1.0 / p.decode.step_s : 0},
                 {"experts_per_layer", p.decode.experts_per_layer},
                 {"tokens_per_expert", p.decode.tokens_per_expert},
                 {"bottleneck", p.decode.bottleneck},
                 {"overlap", p.decode.overlap},
                 {"parts", parts_json(p.decode.parts)}};
  j["prefill"] = {{"tokens", p.prefill.tokens},
                  {"chunk", p.prefill.chunk},
                  {"seconds", p.prefill.total_s},
                  {"tokens_per_s", p.prefill.tokens_per_s},
                  {"stage_threshold", p.prefill.stage_threshold == CostModel::kNever
                                          ? json(nullptr)
                                          : json(p.prefill.stage_threshold)},
                  {"staged_experts_per_chunk", p.prefill.staged_experts_per_chunk},
                  {"cpu_experts_per_chunk", p.prefill.cpu_experts_per_chunk},
                  {"bottleneck", p.prefill.bottleneck},
                  {"overlap", p.prefill.overlap},
                  {"parts", parts_json(p.prefill.parts)}};
  j["roofline"] = {{"decode_tokens_per_s", p.decode_roofline.tokens_per_s},
                   {"decode_bound", p.decode_roofline.bound},
                   {"prefill_tokens_per_s", p.prefill_roofline.tokens_per_s},
                   {"prefill_bound", p.prefill_roofline.bound},
                   {"assumption", p.decode_roofline.assumption}};
  j["request_seconds"] = p.request_seconds;
  j["rates"] = p.rates;
  j["assumptions"] = p.assumptions;
  json s = json::array();
  for (auto& x : p.suggestions) {
    json e = {{"change", x.change}};
    if (x.refusal.empty()) {
      e["decode_tokens_per_s"] = x.decode_tokens_per_s;
      e["prefill_tokens_per_s"] = x.prefill_tokens_per_s;
      e["decode_gain"] = x.decode_gain;
    } else {
      e["refusal"] = x.refusal;
    }
    s.push_back(e);
  }
  j["suggestions"] = s;
  return j;
}

std::string plan_text(const Plan& p) {
  std::ostringstream o;
  o << "model:     " << p.model << "\n";
  o << "hardware:  " << p.hardware << "\n";
  o << "workload:  context " << p.workload.context << ", concurrency " << p.workload.concurrency
    << ", prompt " << p.workload.prompt_len << ", generate " << p.workload.gen_len << "\n";
  auto budgets = [&] {
    for (auto& b : p.budgets) {
      o << "\n" << b.tier;
      if (b.capacity) o << ": " << gb(double(b.capacity));
      o << "\n";
      for (auto& i : b.items) {
        char line[256];
        std::snprintf(line, sizeof line, "  %12s  %s\n", gb(double(i.bytes)).c_str(),
                      i.name.c_str());
        o << line;
      }
      if (b.capacity) {
        char line[128];
        std::snprintf(line, sizeof line, "  %12s  free\n", gb(double(b.free())).c_str());
        o << line;
      }
    }
  };
  if (!p.refusal.empty()) {
    budgets();
    o << "\ncannot run: " << p.refusal << "\n";
    return o.str();
  }
  o << "backend:   " << trunk_backend_name(p.backend);
  if (p.gpus > 0)
    o << " (" << p.gpus << " GPU" << (p.gpus > 1 ? "s" : "") << ", " << p.layers_per_gpu
      << " layers each)";
  o << "\n\nplacement\n";
  if (p.gpus > 0) o << "  dense trunk      " << gb(double(p.trunk_bytes_per_gpu)) << " per GPU\n";
  o << fmt("  routed experts   GPU cache %.1f%% (%.0f), host DRAM %.1f%% (%.0f), ",
           100 * p.placement.gpu, double(p.experts_gpu), 100 * p.placement.host,
           double(p.experts_host))
    << fmt("disk %.1f%% (%.0f) of ", 100 * p.placement.disk, double(p.experts_disk))
    << p.experts_total << " × " << gb(double(p.expert_bytes)) << "\n";
  o << "  state            " << gb(double(p.state_bytes_per_sequence))
    << " per sequence at context " << p.workload.context << "\n";
  budgets();
  o << "\nprediction\n";
  o << "  decode   " << tps(1.0 / p.decode.step_s) << " tok/s per sequence";
  if (p.decode.batch > 1) o << ", " << tps(p.decode.tokens_per_s) << " tok/s total";
  o << fmt(" (step %.1f ms, batch %.0f, ", p.decode.step_s * 1e3, p.decode.batch)
    << fmt("%.0f experts per MoE layer, %.2f tokens each)\n", p.decode.experts_per_layer,
           p.decode.tokens_per_expert);
  o << "           bottleneck: " << p.decode.bottleneck << "\n";
  for (auto& t : p.decode.parts)
    o << fmt("           %9.2f ms  ", t.seconds * 1e3) << t.name << " [" << t.resource << "]\n";
  o << "  prefill  " << tps(p.prefill.tokens_per_s) << " tok/s over " << p.prefill.tokens
    << " tokens" << fmt(" (%.1f s, chunk ", p.prefill.total_s) << p.prefill.chunk;
  if (p.gpus > 0) {
    if (p.prefill.stage_threshold == CostModel::kNever)
      o << ", no expert staged: the CPU is always faster";
    else
      o << fmt(", experts with ≥ %.0f tokens staged to the GPU: %.0f per chunk",
               p.prefill.stage_threshold, p.prefill.staged_experts_per_chunk);
  }
  o << ")\n           bottleneck: " << p.prefill.bottleneck << "\n";
  for (auto& t : p.prefill.parts)
    o << fmt("           %9.2f s   ", t.seconds) << t.name << " [" << t.resource << "]\n";
  o << "  request  " << fmt("%.1f s", p.request_seconds) << " for one prompt of "
    << p.workload.prompt_len << " + " << p.workload.gen_len << " generated tokens\n";
  o << "  roofline (hardware peaks only): decode " << tps(p.decode_roofline.tokens_per_s)
    << " tok/s (" << p.decode_roofline.bound << "), prefill "
    << tps(p.prefill_roofline.tokens_per_s) << " tok/s (" << p.prefill_roofline.bound << ")\n";
  o << "  overlap: " << p.decode.overlap << "\n";
  o << "\nrates\n";
  for (auto& r : p.rates) o << "  " << r << "\n";
  o << "assumptions\n";
  for (auto& a : p.assumptions) o << "  " << a << "\n";
  if (!p.suggestions.empty()) {
    o << "\nwhat would help most\n";
    int n = 0;
    for (auto& s : p.suggestions) {
      o << "  " << ++n << ". " << s.change << ": ";
      if (!s.refusal.empty())
        o << "still cannot run (" << s.refusal << ")\n";
      else
        o << "decode " << tps(s.decode_tokens_per_s) << " tok/s total ("
          << fmt("%.2f×", s.decode_gain) << "), prefill " << tps(s.prefill_tokens_per_s)
          << " tok/s\n";
    }
  }
  return o.str();
}

}  // namespace strata::offload
