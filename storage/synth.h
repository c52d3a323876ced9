// Synthetic checkpoints (`strata synth`): config.json in the released format, sharded safetensors
// with the released tensor names, shapes and dtypes (model_tensor_specs), random weights that are
// deterministic per seed and scaled so activations stay finite and varied through every layer,
// decisive routers, and a stand-in Kimi tokenizer. Streams to disk: never holds the model.
// Not here: the CLI (tools/cmd_synth.cpp).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "storage/config.h"

namespace strata {

// Preset names: "k3-tiny", "k3-mini", "k3-slice", "kimi-linear-tiny".
const std::vector<std::string>& synth_presets();

struct SynthOptions {
  std::string preset;                 // one of synth_presets(), or empty with config_path
  std::filesystem::path config_path;  // --config: any config.json (K3 wrapper or flat)
  int layers = 0;                     // override num_hidden_layers (0 = keep)
  int experts = 0;                    // override num_experts (top-k clamped to it; 0 = keep)
  int vocab = 0;                      // override vocab_size (0 = keep)
  uint64_t seed = 1;
  uint64_t shard_bytes = 0;  // target shard size; 0 = preset default (4 MiB tiny, 512 MiB big)
  bool tokenizer = true;     // write tiktoken.model + tokenizer_config.json
  int threads = 0;           // generator threads; 0 = hardware concurrency
};

// The config.json text synth would write for these options (preset or --config, with the
// overrides applied). Throws strata::Error for unknown presets and bad overrides.
std::string synth_config_json(const SynthOptions& opt);
// Writes that config.json alone (no weights, no tokenizer) into out_dir (created; must be empty or
// absent, as for synth_checkpoint); returns its path. E.g. for `strata plan --config`.
std::filesystem::path synth_config_only(const SynthOptions& opt,
                                        const std::filesystem::path& out_dir);

struct SynthResult {
  ModelConfig config;
  size_t num_tensors = 0;
  int num_shards = 0;
  uint64_t total_bytes = 0;  // safetensors bytes written (all shards)
  double seconds = 0;
};

// Writes the checkpoint into out_dir (created; must be empty or absent). progress, if given, is
// called after each shard with (shards done, shards total, bytes done, bytes total).
SynthResult synth_checkpoint(
    const SynthOptions& opt, const std::filesystem::path& out_dir,
    const std::function<void(int, int, uint64_t, uint64_t)>& progress = nullptr);

}  // namespace strata
