// The backend interface of the one layer schedule (DESIGN decision 9, engine/schedule.h): the
// schedule writes the order of a forward pass once — embed; per layer AttnRes mix and block
// banking, norm, token mixer, norm, FFN, residual adds; final mix, norm, lm_head — and calls a
// Backend per sublayer. Backends differ in where the numbers live and which kernels compute them:
// the fp32/bf16 CPU reference (engine/cpu_backend.h), the CUDA backend (engine/cuda_backend.h), the
// fast CPU backend. They own the model's weights in their memory and the per-sequence state of a
// fixed number of slots (a slot is a batch row: KDA state, conv state, MLA latent cache).
//
// A step runs the new tokens of one or more sequences packed row after row (StepShape); the
// sublayers that are row-wise (norms, mixes, adds, FFNs) see one [rows, D] activation, the token
// mixers see the segments. Activations (Act) are fp32 [rows, cols] in the backend's memory, taken
// from a step arena (alloc) that is reset by begin_step: nothing is allocated per sublayer.
//
// Not here: the schedule itself (engine/schedule.h), sampling, tokenization, what a backend does
// inside a sublayer (its own file).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/expert_executor.h"
#include "engine/sampler.h"
#include "engine/trace.h"

namespace strata::engine {

// One sequence's part of a step: `T` new tokens of slot `slot` at positions pos0 … pos0+T−1,
// packed at rows row0 … row0+T−1 of the step's activations.
struct SeqSpan {
  int slot = 0;
  int64_t pos0 = 0;
  int64_t row0 = 0;
  int64_t T = 0;
};
struct StepShape {
  std::vector<SeqSpan> seqs;
  int64_t rows = 0;  // Σ T
  bool single() const { return seqs.size() == 1; }
  // Every sequence decodes one token.
  bool decode() const {
    for (const SeqSpan& q : seqs)
      if (q.T != 1) return false;
    return true;
  }
};

// An fp32 activation [rows, cols] in the backend's memory (host or device).
struct Act {
  float* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t size() const { return rows * cols; }
};

enum class MixSite { attn, mlp, output };    // AttnRes mixes: before the mixer, the FFN, the head
enum class NormSite { input, post, final };  // input_layernorm, post_attention_layernorm, norm

enum class KdaForm { automatic, recurrent, chunked };  // automatic: chunked iff T > 1
enum class MlaForm { automatic, expanded, absorbed };  // automatic: expanded iff T > 1

// How a backend computes (one typed config, STYLE §10).
struct BackendOptions {
  Precision precision = Precision::fp32;
  ExpertNumerics experts = ExpertNumerics::exact;
  KdaForm kda_form = KdaForm::automatic;
  MlaForm mla_form = MlaForm::automatic;
  // Tiered expert store hooks (engine/offload_executor.h): wraps the numerics executor, and sees
  // each MoE layer's router input x [rows, D] (host memory) first (router lookahead).
  std::function<std::unique_ptr<ExpertExecutor>(std::unique_ptr<ExpertExecutor>)> wrap_executor;
  std::function<void(int layer, const float* x, int64_t T)> on_moe_input;
};

// Inspection of single-sequence steps (STYLE §4): named sites, routing record and replay. The
// positions in the routing logs are the sequence's positions. Not owned.
struct Trace {
  Dumper* dumper = nullptr;
  RoutingLog* record_routing = nullptr;
  const RoutingLog* replay_routing = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "cpu-ref fp32", "cuda bf16", …
  virtual const BackendOptions& options() const = 0;

  // Per-sequence state.
  virtual int slots() const = 0;
  virtual void reset_slot(int slot) = 0;             // a fresh sequence
  virtual int64_t position(int slot) const = 0;      // tokens the slot has consumed
  virtual uint64_t state_bytes(int slot) const = 0;  // KDA + conv + MLA cache held now

  // Inspection hooks for the steps that follow (nullptr: none). Only single-sequence steps.
  virtual void set_trace(const Trace* t) = 0;

