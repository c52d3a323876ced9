// config.json parsing: both real configs, derived values, the router-form rule, the cost figures
// inspect prints, and one error per class of malformed input (message names file and field).
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "storage/config.h"
#include "storage/error.h"
#include "test_util.h"

using namespace strata;
using nlohmann::json;

namespace {

std::filesystem::path k3_path() {
  return test::shared_dir() / "configs" / "kimi-k3.config.json";
}
std::filesystem::path kl_path() {
  return test::shared_dir() / "configs" / "kimi-linear-48b-a3b.config.json";
}

json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

// Parse a modified config and return the error message ("" if it parsed).
std::string parse_error(const json& j, const std::string& name = "bad.json") {
  try {
    parse_config(j.dump(), name);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("K3 config parses with the derived values of spec/model.md", "[config]") {
  test::need_shared(k3_path());
  const ModelConfig c = load_config(k3_path());
  CHECK(c.wrapped);
  CHECK(c.source == k3_path().string());
  CHECK(c.tensor_prefix == "language_model.model.");
  CHECK(c.lm_head_name == "language_model.lm_head.weight");
  CHECK(c.vocab_size == 163840);
  CHECK(c.hidden_size == 7168);
  CHECK(c.num_layers == 93);
  CHECK(c.num_kda_layers() == 69);
  CHECK(c.num_mla_layers() == 24);
  // MLA at 0-based 3, 7, ..., 91 and 92 (two MLA layers at the end).
  for (int l = 0; l < 93; ++l) CHECK(c.is_mla(l) == (l % 4 == 3 || l == 92));
  CHECK(c.is_dense(0));
  CHECK(c.is_moe(1));
  CHECK(c.is_moe(92));
  CHECK(c.num_moe_layers() == 92);
  CHECK(c.dense_intermediate_size == 33792);
  CHECK(c.act == Activation::situ);
  CHECK(c.situ_beta == 4.0f);
  CHECK(c.situ_linear_beta == 25.0f);
  CHECK(c.attn_res_block_size == 12);
  CHECK(c.opens_block(84));
  CHECK_FALSE(c.opens_block(85));
  CHECK(c.kda.num_heads == 96);
  CHECK(c.kda.head_dim == 128);
  CHECK(c.kda.proj_dim() == 12288);
  CHECK(c.kda.conv_kernel == 4);
  CHECK(c.kda.gate == KdaGateKind::bounded_sigmoid);
  CHECK(c.kda.gate_lower_bound == -5.0f);
  CHECK(c.kda.full_rank_output_gate);
  CHECK(c.mla.num_heads == 96);
  CHECK(c.mla.q_lora_rank == 1536);
  CHECK(c.mla.kv_lora_rank == 512);
  CHECK(c.mla.q_head_dim() == 192);
  CHECK(c.mla.v_head_dim == 128);
  CHECK(c.mla.output_gate);
  CHECK(c.moe.num_experts == 896);
  CHECK(c.moe.top_k == 16);
  CHECK(c.moe.num_shared_experts == 2);
  CHECK(c.moe.shared_intermediate() == 6144);
  CHECK(c.moe.intermediate_size == 3072);
  CHECK(c.moe.latent_size == 3584);
  CHECK(c.expert_in_dim() == 3584);
  CHECK(c.moe.latent_norm);
  CHECK(c.moe.routed_scaling_factor == 1.0f);
  CHECK(c.moe.router_form == RouterWeightForm::unbiased);
  CHECK(c.moe.mxfp4);
  CHECK(c.bos_token_id == 163584);
  CHECK(c.eos_token_id == 163586);
  CHECK(c.pad_token_id == 163839);
  CHECK(c.rms_norm_eps == 1e-5f);
}

TEST_CASE("Kimi-Linear config parses as the flat, unquantized, in-place-bias form", "[config]") {
  test::need_shared(kl_path());
  const ModelConfig c = load_config(kl_path());
  CHECK_FALSE(c.wrapped);
  CHECK(c.tensor_prefix == "model.");
  CHECK(c.lm_head_name == "lm_head.weight");
  CHECK(c.num_layers == 27);
  CHECK(c.num_kda_layers() == 20);
  CHECK(c.num_mla_layers() == 7);
  CHECK(c.is_mla(26));
  CHECK(c.is_kda(25));
  CHECK(c.act == Activation::silu);
  CHECK(c.attn_res_block_size == 0);
  CHECK_FALSE(c.has_attn_res());
  CHECK(c.kda.gate == KdaGateKind::softplus);
  CHECK_FALSE(c.kda.full_rank_output_gate);
  CHECK(c.kda.gate_rank == 128);
  CHECK(c.mla.q_lora_rank == 0);
  CHECK_FALSE(c.mla.output_gate);
  CHECK(c.moe.num_experts == 256);
  CHECK(c.moe.top_k == 8);
  CHECK(c.moe.latent_size == 0);
  CHECK(c.expert_in_dim() == 2304);
  CHECK(c.moe.routed_scaling_factor == Approx(2.446f));
  CHECK(c.moe.router_form == RouterWeightForm::bias_in_place);
  CHECK_FALSE(c.moe.mxfp4);
}

TEST_CASE("router form follows the [ASSUMED] K3-field rule", "[config]") {
  test::need_shared(k3_path());
  json j = read_json(k3_path());
  json& t = j["text_config"];
  // Any one K3-only field keeps the unbiased form.
  t.erase("attn_res_block_size");
  t.erase("routed_expert_hidden_size");
  t.erase("latent_moe_use_norm");
  CHECK(parse_config(j.dump(), "x").moe.router_form == RouterWeightForm::unbiased);
  t["linear_attn_config"].erase("gate_lower_bound");
  const ModelConfig c = parse_config(j.dump(), "x");
  CHECK(c.moe.router_form == RouterWeightForm::bias_in_place);
  CHECK(c.kda.gate == KdaGateKind::softplus);
}

TEST_CASE("K3 costs: bytes per expert, routed bytes per token, decode state", "[config][costs]") {
  test::need_shared(k3_path());
  const ModelCosts k = compute_costs(load_config(k3_path()));
  // spec/building-blocks.md §1.3: 3 × 5,849,088 B per expert.
  CHECK(k.bytes_per_routed_expert == 17547264ull);
  CHECK(k.params_per_routed_expert == 3ll * 3072 * 3584);
  // × top-16 × 92 MoE layers ≈ 25.8 GB read per token if every expert is cold.
  CHECK(k.routed_bytes_per_token == 17547264ull * 16 * 92);
  CHECK(double(k.routed_bytes_per_token) / 1e9 == Approx(25.83).epsilon(0.001));
  CHECK(k.num_routed_experts_total == 896ull * 92);
  // spec/model.md §11: 6 MiB per KDA layer × 69 = 414 MiB; conv 216 KiB per layer;
  // MLA latent 1152 B per token per layer × 24.
  CHECK(k.kda_state_bytes_per_layer == 6ull << 20);
  CHECK(k.kda_state_bytes == 414ull << 20);
  CHECK(k.conv_state_bytes_per_layer == 216ull << 10);
  CHECK(k.mla_cache_bytes_per_token_per_layer == 1152);
  CHECK(k.mla_cache_bytes_per_token == 1152 * 24);
  // Report: 2.78T total, 104.2B active parameters (the release rounds; we count stored weights).
  CHECK(double(k.total_params) == Approx(2.78e12).epsilon(0.01));
  CHECK(double(k.active_params_per_token) == Approx(104.2e9).epsilon(0.01));
  int64_t sum = 0;
  for (const auto& cc : k.components) sum += cc.params;
  CHECK(sum == k.total_params);
}

TEST_CASE("malformed configs give one message naming file and field", "[config][errors]") {
  test::need_shared(k3_path());
  const json base = read_json(k3_path());
  auto with = [&](auto edit) {
    json j = base;
    edit(j["text_config"]);
    return parse_error(j, "cfg.json");
  };
  CHECK(parse_error(base, "cfg.json").empty());

  SECTION("invalid JSON") {
    std::string msg;
    try {
      parse_config("{\"text_config\": ", "cfg.json");
    } catch (const Error& e) {
      msg = e.what();
    }
    CHECK_THAT(msg, Catch::StartsWith("cfg.json: invalid JSON"));
  }
  SECTION("missing field") {
    const std::string m = with([](json& t) { t.erase("hidden_size"); });
    CHECK_THAT(m, Catch::StartsWith("cfg.json: text_config.hidden_size: missing field"));
  }
  SECTION("wrong type") {
    const std::string m = with([](json& t) { t["num_experts"] = "many"; });
    CHECK_THAT(m, Catch::StartsWith("cfg.json: text_config.num_experts: expected an integer, "
                                    "got a string"));
    const std::string m2 = with([](json& t) { t["linear_attn_config"] = 3; });
    CHECK_THAT(m2, Catch::Contains("text_config.linear_attn_config: expected an object"));
  }
  SECTION("layer lists not covering every layer exactly once") {
    CHECK_THAT(with([](json& t) {
                 auto& k = t["linear_attn_config"]["kda_layers"];
                 k.erase(k.begin() + 3);  // drops layer 5 (1-based)
               }),
               Catch::Contains("cfg.json: text_config.linear_attn_config.kda_layers: layer 5 "
                               "(1-based) is in neither"));
    CHECK_THAT(with([](json& t) { t["linear_attn_config"]["kda_layers"].push_back(4); }),
               Catch::Contains("layer 4 is in both kda_layers and full_attn_layers"));
    CHECK_THAT(with([](json& t) { t["linear_attn_config"]["full_attn_layers"].push_back(94); }),
               Catch::Contains("full_attn_layers: layer 94 is out of range 1..93"));
    CHECK_THAT(with([](json& t) { t["linear_attn_config"]["full_attn_layers"].push_back(4); }),
               Catch::Contains("full_attn_layers: layer 4 is listed twice"));
  }
  SECTION("unknown activation and router function") {
    CHECK_THAT(with([](json& t) { t["hidden_act"] = "gelu"; }),
               Catch::Contains("text_config.hidden_act: unknown activation \"gelu\""));
    CHECK_THAT(with([](json& t) { t["moe_router_activation_func"] = "softmax"; }),
               Catch::Contains("text_config.moe_router_activation_func: unknown router function "
                               "\"softmax\""));
  }
  SECTION("MXFP4 dims not divisible by 32") {
    CHECK_THAT(with([](json& t) { t["moe_intermediate_size"] = 3000; }),
               Catch::Contains("text_config.moe_intermediate_size: 3000 is not a multiple of 32"));
    CHECK_THAT(
        with([](json& t) { t["routed_expert_hidden_size"] = 3580; }),
        Catch::Contains("text_config.routed_expert_hidden_size: 3580 is not a multiple of 32"));
    // Without quantization_config the same dims are fine (bf16 experts).
    CHECK(with([](json& t) {
            t.erase("quantization_config");
            t["moe_intermediate_size"] = 3000;
          }).empty());
  }
  SECTION("unsupported quantization and grouped routing") {
    CHECK_THAT(with([](json& t) { t["quantization_config"]["format"] = "nvfp4-pack-quantized"; }),
               Catch::Contains("text_config.quantization_config.format: unsupported quantization "
                               "format \"nvfp4-pack-quantized\""));
    CHECK_THAT(with([](json& t) {
                 t["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 16;
               }),
               Catch::Contains("weights.group_size: expected 32"));
    CHECK_THAT(with([](json& t) { t["num_expert_group"] = 8; }),
               Catch::Contains("text_config.num_expert_group: grouped routing is not supported"));
  }
}

TEST_CASE("load_config names an unreadable file", "[config][errors]") {
  std::string msg;
  try {
    load_config("/nonexistent/config.json");
  } catch (const Error& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Catch::StartsWith("/nonexistent/config.json: cannot open"));
}
