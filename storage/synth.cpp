// strata synth: synthetic checkpoints in the released layout.
//
// Weights (all from one counter-based generator: element i of tensor T is a pure function of
// (seed, T's name, i), so generation is parallel, streaming and independent of chunking):
// - projections [out, in]: uniform with std 1/sqrt(in), so each matmul keeps the RMS of its input;
// - embedding: std 1; lm_head std 1/sqrt(hidden);
// - norm weights (RMSNorm, AttnRes key norms, latent norm, q_a/kv_a norms, o_norm): 1 ± 0.1;
// - AttnRes pseudo-queries (*_res_proj [1, D]): std 1/sqrt(D) (logits of order 1: mixing that is
//   neither uniform nor one-hot);
// - conv weights (F32): std 0.5 (4 taps keep the channel's scale);
// - KDA gate, K3 (bounded) form: A_log ≈ 0 per head (±0.1; the report initialises A = 0), zero
//   padding to 128 exactly as released; dt_bias = −2 ± 0.5 so the per-step retention
//   exp(−5·sigmoid(z − 2)) mostly lies in 0.25..0.8 (memory over a few tokens, not instant decay);
//   Kimi-Linear (softplus) form: A_log = log U(1, 16), dt_bias = inverse-softplus of a log-uniform
//   dt in [1e-3, 1e-1] (the Kimi Linear initialisation);
// - routed experts, MXFP4: codes and scales generated directly (no fp32 detour, which would cost
//   minutes for k3-slice): uniform random E2M1 nibbles (RMS 2.93) with per-block scale 2^s,
//   s ∈ {s0, s0+1} chosen at random and s0 = floor(log2(1/(2.93·sqrt(fan_in)))), so the weights
//   have std ≈ 1/sqrt(fan_in) like the bf16 projections; bf16 experts: like the projections;
// - routers: DECISIVE by construction. Experts are grouped into clusters of top_k; router row e is
//   1.5·v_c(e) + per-expert noise of std 0.02, v_c a random unit direction per cluster. A token's
//   logits are then ≈ 1.5·(x·v_c) per cluster, so top-k picks one whole cluster, and the decision
//   margin is the gap between the best and second-best cluster projection (order statistics of
//   E/top_k Gaussians: typically ~0.5 std) instead of the gap between the k-th and (k+1)-th of E
//   independent rows (~0.1 std), i.e. several times larger than bf16-vs-fp32 noise on the logits.
//   Every cluster is equally likely a priori, so all experts are used. The selection bias
//   (e_score_correction_bias, F32) is small and positive (0..0.01) so it nudges but never decides,
//   and keeps Kimi-Linear's bias-in-place routing weights positive.
#include "storage/synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include <sys/statvfs.h>
#include "storage/bf16.h"
#include "storage/checkpoint.h"

#include "storage/error.h"
#include "storage/files.h"
#include "storage/safetensors.h"
#include "storage/tiktoken_files.h"

