// config.json → ModelConfig. Every problem is reported as "FILE: FIELD: what was wrong, what was
// expected", FIELD being the full path of the JSON key (e.g.
// text_config.linear_attn_config.kda_layers).
#include "storage/config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "storage/checkpoint.h"
#include "storage/error.h"
#include "storage/files.h"

namespace strata {

using json = nlohmann::json;

// Upper limits of config dimensions (K3's values in comments). A config beyond them is refused at
// parse time, naming the field, instead of failing later with an allocation of billions of
// tensors or an overflowing width.
namespace kLimits {
constexpr int64_t vocab = 1 << 22;         // 163,840
constexpr int64_t hidden = 1 << 16;        // 7168
constexpr int64_t layers = 1024;           // 93
constexpr int64_t heads = 1024;            // 96 (KDA and MLA)
constexpr int64_t head_dim = 2048;         // 128 (KDA), 128/64/128 (MLA nope/rope/v)
constexpr int64_t conv_kernel = 64;        // 4
constexpr int64_t rank = 1 << 16;          // q_lora 1536, kv_lora 512, latent 3584
constexpr int64_t intermediate = 1 << 20;  // 3072 (routed), 18432 (dense)
constexpr int64_t experts = 1 << 16;       // 896
constexpr int64_t routed_total = 1 << 18;  // 82,432 = 896 experts x 92 MoE layers
constexpr int64_t top_k = 1024;            // 16
constexpr int64_t shared_experts = 64;     // 1
}  // namespace kLimits

const char* layer_kind_name(LayerKind k) {
  return k == LayerKind::kda ? "kda" : "mla";
}
const char* activation_name(Activation a) {
  return a == Activation::situ ? "situ" : "silu";
}
const char* gate_kind_name(KdaGateKind g) {
  return g == KdaGateKind::bounded_sigmoid ? "bounded_sigmoid" : "softplus";
}
const char* router_form_name(RouterWeightForm f) {
  return f == RouterWeightForm::unbiased ? "unbiased" : "bias_in_place";
}

int ModelConfig::num_kda_layers() const {
  return int(std::count(layer_kinds.begin(), layer_kinds.end(), LayerKind::kda));
}
int ModelConfig::num_mla_layers() const {
  return int(std::count(layer_kinds.begin(), layer_kinds.end(), LayerKind::mla));
}
int ModelConfig::num_moe_layers() const {
  int n = 0;
  for (int l = 0; l < num_layers; ++l) n += is_moe(l) ? 1 : 0;
  return n;
}

namespace {

const char* json_type(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number_float()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Typed access to one JSON object, naming the file and the full key path in every error.
class Fields {
 public:
  Fields(const json& obj, std::string source, std::string path)
      : obj_(obj), source_(std::move(source)), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(source_ + ": " + full(key) + ": " + what);
  }
  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  bool has(const std::string& key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const json& at(const std::string& key) const {
    if (!obj_.contains(key)) fail(key, "missing field");
    return obj_.at(key);
  }
  Fields sub(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_object()) fail(key, std::string("expected an object, got ") + json_type(v));
    return Fields(v, source_, full(key));
  }
  int64_t integer(const std::string& key) const {
    const json& v = at(key);
    if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>();
    // Some exporters write 4.0 for 4; accept exact integral floats.
    // (|v| < 2^62 first: converting a larger double to int64 is undefined.)
    if (v.is_number_float() && std::isfinite(v.get<double>()) &&
        std::fabs(v.get<double>()) < 4.6e18 && v.get<double>() == std::floor(v.get<double>()))
      return int64_t(v.get<double>());
    fail(key, std::string("expected an integer, got ") + json_type(v));
  }
  // Integers in [lo, hi]. The upper limits (kLimits below) are far above any released model
  // and keep every size the engine derives from them (tensor shapes, counts, byte sizes) within
  // the integer types that hold them; the message names the limit.
  int in_range(const std::string& key, int64_t lo, int64_t hi) const {
    const int64_t v = integer(key);
    if (v < lo || v > hi)
      fail(key, "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                    (v > hi ? " (strata's limit for this field)" : "") + ", got " +
                    std::to_string(v));
    return int(v);
  }
  int positive(const std::string& key, int64_t hi) const { return in_range(key, 1, hi); }
  int positive_or(const std::string& key, int dflt, int64_t hi) const {
    return has(key) ? positive(key, hi) : dflt;
  }
  int nonnegative_or(const std::string& key, int dflt, int64_t hi) const {
    return has(key) ? in_range(key, 0, hi) : dflt;
  }
  // A number the engine holds as a float: finite and within float range.
  double number(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_number()) fail(key, std::string("expected a number, got ") + json_type(v));
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > 3.0e38)
      fail(key, "expected a finite number within float range, got " + v.dump());
    return d;
  }
  double number_or(const std::string& key, double dflt) const {
    return has(key) ? number(key) : dflt;
  }
  bool boolean_or(const std::string& key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = at(key);
    if (!v.is_boolean()) fail(key, std::string("expected true or false, got ") + json_type(v));
    return v.get<bool>();
  }
  std::string string(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_string()) fail(key, std::string("expected a string, got ") + json_type(v));
    return v.get<std::string>();
  }
  std::vector<int64_t> int_list(const std::string& key) const {
    const json& v = at(key);
    if (!v.is_array()) fail(key, std::string("expected an array of integers, got ") + json_type(v));
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number_integer() && !v[i].is_number_unsigned())
        fail(key, "entry " + std::to_string(i) + ": expected an integer, got " + json_type(v[i]));
      out.push_back(v[i].get<int64_t>());
    }
    return out;
  }

 private:
  const json& obj_;
  std::string source_, path_;
};

