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

// One token's draw: the sampling rule and the uniform number it consumes (0 when greedy). A draw
// is what a backend needs to pick the token where the logits are (Backend::sample): the random
// stream stays on the host, so a seed gives the same draws on every backend.
struct TokenDraw {
  float temperature = 0.0f;  // ≤ 0 (or top_k == 1): greedy
  int top_k = 0;
  float top_p = 1.0f;
  double u = 0.0;  // in [0, 1)
  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
};

// Picks the token of one row of logits [vocab] for draw d: the arg-max when greedy; otherwise the
// candidates sorted by decreasing logit (ties → lower id), cut to top_k, softmax(logit / T) in
// double, cut to the shortest prefix reaching top_p, and the first candidate whose cumulative
// probability exceeds u · Σ. scratch is reused between calls (no allocation per token).
int pick_token(std::span<const float> logits, const TokenDraw& d,
               std::vector<std::pair<float, int>>& scratch);

class Sampler {
 public:
  explicit Sampler(const SamplerConfig& config);

  // The next token's draw: consumes one number of the stream unless the rule is greedy.
  TokenDraw next_draw();
  // Picks the next token from one row of logits [vocab] (pick_token with next_draw()).
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
