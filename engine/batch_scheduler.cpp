// Continuous batching over a StepRunner (engine/batch_scheduler.h).
#include "engine/batch_scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>

#include "engine/schedule.h"
#include "storage/error.h"

namespace strata::engine {

namespace {

class ScheduleRunner final : public StepRunner {
 public:
  ScheduleRunner(Backend& b, const ModelConfig& c) : b_(b), schedule_(b, c) {}
  int slots() const override { return b_.slots(); }
  void reset(int slot) override { b_.reset_slot(slot); }
  int64_t max_step_rows() const override { return b_.max_step_rows(); }
  std::vector<int32_t> step(std::span<const StepChunk> chunks) override {
    chunks_.clear();
    for (const StepChunk& c : chunks) {
      SeqChunk q;
      q.slot = c.slot;
      q.ids = c.ids;
      q.want_logits = false;
      q.draw = c.want_token ? &c.draw : nullptr;
      chunks_.push_back(q);
    }
    const StepOutput& all = schedule_.step(chunks_);
    std::vector<int32_t> out;
    for (size_t i = 0; i < chunks.size(); ++i)
      if (chunks[i].want_token) out.push_back(all.tokens[i]);
    return out;
  }
  std::string describe() const override {
    return std::string(b_.name()) + ", " + std::to_string(b_.slots()) + " slot" +
           (b_.slots() == 1 ? "" : "s");
  }