void parse_layer_map(const Fields& lac, int num_layers, ModelConfig& c) {
  // Layer lists are 1-based (HF is_kda_layer: (l + 1) in kda_layers).
  std::vector<int> owner(num_layers, -1);  // 0 = kda, 1 = mla
  const char* names[2] = {"kda_layers", "full_attn_layers"};
  for (int k = 0; k < 2; ++k) {
    for (int64_t v : lac.int_list(names[k])) {
      if (v < 1 || v > num_layers)
        lac.fail(names[k], "layer " + std::to_string(v) + " is out of range 1.." +
                               std::to_string(num_layers) + " (lists are 1-based)");
      int& o = owner[v - 1];
      if (o == k) lac.fail(names[k], "layer " + std::to_string(v) + " is listed twice");
      if (o >= 0)
        lac.fail(names[k], "layer " + std::to_string(v) +
                               " is in both kda_layers and full_attn_layers (each layer must be "
                               "listed exactly once)");
      o = k;
    }
  }
  for (int l = 0; l < num_layers; ++l)
    if (owner[l] < 0)
      lac.fail("kda_layers", "layer " + std::to_string(l + 1) +
                                 " (1-based) is in neither kda_layers nor full_attn_layers (every "
                                 "layer 1.." +
                                 std::to_string(num_layers) + " must be listed exactly once)");
  c.layer_kinds.clear();
  for (int l = 0; l < num_layers; ++l)
    c.layer_kinds.push_back(owner[l] == 0 ? LayerKind::kda : LayerKind::mla);
}

