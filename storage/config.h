// ModelConfig: the typed form of a Kimi K3 / Kimi-Linear config.json, parsed once and passed
// explicitly (STYLE §10). Model variants are data (DESIGN decision 3): every K3-vs-Kimi-Linear
// behaviour is a field here, derived from the config.json field that carries it (spec/model.md,
// "How the engine should treat this"), never from the model's name.
// Not here: tensor names and shapes (storage/checkpoint.h, model_tensor_specs) and the loading of
// weights.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace strata {

enum class LayerKind { kda, mla };
enum class Activation { situ, silu };
enum class KdaGateKind {
  bounded_sigmoid,  // K3: g = gate_lower_bound · sigmoid(exp(A_log[h]) · (z + dt_bias))
  softplus          // Kimi-Linear: g = −exp(A_log[h]) · softplus(z + dt_bias)
};
enum class RouterWeightForm {
  unbiased,      // K3: routing weights from the unbiased sigmoid scores
  bias_in_place  // Kimi-Linear quirk (spec/model.md §7.2): weights = (sigmoid + bias)[selected]
};

const char* layer_kind_name(LayerKind k);          // "kda" / "mla"
const char* activation_name(Activation a);         // "situ" / "silu"
const char* gate_kind_name(KdaGateKind g);         // "bounded_sigmoid" / "softplus"
const char* router_form_name(RouterWeightForm f);  // "unbiased" / "bias_in_place"

struct KdaConfig {
  int num_heads = 0;             // H (q, k, v all H heads; no GVA)
  int head_dim = 0;              // d_k = d_v
  int conv_kernel = 0;           // short_conv_kernel_size (W)
  float gate_lower_bound = 0.f;  // only for bounded_sigmoid (−5 in K3)
  KdaGateKind gate = KdaGateKind::softplus;
  bool full_rank_output_gate = false;  // true: g_proj [H·d, D]; false: g_b_proj(g_a_proj(x))
  int gate_rank = 0;  // low-rank widths: f_a_proj (decay) and g_a_proj (output gate) = head_dim
  int proj_dim() const { return num_heads * head_dim; }  // P = H·d (12288 in K3)
};

struct MlaConfig {
  int num_heads = 0;
  int q_lora_rank = 0;  // 0 = direct q_proj (Kimi-Linear)
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;  // "rope" slots, never rotated (mla_use_nope)
  int v_head_dim = 0;
  bool output_gate = false;  // mla_use_output_gate
  int q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Latent cache entries per token per MLA layer: normalised latent + shared "rope" key.
  int latent_cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

struct MoeConfig {
  int num_experts = 0;
  int top_k = 0;
  int num_shared_experts = 0;  // realised as ONE MLP of width num_shared_experts · intermediate
  int intermediate_size = 0;   // moe_intermediate_size (per routed expert)
  int latent_size = 0;         // routed_expert_hidden_size; 0 = no latent projection
  bool latent_norm = false;    // latent_moe_use_norm
  float routed_scaling_factor = 1.f;
  bool renormalize = true;
  RouterWeightForm router_form = RouterWeightForm::unbiased;
  bool mxfp4 = false;  // routed experts stored as compressed-tensors MXFP4 (quantization_config)
  int layer_freq = 1;  // moe_layer_freq
  int shared_intermediate() const { return num_shared_experts * intermediate_size; }
};

struct ModelConfig {
  std::string source;    // the file it was read from (for messages)
  bool wrapped = false;  // K3's kimi_k3 wrapper with the text model in text_config
  int vocab_size = 0, hidden_size = 0, num_layers = 0;
  float rms_norm_eps = 1e-5f;
  Activation act = Activation::silu;
  float situ_beta = 0.f;               // activation_situ_beta (β1); only for situ
  float situ_linear_beta = 0.f;        // activation_situ_linear_beta (β2); 0 = no linear cap
  std::vector<LayerKind> layer_kinds;  // 0-based, one per layer
  int first_k_dense = 0;               // first_k_dense_replace
  int dense_intermediate_size = 0;     // intermediate_size of the dense layers
  int attn_res_block_size = 0;         // 0 = plain pre-norm residual (Kimi-Linear)
  KdaConfig kda;
  MlaConfig mla;
  MoeConfig moe;
  int bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;
  std::string tensor_prefix;  // "language_model.model." (wrapped) or "model." (flat)
  std::string lm_head_name;   // "language_model.lm_head.weight" or "lm_head.weight"

