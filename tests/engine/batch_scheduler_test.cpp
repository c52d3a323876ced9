// Continuous batching (engine/batch_scheduler.h) against a scripted step runner: steps respect
// the row budget and the prefill chunk, decode rows come first, a finished sequence's slot is
// refilled for the very next step, memory reservations bound what is in flight, a stop request ends
// the run after the current step, and stop rules (EOS, stop strings, max_tokens) end sequences.
// Then on the CPU reference: the memory formula equals the backend's state bytes, and a batch
// of several sequences gives every request the tokens it gets alone.
#include <catch2/catch.hpp>

#include <map>

#include "engine/batch_scheduler.h"
#include "engine/cpu_backend.h"
#include "engine/model.h"
#include "storage/synth.h"
#include "test_backend_options.h"
#include "test_util.h"

using namespace strata;
using namespace strata::engine;

namespace {

// A runner whose next token is a function of the slot's history: logits peak at
// (sum of the slot's ids + number of ids) % V, so results depend on exactly what was fed.
class ScriptedRunner final : public StepRunner {
 public:
  ScriptedRunner(int slots, int64_t max_rows, int V = 16)
      : hist_(size_t(slots)), max_rows_(max_rows), V_(V) {}
  int slots() const override { return int(hist_.size()); }
  void reset(int slot) override {
    hist_[size_t(slot)].clear();
    resets.push_back(slot);
  }
  int64_t max_step_rows() const override { return max_rows_; }
  std::vector<int32_t> step(std::span<const StepChunk> chunks) override {
    steps.emplace_back(chunks.begin(), chunks.end());
    std::vector<int32_t> out;
    int64_t rows = 0;
    for (const StepChunk& c : chunks) {
      auto& h = hist_[size_t(c.slot)];
      h.insert(h.end(), c.ids.begin(), c.ids.end());
      rows += int64_t(c.ids.size());
      if (c.want_token) {
        int64_t s = int64_t(h.size());
        for (int32_t id : h) s += id;
        std::vector<float> l(size_t(V_), 0.0f);
        l[size_t(s % V_)] = 1.0f;
        out.push_back(pick_token(l, c.draw, scratch_));
      }
    }
    step_rows.push_back(rows);
    return out;
  }
  std::string describe() const override { return "scripted"; }

  std::vector<std::vector<StepChunk>> steps;
  std::vector<int64_t> step_rows;
  std::vector<int> resets;

 private:
  std::vector<std::vector<int32_t>> hist_;
  std::vector<std::pair<float, int>> scratch_;
  int64_t max_rows_;
  int V_;
};

GenRequest req(int64_t key, int prompt_len, int max_tokens, uint64_t reserve = 0) {
  GenRequest r;
  r.key = key;
  for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(int32_t((key * 7 + i) % 13 + 1));
  r.max_tokens = max_tokens;
  r.reserve_bytes = reserve;
  return r;
}

struct RunResult {
  std::map<int64_t, GenResult> results;
  std::vector<int64_t> order;
  bool complete = false;
};

RunResult run_all(StepRunner& runner, std::vector<GenRequest> reqs, SchedulerOptions o,
                  const std::function<bool(int64_t)>& stop_after_step = nullptr) {
  BatchScheduler s(runner, nullptr, o);
  size_t next = 0;
  RunResult rr;
  std::atomic<bool> stop{false};
  rr.complete = s.run(
      [&]() -> std::optional<GenRequest> {
        if (next == reqs.size()) return std::nullopt;
        return reqs[next++];
      },
      [&](GenResult&& g) {
        rr.order.push_back(g.key);
        rr.results[g.key] = std::move(g);
      },
      stop,
      [&](const SchedulerStats& st) {
        if (stop_after_step && stop_after_step(st.steps)) stop.store(true);
      });
  return rr;
}

}  // namespace