bool parse_quantization(const Fields& q) {
  // compressed-tensors MXFP4 as released: format mxfp4-pack-quantized, weights 4-bit float,
  // group 32. Anything else is a format we do not read: fail rather than guess.
  const std::string fmt = q.has("format") ? q.string("format") : "";
  if (fmt != "mxfp4-pack-quantized")
    q.fail("format", "unsupported quantization format \"" + fmt +
                         "\" (strata reads compressed-tensors mxfp4-pack-quantized)");
  if (q.has("quant_method") && q.string("quant_method") != "compressed-tensors")
    q.fail("quant_method",
           "expected \"compressed-tensors\", got \"" + q.string("quant_method") + "\"");
  if (q.has("config_groups")) {
    const json& groups = q.at("config_groups");
    if (!groups.is_object()) q.fail("config_groups", "expected an object");
    Fields gs = q.sub("config_groups");
    for (auto it = groups.begin(); it != groups.end(); ++it) {
      Fields g = gs.sub(it.key());
      if (!g.has("weights")) continue;
      Fields w = g.sub("weights");
      if (w.has("group_size") && w.integer("group_size") != 32)
        w.fail("group_size",
               "expected 32 (MXFP4 block), got " + std::to_string(w.integer("group_size")));
      if (w.has("num_bits") && w.integer("num_bits") != 4)
        w.fail("num_bits", "expected 4, got " + std::to_string(w.integer("num_bits")));
      if (w.has("type") && w.string("type") != "float")
        w.fail("type", "expected \"float\" (E2M1), got \"" + w.string("type") + "\"");
    }
  }
  return true;
}

}  // namespace

