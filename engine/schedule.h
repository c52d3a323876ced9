// The one layer schedule of a forward pass (spec/model.md §2.2, DESIGN decision 9), written once
// for every backend: embed; per layer (a) AttnRes mix over [B…, P] (or P), (b) block banking,
// (c) norm → token mixer (KDA or gated MLA) → residual add, (d) mix → norm → FFN (dense or MoE) →
// residual add; final mix → norm → lm_head. Each step is named and dumped at a stable site
// (blk.{layer}.{mix_attn, attn_norm, kda_out|mla_out, mix_mlp, ffn_norm, moe_out|mlp_out, out};
// embed, final_mix, final_norm, logits) so a numeric difference is located by one command.
//
// A step runs several sequences at once (continuous batching): each SeqChunk is one slot's new
// tokens; rows are packed in chunk order. Prefill and decode are the same call.
// Not here: what a sublayer computes (the backends), sampling and the generation loop.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "storage/config.h"

namespace strata::engine {

// The residual stream of a step between layers (spec §2.2): banked AttnRes blocks B and the
// running partial sum P (plain models: P is the hidden state; B stays empty). P.data == nullptr
// right after a block was banked.
struct ActStream {
  std::vector<Act> blocks;
  Act P;
};

struct SeqChunk {
  int slot = 0;
  std::span<const int32_t> ids;
  bool want_logits = true;  // the last row's logits
  bool all_logits = false;  // every row's logits (implies want_logits)
  // Set: the last row's token is drawn on the backend (Backend::sample) and its logits are not
  // returned (want_logits and all_logits ignored). Not owned; read during step().
  const TokenDraw* draw = nullptr;
};

// What one step returns, per chunk in chunk order; valid until the next step of the schedule.
struct StepOutput {
  std::vector<std::span<const float>> logits;  // [V] (last row), [T·V] (all_logits) or empty
  std::vector<int32_t> tokens;                 // the drawn token, or −1 (no draw)
};

struct ScheduleOptions {
  int stop_after_layer = -1;  // ≥ 0: stop after this layer, no logits
  Dumper* dumper = nullptr;   // model-level sites (single-sequence steps only)
};

class Schedule {
 public:
  Schedule(Backend& backend, const ModelConfig& c, ScheduleOptions o = {})
      : b_(backend), c_(c), opt_(o) {}

  // One step over the chunks (distinct slots). Returns per chunk its logits ([V] for the last row,
  // [T, V] with all_logits, empty when not wanted, drawn or stopped early) and its drawn token.
  // Advances every slot. Throws strata::Error for a token id outside the vocabulary (naming slot
  // and position).
  const StepOutput& step(std::span<const SeqChunk> chunks);
  // step() with each chunk's logits copied out (tests and callers that keep them).
  std::vector<std::vector<float>> step_logits(std::span<const SeqChunk> chunks);

  // The pieces of step(), for the layer-by-layer API (engine/session.h).
  StepShape shape(std::span<const SeqChunk> chunks) const;
  void begin(const StepShape& s);  // begins the backend's step and takes the scratch
  ActStream embed(const StepShape& s, std::span<const int32_t> ids);  // ids: all rows, packed
  void run_layer(int l, const StepShape& s, ActStream& st);
  // Final mix, norm and lm_head of `rows`; out: host [rows.size(), V]. Then the tokens of
  // `draw_rows` with `draws` into draw_ids (Backend::sample), when there are any.
  void head(const ActStream& st, std::span<const int64_t> rows, float* out,
            std::span<const int64_t> draw_rows = {}, std::span<const TokenDraw> draws = {},
            int32_t* draw_ids = nullptr);

 private:
  void dump(const std::string& name, Act a, const std::vector<int64_t>& row_shape);
  void dump(int l, const char* site, Act a, const std::vector<int64_t>& row_shape);

  Backend& b_;
  const ModelConfig& c_;
  ScheduleOptions opt_;
  bool single_ = true;         // the current step has one sequence (dumps allowed)
  Act x_, h_, a_;              // this step's scratch activations [rows, D]
  std::vector<float> host_;    // dump staging
  std::vector<float> logits_;  // the step's host logits, grown as needed and never zero-filled
  StepOutput out_;             // step()'s result
  std::vector<int64_t> rows_, draw_rows_;
  std::vector<TokenDraw> draws_;
  std::vector<int32_t> draw_ids_;
};

}  // namespace strata::engine