namespace strata {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

const std::vector<std::string>& synth_presets() {
  static const std::vector<std::string> p = {"k3-tiny", "k3-mini", "k3-slice", "kimi-linear-tiny"};
  return p;
}

namespace {

// ------------------------------------------------------------------------------------------
// Config templates: the released configs' text fields (K3 without the vision tower).

const char* kK3Template = R"({
  "architectures": ["KimiK3ForConditionalGeneration"],
  "auto_map": {
    "AutoConfig": "configuration_kimi_k3.KimiK3Config",
    "AutoModel": "modeling_kimi_k3.KimiK3ForConditionalGeneration",
    "AutoModelForCausalLM": "modeling_kimi_k3.KimiK3ForConditionalGeneration"
  },
  "bos_token_id": 163584, "dtype": "bfloat16", "eos_token_id": 163586, "ignore_index": -100,
  "model_type": "kimi_k3", "pad_token_id": 163839,
  "text_config": {
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "architectures": ["KimiLinearForCausalLM"], "attn_res_block_size": 12,
    "bos_token_id": 163584, "dtype": "bfloat16", "eos_token_id": 163586,
    "first_k_dense_replace": 1, "hidden_act": "situ", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 33792, "kv_lora_rank": 512,
    "latent_moe_use_norm": true,
    "linear_attn_config": {
      "full_attn_layers": [], "gate_lower_bound": -5.0, "head_dim": 128, "kda_layers": [],
      "num_heads": 96, "short_conv_kernel_size": 4, "use_full_rank_gate": true
    },
    "max_position_embeddings": 1048576, "mla_use_nope": true, "mla_use_output_gate": true,
    "model_type": "kimi_linear", "moe_intermediate_size": 3072, "moe_layer_freq": 1,
    "moe_renormalize": true, "moe_router_activation_func": "sigmoid", "num_attention_heads": 96,
    "num_expert_group": 1, "num_experts": 896, "num_experts_per_token": 16,
    "num_hidden_layers": 93, "num_key_value_heads": 96, "num_nextn_predict_layers": 0,
    "num_shared_experts": 2, "pad_token_id": 163839, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {
      "config_groups": {
        "group_0": {
          "format": "mxfp4-pack-quantized", "input_activations": null,
          "output_activations": null, "targets": ["Linear"],
          "weights": {
            "actorder": null, "block_structure": null, "dynamic": false, "group_size": 32,
            "num_bits": 4, "observer": "minmax", "observer_kwargs": {},
            "scale_dtype": "torch.uint8", "strategy": "group", "symmetric": true,
            "type": "float", "zp_dtype": null
          }
        }
      },
      "format": "mxfp4-pack-quantized",
      "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*",
                 "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*",
                 "re:.*vision_tower.*", "re:.*mm_projector.*"],
      "kv_cache_scheme": null, "quant_method": "compressed-tensors",
      "quantization_status": "compressed"
    },
    "rms_norm_eps": 1e-05, "routed_expert_hidden_size": 3584, "routed_scaling_factor": 1.0,
    "tie_word_embeddings": false, "topk_group": 1, "topk_method": "noaux_tc",
    "transformers_version": "4.56.2", "use_cache": true, "use_grouped_topk": true,
    "v_head_dim": 128, "vocab_size": 163840
  },
  "tie_word_embeddings": false
})";

const char* kKimiLinearTemplate = R"({
  "architectures": ["KimiLinearForCausalLM"],
  "auto_map": {
    "AutoConfig": "configuration_kimi.KimiLinearConfig",
    "AutoModel": "modeling_kimi.KimiLinearModel",
    "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM"
  },
  "bos_token_id": 163584, "dtype": "bfloat16", "eos_token_id": 163586,
  "first_k_dense_replace": 1, "head_dim": 72, "hidden_act": "silu", "hidden_size": 2304,
  "initializer_range": 0.02, "intermediate_size": 9216, "kv_lora_rank": 512,
  "linear_attn_config": {
    "full_attn_layers": [], "head_dim": 128, "kda_layers": [], "num_heads": 32,
    "short_conv_kernel_size": 4
  },
  "mla_use_nope": true, "model_max_length": 1048576, "model_type": "kimi_linear",
  "moe_intermediate_size": 1024, "moe_layer_freq": 1, "moe_renormalize": true,
  "moe_router_activation_func": "sigmoid", "num_attention_heads": 32, "num_expert_group": 1,
  "num_experts": 256, "num_experts_per_token": 8, "num_hidden_layers": 27,
  "num_key_value_heads": 32, "num_nextn_predict_layers": 0, "num_shared_experts": 1,
  "pad_token_id": 163839, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "routed_scaling_factor": 2.446, "tie_word_embeddings": false, "topk_group": 1,
  "transformers_version": "4.57.0", "use_cache": true, "use_grouped_topk": true,
  "v_head_dim": 128, "vocab_size": 163840
})";

// Layer lists (1-based) for n layers: KDA except every 4th layer and the last one (K3's pattern:
// MLA at 4, 8, ... and at the end).
void set_layer_pattern(ojson& t, int n, const std::vector<bool>& keep_mla) {
  ojson kda = ojson::array(), full = ojson::array();
  for (int l = 0; l < n; ++l) {
    const bool mla = (l < int(keep_mla.size()) ? keep_mla[l] : (l + 1) % 4 == 0) || l == n - 1;
    (mla ? full : kda).push_back(l + 1);
  }
  t["linear_attn_config"]["kda_layers"] = kda;
  t["linear_attn_config"]["full_attn_layers"] = full;
  t["num_hidden_layers"] = n;
}