ModelConfig parse_config(const std::string& json_text, const std::string& source_name) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {  // also out_of_range: a number beyond double
    throw Error(source_name + ": invalid JSON: " + e.what());
  }
  if (!root.is_object()) throw Error(source_name + ": expected a JSON object at the top level");

  ModelConfig c;
  c.source = source_name;
  Fields top(root, source_name, "");
  c.wrapped = root.contains("text_config");
  const Fields t = c.wrapped ? top.sub("text_config") : top;
  c.tensor_prefix = c.wrapped ? "language_model.model." : "model.";
  c.lm_head_name = c.wrapped ? "language_model.lm_head.weight" : "lm_head.weight";

  c.vocab_size = t.positive("vocab_size", kLimits::vocab);
  c.hidden_size = t.positive("hidden_size", kLimits::hidden);
  c.num_layers = t.positive("num_hidden_layers", kLimits::layers);
  c.rms_norm_eps = float(t.number("rms_norm_eps"));
  // An epsilon is a small guard against division by zero; one near 1 or above swamps the mean
  // square and flattens every activation (and 1e300 is inf as a float).
  if (!(c.rms_norm_eps > 0.f && c.rms_norm_eps <= 0.1f))
    t.fail("rms_norm_eps",
           "expected a small positive number (0 < eps <= 0.1), got " + t.at("rms_norm_eps").dump());
  if (t.boolean_or("tie_word_embeddings", false) ||
      (c.wrapped && top.boolean_or("tie_word_embeddings", false)))
    t.fail("tie_word_embeddings", "tied embeddings are not supported (both released models untie)");

  const std::string act = t.string("hidden_act");
  if (act == "situ") {
    c.act = Activation::situ;
    c.situ_beta = float(t.number("activation_situ_beta"));
    if (!(c.situ_beta > 0.f)) t.fail("activation_situ_beta", "expected a positive number");
    c.situ_linear_beta = float(t.number_or("activation_situ_linear_beta", 0.0));
    if (c.situ_linear_beta < 0.f)
      t.fail("activation_situ_linear_beta", "expected a positive number or null");
  } else if (act == "silu") {
    c.act = Activation::silu;
  } else {
    t.fail("hidden_act", "unknown activation \"" + act + "\" (expected \"situ\" or \"silu\")");
  }

  // Token mixers.
  const Fields lac = t.sub("linear_attn_config");
  parse_layer_map(lac, c.num_layers, c);
  c.kda.num_heads = lac.positive("num_heads", kLimits::heads);
  c.kda.head_dim = lac.positive("head_dim", kLimits::head_dim);
  c.kda.conv_kernel = lac.positive("short_conv_kernel_size", kLimits::conv_kernel);
  if (lac.has("gate_lower_bound")) {
    c.kda.gate = KdaGateKind::bounded_sigmoid;
    c.kda.gate_lower_bound = float(lac.number("gate_lower_bound"));
    if (!(c.kda.gate_lower_bound < 0.f))
      lac.fail("gate_lower_bound", "expected a negative number (the decay gate's lower bound)");
  } else {
    c.kda.gate = KdaGateKind::softplus;
  }
  c.kda.full_rank_output_gate = lac.boolean_or("use_full_rank_gate", false);
  c.kda.gate_rank = c.kda.head_dim;

  c.mla.num_heads = t.positive("num_attention_heads", kLimits::heads);
  if (t.has("num_key_value_heads") && t.integer("num_key_value_heads") != c.mla.num_heads)
    t.fail("num_key_value_heads", "expected " + std::to_string(c.mla.num_heads) +
                                      " (= num_attention_heads; MLA has no GQA)");
  c.mla.q_lora_rank = t.nonnegative_or("q_lora_rank", 0, kLimits::rank);
  c.mla.kv_lora_rank = t.positive("kv_lora_rank", kLimits::rank);
  c.mla.qk_nope_head_dim = t.positive("qk_nope_head_dim", kLimits::head_dim);
  c.mla.qk_rope_head_dim = t.nonnegative_or("qk_rope_head_dim", 0, kLimits::head_dim);
  c.mla.v_head_dim = t.positive("v_head_dim", kLimits::head_dim);
  c.mla.output_gate = t.boolean_or("mla_use_output_gate", false);
  if (!t.boolean_or("mla_use_nope", true))
    t.fail("mla_use_nope", "rotary MLA is not supported (both released models set true)");

  // Residual stream.
  c.attn_res_block_size = t.nonnegative_or("attn_res_block_size", 0, kLimits::layers);

  // FFNs.
  c.first_k_dense = t.nonnegative_or("first_k_dense_replace", 0, kLimits::layers);
  if (c.first_k_dense > c.num_layers)
    t.fail("first_k_dense_replace",
           "expected at most num_hidden_layers (" + std::to_string(c.num_layers) + ")");
  if (c.first_k_dense > 0)
    c.dense_intermediate_size = t.positive("intermediate_size", kLimits::intermediate);
  c.moe.layer_freq = t.positive_or("moe_layer_freq", 1, kLimits::layers);
  c.moe.num_experts = t.positive("num_experts", kLimits::experts);
  if (int64_t(c.moe.num_experts) * c.num_moe_layers() > kLimits::routed_total)
    t.fail("num_experts",
           std::to_string(c.moe.num_experts) + " experts x " + std::to_string(c.num_moe_layers()) +
               " MoE layers = " + std::to_string(int64_t(c.moe.num_experts) * c.num_moe_layers()) +
               " routed experts, more than strata's limit of " +
               std::to_string(kLimits::routed_total));
  c.moe.top_k = t.positive("num_experts_per_token", kLimits::top_k);
  if (c.moe.top_k > c.moe.num_experts)
    t.fail("num_experts_per_token",
           "expected at most num_experts (" + std::to_string(c.moe.num_experts) + ")");
  c.moe.num_shared_experts = t.nonnegative_or("num_shared_experts", 0, kLimits::shared_experts);
  c.moe.intermediate_size = t.positive("moe_intermediate_size", kLimits::intermediate);
  c.moe.latent_size = t.nonnegative_or("routed_expert_hidden_size", 0, kLimits::rank);
  c.moe.latent_norm = t.boolean_or("latent_moe_use_norm", false);
  if (c.moe.latent_norm && c.moe.latent_size == 0)
    t.fail("latent_moe_use_norm", "true needs routed_expert_hidden_size (the latent width)");
  c.moe.routed_scaling_factor = float(t.number_or("routed_scaling_factor", 1.0));
  if (!(c.moe.routed_scaling_factor > 0.f && c.moe.routed_scaling_factor <= 1e4f))
    t.fail("routed_scaling_factor",
           "expected a positive number up to 1e4, got " + t.at("routed_scaling_factor").dump());
  c.moe.renormalize = t.boolean_or("moe_renormalize", true);
  const std::string router = t.string("moe_router_activation_func");
  if (router != "sigmoid")
    t.fail("moe_router_activation_func",
           "unknown router function \"" + router + "\" (expected \"sigmoid\")");
  if (t.has("num_expert_group") && t.integer("num_expert_group") != 1)
    t.fail("num_expert_group", "grouped routing is not supported (expected 1, as released)");
  if (t.has("topk_group") && t.integer("topk_group") != 1)
    t.fail("topk_group", "grouped routing is not supported (expected 1, as released)");

  // [ASSUMED] rule of spec/model.md: Kimi-Linear's in-place-bias router weights only when the
  // config carries none of the K3-only fields.
  const bool k3_fields = t.has("attn_res_block_size") || t.has("routed_expert_hidden_size") ||
                         lac.has("gate_lower_bound");
  c.moe.router_form = k3_fields ? RouterWeightForm::unbiased : RouterWeightForm::bias_in_place;

  // Quantization: K3 carries it inside text_config; accept the top level too.
  if (t.has("quantization_config")) {
    c.moe.mxfp4 = parse_quantization(t.sub("quantization_config"));
  } else if (c.wrapped && top.has("quantization_config")) {
    c.moe.mxfp4 = parse_quantization(top.sub("quantization_config"));
  }
  if (c.moe.mxfp4) {
    if (c.expert_in_dim() % 32 != 0)
      t.fail(c.moe.latent_size > 0 ? "routed_expert_hidden_size" : "hidden_size",
             std::to_string(c.expert_in_dim()) +
                 " is not a multiple of 32 (MXFP4 experts need whole 32-element blocks)");
    if (c.moe.intermediate_size % 32 != 0)
      t.fail("moe_intermediate_size", std::to_string(c.moe.intermediate_size) +
                                          " is not a multiple of 32 (MXFP4 experts need whole "
                                          "32-element blocks)");
  }

  auto token = [&](const char* key) -> int {
    const Fields& f = t.has(key) ? t : top;
    if (!f.has(key)) return -1;
    // Not checked against vocab_size: an id the model never produces is harmless, and synth
    // rewrites the template's ids after shrinking the vocabulary.
    return f.in_range(key, -1, INT32_MAX);
  };
  c.bos_token_id = token("bos_token_id");
  c.eos_token_id = token("eos_token_id");
  c.pad_token_id = token("pad_token_id");
  return c;
}

