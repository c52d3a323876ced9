// A sequence being run through a Model: one slot of a Backend driven by the layer schedule
// (engine/schedule.h). Prefill and decode are the same call: forward() runs T new tokens at
// positions position()…position()+T−1 (T > 1 uses the chunked KDA form and the expanded MLA
// attention, T == 1 the recurrent form and the absorbed attention, unless forced).
// The forward is also available layer by layer on a host copy of the residual stream (embed /
// run_layer / head) so a test can inject a layer input and compare one layer (STYLE §4), and it
// can stop after a layer, dump named sites and record or replay the routing (engine/trace.h).
// A Session either owns a CPU reference backend with one slot (Session(model, options)) or drives
// one slot of a backend it is given (several sessions can share a backend; steps that batch
// several sequences go through Schedule::step directly).
// Not here: sampling and the generation loop (tools/cmd_run.cpp), tokenization.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu_backend.h"
#include "engine/model.h"
#include "engine/schedule.h"
#include "engine/trace.h"

namespace strata::engine {

struct SessionOptions {
  Precision precision = Precision::fp32;
  ExpertNumerics experts = ExpertNumerics::exact;
  KdaForm kda_form = KdaForm::automatic;
  MlaForm mla_form = MlaForm::automatic;
  int stop_after_layer = -1;  // ≥ 0: forward() stops after this layer, returns no logits
  Dumper* dumper = nullptr;   // captures matching sites (not owned)
  RoutingLog* record_routing = nullptr;        // filled with every MoE layer's selection
  const RoutingLog* replay_routing = nullptr;  // forced selections (tokens it covers)
  // Tiered expert store hooks (engine/offload_executor.h): wraps the numerics executor, and sees
  // each MoE layer's router input x [T, D] first (router lookahead).
  std::function<std::unique_ptr<ExpertExecutor>(std::unique_ptr<ExpertExecutor>)> wrap_executor;
  std::function<void(int layer, const float* x, int64_t T)> on_moe_input;

  BackendOptions backend() const;  // the fields a backend takes
};

// The residual stream of T tokens between layers on the host (spec §2.2): banked AttnRes blocks B
// and the running partial sum P (plain models: P is the hidden state; B stays empty).
struct Stream {
  int64_t T = 0;
  std::vector<std::vector<float>> blocks;  // each [T, D]
  std::vector<float> P;                    // [T, D]; empty right after a block was banked
};

class Session {
 public:
  // A session on its own CPU reference backend (one slot).
  Session(const Model& model, SessionOptions options = {});
  // A session on slot `slot` of `backend` (not owned; must outlive the session). The backend's
  // own options decide precision, numerics and forms; options' inspection fields apply.
  Session(const Model& model, Backend& backend, int slot, SessionOptions options = {});
  // Detaches its trace from the backend, which may outlive it (a Schedule driven directly, the
  // next session on another slot): the backend must not keep a pointer into this session.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const Model& model() const { return model_; }
  const SessionOptions& options() const { return opt_; }
  Backend& backend() { return *backend_; }
  int64_t position() const { return backend_->position(slot_); }  // tokens consumed so far

  // Runs `ids` at the next positions and advances. Returns logits [T, V] when all_logits, else
  // the last row [V]; empty when options().stop_after_layer stopped the pass.
  std::vector<float> forward(std::span<const int32_t> ids, bool all_logits = false);
  // Runs `ids` like forward() and returns the token drawn from the last row's logits with `draw`
  // (Backend::sample: on a device backend only the id leaves the device). −1 when
  // options().stop_after_layer stopped the pass.
  int32_t forward_token(std::span<const int32_t> ids, const TokenDraw& draw);

  // The pieces of forward(), in order, on a host copy of the stream. run_layer advances layer l's
  // state over s.T tokens at positions position()…; advance() then moves position().
  Stream embed(std::span<const int32_t> ids);
  void run_layer(int l, Stream& s);
  std::vector<float> head(const Stream& s, bool all_logits);
  void advance(int64_t T);

  // Drop all state (a fresh sequence).
  void reset() { backend_->reset_slot(slot_); }

  // The CPU reference backend's state (nullptr on other backends or for the other layer kind).
  const KdaState* kda_state(int l) const;
  const MlaCache* mla_cache(int l) const;
  // Bytes of per-sequence state held now (KDA + conv + MLA cache).
  uint64_t state_bytes() const { return backend_->state_bytes(slot_); }

 private:
  StepShape shape(int64_t T) const;
  // forward()'s chunk loop: each step's output to `take`; the last chunk draws with `draw` if set.
  void run_chunks(std::span<const int32_t> ids, bool all_logits, const TokenDraw* draw,
                  const std::function<void(const StepOutput&)>& take);
  ActStream upload(const StepShape& s, const Stream& st);
  void download(const ActStream& a, Stream& st);

  const Model& model_;
  SessionOptions opt_;
  std::unique_ptr<Backend> owned_;
  Backend* backend_ = nullptr;
  int slot_ = 0;
  Trace trace_;
  Schedule schedule_;
};

}  // namespace strata::engine
