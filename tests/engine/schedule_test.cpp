// The layer schedule with several sequences per step (engine/schedule.h): on the CPU reference
// backend every row is computed on its own in a fixed order, so a sequence's logits must not
// depend on which other sequences share its step, in which slot it runs, or how its prompt is
// split into steps. Exact equality is the claim (the reference has no batch-dependent kernels).
#include <catch2/catch.hpp>

#include <filesystem>

#include "engine/cpu_backend.h"
#include "engine/model.h"
#include "engine/schedule.h"
#include "engine/session.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
using namespace strata::engine;

namespace {
// Each case synthesizes into its own directory: ctest runs cases as parallel processes.
std::filesystem::path tiny_model(const std::string& name) {
  static std::filesystem::path dir = [&] {
    std::filesystem::path d = test::scratch_dir("schedule_k3_tiny_" + name);
    SynthOptions o;
    o.preset = "k3-tiny";
    o.tokenizer = false;
    synth_checkpoint(o, d);
    return d;
  }();
  return dir;
}
}  // namespace

TEST_CASE("schedule: a sequence's logits do not depend on the sequences sharing its step",
          "[engine][schedule]") {
  auto model = Model::load(tiny_model("steps"));
  const std::vector<int32_t> a = {5, 17, 300, 2, 999, 41, 7};
  const std::vector<int32_t> b = {12, 88, 640};
  const int32_t a_next = 77, b_next = 3;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    for (ExpertNumerics e : {ExpertNumerics::exact, ExpertNumerics::contract}) {
      BackendOptions bo;
      bo.precision = p;
      bo.experts = e;
      // Alone: one sequence per step, prefill then one decode token.
      CpuRefBackend alone(*model, bo, 1);
      Schedule sa(alone, model->config());
      SeqChunk ca{0, a, true, true, nullptr};
      std::vector<float> a_pre = sa.step_logits(std::span(&ca, 1))[0];
      ca = SeqChunk{0, std::span(&a_next, 1), true, false, nullptr};
      std::vector<float> a_dec = sa.step_logits(std::span(&ca, 1))[0];
      alone.reset_slot(0);
      SeqChunk cb{0, b, true, false, nullptr};
      std::vector<float> b_pre = sa.step_logits(std::span(&cb, 1))[0];
      // Together: b in slot 2 first, a in slot 1, in one step; then both decode in one step.
      CpuRefBackend both(*model, bo, 3);
      Schedule sb(both, model->config());
      std::vector<SeqChunk> chunks = {{2, b, true, false, nullptr}, {1, a, true, true, nullptr}};
      auto out = sb.step_logits(chunks);
      CHECK(out[0] == b_pre);
      CHECK(out[1] == a_pre);
      CHECK(both.position(1) == int64_t(a.size()));
      CHECK(both.position(2) == int64_t(b.size()));
      CHECK(both.position(0) == 0);
      chunks = {{1, std::span(&a_next, 1), true, false, nullptr},
                {2, std::span(&b_next, 1), false, false, nullptr}};
      out = sb.step_logits(chunks);
      CHECK(out[0] == a_dec);
      CHECK(out[1].empty());
      // Prompt split over two steps: the last row's logits are the same as in one step.
      CpuRefBackend split(*model, bo, 1);
      Schedule ss(split, model->config());
      SeqChunk c1{0, std::span(a).first(4), false, false, nullptr};
      CHECK(ss.step_logits(std::span(&c1, 1))[0].empty());
      SeqChunk c2{0, std::span(a).subspan(4), true, false, nullptr};
      const std::vector<float> last = ss.step_logits(std::span(&c2, 1))[0];
      const int64_t V = model->config().vocab_size;
      REQUIRE(last.size() == size_t(V));
      // The chunked KDA form and expanded MLA of different lengths differ by fp32 rounding only.
      double m = 0;
      for (int64_t v = 0; v < V; ++v)
        m = std::max(m, double(std::fabs(last[size_t(v)] - a_pre[size_t((a.size() - 1) * V + v)])));
      INFO("max |logit diff| split vs whole prompt " << m);
      CHECK(m < (p == Precision::fp32 ? 1e-3 : 0.25));
    }
  }
}

TEST_CASE("schedule: bad slots and token ids are refused with a clear error",
          "[engine][schedule]") {
  auto model = Model::load(tiny_model("refusals"));
  CpuRefBackend be(*model, BackendOptions{}, 2);
  Schedule s(be, model->config());
  const std::vector<int32_t> ok = {1, 2}, bad = {1, 5000};
  SeqChunk c{2, ok, true, false, nullptr};
  CHECK_THROWS_WITH(s.step_logits(std::span(&c, 1)), Catch::Contains("slot 2"));
  std::vector<SeqChunk> two = {{0, ok, true, false, nullptr}, {1, bad, true, false, nullptr}};
  CHECK_THROWS_WITH(s.step_logits(two), Catch::Contains("token id 5000 at position 1 of slot 1"));
  CHECK(be.position(0) == 0);  // nothing ran
}

TEST_CASE("schedule: drawn tokens come from their own chunk's last row, beside chunks' logits",
          "[engine][schedule]") {
  auto model = Model::load(tiny_model("draws"));
  const std::vector<int32_t> a = {5, 17, 300, 2}, b = {12, 88, 640, 9, 4}, c = {7, 70};
  const BackendOptions bo;
  // Reference: every chunk's logits (all rows), then the host draws.
  CpuRefBackend ref(*model, bo, 3);
  Schedule sr(ref, model->config());
  std::vector<SeqChunk> all = {
      {0, a, true, true, nullptr}, {1, b, true, true, nullptr}, {2, c, true, true, nullptr}};
  const std::vector<std::vector<float>> l = sr.step_logits(all);
  const int64_t V = model->config().vocab_size;
  // The same step with b and c drawn (greedy, and a temperature draw whose u lands past the
  // first candidate), a's logits returned.
  CpuRefBackend be(*model, bo, 3);
  Schedule s(be, model->config());
  TokenDraw greedy, hot;
  hot.temperature = 1.5f;
  hot.u = 0.93;
  std::vector<SeqChunk> mixed = {
      {0, a, true, false, nullptr}, {1, b, true, false, &greedy}, {2, c, true, true, &hot}};
  const StepOutput& o = s.step(mixed);
  REQUIRE(o.logits.size() == 3);
  REQUIRE(o.tokens.size() == 3);
  CHECK(o.tokens[0] == -1);
  CHECK(o.logits[1].empty());
  CHECK(o.logits[2].empty());  // a draw returns no logits, all_logits or not
  const std::vector<float> a_last(l[0].end() - V, l[0].end());
  CHECK(std::vector<float>(o.logits[0].begin(), o.logits[0].end()) == a_last);
  std::vector<std::pair<float, int>> scratch;
  const std::vector<float> b_last(l[1].end() - V, l[1].end()), c_last(l[2].end() - V, l[2].end());
  CHECK(o.tokens[1] == argmax(b_last));
  CHECK(o.tokens[2] == pick_token(c_last, hot, scratch));
  CHECK(o.tokens[2] != argmax(c_last));  // the draw is not the greedy one
  CHECK(be.position(2) == int64_t(c.size()));
}