ojson preset_json(const std::string& name) {
  if (name == "k3-tiny" || name == "k3-mini" || name == "k3-slice") {
    ojson j = ojson::parse(kK3Template);
    ojson& t = j["text_config"];
    if (name == "k3-slice") {
      set_layer_pattern(t, 93, {});  // the release's map (MLA at 4, 8, ..., 92, 93)
      return j;
    }
    const bool tiny = name == "k3-tiny";
    // k3-tiny: the golden k3-tiny dimensions. k3-mini: spec/model.md §13.3 variant C (9 layers,
    // MLA at 4, 8, 9; AttnRes blocks of 4 → two banked blocks + a partial one; K3's per-head dims
    // so the real kernels run), with the real vocabulary (≈1 GB in all).
    t["vocab_size"] = tiny ? 1024 : 163840;
    t["hidden_size"] = tiny ? 256 : 1024;
    set_layer_pattern(t, 9, {});
    t["linear_attn_config"]["num_heads"] = tiny ? 2 : 8;
    t["num_attention_heads"] = tiny ? 2 : 8;
    t["num_key_value_heads"] = tiny ? 2 : 8;
    t["q_lora_rank"] = tiny ? 64 : 384;
    t["kv_lora_rank"] = tiny ? 128 : 512;
    t["qk_nope_head_dim"] = tiny ? 64 : 128;
    t["qk_rope_head_dim"] = tiny ? 32 : 64;
    t["v_head_dim"] = tiny ? 64 : 128;
    t["attn_res_block_size"] = 4;
    t["intermediate_size"] = tiny ? 512 : 4096;
    t["num_experts"] = tiny ? 16 : 64;
    t["num_experts_per_token"] = 4;
    t["moe_intermediate_size"] = tiny ? 96 : 384;
    t["routed_expert_hidden_size"] = tiny ? 128 : 512;
    return j;
  }
  if (name == "kimi-linear-tiny") {
    ojson j = ojson::parse(kKimiLinearTemplate);
    j["vocab_size"] = 1024;
    j["hidden_size"] = 256;
    j["head_dim"] = 128;
    j["linear_attn_config"]["kda_layers"] = {1, 2, 3, 5, 6, 7};
    j["linear_attn_config"]["full_attn_layers"] = {4, 8};
    j["num_hidden_layers"] = 8;
    j["linear_attn_config"]["num_heads"] = 2;
    j["num_attention_heads"] = 2;
    j["num_key_value_heads"] = 2;
    j["kv_lora_rank"] = 128;
    j["qk_nope_head_dim"] = 64;
    j["qk_rope_head_dim"] = 32;
    j["v_head_dim"] = 64;
    j["intermediate_size"] = 512;
    j["num_experts"] = 16;
    j["num_experts_per_token"] = 4;
    j["moe_intermediate_size"] = 96;
    return j;
  }
  std::string known;
  for (const auto& p : synth_presets()) known += (known.empty() ? "" : ", ") + p;
  throw Error("synth: unknown preset \"" + name + "\" (expected one of: " + known + ")");
}

ojson read_json_file(const fs::path& p) {
  const std::string text = read_small_file(p, p.string());
  try {
    return ojson::parse(text);
  } catch (const ojson::exception& e) {  // also out_of_range: a number beyond double
    throw Error(p.string() + ": invalid JSON: " + e.what());
  }
}

ojson build_config_json(const SynthOptions& opt) {
  ojson j;
  std::string source;
  if (!opt.config_path.empty()) {
    if (!opt.preset.empty()) throw Error("synth: give either --preset or --config, not both");
    j = read_json_file(opt.config_path);
    source = opt.config_path.string();
    parse_config(j.dump(), source);  // validate before editing
  } else if (!opt.preset.empty()) {
    j = preset_json(opt.preset);
    source = "preset " + opt.preset;
  } else {
    throw Error("synth: give --preset or --config");
  }
  ojson& t = j.contains("text_config") ? j["text_config"] : j;
  int layers = opt.layers;
  if (layers == 0 && opt.preset == "k3-slice") layers = 2;  // layer 0 dense + one MoE layer
  if (layers < 0) throw Error("synth: --layers must be positive");
  if (layers > 0) {
    const ModelConfig c = parse_config(j.dump(), source);
    std::vector<bool> mla;
    for (int l = 0; l < c.num_layers; ++l) mla.push_back(c.is_mla(l));
    set_layer_pattern(t, layers, mla);
    if (t.value("first_k_dense_replace", 0) > layers) t["first_k_dense_replace"] = layers;
  }
  if (opt.experts < 0) throw Error("synth: --experts must be positive");
  if (opt.experts > 0) {
    t["num_experts"] = opt.experts;
    if (t["num_experts_per_token"].get<int>() > opt.experts)
      t["num_experts_per_token"] = opt.experts;
  }
  if (opt.vocab < 0) throw Error("synth: --vocab must be positive");
  if (opt.vocab > 0) t["vocab_size"] = opt.vocab;
  return j;
}

