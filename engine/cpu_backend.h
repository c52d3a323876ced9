// The CPU reference backend of the layer schedule: every sublayer computed by the fp32 reference
// ops (cpu/ref/ops.h) in fp32 (the oracle) or with the bf16 rounding points of spec §12.2, routed
// experts through an ExpertExecutor (exact fp32 dequantisation or the integer contract). Per slot
// it holds the decode state of spec §11: the KDA recurrent state [H, V, K] fp32 and conv state per
// KDA layer, the MLA latent cache per MLA layer. Activations are host vectors.
// Not here: the order of the sublayers (engine/schedule.h), fast kernels (the fast CPU backend).
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"

namespace strata::engine {

struct KdaState {
  std::vector<float> S;                       // [H, V, K] fp32 recurrent state
  std::vector<float> conv_q, conv_k, conv_v;  // [P, W−1] last pre-conv inputs, oldest first
};

struct MlaCache {
  int64_t len = 0;
  std::vector<float> rows;  // [len, kv_lora + rope]: normalised latent | shared rope key
};

// One sequence's decode state on the host, shared by the CPU backends (reference and fast).
struct CpuSeqState {
  int64_t pos = 0;
  std::vector<KdaState> kda;                   // [layer] (empty entries for MLA layers)
  std::vector<MlaCache> mla;                   // [layer] (empty entries for KDA layers)
  void reset(const ModelConfig& c);            // a fresh sequence: zero KDA and conv state
  uint64_t bytes(const ModelConfig& c) const;  // KDA + conv + MLA cache held now
  const KdaState* kda_at(const ModelConfig& c, int l) const {
    return c.is_kda(l) ? &kda[size_t(l)] : nullptr;
  }
  const MlaCache* mla_at(const ModelConfig& c, int l) const {
    return c.is_mla(l) ? &mla[size_t(l)] : nullptr;
  }
};

// What the CPU backends share: the model, options and name, the routed-expert executor, each
// slot's host state (CpuSeqState), the trace, and activations in host memory (copies, finite
// scans and dumps in place).
class CpuHostBackend : public Backend {
 public:
  const char* name() const override { return name_.c_str(); }
  const BackendOptions& options() const override { return opt_; }
  int slots() const override { return int(slots_.size()); }
  void reset_slot(int slot) override { slots_[size_t(slot)].reset(c_); }
  int64_t position(int slot) const override { return slots_[size_t(slot)].pos; }
  uint64_t state_bytes(int slot) const override { return slots_[size_t(slot)].bytes(c_); }
  void set_trace(const Trace* t) override { trace_ = t; }
  void commit_step(const StepShape& s) override;
  void copy(Act src, Act dst) override;
  void to_host(Act a, float* dst) override;
  int64_t first_non_finite(Act a, const StepShape& s) override;  // every row, in place
  void from_host(const float* src, Act a) override;

  // The state of a slot's layer (nullptr for a layer of the other kind), for tests.
  const KdaState* kda_state(int slot, int l) const { return slots_[size_t(slot)].kda_at(c_, l); }
  const MlaCache* mla_cache(int slot, int l) const { return slots_[size_t(slot)].mla_at(c_, l); }

 protected:
  using Slot = CpuSeqState;
  // The executor of the options (wrapped by options.wrap_executor) and `slots` fresh slots.
  CpuHostBackend(const Model& model, BackendOptions options, int slots);
  void dump(int l, const char* site, const float* data, int64_t rows,
            const std::vector<int64_t>& row_shape) const;
  void embed_rows(std::span<const int32_t> ids, Act out) const;  // bf16 rows widen exactly
  const AttnResWeights& mix_weights(int layer, MixSite site) const;
  const std::vector<float>& norm_weights(int layer, NormSite site) const;

  const Model& model_;
  const ModelConfig& c_;
  BackendOptions opt_;
  std::string name_;
  std::unique_ptr<ExpertExecutor> executor_;
  std::vector<Slot> slots_;
  const Trace* trace_ = nullptr;
};

class CpuRefBackend final : public CpuHostBackend {
 public:
  // Throws strata::Error when the options cannot run on this model (e.g. contract numerics
  // without MXFP4 experts).
  CpuRefBackend(const Model& model, BackendOptions options, int slots = 1);

  void begin_step(const StepShape& s) override;
  Act alloc(int64_t rows, int64_t cols) override;

  void embed(std::span<const int32_t> ids, Act out) override;
  void mix(int layer, MixSite site, std::span<const Act> sources, Act out) override;
  void norm(int layer, NormSite site, Act x, Act out) override;
  void token_mixer(int layer, const StepShape& s, Act x, Act out) override;
  void ffn(int layer, const StepShape& s, Act x, Act out) override;
  void add(Act acc, Act b) override;
  void logits(Act h, std::span<const int64_t> rows, float* out) override;

 private:
  void kda(int l, Slot& st, const float* x, float* out, int64_t T);
  void mla(int l, Slot& st, int64_t pos0, const float* x, float* out, int64_t T);
  void moe(int l, const StepShape& s, const float* x, float* out, int64_t T);

  std::deque<std::vector<float>> arena_;  // this step's activations
};

}  // namespace strata::engine