TEST_CASE("batch scheduler: row budget, prefill chunks, decode first, refill at once",
          "[engine][batch]") {
  ScriptedRunner r(2, 6);
  SchedulerOptions o;
  o.prefill_chunk = 4;
  // Request 0: short prompt, 2 tokens; 1: long prompt; 2: waits for a free slot.
  const RunResult rr = run_all(r, {req(0, 3, 2), req(1, 10, 3), req(2, 5, 2)}, o);
  REQUIRE(rr.complete);
  REQUIRE(rr.results.size() == 3);
  for (const auto& [k, g] : rr.results) CHECK(g.finish_reason == "length");
  CHECK(rr.results.at(0).tokens.size() == 2);
  CHECK(rr.results.at(1).tokens.size() == 3);
  for (size_t i = 0; i < r.steps.size(); ++i) {
    CHECK(r.step_rows[i] <= 6);
    for (const StepChunk& c : r.steps[i]) CHECK(c.ids.size() <= 4);
  }
  // Step 1: prefill 0 (3 rows) + the first 3 rows of 1 (budget 6).
  REQUIRE(r.steps.size() >= 3);
  CHECK(r.steps[0].size() == 2);
  CHECK(r.steps[0][0].ids.size() == 3);
  CHECK(r.steps[0][1].ids.size() == 3);
  // Step 2: request 0's decode row first, then 4 more prompt rows of request 1.
  REQUIRE(r.steps[1].size() == 2);
  CHECK(r.steps[1][0].slot == 0);
  CHECK(r.steps[1][0].ids.size() == 1);
  CHECK(r.steps[1][1].slot == 1);
  CHECK(r.steps[1][1].ids.size() == 4);
  // Request 0 ends after its second token (step 2); request 2 is admitted into its slot (0) and
  // prefills in step 3.
  CHECK(rr.order.front() == 0);
  bool req2_in_step3 = false;
  for (const StepChunk& c : r.steps[2])
    if (c.slot == 0 && c.ids.size() == 4) req2_in_step3 = true;
  CHECK(req2_in_step3);
  CHECK(r.resets == std::vector<int>{0, 1, 0});
}

TEST_CASE("batch scheduler: results do not depend on slots or budget", "[engine][batch]") {
  std::vector<GenRequest> reqs;
  for (int k = 0; k < 7; ++k) reqs.push_back(req(k, 1 + (k * 5) % 11, 1 + k % 4));
  SchedulerOptions o;
  o.prefill_chunk = 3;
  ScriptedRunner one(1, 1000);
  const RunResult a = run_all(one, reqs, o);
  ScriptedRunner four(4, 5);
  const RunResult b = run_all(four, reqs, o);
  REQUIRE(a.results.size() == 7);
  REQUIRE(b.results.size() == 7);
  for (int k = 0; k < 7; ++k) CHECK(a.results.at(k).tokens == b.results.at(k).tokens);
}

TEST_CASE("batch scheduler: memory reservations bound what is in flight", "[engine][batch]") {
  SchedulerOptions o;
  o.mem_limit_bytes = 100;
  auto max_in_flight = [&](std::vector<uint64_t> reserve) {
    ScriptedRunner r(3, 100);
    BatchScheduler s(r, nullptr, o);
    size_t next = 0;
    std::atomic<bool> stop{false};
    REQUIRE(s.run(
        [&]() -> std::optional<GenRequest> {
          if (next == reserve.size()) return std::nullopt;
          ++next;
          return req(int64_t(next), 2, 3, reserve[next - 1]);
        },
        [&](GenResult&&) {}, stop));
    CHECK(s.stats().finished == int64_t(reserve.size()));
    return s.stats().max_in_flight;
  };
  CHECK(max_in_flight({60, 60, 60}) == 1);  // 60 + 60 > 100: each waits for the one before
  CHECK(max_in_flight({60, 30, 30}) == 2);  // 60 + 30 fits, the third waits
  CHECK(max_in_flight({30, 30, 30}) == 3);
  CHECK(max_in_flight({200}) == 1);  // alone it runs (the caller refuses what can never fit)
}

