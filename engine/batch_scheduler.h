// Continuous batching for `strata batch`: several sequences in flight, one slot each; every step
// runs the next chunk of each sequence (the one token sampled last, or a prefill chunk of at most
// `prefill_chunk` prompt tokens), at most the runner's max_step_rows rows in all (decode rows
// first, then prefill chunks in slot order); a finished sequence hands its slot to the next
// request at once.
// Sampling and stop rules are per request, so a request's tokens do not depend on what else is
// in flight as long as the step runner computes every sequence's rows independently (the CPU
// reference does). Also the memory a sequence needs (state, MLA cache, prefill working set), so a
// request that cannot fit is refused before it runs.
// Not here: the request format (engine/batch_format.h), durability (engine/batch_journal.h), the
// command (tools/cmd_batch.cpp).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"
#include "storage/config.h"

namespace strata::engine {

// One sequence's part of a step: new tokens for `slot`; want_token asks for the token drawn with
// `draw` from the logits of the last of them.
struct StepChunk {
  int slot = 0;
  std::span<const int32_t> ids;
  bool want_token = false;
  TokenDraw draw;
};

// What the scheduler steps: a fixed number of slots of per-sequence state.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual int slots() const = 0;
  virtual void reset(int slot) = 0;  // a fresh sequence
  // Runs one step; returns the drawn token of each chunk that wants one, in chunk order.
  virtual std::vector<int32_t> step(std::span<const StepChunk> chunks) = 0;
  virtual int64_t max_step_rows() const { return INT64_MAX; }  // rows one step may hold
  virtual std::string describe() const = 0;
};

// The layer schedule over a backend's slots (engine/schedule.h): one step runs every chunk at
// once, so a MoE layer routes all rows together and computes each selected expert once.
std::unique_ptr<StepRunner> make_schedule_runner(Backend& backend, const ModelConfig& c);

// Memory one sequence of `tokens` tokens needs at its peak, prefilled in chunks of
// `prefill_chunk`, on the CPU reference (fp32 state and cache): the KDA recurrent and conv state
// (fixed), the MLA latent cache (grows with tokens), and the working set of the last prefill chunk
// (the expanded MLA attention materialises keys and values for the whole context, plus the chunk's
// activations).
struct SequenceMemory {
  uint64_t state_bytes = 0;
  uint64_t cache_bytes = 0;
  uint64_t work_bytes = 0;
  uint64_t total() const { return state_bytes + cache_bytes + work_bytes; }
  std::string describe() const;  // "5.2 GiB (state 414 MiB + MLA cache 3.1 GiB + working set ...)"
};
SequenceMemory sequence_memory(const ModelConfig& c, int64_t tokens, int64_t prefill_chunk);
// The fixed part alone (what Session::state_bytes reports for a fresh sequence) and the cache bytes
// per token (what it grows by per token).
uint64_t fixed_state_bytes(const ModelConfig& c);
uint64_t cache_bytes_per_token(const ModelConfig& c);

std::string format_bytes(uint64_t bytes);  // "512 B", "3.4 MiB", "12.1 GiB"

struct GenRequest {
  int64_t key = 0;  // the caller's name for it (the input line)
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplerConfig sampler;
  std::vector<std::string> stop;  // stop strings (the text is cut before the first one)
  std::vector<int> eos_ids;       // sampling one of these ends the sequence (not in the text)
  uint64_t reserve_bytes = 0;     // memory held while in flight (sequence_memory().total())
};

struct GenResult {
  int64_t key = 0;
  std::vector<int32_t> tokens;  // sampled, including a final EOS
  std::string text;             // decoded (EOS not included), cut at a stop string
  std::string finish_reason;    // "stop" or "length"
  int64_t prompt_tokens = 0;
};

struct SchedulerOptions {
  int prefill_chunk = 2048;      // prompt tokens of one sequence per step
  uint64_t mem_limit_bytes = 0;  // Σ reserve_bytes in flight; 0 = no limit
};

struct SchedulerStats {
  int64_t finished = 0;
  int64_t prompt_tokens = 0;     // prefilled
  int64_t generated_tokens = 0;  // sampled
  int64_t steps = 0;
  int64_t rows = 0;  // tokens run through the model (Σ chunk sizes)
  int in_flight = 0, max_in_flight = 0;
  double seconds = 0;  // inside run()
};

class BatchScheduler {
 public:
  BatchScheduler(StepRunner& runner, const Tokenizer* tokenizer, SchedulerOptions o);

  // Takes requests from `next` (nullopt: none left) into free slots, steps until all have
  // finished, and hands each result to `done` as soon as it finishes (before the next step).
  // `stop` is checked after every step: when set, the requests in flight are dropped and run()
  // returns false. `on_step` (optional) sees the stats after every step.
  bool run(const std::function<std::optional<GenRequest>()>& next,
           const std::function<void(GenResult&&)>& done, const std::atomic<bool>& stop,
           const std::function<void(const SchedulerStats&)>& on_step = nullptr);

  const SchedulerStats& stats() const { return stats_; }

 private:
  struct Seq;
  StepRunner& runner_;
  const Tokenizer* tok_;
  SchedulerOptions o_;
  SchedulerStats stats_;
};

}  // namespace strata::engine