// ------------------------------------------------------------------------------------------
// Counter-based generator.

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (char ch : s) h = (h ^ uint8_t(ch)) * 0x100000001B3ull;
  return h;
}

// Uniform in (−1, 1) for element i of stream `key` (16 bits of resolution is plenty for bf16).
inline float uni(uint64_t key, int64_t i) {
  const uint64_t h = splitmix64(key + uint64_t(i >> 2) * 0xD1B54A32D192ED03ull);
  const uint32_t lane = uint32_t(h >> (16 * (i & 3))) & 0xFFFFu;
  return (float(lane) + 0.5f) * (2.0f / 65536.0f) - 1.0f;
}

constexpr float kSqrt3 = 1.7320508f;

enum class Init {
  uniform,      // a · U(−1, 1)
  ones,         // 1 + a · U(−1, 1)
  alog_k3,      // a · U for the first `heads` entries, 0 after
  alog_kl,      // log U(1, 16)
  dt_k3,        // −2 + 0.5 · U
  dt_kl,        // inverse softplus of log-uniform dt in [1e-3, 1e-1]
  router,       // clustered rows (see the file comment)
  router_bias,  // U(0, 0.01)
  fp4_codes,    // random bytes
  fp4_scales,   // s0 or s0 + 1
};

struct Gen {
  Init kind = Init::uniform;
  uint64_t key = 0;
  float a = 0.f;
  int64_t cols = 1;  // row length (router: D)
  int64_t heads = 0;
  int top_k = 1;
  int scale0 = 127;
};

Gen gen_for(const ModelConfig& c, const TensorSpec& s, uint64_t seed) {
  Gen g;
  g.key = splitmix64(seed ^ fnv1a(s.name));
  const std::string& n = s.name;
  auto ends = [&](std::string_view suf) { return n.ends_with(suf); };
  const int64_t fan_in = s.shape.empty() ? 1 : s.shape.back();
  if (ends(".weight_packed")) {
    g.kind = Init::fp4_codes;
  } else if (ends(".weight_scale")) {
    g.kind = Init::fp4_scales;
    const int64_t logical_in = s.shape[1] * 32;
    // Uniform E2M1 codes have RMS sqrt(68.5 / 8) = 2.93.
    g.scale0 = 127 + int(std::floor(std::log2(1.0 / (2.926 * std::sqrt(double(logical_in))))));
  } else if (ends("block_sparse_moe.gate.weight")) {
    g.kind = Init::router;
    g.cols = s.shape[1];
    g.top_k = c.moe.top_k;
  } else if (ends("e_score_correction_bias")) {
    g.kind = Init::router_bias;
  } else if (ends("A_log")) {
    g.kind = c.kda.gate == KdaGateKind::bounded_sigmoid ? Init::alog_k3 : Init::alog_kl;
    g.heads = c.kda.num_heads;
    g.a = 0.1f;
  } else if (ends("dt_bias")) {
    g.kind = c.kda.gate == KdaGateKind::bounded_sigmoid ? Init::dt_k3 : Init::dt_kl;
  } else if (ends("_conv1d.weight")) {
    g.a = 0.5f * kSqrt3;
  } else if (ends("norm.weight") || ends("layernorm.weight")) {
    g.kind = Init::ones;  // RMSNorm-family weights, o_norm, AttnRes key norms
    g.a = 0.1f;
  } else if (n == c.tensor_prefix + "embed_tokens.weight") {
    g.a = kSqrt3;
  } else {
    g.a = kSqrt3 / std::sqrt(float(fan_in));  // projections, lm_head, AttnRes pseudo-queries
  }
  return g;
}

