// The CUDA backend of the layer schedule (issue 18): every sublayer on the GPU — bf16 weights
// uploaded once (KDA q|k|v and MLP gate|up concatenated for fused GEMMs, cuBLASLt), KDA and MLA
// kernels with per-slot state in device memory (KDA recurrent + conv state, MLA latent cache), the
// router on the GPU — and the routed experts across tiers: experts in the GPU expert cache run
// through kernels::moe::grouped_experts, the rest (misses) are computed by the CPU contract
// kernels from host memory (the mmapped checkpoint, or the tiered host cache + disk through the
// wrap_executor hook) while the GPU does the resident experts and the shared experts; all expert
// outputs meet in one buffer and one merge kernel sums them in expert-id order, so where an expert
// ran changes speed, never a bit (DESIGN decision 7). Experts the routing keeps choosing are
// promoted into the GPU cache off the step's path (CudaBackendOptions::promote).
//
// Numerics: bf16 with the rounding points of spec §12.2, routed experts under the integer
// contract. fp32 or exact numerics are the CPU reference's (engine/cpu_backend.h): refused here.
// Memory: one budget printed at start (budget_lines); weights, expert cache, per-slot state, the
// step arena and pinned staging are allocated in the constructor and nothing in the step loop.
// Not here: the order of the sublayers (engine/schedule.h), kernels (kernels/).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"
#include "offload/cost_model.h"

namespace strata::engine {

struct CudaBackendOptions {
  int slots = 1;
  int64_t max_context = 4096;    // positions per slot (MLA latent cache rows)
  int64_t max_step_rows = 512;   // rows of one step (a prefill chunk; the step arena's size)
  double gpu_expert_share = -1;  // share of each MoE layer's routed experts in the GPU cache;
                                 // < 0: as many as the budget holds
  uint64_t gpu_mem_bytes = 0;    // 0: the device's free memory less a 1 GiB margin
  int device = 0;
  bool progress = true;  // a progress line while uploading weights
  // Prefill staging (issue 18 item 6): an expert outside the GPU cache with at least this many
  // tokens in a step is copied host → GPU and run there; 0 = the cost model's threshold
  // (offload/cost_model.h prefill_stage_threshold) from `hardware_file` (strata bench hw --save),
  // or from host→device and memory rates measured at the first step that needs them.
  int stage_threshold = 0;
  std::string hardware_file;
  // Experts per staging round (two rounds in flight: 2× this many slots); the planner budgets
  // the same (offload/cost_model.h, one model).
  int stage_slots = offload::kStageSlotsPerRound;
  // Decode steps (every sequence one token) run from CUDA graphs: the launches between host
  // decisions (a MoE layer's routing on the host, the logits) are captured once per step shape
  // (rows, slots and MLA's length bucket; MLA reads its positions from the device) and replayed
  // afterwards. With every expert in the GPU cache a step is one graph.
  bool cuda_graphs = true;
  // MoE layers whose routed experts are all in the GPU cache build their expert groups on the
  // device (no host round trip); false forces the host path (tests compare the two bitwise).
  bool device_groups = true;
  // GPU time per sublayer kind from timing events around each backend call (eager launches: it
  // turns CUDA graphs off), in the telemetry line — where a step's GPU time goes.
  bool profile = false;
  // Promotions into the GPU expert cache (issue 18 item 5), in MoE layers with part of their
  // experts resident: the host keeps decayed routing counts per expert (halved every interval);
  // every `promote_interval` steps the hottest non-resident experts whose count beats the coldest
  // resident's by `promote_margin` (count > (1 + margin) · victim's + 1) take the victims' slots,
  // at most `promote_max` per interval. The copy runs on its own stream after the work that may
  // still read the victim, and the expert is switched in only once a non-blocking query at a later
  // step sees it done (meanwhile both run on the CPU): no step waits for it, no bit changes.
  bool promote = true;
  int promote_interval = 16;  // steps between decisions
  int promote_max = 4;        // promotions per decision (the pinned buffer holds as many experts)
  double promote_margin = 0.5;
};

// Step telemetry (summed over steps; reset by the caller reading it).
struct CudaTelemetry {
  uint64_t gpu_expert_pairs = 0, cpu_expert_pairs = 0;  // (token, expert) pairs by executor
  uint64_t gpu_experts = 0, cpu_experts = 0;            // distinct experts per layer-step
  double cpu_expert_s = 0;                              // host time in CPU expert kernels
  double sync_wait_s = 0;                               // host time waiting for the GPU
  double h2d_bytes = 0, d2h_bytes = 0;
  uint64_t staged_experts = 0, staged_pairs = 0;  // prefill staging host → GPU
  uint64_t staged_direct = 0;  // of those, DMA'd straight from a page-locked host expert cache
  double stage_copy_s = 0;     // host time of staging: copies into pinned buffers, waits for reads
  uint64_t graph_captures = 0, graph_launches = 0;  // CUDA graph segments captured / replayed
  uint64_t device_group_layers = 0;  // MoE layer-steps routed → grouped on the device
  uint64_t promotions = 0;           // experts switched into the GPU cache (copies completed)
  double promote_bytes = 0;          // bytes those copies moved host → GPU
  double promote_copy_s = 0;         // worker-thread time copying them (off the step's path)
  uint64_t steps = 0;
};

class CudaBackend final : public Backend {
 public:
  // Throws strata::Error with one line when the build has no CUDA, no device is present, the
  // options need the CPU reference (fp32, exact experts), the model has shapes the kernels do not
  // support, or the budget cannot hold the dense weights plus one sequence (with the numbers).
  CudaBackend(const Model& model, BackendOptions options, CudaBackendOptions cuda);
  ~CudaBackend() override;