  bool is_kda(int l) const { return layer_kinds[l] == LayerKind::kda; }
  bool is_mla(int l) const { return layer_kinds[l] == LayerKind::mla; }
  // FFN kind: layers < first_k_dense are dense MLPs; the rest MoE every layer_freq layers
  // (HF/DeepSeek rule: l >= first_k_dense && l % moe_layer_freq == 0).
  bool is_moe(int l) const { return l >= first_k_dense && l % moe.layer_freq == 0; }
  bool is_dense(int l) const { return !is_moe(l); }
  bool has_attn_res() const { return attn_res_block_size > 0; }
  // AttnRes: layer l banks the running block sum and opens a new block.
  bool opens_block(int l) const { return has_attn_res() && l % attn_res_block_size == 0; }
  // Input width of the routed experts (latent when LatentMoE, else hidden).
  int expert_in_dim() const { return moe.latent_size > 0 ? moe.latent_size : hidden_size; }
  int num_kda_layers() const;
  int num_mla_layers() const;
  int num_moe_layers() const;
  std::string layer_prefix(int l) const {  // "language_model.model.layers.{l}."
    return tensor_prefix + "layers." + std::to_string(l) + ".";
  }
};

// Parse a config.json (K3 wrapper or flat Kimi-Linear). Throws strata::Error naming the file and
// the field for: missing fields, wrong types, layer lists not covering every layer exactly once,
// unknown hidden_act, router function other than sigmoid, MXFP4 dims not divisible by 32,
// unsupported quantization formats or grouped routing.
ModelConfig load_config(const std::filesystem::path& config_json);
ModelConfig parse_config(const std::string& json_text, const std::string& source_name);

// One-line human summary, e.g. "K3-form, 93 layers (69 KDA, 24 MLA), hidden 7168, ...".
std::string describe_config(const ModelConfig& c);

// ------------------------------------------------------------------------------------------
// What a model costs: parameters and bytes by component, bytes per routed expert, routed bytes
// read per token, decode state per sequence. Computed from the tensor list implied by the config
// (model_tensor_specs in storage/checkpoint.h) so it cannot drift from what the loader expects.
struct ComponentCost {
  std::string name;  // "embedding+head", "kda", "mla", "dense_mlp", "shared_experts",
                     // "routed_experts", "moe_other" (router, latent proj/norm), "norms+attnres"
  int64_t params = 0;
  uint64_t bytes = 0;
};

struct ModelCosts {
  std::vector<ComponentCost> components;
  int64_t total_params = 0;
  uint64_t total_bytes = 0;
  int64_t active_params_per_token = 0;    // non-routed weights except the embedding + top_k experts
  uint64_t bytes_per_routed_expert = 0;   // w1 + w3 + w2 (packed + scales when MXFP4)
  int64_t params_per_routed_expert = 0;   // logical weights
  uint64_t routed_bytes_per_token = 0;    // bytes_per_routed_expert · top_k · MoE layers
  uint64_t num_routed_experts_total = 0;  // num_experts · MoE layers
  // Decode state per sequence (fp32 KDA state, bf16 conv state, bf16 MLA latent cache).
  uint64_t kda_state_bytes_per_layer = 0;   // H · d · d · 4
  uint64_t kda_state_bytes = 0;             // · KDA layers
  uint64_t conv_state_bytes_per_layer = 0;  // 3 (q,k,v) · (W−1) · P · 2
  uint64_t conv_state_bytes = 0;
  uint64_t mla_cache_bytes_per_token_per_layer = 0;  // (kv_lora + rope) · 2
  uint64_t mla_cache_bytes_per_token = 0;            // · MLA layers
};

ModelCosts compute_costs(const ModelConfig& c);

}  // namespace strata
