// Token sampling for `strata run`: greedy, temperature, top-k, top-p (nucleus) with a seeded,
// platform-independent random stream, plus the stop rules (EOS ids, stop strings). Not the place
// for logits processors beyond these (repetition penalty etc. are not implemented).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace strata::engine {

struct SamplerConfig {
  float temperature = 0.0f;  // 0 → greedy (argmax, ties → lower id)
  int top_k = 0;             // 0 → no top-k cut
  float top_p = 1.0f;        // 1 → no nucleus cut
  uint64_t seed = 1;
};

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& config);

  // Picks the next token from one row of logits [vocab].
  int sample(std::span<const float> logits);

  const SamplerConfig& config() const { return config_; }

 private:
  double next_uniform();  // in [0, 1), splitmix64-based: same stream on every platform

  SamplerConfig config_;
  uint64_t state_;
  std::vector<std::pair<float, int>> candidates_;  // reused scratch (no allocation per token)
};

// Index of the largest value; ties → lowest index. NaN never wins.
int argmax(std::span<const float> logits);

// Stop rules of a generation: a token id in `eos_ids`, or the generated text containing one of
// `stop_strings`. `text` is the text generated so far; returns the length at which to cut it
// (std::string::npos when no stop string occurs).
struct StopRules {
  std::vector<int> eos_ids;
  std::vector<std::string> stop_strings;
  bool is_eos(int id) const;
  size_t stop_position(const std::string& text) const;
};

}  // namespace strata::engine
