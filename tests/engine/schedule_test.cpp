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
      SeqChunk ca{0, a, true, true};
      std::vector<float> a_pre = sa.step(std::span(&ca, 1))[0];
      ca = SeqChunk{0, std::span(&a_next, 1), true, false};
      std::vector<float> a_dec = sa.step(std::span(&ca, 1))[0];
      alone.reset_slot(0);
      SeqChunk cb{0, b, true, false};
      std::vector<float> b_pre = sa.step(std::span(&cb, 1))[0];
      // Together: b in slot 2 first, a in slot 1, in one step; then both decode in one step.
      CpuRefBackend both(*model, bo, 3);
      Schedule sb(both, model->config());
      std::vector<SeqChunk> chunks = {{2, b, true, false}, {1, a, true, true}};
      auto out = sb.step(chunks);
      CHECK(out[0] == b_pre);
      CHECK(out[1] == a_pre);
      CHECK(both.position(1) == int64_t(a.size()));
      CHECK(both.position(2) == int64_t(b.size()));
      CHECK(both.position(0) == 0);
      chunks = {{1, std::span(&a_next, 1), true, false}, {2, std::span(&b_next, 1), false, false}};
      out = sb.step(chunks);
      CHECK(out[0] == a_dec);
      CHECK(out[1].empty());
      // Prompt split over two steps: the last row's logits are the same as in one step.
      CpuRefBackend split(*model, bo, 1);
      Schedule ss(split, model->config());
      SeqChunk c1{0, std::span(a).first(4), false, false};
      CHECK(ss.step(std::span(&c1, 1))[0].empty());
      SeqChunk c2{0, std::span(a).subspan(4), true, false};
      const std::vector<float> last = ss.step(std::span(&c2, 1))[0];
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
  SeqChunk c{2, ok, true, false};
  CHECK_THROWS_WITH(s.step(std::span(&c, 1)), Catch::Contains("slot 2"));
  std::vector<SeqChunk> two = {{0, ok, true, false}, {1, bad, true, false}};
  CHECK_THROWS_WITH(s.step(two), Catch::Contains("token id 5000 at position 1 of slot 1"));
  CHECK(be.position(0) == 0);  // nothing ran
}