inline float value(const Gen& g, int64_t i) {
  switch (g.kind) {
    case Init::uniform:
      return g.a * uni(g.key, i);
    case Init::ones:
      return 1.0f + g.a * uni(g.key, i);
    case Init::alog_k3:
      return i < g.heads ? g.a * uni(g.key, i) : 0.0f;
    case Init::alog_kl:
      return std::log(1.0f + 15.0f * 0.5f * (uni(g.key, i) + 1.0f));
    case Init::dt_k3:
      return -2.0f + 0.5f * uni(g.key, i);
    case Init::dt_kl: {
      const float dt = std::exp(std::log(1e-3f) + 0.5f * (uni(g.key, i) + 1.0f) * std::log(100.0f));
      return std::log(std::expm1(dt));
    }
    case Init::router: {
      const int64_t e = i / g.cols, d = i % g.cols;
      const int64_t cluster = e / g.top_k;
      const float unit = kSqrt3 / std::sqrt(float(g.cols));
      const float dir = uni(splitmix64(g.key ^ 0xC1A5E5ull), cluster * g.cols + d) * unit;
      return 1.5f * dir + 0.02f * unit * uni(g.key, i);
    }
    case Init::router_bias:
      return 0.005f * (uni(g.key, i) + 1.0f);
    default:
      STRATA_ASSERT(false);
      return 0.f;
  }
}

inline uint8_t byte_value(const Gen& g, int64_t i) {
  const uint64_t h = splitmix64(g.key + uint64_t(i >> 3) * 0xD1B54A32D192ED03ull);
  const uint8_t b = uint8_t(h >> (8 * (i & 7)));
  if (g.kind == Init::fp4_codes) return b;
  return uint8_t(std::clamp(g.scale0 + (b & 1), 0, 254));
}

// Fill elements [begin, begin + n) of a tensor into out (dtype bytes).
void fill(const Gen& g, DType dt, int64_t begin, int64_t n, uint8_t* out) {
  switch (dt) {
    case DType::U8:
      for (int64_t i = 0; i < n; ++i) out[i] = byte_value(g, begin + i);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = f32_to_bf16(value(g, begin + i));
        std::memcpy(out + 2 * i, &b, 2);
      }
      break;
    case DType::F32:
      for (int64_t i = 0; i < n; ++i) {
        const float f = value(g, begin + i);
        std::memcpy(out + 4 * i, &f, 4);
      }
      break;
    default:
      STRATA_ASSERT(false);
  }
}

// A shard holds whole groups: a single tensor, or all tensors of one routed expert.
struct Shard {
  std::vector<size_t> specs;  // indices into the spec list
  uint64_t bytes = 0;
};

std::string expert_group(const std::string& name) {
  const size_t p = name.find(".experts.");
  if (p == std::string::npos) return "";
  const size_t q = name.find('.', p + 9);
  return name.substr(0, q);
}

std::vector<Shard> plan_shards(const std::vector<TensorSpec>& specs, uint64_t shard_bytes) {
  std::vector<Shard> shards(1);
  size_t i = 0;
  while (i < specs.size()) {
    size_t j = i + 1;
    uint64_t bytes = specs[i].nbytes();
    const std::string grp = expert_group(specs[i].name);
    while (!grp.empty() && j < specs.size() && expert_group(specs[j].name) == grp)
      bytes += specs[j++].nbytes();
    if (!shards.back().specs.empty() && shards.back().bytes + bytes > shard_bytes)
      shards.emplace_back();
    for (size_t k = i; k < j; ++k) shards.back().specs.push_back(k);
    shards.back().bytes += bytes;
    i = j;
  }
  return shards;
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
  if (!out) throw Error(p.string() + ": write failed");
}

// synth writes into a new or empty directory, never over files.
void make_output_dir(const fs::path& out_dir) {
  std::error_code ec;
  if (fs::exists(out_dir) && !fs::is_empty(out_dir, ec))
    throw Error(out_dir.string() +
                ": exists and is not empty (synth writes into an empty or new "
                "directory)");
  fs::create_directories(out_dir, ec);
  if (ec) throw Error(out_dir.string() + ": cannot create: " + ec.message());
}

}  // namespace

std::string synth_config_json(const SynthOptions& opt) {
  const ojson j = build_config_json(opt);
  parse_config(j.dump(), opt.preset.empty() ? opt.config_path.string() : "preset " + opt.preset);
  return j.dump(2) + "\n";
}

fs::path synth_config_only(const SynthOptions& opt, const fs::path& out_dir) {
  const std::string text = synth_config_json(opt);  // validated before anything is created
  make_output_dir(out_dir);
  write_text(out_dir / "config.json", text);
  return out_dir / "config.json";
}