ModelConfig load_config(const std::filesystem::path& config_json) {
  return parse_config(read_small_file(config_json, config_json.string()), config_json.string());
}

std::string describe_config(const ModelConfig& c) {
  std::ostringstream o;
  o << (c.wrapped ? "kimi_k3 wrapper" : "flat kimi_linear") << ", " << c.num_layers << " layers ("
    << c.num_kda_layers() << " KDA, " << c.num_mla_layers() << " MLA), hidden " << c.hidden_size
    << ", vocab " << c.vocab_size << ", " << c.moe.num_experts << " experts top-" << c.moe.top_k
    << (c.moe.mxfp4 ? " MXFP4" : " bf16") << ", " << activation_name(c.act);
  if (c.has_attn_res()) o << ", AttnRes block " << c.attn_res_block_size;
  if (c.moe.latent_size) o << ", latent " << c.moe.latent_size;
  return o.str();
}

// ------------------------------------------------------------------------------------------
// Costs: each tensor of model_tensor_specs is assigned to one component by its name.

namespace {

std::string component_of(const ModelConfig& c, const std::string& name) {
  if (name == c.lm_head_name || name == c.tensor_prefix + "embed_tokens.weight")
    return "embedding+head";
  const std::string lp = c.tensor_prefix + "layers.";
  if (name.compare(0, lp.size(), lp) == 0) {
    const size_t dot = name.find('.', lp.size());
    const int l = std::stoi(name.substr(lp.size(), dot - lp.size()));
    const std::string rest = name.substr(dot + 1);
    if (rest.rfind("self_attn.", 0) == 0) return c.is_kda(l) ? "kda" : "mla";
    if (rest.rfind("mlp.", 0) == 0) return "dense_mlp";
    if (rest.rfind("block_sparse_moe.shared_experts.", 0) == 0) return "shared_experts";
    if (rest.rfind("block_sparse_moe.experts.", 0) == 0) return "routed_experts";
    if (rest.rfind("block_sparse_moe.", 0) == 0) return "moe_other";
  }
  return "norms+attnres";
}

}  // namespace

