// Capacity planning (issue 22): where a model's pieces go on a machine (dense trunk per GPU, expert
// cache per tier, state per sequence), the memory budget of each tier with its headroom, and the
// predicted prefill and decode speed with the bottleneck named — all from the one cost model
// (offload/cost_model.h). `strata plan` prints it; the sizes are the ones the engine's budget will
// carve (issue 18 item 4), stated here as planning assumptions where the engine has none yet.
//
// Not here: printing, JSON and SVG (tools/cmd_plan.cpp); measuring hardware (hw_measure.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "offload/cost_model.h"

namespace strata::offload {

struct Workload {
  int64_t context = 8192;     // tokens cached per sequence when decoding (prompt + generated)
  int concurrency = 1;        // sequences decoded together (a step advances each by one token)
  int64_t prompt_len = 8192;  // prefill length
  int64_t gen_len = 256;      // tokens generated per request (for the request time)
  int64_t chunk = 0;          // prefill chunk; 0 = the planner's choice (GPU: ≤ 8192; CPU: whole)
};

enum class BackendChoice { automatic, gpu, cpu_reference, cpu_bf16 };
// "auto", "gpu", "cpu-reference", "cpu-bf16"; throws strata::Error naming `what`.
BackendChoice parse_backend(const std::string& s, const std::string& what);

struct PlanOptions {
  BackendChoice backend = BackendChoice::automatic;  // auto: the GPUs when present, else the CPU
                                                     // reference (what the engine runs today)
  Overlap overlap = Overlap::moe_layer;
  CostAssumptions assumptions;
  // A placement to use instead of the planner's (validation against measured placements); the
  // budget then checks that each tier can hold its share, and refuses if not.
  bool force_placement = false;
  Placement placement;
  // Planning assumptions for memory (printed with the budget).
  double gpu_headroom_share = 0.05;         // of each GPU's memory, kept free
  uint64_t gpu_context_bytes = 1ull << 30;  // CUDA context, cuBLASLt workspace, graphs
  uint64_t workspace_bytes_per_chunk_token = 1ull << 20;  // prefill activations per chunk token
  // Staging (the GPU engine, engine/cuda_backend.cpp): 2 rounds of kStageSlotsPerRound device
  // slots per GPU (fewer when a layer has fewer experts) and 2 pinned host buffers.
  int staging_pinned_slots = 2;
  double host_headroom_share = 0.10;  // of DRAM, kept for the OS and page cache
  uint64_t host_headroom_min_bytes = 8ull << 30;
};

struct BudgetItem {
  std::string name;
  uint64_t bytes = 0;
};

struct TierBudget {
  std::string tier;       // "GPU (each of 8 × NVIDIA H200)", "host DRAM (per node)", "disk"
  uint64_t capacity = 0;  // 0 = not bounded here (disk)
  std::vector<BudgetItem> items;
  uint64_t used() const;
  uint64_t free() const { return capacity > used() ? capacity - used() : 0; }
};

struct Suggestion {
  std::string change;  // "double the DRAM to 4 TB per node"
  double decode_tokens_per_s = 0;
  double prefill_tokens_per_s = 0;
  double decode_gain = 0;  // new / current decode tok/s
  std::string refusal;     // the changed machine cannot run it either (then no gain)
};

struct Plan {
  std::string model;     // describe_config
  std::string hardware;  // profile description
  std::string refusal;   // non-empty: cannot run, and why (nothing below is meaningful)
  TrunkBackend backend = TrunkBackend::gpu;
  int gpus = 0;  // total GPUs used (pipeline stages)
  int layers_per_gpu = 0;
  Placement placement;
  uint64_t experts_total = 0, experts_gpu = 0, experts_host = 0, experts_disk = 0;
  uint64_t expert_bytes = 0;
  uint64_t trunk_bytes_per_gpu = 0;
  uint64_t state_bytes_per_sequence = 0;  // KDA + conv + MLA cache at workload.context
  std::vector<TierBudget> budgets;
  Workload workload;
  DecodeEstimate decode;
  PrefillEstimate prefill;
  Roofline decode_roofline, prefill_roofline;
  double request_seconds = 0;      // prefill of prompt_len + gen_len decode steps, one sequence
  std::vector<std::string> rates;  // CostModel::describe_rates
  std::vector<std::string> assumptions;  // memory and overlap assumptions, in words
  std::vector<Suggestion> suggestions;   // best first
};

// Throws strata::Error for inconsistent input (a rate the chosen backend needs is missing, a
// workload value out of range); returns a Plan with `refusal` set when the machine cannot run the
// model (too little memory; GPUs this build does not support).
Plan make_plan(const HardwareProfile& hw, const ModelConfig& cfg, const Workload& w,
               const PlanOptions& o = {});
// The same without the suggestions (what the suggestions and the chart evaluate).
Plan make_plan_core(const HardwareProfile& hw, const ModelConfig& cfg, const Workload& w,
                    const PlanOptions& o);

// The placements of the routed experts `strata bench e2e` measures and `strata plan --bench-e2e`
// predicts (one list for both): the share each tier serves and the engine flags that make it.
struct BenchPlacement {
  std::string name;         // "all GPU", "10% GPU + host", ... (bench e2e's --placements names)
  Placement share;          // as the engine realises it (see engine_gpu_share)
  std::string gpu_experts;  // the engine's --gpu-experts ("" on the CPU backends)
  std::string host_mem;     // --host-mem: the host expert cache ("" = the mmapped checkpoint)
};
std::vector<BenchPlacement> bench_e2e_placements(bool gpu, int num_experts);
// The share of each MoE layer's experts the GPU engine caches for --gpu-experts `share`: it
// rounds share·E to whole experts per layer (engine/cuda_backend.cpp).
double engine_gpu_share(double share, int num_experts);

nlohmann::json plan_json(const Plan& p);
std::string plan_text(const Plan& p);  // the terminal report

}  // namespace strata::offload
