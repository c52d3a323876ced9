// `strata inspect DIR|config.json [--json]`: what a model holds and what it costs per token per
// tier: architecture, layer map, parameters and bytes by component, bytes per routed expert,
// routed bytes read per token, decode state per sequence. With weights, the checkpoint is also
// validated (every tensor claimed with the shape the config implies, expert scales not NaN).
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "storage/checkpoint.h"
#include "storage/config.h"
#include "tools/command.h"

namespace {

namespace fs = std::filesystem;
using strata::ModelConfig;
using strata::ModelCosts;

std::string human_count(double v) {
  const char* units[] = {"", " K", " M", " B", " T"};
  int u = 0;
  while (v >= 1000 && u < 4) v /= 1000, ++u;
  char b[32];
  std::snprintf(b, sizeof b, u ? "%.2f%s" : "%.0f%s", v, units[u]);
  return b;
}

std::string human_bytes(double v) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (v >= 1000 && u < 4) v /= 1000, ++u;
  char b[32];
  std::snprintf(b, sizeof b, u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return b;
}

std::string mib(double v) {  // binary units, as state sizes are quoted in spec/model.md §11
  char b[32];
  if (v >= 1048576.0)
    std::snprintf(b, sizeof b, "%.1f MiB", v / 1048576.0);
  else
    std::snprintf(b, sizeof b, "%.1f KiB", v / 1024.0);
  return b;
}

std::string layer_map(const ModelConfig& c) {
  // One letter per layer: K = KDA, M = MLA; lowercase = dense FFN; '|' opens an AttnRes block.
  std::string s;
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.opens_block(l) && l > 0) s += '|';
    char ch = c.is_kda(l) ? 'K' : 'M';
    if (c.is_dense(l)) ch = char(ch - 'A' + 'a');
    s += ch;
  }
  return s;
}

struct CheckpointReport {
  bool present = false;
  int shards = 0;
  size_t tensors = 0;
  uint64_t file_bytes = 0;
  uint64_t bytes_per_expert = 0;
  size_t max_spans_per_expert = 0;
};

