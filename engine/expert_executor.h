// The one interface through which a MoE layer's routed experts are computed. The engine routes
// (router + top-k, or a replayed routing), groups the layer's tokens by expert, hands the groups
// to an ExpertExecutor, and merges the per-(token, slot) outputs itself in expert-id order
// (docs/numerics.md §5) — so executors only compute expert FFNs and can be swapped: the fp32
// exact oracle, the scalar contract mode, later the fast CPU kernels, the GPU and the tiered store.
// Not here: routing, the weighted merge, the latent projections or shared experts (engine/session).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cpu/ref/ops.h"
#include "engine/model.h"

namespace strata::cpu {
enum class ExpertIsa;  // cpu/expert_kernels.h
}

namespace strata::engine {

enum class ExpertNumerics {
  exact,     // experts dequantised to fp32 (MXFP4 exact), fp32 math: the oracle, used vs golden
  contract,  // docs/numerics.md integer contract: the fast CPU expert kernels
             // (cpu/expert_kernels.h), bit-identical to the scalar strata::cpu::expert_ffn_contract
  bf16,      // bf16 routed experts (Kimi-Linear) on the fast bf16 GEMMs of the trunk
             // (cpu/bf16_linear.h): the bf16 model's rounding points, fp32 sums whose order
             // follows the kernel (GEMV or oneDNN by the expert's token count) — outside the
             // contract, within the bf16 noise of the exact oracle (engine/bf16_executor.cpp)
};
const char* expert_numerics_name(ExpertNumerics n);
ExpertNumerics parse_expert_numerics(const std::string& s);  // throws strata::Error

// A layer's routing: per token the selected experts (ascending id) and their weights.
struct MoeRouting {
  int64_t T = 0, top_k = 0;
  std::vector<int32_t> ids;    // [T, top_k], ascending per token
  std::vector<float> weights;  // [T, top_k], aligned with ids (renormalised, scaled)
};

// The work of one expert: the tokens routed to it and, per token, the output slot
// (token · top_k + j) its result goes to.
struct ExpertTask {
  int32_t expert = 0;
  std::vector<int32_t> tokens;
  std::vector<int32_t> slots;
};
// Groups a routing by expert (tasks in increasing expert id; tokens in increasing order).
std::vector<ExpertTask> group_by_expert(const MoeRouting& r);

// What an executor needs of one MoE layer.
struct ExpertLayer {
  int layer = 0;
  const MoeWeights* weights = nullptr;
  const ModelConfig* config = nullptr;
  cpu::ref::Glu glu;
  int64_t in_dim = 0;  // expert input/output width (latent size or hidden)
  int64_t intermediate = 0;
};

class HostExpertSource;  // engine/offload_executor.h

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  virtual const char* name() const = 0;
  // Where this executor's experts' bytes come from when another consumer needs them (the GPU
  // backend's prefill staging): the tiered store's host cache, or nullptr for the layer weights as
  // given (the mmapped checkpoint).
  virtual HostExpertSource* host_source() { return nullptr; }
  // The next run() comes soon (the GPU engine calls this before it waits for a decode layer's
  // routing): an executor whose kernels run on a thread pool may wake its workers now, so that
  // they spin through the wait instead of sleeping until run() wakes them. Default: nothing.
  virtual void warm() {}
  // For every task and every (token, slot) in it: y[slot, :] = expert(x[token, :]).
  // x: [T, in_dim] expert inputs; y: [T·top_k, in_dim].
  virtual void run(const ExpertLayer& layer, std::span<const ExpertTask> tasks, const float* x,
                   float* y, Precision p) = 0;
  // Where run()'s time went since the last reset_telemetry(): named seconds (a wrapper's own
  // parts, then its inner executor's), for the backend's telemetry. Default: none.
  virtual std::vector<std::pair<std::string, double>> telemetry_values() const { return {}; }
  virtual void reset_telemetry() {}
};

// The executor for a numerics mode. contract requires MXFP4 experts, bf16 requires bf16 experts
// (throws strata::Error naming the reason otherwise: no silent fallback, STYLE §12).
std::unique_ptr<ExpertExecutor> make_expert_executor(ExpertNumerics n, const ModelConfig& c);

// The bf16 executor (ExpertNumerics::bf16): per expert, its tokens' rows through the trunk's
// cpu::Bf16Linear (gate and up in one pass, the GLU, down), outputs rounded to bf16. Requires bf16
// experts and Precision::bf16 (asserted).
std::unique_ptr<ExpertExecutor> make_bf16_executor();
// The contract executor with its kernels' ISA chosen (cpu::ExpertIsa::automatic: the best this CPU
// runs; scalar/avx2/avx512: forced, for tests and benchmarks). An ISA this CPU cannot run throws
// strata::Error (no silent fallback). Requires MXFP4 experts (asserted). pin_threads: the kernels
// run in an arena of one hwloc-pinned worker per core (cpu::PinnedArena) instead of an unpinned
// one. keep_warm: warm() keeps the arena's workers spinning (at most 5 ms) until run().
std::unique_ptr<ExpertExecutor> make_contract_executor(const ModelConfig& c, cpu::ExpertIsa isa,
                                                       bool pin_threads = false,
                                                       bool keep_warm = false);

}  // namespace strata::engine