SynthResult synth_checkpoint(const SynthOptions& opt, const fs::path& out_dir,
                             const std::function<void(int, int, uint64_t, uint64_t)>& progress) {
  const auto t0 = std::chrono::steady_clock::now();
  ojson j = build_config_json(opt);
  const std::string source = opt.preset.empty() ? opt.config_path.string() : "preset " + opt.preset;
  ModelConfig cfg = parse_config(j.dump(), source);

  make_output_dir(out_dir);

  ojson& t = j.contains("text_config") ? j["text_config"] : j;
  if (opt.tokenizer) {
    write_standin_tokenizer(out_dir, cfg.vocab_size);
    if (!opt.preset.empty() || opt.vocab > 0) {
      // Presets take their special ids from the stand-in tokenizer just written.
      const TokenizerFiles tf = load_tokenizer_files(out_dir);
      // The chat eos, as in the released configs: K3's turn end <|end_of_msg|>
      // (spec/chat-format.md), Kimi-Linear's <|im_end|>.
      const std::string chat_eos = cfg.wrapped ? "<|end_of_msg|>" : "<|im_end|>";
      int eos = tf.eos_id;
      for (const auto& [id, text] : tf.specials)
        if (text == chat_eos) eos = id;
      for (ojson* o : {&j, &t}) {
        (*o)["bos_token_id"] = tf.bos_id;
        (*o)["eos_token_id"] = eos;
        (*o)["pad_token_id"] = tf.pad_id;
      }
      cfg = parse_config(j.dump(), source);
    }
  }

  const std::vector<TensorSpec> specs = model_tensor_specs(cfg);
  const bool big = cfg.hidden_size >= 1024;
  const uint64_t shard_bytes = opt.shard_bytes ? opt.shard_bytes : big ? 512ull << 20 : 4ull << 20;
  const std::vector<Shard> shards = plan_shards(specs, shard_bytes);
  uint64_t total = 0;
  for (const Shard& s : shards) total += s.bytes;

  // Fail before writing, not when the disk is full half-way.
  {
    struct statvfs vs {};
    if (::statvfs(out_dir.c_str(), &vs) == 0) {
      const uint64_t free_bytes = uint64_t(vs.f_bavail) * uint64_t(vs.f_frsize);
      if (total > free_bytes)
        throw Error("synth: the checkpoint needs " + std::to_string(total) + " bytes, " +
                    out_dir.string() + " has " + std::to_string(free_bytes) + " free");
    }
  }
  const int threads =
      opt.threads > 0 ? opt.threads : std::max(1, int(std::thread::hardware_concurrency()));
  constexpr int64_t kChunkElems = 4 << 20;
  std::vector<uint8_t> buf;
  ojson weight_map = ojson::object();
  uint64_t done = 0;
  char name[64];
  for (size_t si = 0; si < shards.size(); ++si) {
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", si + 1, shards.size());
    std::vector<TensorDecl> decls;
    for (size_t k : shards[si].specs) {
      decls.push_back({specs[k].name, specs[k].dtype, specs[k].shape});
      weight_map[specs[k].name] = name;
    }
    SafetensorsWriter w(out_dir / name, decls);
    for (size_t k : shards[si].specs) {
      const TensorSpec& s = specs[k];
      const Gen g = gen_for(cfg, s, opt.seed);
      int64_t numel = 1;
      for (int64_t d : s.shape) numel *= d;
      const size_t es = dtype_size(s.dtype);
      for (int64_t b = 0; b < numel; b += kChunkElems) {
        const int64_t n = std::min<int64_t>(kChunkElems, numel - b);
        buf.resize(size_t(n) * es);
        const int nt = n >= (1 << 16) ? threads : 1;
        if (nt == 1) {
          fill(g, s.dtype, b, n, buf.data());
        } else {
          std::vector<std::thread> pool;
          const int64_t per = (n + nt - 1) / nt;
          for (int ti = 0; ti < nt; ++ti) {
            const int64_t lo = ti * per, hi = std::min(n, lo + per);
            if (lo >= hi) break;
            pool.emplace_back(
                [&, lo, hi] { fill(g, s.dtype, b + lo, hi - lo, buf.data() + lo * es); });
          }
          for (auto& th : pool) th.join();
        }
        w.write(buf.data(), buf.size());
      }
    }
    w.finish();
    done += shards[si].bytes;
    if (progress) progress(int(si + 1), int(shards.size()), done, total);
  }
  write_text(
      out_dir / "model.safetensors.index.json",
      ojson{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
  // config.json last: a directory with a config is a complete checkpoint.
  write_text(out_dir / "config.json", j.dump(2) + "\n");

  SynthResult r;
  r.config = std::move(cfg);
  r.config.source = (out_dir / "config.json").string();
  r.num_tensors = specs.size();
  r.num_shards = int(shards.size());
  r.total_bytes = total;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace strata
