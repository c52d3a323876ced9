// The Kimi K3 / Kimi-Linear text model on the CPU: weights per layer (composed, STYLE §8) loaded
// from a Checkpoint with every tensor claimed and shape-checked, and the forward pass of
// spec/model.md §2.2 for both variants, switched by config fields only (DESIGN decision 3).
// Compute is the fp32 reference ops (cpu/ref/ops.h) in fp32 (the oracle) or with the bf16 rounding
// points of spec §12.2; routed experts go through an ExpertExecutor (engine/expert_executor.h).
// Weights stay in the mmapped checkpoint: bf16 matrices and MXFP4 experts are widened row by row
// inside the ops, never copied whole. Small vectors (norms, conv taps, gate params) are fp32
// copies. Not here: per-sequence state and the decode loop (engine/session.h), sampling, tokenizer.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cpu/ref/ops.h"
#include "storage/checkpoint.h"
#include "storage/config.h"

namespace strata::engine {

using cpu::ref::Precision;
using cpu::ref::WeightView;

// AttnRes pseudo-query of one mix: the norm weight and the [1, D] projection direction (spec §6.2).
struct AttnResWeights {
  std::vector<float> norm;  // [D]
  std::vector<float> proj;  // [D]
};

struct KdaWeights {
  WeightView q_proj, k_proj, v_proj;          // [P, D]
  std::vector<float> q_conv, k_conv, v_conv;  // [P, W] fp32
  WeightView f_a_proj, f_b_proj;              // [rank, D], [P, rank]: decay logits
  std::vector<float> A_log;                   // [H] (per head; padding checked zero)
  std::vector<float> dt_bias;                 // [P]
  WeightView b_proj;                          // [H, D]: beta logits
  WeightView g_proj;                          // full-rank output gate [P, D] (K3)
  WeightView g_a_proj, g_b_proj;              // low-rank output gate (Kimi-Linear)
  std::vector<float> o_norm;                  // [d] fp32
  WeightView o_proj;                          // [D, P]
};

struct MlaWeights {
  WeightView q_a_proj;           // [q_lora, D]       (q-LoRA form)
  std::vector<float> q_a_norm;   // [q_lora]
  WeightView q_b_proj;           // [H·q_dim, q_lora]
  WeightView q_proj;             // [H·q_dim, D]      (direct form, q_lora_rank 0)
  WeightView kv_a_proj;          // [kv_lora + rope, D]
  std::vector<float> kv_a_norm;  // [kv_lora]
  WeightView kv_b_proj;          // [H·(nope + v), kv_lora]
  WeightView g_proj;             // [H·v, D] output gate (when mla.output_gate)
  WeightView o_proj;             // [D, H·v]
};

struct DenseMlpWeights {
  cpu::ref::GluMlp mlp;  // gate/up [I, D], down [D, I]
};

// One routed expert: w1 = gate, w3 = up, w2 = down, MXFP4 or bf16 views (logical shapes).
struct ExpertWeights {
  WeightView w1, w3, w2;
};

struct MoeWeights {
  WeightView router;                       // gate.weight [E, D]
  std::vector<float> router_bias;          // e_score_correction_bias [E]
  WeightView latent_down;                  // routed_expert_down_proj [latent, D] (LatentMoE)
  std::vector<float> latent_norm;          // routed_expert_norm [latent] (latent_moe_use_norm)
  WeightView latent_up;                    // routed_expert_up_proj [D, latent]
  std::optional<cpu::ref::GluMlp> shared;  // shared_experts as one MLP (num_shared_experts > 0)
  std::vector<ExpertWeights> experts;      // [E]
};

struct LayerWeights {
  int index = 0;
  LayerKind kind = LayerKind::kda;
  std::vector<float> input_norm, post_norm;         // [D]
  std::optional<AttnResWeights> attn_res, mlp_res;  // AttnRes models only
  std::optional<KdaWeights> kda;
  std::optional<MlaWeights> mla;
  std::optional<DenseMlpWeights> dense;
  std::optional<MoeWeights> moe;
};

struct ModelWeights {
  WeightView embed;                          // [V, D] bf16
  WeightView lm_head;                        // [V, D]
  std::vector<float> final_norm;             // [D]
  std::optional<AttnResWeights> output_res;  // the final AttnRes mix (AttnRes models)
  std::vector<LayerWeights> layers;
};

// How much of the weights Model::load scans for NaN/Inf (issue 17: one non-finite weight turns
// every logit into NaN). Tensors copied to fp32 (norms, conv taps, gate parameters, biases) and
// bf16/f32 matrices of at most kSmallTensorBytes are always scanned — a few MB per layer, also
// for K3; check_weights scans every bf16/f32 matrix too (all of the dense trunk: ~113 GB for
// K3, so not by default). MXFP4 experts hold no non-finite values except NaN scales, which the
// checkpoint validates on open; products that overflow are caught in the activations.
// The refusals of LoadOptions::quantize_experts for a model (`what` names it in the message): no
// routed experts, experts already MXFP4, expert widths not multiples of the MXFP4 block. Throws
// strata::Error. `strata plan --experts-quantize` applies the same checks to a config alone.
void check_experts_quantizable(const ModelConfig& c, const std::string& what);

struct LoadOptions {
  bool check_weights = false;
  // --experts-quantize mxfp4: every bf16 routed expert is quantized to MXFP4 (storage/mxfp4.h,
  // the OCP rule) into host memory the Model owns, and config().moe.mxfp4 becomes true: from then
  // on the model is an MXFP4 model everywhere (contract numerics, GPU expert cache, CPU contract
  // kernels). Refused for models whose experts are already MXFP4, models without routed experts,
  // and expert widths that are not a multiple of 32 (the MXFP4 block).
  bool quantize_experts = false;
  bool progress = false;  // stderr lines while quantizing (after 1 s) and one line when done
  static constexpr uint64_t kSmallTensorBytes = 4ull << 20;
  uint64_t small_tensor_bytes = kSmallTensorBytes;  // tests lower it to leave a tensor unscanned
};

// A loaded model: the checkpoint (kept open: the weight views point into its mmapped shards) and
// the weights. Immutable after load, shared by any number of sessions.
class Model {
 public:
  // Opens DIR, claims every tensor with its dtype and shape, and fails with "expected N tensors,
  // got M" if the checkpoint holds tensors the model does not use.
  static std::unique_ptr<Model> load(const std::filesystem::path& dir, LoadOptions opt = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Checkpoint& checkpoint() const { return *ckpt_; }
  // Bytes of weights scanned for NaN/Inf at load.
  uint64_t scanned_weight_bytes() const { return scanned_bytes_; }
  cpu::ref::Glu glu() const;  // the GLU of every MLP/expert (SiTU β1/β2 or SiLU)
  // LoadOptions::quantize_experts: whether the experts were quantized at load (the checkpoint's
  // expert tensors are then bf16 and config().moe.mxfp4 is true), the host bytes they took and the
  // seconds it took.
  bool experts_quantized() const { return !quantized_.empty(); }
  uint64_t quantized_expert_bytes() const { return quantized_bytes_; }
  double quantize_seconds() const { return quantize_s_; }

 private:
  Model() = default;
  std::unique_ptr<Checkpoint> ckpt_;
  ModelConfig config_;
  ModelWeights weights_;
  uint64_t scanned_bytes_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> quantized_;  // per MoE layer: its experts' MXFP4 arrays
  uint64_t quantized_bytes_ = 0;
  double quantize_s_ = 0;
  void quantize_experts(bool progress);
};

}  // namespace strata::engine