  // Step arena: begin_step sizes it for the step; alloc hands out [rows, cols] activations valid
  // until the next begin_step. commit_step advances every slot of the step by its T (separate, so
  // the layer-by-layer API can run a step's layers one call at a time).
  virtual void begin_step(const StepShape& s) = 0;
  virtual Act alloc(int64_t rows, int64_t cols) = 0;
  virtual void commit_step(const StepShape& s) = 0;
  // The most rows one step may hold (callers split longer prompts into chunks).
  virtual int64_t max_step_rows() const { return INT64_MAX; }
  // The most positions one slot can hold (backends that size their state up front); callers refuse
  // longer sequences before they start.
  virtual int64_t max_context() const { return INT64_MAX; }

  // Sublayers (spec/model.md §2.2). Shapes: x, out [rows, D] unless stated.
  virtual void embed(std::span<const int32_t> ids, Act out) = 0;  // ids validated by the caller
  // AttnRes mix over sources (banked blocks then the partial sum), layer -1 for the output mix.
  virtual void mix(int layer, MixSite site, std::span<const Act> sources, Act out) = 0;
  virtual void copy(Act src, Act dst) = 0;
  virtual void norm(int layer, NormSite site, Act x, Act out) = 0;  // layer ignored for final
  virtual void token_mixer(int layer, const StepShape& s, Act x, Act out) = 0;  // KDA or MLA
  virtual void ffn(int layer, const StepShape& s, Act x, Act out) = 0;          // dense or MoE
  virtual void add(Act acc, Act b) = 0;  // acc = acc + b (a bf16 rounding point in bf16 mode)
  // logits[i, :] = lm_head · h[rows[i], :], fp32, written to host memory [rows.size(), V].
  virtual void logits(Act h, std::span<const int64_t> rows, float* out) = 0;
  // ids[i] = the token drawn from lm_head · h[rows[i], :] with draws[i] (engine/sampler.h,
  // pick_token), host memory. Throws the "logits" site's error of engine/finite_check.h when a
  // logit is NaN/Inf. The default computes the logits into host memory (logits()) and picks there;
  // a device backend picks where the logits are and moves only the ids — the same token (its sums
  // in double too, in another order: a draw can differ only where u falls within ~1e-16 of the
  // mass of an edge between two candidates).
  // V is the vocabulary (the width of logits()'s rows).
  virtual void sample(Act h, std::span<const int64_t> rows, std::span<const TokenDraw> draws,
                      int64_t V, int32_t* ids);

  // One line of what this backend did since start (experts per executor, time split), or "".
  virtual std::string telemetry_line() const { return {}; }
  // Starts the telemetry over (benchmarks read it per measured line).
  virtual void reset_telemetry() {}
  // The same telemetry as named numbers (--stats-json's "backend" object), or none.
  virtual std::vector<std::pair<std::string, double>> telemetry_values() const { return {}; }

  // Copies an activation to host memory (dumps, the layer-by-layer API, checks).
  virtual void to_host(Act a, float* dst) = 0;
  // Index (row · cols + col) of the first NaN/Inf in a [s.rows, cols], −1 if none: the schedule's
  // check of every sublayer output (engine/finite_check.h). The default copies to the host every
  // row of a step of at most kFiniteCheckAllRows rows, else the last row of each sequence (a NaN
  // anywhere in a sequence reaches its last row at the next token mixer, so a long prefill is
  // stopped at most one sublayer later and never copies gigabytes). A backend whose activations
  // are host memory scans every row in place; a device backend may reduce on the device.
  static constexpr int64_t kFiniteCheckAllRows = 64;
  virtual int64_t first_non_finite(Act a, const StepShape& s);
  // The schedule's guard at a site (layer −1: a model-level site such as "embed"): throws the
  // error of engine/finite_check.h when a holds a NaN/Inf. The default checks now, through
  // first_non_finite. A device backend may defer the verdict to a synchronisation it makes anyway
  // later in the same step (the MoE routing, the logits, commit_step), throwing there the error
  // of the first failing site in call order — one step's later sublayers then ran on garbage, but
  // nothing reached a token, the host's routing or a sequence's committed position.
  virtual void check_finite(Act a, const StepShape& s, int layer, const char* site);
  virtual void from_host(const float* src, Act a) = 0;
};

}  // namespace strata::engine