TEST_CASE("batch scheduler: a stop request ends the run after the current step",
          "[engine][batch]") {
  ScriptedRunner r(2, 100);
  std::vector<GenRequest> reqs;
  for (int k = 0; k < 5; ++k) reqs.push_back(req(k, 3, 4));
  const RunResult rr =
      run_all(r, reqs, SchedulerOptions{}, [](int64_t steps) { return steps == 5; });
  CHECK_FALSE(rr.complete);
  CHECK(r.steps.size() == 5);
  CHECK(rr.results.size() == 2);  // the first two (4 tokens each: steps 1-4)
}

TEST_CASE("batch scheduler: EOS and stop strings end a sequence", "[engine][batch]") {
  ScriptedRunner r(1, 100);
  GenRequest a = req(0, 3, 50);
  // The scripted tokens of request 0 alone, then the same request ending at its third token.
  const RunResult free_run = run_all(r, {a}, SchedulerOptions{});
  const std::vector<int32_t> toks = free_run.results.at(0).tokens;
  REQUIRE(toks.size() == 50);
  a.eos_ids = {toks[2]};
  ScriptedRunner r2(1, 100);
  const RunResult eos = run_all(r2, {a}, SchedulerOptions{});
  const size_t first = size_t(std::find(toks.begin(), toks.end(), toks[2]) - toks.begin());
  CHECK(eos.results.at(0).tokens.size() == first + 1);  // the EOS itself is sampled
  CHECK(eos.results.at(0).finish_reason == "stop");
}

namespace {
std::filesystem::path tiny_model() {
  static std::filesystem::path dir = [] {
    std::filesystem::path d = test::scratch_dir("batch_scheduler_k3_tiny");
    SynthOptions o;
    o.preset = "k3-tiny";
    synth_checkpoint(o, d);
    return d;
  }();
  return dir;
}
}  // namespace

TEST_CASE("sequence memory: the formula's state and cache equal the CPU reference's",
          "[engine][batch]") {
  auto model = Model::load(tiny_model());
  const ModelConfig& c = model->config();
  CpuRefBackend b(*model, BackendOptions{}, 1);
  CHECK(b.state_bytes(0) == fixed_state_bytes(c));
  auto runner = make_schedule_runner(b, c);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7};
  StepChunk ch{0, ids, true, {}};
  runner->step(std::span(&ch, 1));
  CHECK(b.state_bytes(0) == fixed_state_bytes(c) + 7 * cache_bytes_per_token(c));
  const SequenceMemory m = sequence_memory(c, 7, 4);
  CHECK(m.state_bytes + m.cache_bytes == b.state_bytes(0));
  CHECK(m.work_bytes > 0);
  // Longer contexts need more; the working set grows with the context (expanded MLA).
  CHECK(sequence_memory(c, 1 << 20, 2048).total() > sequence_memory(c, 4096, 2048).total());
}

TEST_CASE(
    "batch scheduler on the CPU reference: a request's tokens are the same alone and in a "
    "batch",
    "[engine][batch]") {
  auto model = Model::load(tiny_model());
  const ModelConfig& c = model->config();
  std::vector<GenRequest> reqs;
  for (int k = 0; k < 6; ++k) {
    GenRequest g;
    g.key = k;
    for (int i = 0; i < 3 + 4 * k; ++i) g.prompt.push_back(int32_t((k * 131 + i * 17) % 900 + 5));
    g.max_tokens = 4 + k % 3;
    g.sampler.temperature = k % 2 ? 0.8f : 0.0f;  // sampled ones too: seeded per request
    g.sampler.seed = uint64_t(k + 1);
    reqs.push_back(g);
  }
  SchedulerOptions o;
  o.prefill_chunk = 5;
  const BackendOptions bo = test::bf16_contract();
  CpuRefBackend alone(*model, bo, 1);
  auto r1 = make_schedule_runner(alone, c);
  const RunResult a = run_all(*r1, reqs, o);
  CpuRefBackend batch(*model, bo, 4);
  auto r4 = make_schedule_runner(batch, c);
  const RunResult b = run_all(*r4, reqs, o);
  REQUIRE(a.results.size() == 6);
  REQUIRE(b.results.size() == 6);
  int differ = 0;
  for (int k = 0; k < 6; ++k) differ += a.results.at(k).tokens != b.results.at(k).tokens;
  CHECK(differ == 0);
}