ModelCosts compute_costs(const ModelConfig& c) {
  ModelCosts k;
  const char* order[] = {
      "embedding+head", "kda",       "mla",          "dense_mlp", "shared_experts",
      "routed_experts", "moe_other", "norms+attnres"};
  std::map<std::string, size_t> idx;
  for (const char* n : order) {
    idx[n] = k.components.size();
    k.components.push_back({n, 0, 0});
  }
  const std::string expert0 = c.num_moe_layers() > 0 ? expert_tensor_name(
                                                           c,
                                                           [&] {
                                                             for (int l = 0; l < c.num_layers; ++l)
                                                               if (c.is_moe(l)) return l;
                                                             return 0;
                                                           }(),
                                                           0, "")
                                                     : std::string();
  for (const TensorSpec& s : model_tensor_specs(c)) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    const bool scale = s.name.size() > 13 && s.name.ends_with(".weight_scale");
    const bool packed = s.name.ends_with(".weight_packed");
    const int64_t params = scale ? 0 : packed ? 2 * n : n;
    ComponentCost& cc = k.components[idx[component_of(c, s.name)]];
    cc.params += params;
    cc.bytes += s.nbytes();
    if (!expert0.empty() && s.name.rfind(expert0, 0) == 0) {
      k.bytes_per_routed_expert += s.nbytes();
      k.params_per_routed_expert += params;
    }
  }
  for (const ComponentCost& cc : k.components) {
    k.total_params += cc.params;
    k.total_bytes += cc.bytes;
  }
  const int moe_layers = c.num_moe_layers();
  k.num_routed_experts_total = uint64_t(c.moe.num_experts) * moe_layers;
  k.routed_bytes_per_token = k.bytes_per_routed_expert * uint64_t(c.moe.top_k) * moe_layers;
  // Active per token: every weight a token multiplies — not the embedding table (one row is
  // looked up) and only top_k routed experts per MoE layer. This is how the K3 report counts its
  // 104.2B.
  k.active_params_per_token = k.total_params - k.components[idx["routed_experts"]].params +
                              k.params_per_routed_expert * c.moe.top_k * moe_layers -
                              int64_t(c.vocab_size) * c.hidden_size;
  const uint64_t H = c.kda.num_heads, d = c.kda.head_dim;
  k.kda_state_bytes_per_layer = H * d * d * 4;  // fp32 [H, V, K]
  k.kda_state_bytes = k.kda_state_bytes_per_layer * c.num_kda_layers();
  k.conv_state_bytes_per_layer = 3 * uint64_t(c.kda.conv_kernel - 1) * c.kda.proj_dim() * 2;
  k.conv_state_bytes = k.conv_state_bytes_per_layer * c.num_kda_layers();
  k.mla_cache_bytes_per_token_per_layer = uint64_t(c.mla.latent_cache_dim()) * 2;
  k.mla_cache_bytes_per_token = k.mla_cache_bytes_per_token_per_layer * c.num_mla_layers();
  return k;
}

}  // namespace strata
