// A sequence being run through a Model: the per-sequence decode state (spec §11: KDA recurrent
// state [H, V, K] fp32 and conv state per KDA layer, the MLA latent cache per MLA layer) and the
// forward pass of spec/model.md §2.2 — embed, layers (AttnRes or plain residual; KDA or gated MLA;
// dense MLP or MoE), final mix, norm, lm_head. Prefill and decode are the same call: forward()
// runs T new tokens at positions position()…position()+T−1 (T > 1 uses the chunked KDA form and
// the expanded MLA attention, T == 1 the recurrent form and the absorbed attention).
// The forward is also available layer by layer (embed / run_layer / head) so a test can inject a
// layer input and compare one layer (STYLE §4), and it can stop after a layer, dump named sites
// and record or replay the routing (engine/trace.h).
// Not here: sampling and the generation loop (tools/cmd_run.cpp), tokenization.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/expert_executor.h"
#include "engine/model.h"
#include "engine/trace.h"

namespace strata::engine {

enum class KdaForm { automatic, recurrent, chunked };  // automatic: chunked iff T > 1
enum class MlaForm { automatic, expanded, absorbed };  // automatic: expanded iff T > 1

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
};

// The residual stream of T tokens between layers (spec §2.2): banked AttnRes blocks B and the
// running partial sum P (plain models: P is the hidden state; B stays empty).
struct Stream {
  int64_t T = 0;
  std::vector<std::vector<float>> blocks;  // each [T, D]
  std::vector<float> P;                    // [T, D]; empty right after a block was banked
};

struct KdaState {
  std::vector<float> S;                       // [H, V, K] fp32 recurrent state
  std::vector<float> conv_q, conv_k, conv_v;  // [P, W−1] last pre-conv inputs, oldest first
};

struct MlaCache {
  int64_t len = 0;
  std::vector<float> rows;  // [len, kv_lora + rope]: normalised latent | shared rope key
};

class Session {
 public:
  Session(const Model& model, SessionOptions options = {});

  const Model& model() const { return model_; }
  const SessionOptions& options() const { return opt_; }
  int64_t position() const { return pos_; }  // tokens consumed so far

  // Runs `ids` at the next positions and advances. Returns logits [T, V] when all_logits, else
  // the last row [V]; empty when options().stop_after_layer stopped the pass.
  std::vector<float> forward(std::span<const int32_t> ids, bool all_logits = false);

  // The pieces of forward(), in order. run_layer advances layer l's state over s.T tokens at
  // positions position()…; advance() then moves position() (forward() does all of this).
  Stream embed(std::span<const int32_t> ids) const;
  void run_layer(int l, Stream& s);
  std::vector<float> head(const Stream& s, bool all_logits);
  void advance(int64_t T) { pos_ += T; }

  // Drop all state (a fresh sequence).
  void reset();

  const KdaState* kda_state(int l) const;
  const MlaCache* mla_cache(int l) const;
  // Bytes of per-sequence state held now (KDA + conv + MLA cache).
  uint64_t state_bytes() const;

 private:
  void kda(int l, const float* x, float* out, int64_t T);
  void mla(int l, const float* x, float* out, int64_t T);
  void moe(int l, const float* x, float* out, int64_t T);
  void dense(int l, const float* x, float* out, int64_t T);
  void mix(const Stream& s, const AttnResWeights& w, float* out) const;
  void dump(const std::string& name, const float* data, int64_t rows,
            const std::vector<int64_t>& row_shape) const;
  void dump(int l, const char* site, const float* data, int64_t rows,
            const std::vector<int64_t>& row_shape) const;

  const Model& model_;
  const ModelConfig& c_;
  SessionOptions opt_;
  std::unique_ptr<ExpertExecutor> executor_;
  int64_t pos_ = 0;
  std::vector<KdaState> kda_;  // [layer] (empty entries for MLA layers)
  std::vector<MlaCache> mla_;  // [layer] (empty entries for KDA layers)
};

}  // namespace strata::engine