 private:
  Backend& b_;
  Schedule schedule_;
  std::vector<SeqChunk> chunks_;
};

}  // namespace

std::unique_ptr<StepRunner> make_schedule_runner(Backend& backend, const ModelConfig& c) {
  return std::make_unique<ScheduleRunner>(backend, c);
}

// ------------------------------------------------------------------------------------------
// Memory of one sequence.

uint64_t fixed_state_bytes(const ModelConfig& c) {
  // Session::reset: per KDA layer S [H, d, d] and three conv states [P, W−1], all fp32.
  const uint64_t H = uint64_t(c.kda.num_heads), d = uint64_t(c.kda.head_dim),
                 P = uint64_t(c.kda.proj_dim()), W = uint64_t(std::max(c.kda.conv_kernel, 1));
  return uint64_t(c.num_kda_layers()) * (H * d * d + 3 * P * (W - 1)) * 4;
}

uint64_t cache_bytes_per_token(const ModelConfig& c) {
  return uint64_t(c.num_mla_layers()) * uint64_t(c.mla.latent_cache_dim()) * 4;
}

SequenceMemory sequence_memory(const ModelConfig& c, int64_t tokens, int64_t prefill_chunk) {
  SequenceMemory m;
  const uint64_t S = uint64_t(std::max<int64_t>(tokens, 0));
  const uint64_t T = uint64_t(std::clamp<int64_t>(prefill_chunk, 1, std::max<int64_t>(tokens, 1)));
  m.state_bytes = fixed_state_bytes(c);
  m.cache_bytes = S * cache_bytes_per_token(c);
  // Working set of the last prefill chunk (T tokens at context S), the largest of the step's
  // transients, which are freed sublayer by sublayer:
  //  - expanded MLA attention (cpu/ref/mla.cpp): latents [S, kv_lora], values and keys
  //    [S, H, nope + v] and [S, H, nope + rope], queries and outputs of the chunk;
  //  - the residual stream: AttnRes blocks [T, D] (one per block of layers) plus a few [T, D]
  //    activations; the MoE's router scores [T, E] and expert inputs/outputs.
  uint64_t mla = 0;
  if (c.num_mla_layers() > 0) {
    const auto& a = c.mla;
    const uint64_t H = uint64_t(a.num_heads);
    mla = S * uint64_t(a.kv_lora_rank) + S * H * uint64_t(a.qk_nope_head_dim + a.v_head_dim) +
          S * H * uint64_t(a.q_head_dim()) + T * H * uint64_t(a.q_head_dim() + a.v_head_dim);
  }
  const uint64_t D = uint64_t(c.hidden_size);
  const uint64_t blocks = c.has_attn_res() ? uint64_t(c.num_layers / c.attn_res_block_size + 2) : 1;
  const uint64_t kda = c.num_kda_layers() > 0 ? T * uint64_t(c.kda.proj_dim()) * 8 : 0;
  uint64_t ffn = T * uint64_t(std::max(c.dense_intermediate_size, 1)) * 3;
  if (c.num_moe_layers() > 0) {
    const auto& e = c.moe;
    ffn = std::max(ffn, T * (uint64_t(e.num_experts) +
                             uint64_t(e.top_k) * (uint64_t(c.expert_in_dim()) * 2 +
                                                  uint64_t(e.intermediate_size) * 3) +
                             uint64_t(e.shared_intermediate()) * 3));
  }
  m.work_bytes = (std::max({mla, kda, ffn}) + T * D * (blocks + 6)) * 4;
  return m;
}

std::string format_bytes(uint64_t b) {
  char buf[64];
  if (b < 1024)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else if (b < (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  else if (b < (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1ull << 20));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1ull << 30));
  return buf;
}

std::string SequenceMemory::describe() const {
  return format_bytes(total()) + " (state " + format_bytes(state_bytes) + " + MLA cache " +
         format_bytes(cache_bytes) + " + prefill working set " + format_bytes(work_bytes) + ")";
}

// ------------------------------------------------------------------------------------------
// The scheduler.

struct BatchScheduler::Seq {
  GenRequest req;
  int slot = 0;
  size_t prefilled = 0;       // prompt tokens run so far
  std::vector<int32_t> feed;  // the token to run next (decode)
  Sampler sampler;
  Utf8Stream utf8;
  std::string text;  // whole characters so far
  std::vector<int32_t> tokens;
  explicit Seq(GenRequest r, int s) : req(std::move(r)), slot(s), sampler(req.sampler) {}
};

BatchScheduler::BatchScheduler(StepRunner& runner, const Tokenizer* tokenizer, SchedulerOptions o)
    : runner_(runner), tok_(tokenizer), o_(std::move(o)) {
  STRATA_ASSERT(o_.prefill_chunk >= 1);
}

namespace {

// First occurrence of a stop string in `text` that ends after `from` (earlier ones were
// already checked), or npos.
size_t find_stop(const std::string& text, const std::vector<std::string>& stops, size_t from) {
  size_t best = std::string::npos;
  for (const std::string& s : stops) {
    const size_t start = from >= s.size() ? from - s.size() + 1 : 0;
    const size_t p = text.find(s, start);
    if (p != std::string::npos && p < best) best = p;
  }
  return best;
}

}  // namespace

bool BatchScheduler::run(const std::function<std::optional<GenRequest>()>& next,
                         const std::function<void(GenResult&&)>& done,
                         const std::atomic<bool>& stop,
                         const std::function<void(const SchedulerStats&)>& on_step) {
  const auto t0 = std::chrono::steady_clock::now();
  const double seconds0 = stats_.seconds;
  const int nslots = runner_.slots();
  const int64_t max_rows = std::max<int64_t>(1, runner_.max_step_rows());
  std::vector<std::unique_ptr<Seq>> slots(static_cast<size_t>(nslots));
  std::optional<GenRequest> waiting;  // taken from `next` but not yet admitted (memory)
  bool exhausted = false;
  uint64_t reserved = 0;

  auto finish = [&](std::unique_ptr<Seq>& s, const char* reason) {
    GenResult r;
    r.key = s->req.key;
    r.prompt_tokens = int64_t(s->req.prompt.size());
    r.tokens = std::move(s->tokens);
    s->text += s->utf8.flush();
    const size_t cut = find_stop(s->text, s->req.stop, 0);
    if (cut != std::string::npos) {
      s->text.resize(cut);
      reason = "stop";
    }
    r.text = std::move(s->text);
    r.finish_reason = reason;
    reserved -= s->req.reserve_bytes;
    s.reset();
    --stats_.in_flight;
    ++stats_.finished;
    done(std::move(r));
  };

  // Fills free slots (continuous batching: called after every step).
  auto admit = [&] {
    for (int i = 0; i < nslots; ++i) {
      if (slots[size_t(i)]) continue;
      if (!waiting && !exhausted) {
        waiting = next();
        if (!waiting) exhausted = true;
      }
      if (!waiting) return;
      // A request that does not fit beside those in flight waits for them; alone it is always
      // admitted (the caller refuses requests that cannot fit at all).
      if (o_.mem_limit_bytes > 0 && stats_.in_flight > 0 &&
          reserved + waiting->reserve_bytes > o_.mem_limit_bytes)
        return;
      STRATA_ASSERT(!waiting->prompt.empty() && waiting->max_tokens >= 1);
      runner_.reset(i);
      reserved += waiting->reserve_bytes;
      slots[size_t(i)] = std::make_unique<Seq>(std::move(*waiting), i);
      waiting.reset();
      ++stats_.in_flight;
      stats_.max_in_flight = std::max(stats_.max_in_flight, stats_.in_flight);
    }
  };

  admit();
  std::vector<StepChunk> chunks;
  std::vector<Seq*> wants;
  while (stats_.in_flight > 0) {
    chunks.clear();
    wants.clear();
    int64_t rows = 0, prompt_rows = 0;
    // Decode rows first (one each), then prefill chunks in slot order while the step has room.
    for (auto& sp : slots) {
      if (!sp || sp->prefilled < sp->req.prompt.size() || rows >= max_rows) continue;
      StepChunk c;
      c.slot = sp->slot;
      c.ids = std::span<const int32_t>(sp->feed);
      c.want_token = true;
      c.draw = sp->sampler.next_draw();
      ++rows;
      chunks.push_back(c);
    }
    for (auto& sp : slots) {
      if (!sp || sp->prefilled >= sp->req.prompt.size() || rows >= max_rows) continue;
      Seq& s = *sp;
      const size_t n = std::min(
          {s.req.prompt.size() - s.prefilled, size_t(o_.prefill_chunk), size_t(max_rows - rows)});
      StepChunk c;
      c.slot = s.slot;
      c.ids = std::span<const int32_t>(s.req.prompt.data() + s.prefilled, n);
      s.prefilled += n;
      c.want_token = s.prefilled == s.req.prompt.size();
      if (c.want_token) c.draw = s.sampler.next_draw();
      prompt_rows += int64_t(n);
      rows += int64_t(n);
      chunks.push_back(c);
    }
    for (const StepChunk& c : chunks)
      if (c.want_token) wants.push_back(slots[size_t(c.slot)].get());
    const std::vector<int32_t> drawn = runner_.step(chunks);
    STRATA_ASSERT(drawn.size() == wants.size());
    ++stats_.steps;
    stats_.rows += rows;
    stats_.prompt_tokens += prompt_rows;
    for (size_t i = 0; i < wants.size(); ++i) {
      Seq& s = *wants[i];
      const int32_t id = drawn[i];
      s.tokens.push_back(id);
      ++stats_.generated_tokens;
      auto& owner = slots[size_t(s.slot)];
      if (std::find(s.req.eos_ids.begin(), s.req.eos_ids.end(), id) != s.req.eos_ids.end()) {
        finish(owner, "stop");
        continue;
      }
      if (tok_ != nullptr) {
        const size_t before = s.text.size();
        s.text += s.utf8.push(tok_->decode_token(id));
        if (!s.req.stop.empty() && find_stop(s.text, s.req.stop, before) != std::string::npos) {
          finish(owner, "stop");
          continue;
        }
      }
      if (int(s.tokens.size()) >= s.req.max_tokens) {
        finish(owner, "length");
        continue;
      }
      s.feed.assign(1, id);
    }
    stats_.seconds =
        seconds0 + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (on_step) on_step(stats_);
    if (stop.load()) {
      for (auto& sp : slots) sp.reset();
      stats_.in_flight = 0;
      return false;
    }
    admit();
  }
  stats_.seconds =
      seconds0 + std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

}  // namespace strata::engine