strata::tools::CommandRun setup(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  app.add_option("path", *path, "checkpoint directory or config.json")->required();
  app.add_flag("--json", *as_json, "print the same figures as JSON");
  return [path, as_json]() -> int {
    const fs::path p(*path);
    CheckpointReport ck;
    ModelConfig c;
    const bool has_weights =
        fs::is_directory(p) &&
        (fs::exists(p / "model.safetensors") || fs::exists(p / "model.safetensors.index.json"));
    if (has_weights) {
      strata::Checkpoint cp(p);  // validates headers, shapes and expert scales
      cp.claim_all_specs();
      cp.check_all_claimed();
      c = cp.config();
      ck.present = true;
      ck.shards = cp.num_files();
      ck.tensors = cp.num_tensors();
      ck.file_bytes = cp.total_file_bytes();
      for (int l = 0; l < c.num_layers; ++l)
        if (cp.has_experts(l))
          for (int e = 0; e < c.moe.num_experts; ++e) {
            ck.bytes_per_expert = cp.expert(l, e).nbytes;
            ck.max_spans_per_expert =
                std::max(ck.max_spans_per_expert, cp.expert(l, e).spans.size());
          }
    } else {
      c = strata::load_config(fs::is_directory(p) ? p / "config.json" : p);
    }
    const ModelCosts k = strata::compute_costs(c);
    const int moe_layers = c.num_moe_layers();

    if (*as_json) {
      nlohmann::ordered_json j;
      j["source"] = c.source;
      j["architecture"] = {{"wrapped", c.wrapped},
                           {"layers", c.num_layers},
                           {"kda_layers", c.num_kda_layers()},
                           {"mla_layers", c.num_mla_layers()},
                           {"moe_layers", moe_layers},
                           {"layer_map", layer_map(c)},
                           {"hidden_size", c.hidden_size},
                           {"vocab_size", c.vocab_size},
                           {"activation", strata::activation_name(c.act)},
                           {"attn_res_block_size", c.attn_res_block_size},
                           {"kda_gate", strata::gate_kind_name(c.kda.gate)},
                           {"kda_full_rank_output_gate", c.kda.full_rank_output_gate},
                           {"mla_q_lora_rank", c.mla.q_lora_rank},
                           {"mla_output_gate", c.mla.output_gate},
                           {"num_experts", c.moe.num_experts},
                           {"top_k", c.moe.top_k},
                           {"num_shared_experts", c.moe.num_shared_experts},
                           {"expert_in_dim", c.expert_in_dim()},
                           {"expert_intermediate", c.moe.intermediate_size},
                           {"latent_size", c.moe.latent_size},
                           {"router_form", strata::router_form_name(c.moe.router_form)},
                           {"routed_scaling_factor", c.moe.routed_scaling_factor},
                           {"mxfp4_experts", c.moe.mxfp4}};
      nlohmann::ordered_json comps = nlohmann::ordered_json::array();
      for (const auto& cc : k.components)
        comps.push_back({{"name", cc.name}, {"params", cc.params}, {"bytes", cc.bytes}});
      j["components"] = comps;
      j["total_params"] = k.total_params;
      j["total_bytes"] = k.total_bytes;
      j["active_params_per_token"] = k.active_params_per_token;
      j["params_per_routed_expert"] = k.params_per_routed_expert;
      j["bytes_per_routed_expert"] = k.bytes_per_routed_expert;
      j["routed_experts_total"] = k.num_routed_experts_total;
      j["routed_bytes_per_token"] = k.routed_bytes_per_token;
      j["kda_state_bytes_per_layer"] = k.kda_state_bytes_per_layer;
      j["kda_state_bytes"] = k.kda_state_bytes;
      j["conv_state_bytes_per_layer"] = k.conv_state_bytes_per_layer;
      j["conv_state_bytes"] = k.conv_state_bytes;
      j["mla_cache_bytes_per_token_per_layer"] = k.mla_cache_bytes_per_token_per_layer;
      j["mla_cache_bytes_per_token"] = k.mla_cache_bytes_per_token;
      if (ck.present)
        j["checkpoint"] = {{"shards", ck.shards},
                           {"tensors", ck.tensors},
                           {"file_bytes", ck.file_bytes},
                           {"all_tensors_claimed", true},
                           {"bytes_per_routed_expert", ck.bytes_per_expert},
                           {"max_spans_per_expert", ck.max_spans_per_expert}};
      std::printf("%s\n", j.dump(2).c_str());
      return 0;
    }

    std::printf("source: %s\n", c.source.c_str());
    std::printf("architecture: %s\n", strata::describe_config(c).c_str());
    std::printf("layer map (K=KDA M=MLA, lowercase=dense FFN, |=AttnRes block): %s\n",
                layer_map(c).c_str());
    std::printf("KDA: %d heads x %d, conv %d, gate %s", c.kda.num_heads, c.kda.head_dim,
                c.kda.conv_kernel, strata::gate_kind_name(c.kda.gate));
    if (c.kda.gate == strata::KdaGateKind::bounded_sigmoid)
      std::printf(" (lower bound %g)", c.kda.gate_lower_bound);
    std::printf(", output gate %s\n", c.kda.full_rank_output_gate ? "full-rank" : "low-rank");
    std::printf(
        "MLA: %d heads, q %s, kv latent %d + rope %d, nope %d, v %d, output gate %s\n",
        c.mla.num_heads,
        c.mla.q_lora_rank ? ("lora " + std::to_string(c.mla.q_lora_rank)).c_str() : "direct",
        c.mla.kv_lora_rank, c.mla.qk_rope_head_dim, c.mla.qk_nope_head_dim, c.mla.v_head_dim,
        c.mla.output_gate ? "yes" : "no");
    std::printf(
        "MoE: %d layers, %d experts top-%d (%s), %d shared (width %d), expert %d->%d%s, "
        "router sigmoid (%s weights), scaling %g\n",
        moe_layers, c.moe.num_experts, c.moe.top_k, c.moe.mxfp4 ? "MXFP4" : "bf16",
        c.moe.num_shared_experts, c.moe.shared_intermediate(), c.expert_in_dim(),
        c.moe.intermediate_size,
        c.moe.latent_size ? (", latent " + std::to_string(c.moe.latent_size) +
                             (c.moe.latent_norm ? " + norm" : ""))
                                .c_str()
                          : "",
        strata::router_form_name(c.moe.router_form), c.moe.routed_scaling_factor);
    std::printf("\n%-16s %14s %14s\n", "component", "params", "bytes");
    for (const auto& cc : k.components)
      std::printf("%-16s %14s %14s\n", cc.name.c_str(), human_count(double(cc.params)).c_str(),
                  human_bytes(double(cc.bytes)).c_str());
    std::printf("%-16s %14s %14s\n", "total", human_count(double(k.total_params)).c_str(),
                human_bytes(double(k.total_bytes)).c_str());
    std::printf("active parameters per token: %s\n",
                human_count(double(k.active_params_per_token)).c_str());
    std::printf("routed experts: %llu (%d x %d layers), %s each (%llu B)\n",
                (unsigned long long)k.num_routed_experts_total, c.moe.num_experts, moe_layers,
                human_bytes(double(k.bytes_per_routed_expert)).c_str(),
                (unsigned long long)k.bytes_per_routed_expert);
    std::printf("routed bytes read per token (top-%d x %d layers, all cold): %s\n", c.moe.top_k,
                moe_layers, human_bytes(double(k.routed_bytes_per_token)).c_str());
    std::printf(
        "decode state per sequence: KDA state %s (%s x %d layers), conv state %s; "
        "MLA latent cache %llu B x %d layers = %llu B per token\n",
        mib(double(k.kda_state_bytes)).c_str(), mib(double(k.kda_state_bytes_per_layer)).c_str(),
        c.num_kda_layers(), mib(double(k.conv_state_bytes)).c_str(),
        (unsigned long long)k.mla_cache_bytes_per_token_per_layer, c.num_mla_layers(),
        (unsigned long long)k.mla_cache_bytes_per_token);
    if (ck.present) {
      std::printf(
          "checkpoint: %d shard%s, %zu tensors, %s on disk; all tensors claimed with the "
          "shapes the config implies; expert scales valid; %s per expert in %zu span%s\n",
          ck.shards, ck.shards == 1 ? "" : "s", ck.tensors,
          human_bytes(double(ck.file_bytes)).c_str(),
          human_bytes(double(ck.bytes_per_expert)).c_str(), ck.max_spans_per_expert,
          ck.max_spans_per_expert == 1 ? "" : "s (max)");
    } else {
      std::printf("checkpoint: none (config only)\n");
    }
    return 0;
  };
}

}  // namespace

STRATA_COMMAND("inspect", "what a checkpoint holds and what it costs per token per tier", setup);