  const char* name() const override { return name_.c_str(); }
  const BackendOptions& options() const override { return opt_; }
  int slots() const override { return cuda_.slots; }
  void reset_slot(int slot) override;
  int64_t position(int slot) const override { return pos_[size_t(slot)]; }
  uint64_t state_bytes(int slot) const override;
  void set_trace(const Trace* t) override { trace_ = t; }

  void begin_step(const StepShape& s) override;
  Act alloc(int64_t rows, int64_t cols) override;
  void commit_step(const StepShape& s) override;
  int64_t max_step_rows() const override { return cuda_.max_step_rows; }
  int64_t max_context() const override { return cuda_.max_context; }

  void embed(std::span<const int32_t> ids, Act out) override;
  void mix(int layer, MixSite site, std::span<const Act> sources, Act out) override;
  void copy(Act src, Act dst) override;
  void norm(int layer, NormSite site, Act x, Act out) override;
  void token_mixer(int layer, const StepShape& s, Act x, Act out) override;
  void ffn(int layer, const StepShape& s, Act x, Act out) override;
  void add(Act acc, Act b) override;
  void logits(Act h, std::span<const int64_t> rows, float* out) override;
  // The draws on the device (kernels/sample): only the ids come to the host.
  void sample(Act h, std::span<const int64_t> rows, std::span<const TokenDraw> draws, int64_t V,
              int32_t* ids) override;
  void to_host(Act a, float* dst) override;
  void from_host(const float* src, Act a) override;
  // Deferred: a scan kernel on the stream (inside the decode graphs), the verdict read at the
  // step's existing synchronisations (MoE routing, logits) or at commit_step (Backend docs).
  void check_finite(Act a, const StepShape& s, int layer, const char* site) override;

  // The budget printed at start: one line per pool and the totals.
  const std::vector<std::string>& budget_lines() const { return budget_; }
  // Routed experts resident in the GPU cache, of all (layer, expert) pairs.
  int64_t gpu_resident_experts() const;
  int64_t routed_experts() const;
  CudaTelemetry& telemetry() { return tel_; }
  std::string telemetry_line() const override;
  void reset_telemetry() override;
  std::vector<std::pair<std::string, double>> telemetry_values() const override;

  struct Impl;
  struct Graphs;
  struct Profile;

  // The prefill staging threshold in use (resolving it on first call; see CudaBackendOptions).
  int stage_threshold();

 private:
  const Model& model_;
  const ModelConfig& c_;
  BackendOptions opt_;
  CudaBackendOptions cuda_;
  std::string name_;
  std::vector<std::string> budget_;
  std::vector<int64_t> pos_;
  const Trace* trace_ = nullptr;
  CudaTelemetry tel_;
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<Graphs> graphs_;
  std::unique_ptr<Profile> prof_;
  friend struct ProfScope;
  // Graph segments: graphable() opens (or, when replaying, skips) a segment and says whether the
  // caller issues its launches; eager_point() closes the open segment (capture: end, keep and
  // launch it; replay: launch the kept one) before host-dependent work.
  bool graphable();
  void eager_point();
  // check_finite's scan waits for the next launch point (graphable, eager_point: flush_scan) or is
  // folded into the residual add that reads the same activation next (add_inplace_scan).
  struct PendingScan {
    const float* x = nullptr;
    int64_t n = 0;
    uint32_t site = 0;
  };
  PendingScan scan_pending_;
  void flush_scan();
  // Non-finite guard: the sites scanned this step (layer, site, columns) in call order and how
  // many of them the last read of the device record covered.
  struct FiniteSite {
    int layer;
    const char* site;
    int64_t cols;
    const char* unit = nullptr;  // set: rows named by index and unit (fail_row), not by position
  };
  std::vector<FiniteSite> finite_sites_;
  size_t finite_read_ = 0;
  size_t finite_downloaded_ = 0;  // sites covered by the last enqueued (or replayed) download
  StepShape finite_shape_;
  // STRATA_CUDA_PROFILE_STEP=n: the n-th replayed decode step runs between profiler_start and
  // profiler_stop (ncu --profile-from-start off collects that one step); 0 = off.
  int profile_step_ = 0, replayed_steps_ = 0;
  bool profiling_ = false;
  // The record's download, covering the sites so far, before a sync the caller makes (enqueue:
  // false when a replayed graph segment holds the copy); after that sync, finite_verdict() throws
  // for the first failing site.
  void finite_download(bool enqueue = true);
  void finite_verdict();
  void moe_tail(int l, int64_t T, float* acc, uint16_t* accb, const float* shared, Act out);
  // Promotions (CudaBackendOptions::promote), at every commit_step: switches in a batch whose
  // copies are seen done and, at an interval, decides the next (copied by a worker thread).
  void promote_poll();
};

}  // namespace strata::engine
