// `strata synth`: write a synthetic checkpoint in the released layout (storage/synth.h).
#include <cstdio>

#include "engine/cli_support.h"
#include "storage/error.h"
#include "storage/synth.h"
#include "tools/command.h"

namespace {

struct SynthArgs {
  strata::SynthOptions opt;
  std::string out;
  std::string config;
  double shard_mb = 0;
  bool no_tokenizer = false;
  bool quiet = false;
  bool config_only = false;
};

strata::tools::CommandRun setup(CLI::App& app) {
  auto a = std::make_shared<SynthArgs>();
  std::string presets;
  for (const auto& p : strata::synth_presets()) presets += (presets.empty() ? "" : "|") + p;
  app.add_option("--preset", a->opt.preset, "model preset: " + presets);
  app.add_option("--config", a->config, "any config.json to synthesise instead of a preset");
  // Given, each must be ≥ 1 (left out, 0 internally keeps the preset's value); the config's own
  // bounds (storage/config.h) are checked when the model is made.
  constexpr int kMaxOverride = 1 << 30;
  app.add_option("--layers", a->opt.layers,
                 "number of layers (default: the preset's; k3-slice: 2). The last layer is MLA")
      ->check(CLI::Range(1, kMaxOverride));
  app.add_option("--experts", a->opt.experts, "routed experts per MoE layer (top-k clamped)")
      ->check(CLI::Range(1, kMaxOverride));
  app.add_option("--vocab", a->opt.vocab, "vocabulary size override")
      ->check(CLI::Range(1, kMaxOverride));
  app.add_option("--seed", a->opt.seed, "random seed (weights are a pure function of it)")
      ->default_val(1);
  app.add_option("--shard-mb", a->shard_mb,
                 "target shard size in MiB (default 4 for tiny models, 512 otherwise)");
  app.add_option("--threads", a->opt.threads, "generator threads (default: all cores)");
  app.add_flag("--no-tokenizer", a->no_tokenizer, "do not write the stand-in tokenizer");
  app.add_flag("-q,--quiet", a->quiet, "no progress lines");
  app.add_flag("--config-only", a->config_only,
               "write only the config.json the checkpoint would have (no weights; e.g. for "
               "`strata plan --config`)");
  app.add_option("-o,--output", a->out, "output directory (new or empty)")->required();
  return [a]() -> int {
    strata::engine::check_thread_count("--threads", a->opt.threads);
    if (!(a->shard_mb == 0 || (a->shard_mb >= 0.01 && a->shard_mb <= 1 << 20)))
      throw strata::Error("--shard-mb " + std::to_string(a->shard_mb) +
                          ": expected 0.01..1048576 MiB (0: the default)");
    a->opt.config_path = a->config;
    a->opt.tokenizer = !a->no_tokenizer;
    a->opt.shard_bytes = uint64_t(a->shard_mb * 1048576.0);
    if (a->config_only) {
      const auto file = strata::synth_config_only(a->opt, a->out);
      std::printf("wrote %s (config only, no weights)\n", file.c_str());
      return 0;
    }
    auto progress = [a](int done, int total, uint64_t bytes, uint64_t all) {
      if (!a->quiet)
        std::fprintf(stderr, "synth: shard %d/%d written (%.2f of %.2f GB)\n", done, total,
                     double(bytes) / 1e9, double(all) / 1e9);
    };
    const strata::SynthResult r = strata::synth_checkpoint(a->opt, a->out, progress);
    std::printf("wrote %s: %s\n", a->out.c_str(), strata::describe_config(r.config).c_str());
    std::printf("%zu tensors in %d shard%s, %.3f GB in %.1f s (%.2f GB/s)\n", r.num_tensors,
                r.num_shards, r.num_shards == 1 ? "" : "s", double(r.total_bytes) / 1e9, r.seconds,
                double(r.total_bytes) / 1e9 / std::max(r.seconds, 1e-9));
    return 0;
  };
}

}  // namespace

STRATA_COMMAND("synth", "write a synthetic checkpoint in the released K3 / Kimi-Linear layout",
               setup);
