// The contract-mode expert executor on the fast layer-level CPU kernels (engine/contract_executor,
// cpu/expert_kernels.h) against the scalar contract: the logits of a short prompt (prefill, then
// decode) with every routed expert computed by one strata::cpu::expert_ffn_contract call per
// (token, expert) pair must be bit-identical (memcmp) to those of the fast executor, for every
// kernel ISA this CPU runs (the others are WARN-skipped), in fp32 and bf16 precision. Models: the
// golden k3-tiny (../shared/golden, skipped with a message when absent), a synthetic k3-tiny, and
// a synthetic kimi-linear-tiny whose bf16 experts were quantized at load (--experts-quantize).
#include <catch2/catch.hpp>
#include <cstring>

#include "cpu/expert_contract.h"
#include "cpu/expert_kernels.h"
#include "engine/session.h"
#include "storage/config.h"
#include "storage/error.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
using namespace strata::engine;

namespace {

// The reference: every (token, expert) pair through the scalar expert_ffn_contract, serially.
class ScalarContractExecutor final : public ExpertExecutor {
 public:
  explicit ScalarContractExecutor(int* calls) : calls_(calls) {}
  const char* name() const override { return "scalar-contract-reference"; }
  void run(const ExpertLayer& layer, std::span<const ExpertTask> tasks, const float* x, float* y,
           Precision p) override {
    ++*calls_;
    strata::GluParams glu;
    glu.situ = layer.glu.kind == cpu::ref::GluKind::situ;
    glu.beta1 = layer.glu.beta1;
    glu.beta2 = layer.glu.beta2;
    const int64_t D = layer.in_dim;
    for (const ExpertTask& task : tasks) {
      const ExpertWeights& w = layer.weights->experts[size_t(task.expert)];
      strata::Mxfp4ExpertView v;
      v.w1_packed = static_cast<const uint8_t*>(w.w1.data);
      v.w1_scale = w.w1.scale;
      v.w3_packed = static_cast<const uint8_t*>(w.w3.data);
      v.w3_scale = w.w3.scale;
      v.w2_packed = static_cast<const uint8_t*>(w.w2.data);
      v.w2_scale = w.w2.scale;
      v.hidden = int(D);
      v.inter = int(layer.intermediate);
      for (size_t r = 0; r < task.tokens.size(); ++r) {
        float* out = y + int64_t(task.slots[r]) * D;
        cpu::expert_ffn_contract(v, x + int64_t(task.tokens[r]) * D, out, glu);
        cpu::ref::round_if(p, out, D);
      }
    }
  }

 private:
  int* calls_;
};

// Calls warm() before every run(), as the GPU engine does before a decode layer's routing wait.
class WarmingExecutor final : public ExpertExecutor {
 public:
  explicit WarmingExecutor(std::unique_ptr<ExpertExecutor> inner) : inner_(std::move(inner)) {}
  const char* name() const override { return inner_->name(); }
  void run(const ExpertLayer& layer, std::span<const ExpertTask> tasks, const float* x, float* y,
           Precision p) override {
    inner_->warm();
    inner_->warm();  // twice: the first generation's spinners must not outlive this run
    inner_->run(layer, tasks, x, y, p);
  }

 private:
  std::unique_ptr<ExpertExecutor> inner_;
};

// Prefill 6 tokens (all logits), then decode 2 (last-row logits).
std::vector<float> logits(const Model& m, const SessionOptions& so) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 8; i++) ids.push_back(int32_t((i * 53 + 7) % V));
  Session s(m, so);
  auto out = s.forward(std::span<const int32_t>(ids.data(), 6), true);
  for (size_t i = 6; i < ids.size(); i++) {
    auto row = s.forward(std::span<const int32_t>(&ids[i], 1), false);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

void check_fast_equals_scalar(const Model& model) {
  const ModelConfig& c = model.config();
  REQUIRE(c.moe.mxfp4);
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    SessionOptions base;
    base.precision = p;
    base.experts = ExpertNumerics::contract;
    int ref_calls = 0;
    SessionOptions ref = base;
    ref.wrap_executor = [&](std::unique_ptr<ExpertExecutor>) -> std::unique_ptr<ExpertExecutor> {
      return std::make_unique<ScalarContractExecutor>(&ref_calls);
    };
    const std::vector<float> want = logits(model, ref);
    REQUIRE(ref_calls > 0);  // the reference really computed the experts
    REQUIRE_FALSE(want.empty());

    // The engine's default contract executor (automatic ISA).
    {
      INFO("precision " << (p == Precision::fp32 ? "fp32" : "bf16") << ", default executor");
      const std::vector<float> got = logits(model, base);
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
    }
    // Pinned workers and workers kept warm between calls: the same bits.
    for (auto [pin, warm] :
         {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
      const bool pinned = pin, warmed = warm;  // lambdas capture no structured bindings (clang 14)
      INFO("precision " << (p == Precision::fp32 ? "fp32" : "bf16") << ", pinned " << pin
                        << ", kept warm " << warm);
      SessionOptions so = base;
      so.wrap_executor = [&](std::unique_ptr<ExpertExecutor>) -> std::unique_ptr<ExpertExecutor> {
        return std::make_unique<WarmingExecutor>(
            make_contract_executor(c, cpu::ExpertIsa::automatic, pinned, warmed));
      };
      const std::vector<float> got = logits(model, so);
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
    }
    for (cpu::ExpertIsa isa : {cpu::ExpertIsa::scalar, cpu::ExpertIsa::avx2, cpu::ExpertIsa::avx512,
                               cpu::ExpertIsa::amx}) {
      if (!cpu::isa_supported(isa)) {
        WARN("skipped ISA " << cpu::isa_name(isa) << ": not supported by this CPU");
        CHECK_THROWS_AS(make_contract_executor(c, isa), Error);  // no silent fallback
        continue;
      }
      INFO("precision " << (p == Precision::fp32 ? "fp32" : "bf16") << ", ISA "
                        << cpu::isa_name(isa));
      SessionOptions so = base;
      int fast_calls = 0;
      so.wrap_executor = [&](std::unique_ptr<ExpertExecutor>) -> std::unique_ptr<ExpertExecutor> {
        ++fast_calls;
        return make_contract_executor(c, isa);
      };
      const std::vector<float> got = logits(model, so);
      REQUIRE(fast_calls == 1);
      REQUIRE(got.size() == want.size());
      CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
    }
  }
}

}  // namespace

TEST_CASE("contract fast: golden k3-tiny logits equal the scalar contract, every ISA",
          "[engine][contract]") {
  const auto dir = test::golden_dir() / "k3-tiny";
  test::need_shared(dir / "config.json");
  auto model = Model::load(dir);
  check_fast_equals_scalar(*model);
}

TEST_CASE("contract fast: synthetic k3-tiny logits equal the scalar contract, every ISA",
          "[engine][contract]") {
  const auto dir = test::scratch_dir("contract_fast") / "k3-tiny";
  SynthOptions o;
  o.preset = "k3-tiny";
  o.seed = 11;
  o.threads = 2;
  synth_checkpoint(o, dir);
  auto model = Model::load(dir);
  check_fast_equals_scalar(*model);
}

TEST_CASE("contract fast: kimi-linear-tiny quantized at load equals the scalar contract, every ISA",
          "[engine][contract][quantize]") {
  const auto dir = test::scratch_dir("contract_fast") / "kimi-linear-tiny";
  SynthOptions o;
  o.preset = "kimi-linear-tiny";
  o.seed = 12;
  o.threads = 2;
  o.tokenizer = false;
  synth_checkpoint(o, dir);
  LoadOptions lo;
  lo.quantize_experts = true;
  auto model = Model::load(dir, lo);
  REQUIRE(model->experts_quantized());
  check_fast_equals_scalar(*model);
}

TEST_CASE("contract fast: an executor kept warm goes away safely with its workers still spinning",
          "[engine][contract]") {
  SynthOptions o;
  o.preset = "k3-tiny";
  const ModelConfig c = parse_config(synth_config_json(o), "k3-tiny");
  for (bool pin : {false, true}) {
    auto ex = make_contract_executor(c, cpu::ExpertIsa::automatic, pin, true);
    ex->warm();
    ex->warm();
    // Waits for the spinners it released; a spinner reading the freed object is what the
    // sanitizer build (scripts/ci-sanitize.sh) would report.
    REQUIRE_NOTHROW(ex.reset());
  }
}
