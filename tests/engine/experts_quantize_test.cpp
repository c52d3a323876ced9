// --experts-quantize mxfp4 (LoadOptions::quantize_experts) on the synthetic kimi-linear-tiny (bf16
// routed experts): the experts become MXFP4 by storage/mxfp4.h's OCP rule and the model then is an
// MXFP4 model (contract numerics on the fast CPU backend and the CPU reference); its logits stay
// close to the bf16-expert model's (the bound below is MXFP4's quantization error, measured); and
// the refusals (experts already MXFP4, widths not a multiple of 32, --host-mem) are one line each.
// The contract executor on the quantized experts against the scalar contract is in
// contract_fast_test.cpp; the GPU side in experts_quantize_gpu.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/cpu_backend.h"
#include "engine/cpu_fast_backend.h"
#include "engine/model.h"
#include "engine/session.h"
#include "storage/checkpoint.h"
#include "storage/error.h"
#include "storage/mxfp4.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
using namespace strata::engine;
namespace fs = std::filesystem;

namespace {

fs::path kimi_tiny(const std::string& test_case) {
  fs::path d = test::scratch_dir("experts_quantize_" + test_case);
  SynthOptions o;
  o.preset = "kimi-linear-tiny";
  o.seed = 5;
  o.tokenizer = false;
  synth_checkpoint(o, d);
  return d;
}

LoadOptions quantized() {
  LoadOptions lo;
  lo.quantize_experts = true;
  return lo;
}

// Prefill 6 tokens (all logits), then decode 2 (last-row logits), on `backend`.
std::vector<float> logits(const Model& m, Backend& backend, const SessionOptions& so) {
  const int64_t V = m.config().vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 8; i++) ids.push_back(int32_t((i * 131 + 17) % V));
  Session s(m, backend, 0, so);
  auto out = s.forward(std::span<const int32_t>(ids.data(), 6), true);
  for (size_t i = 6; i < ids.size(); i++) {
    auto row = s.forward(std::span<const int32_t>(&ids[i], 1), false);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

SessionOptions options(ExpertNumerics n) {
  SessionOptions so;
  so.precision = Precision::bf16;
  so.experts = n;
  return so;
}

}  // namespace

TEST_CASE("experts quantize: bf16 routed experts become MXFP4 by the OCP rule",
          "[engine][quantize]") {
  const fs::path dir = kimi_tiny("rule");
  auto plain = Model::load(dir);
  auto q = Model::load(dir, quantized());
  const ModelConfig& c = q->config();
  REQUIRE_FALSE(plain->config().moe.mxfp4);
  REQUIRE(c.moe.mxfp4);
  REQUIRE(q->experts_quantized());
  REQUIRE_FALSE(plain->experts_quantized());
  const int64_t I = c.moe.intermediate_size, D = c.expert_in_dim(), E = c.moe.num_experts;
  CHECK(q->quantized_expert_bytes() == uint64_t(c.num_moe_layers() * E * 3 * I * D * 17 / 32));
  int checked = 0;
  for (size_t l = 0; l < q->weights().layers.size(); ++l) {
    const auto& Lq = q->weights().layers[l];
    const auto& Lp = plain->weights().layers[l];
    if (!Lq.moe) continue;
    for (int64_t e = 0; e < E; ++e) {
      const ExpertWeights& xq = Lq.moe->experts[size_t(e)];
      const ExpertWeights& xp = Lp.moe->experts[size_t(e)];
      const std::pair<const WeightView*, const WeightView*> projs[] = {
          {&xq.w1, &xp.w1}, {&xq.w3, &xp.w3}, {&xq.w2, &xp.w2}};
      for (auto [wq, wp] : projs) {
        REQUIRE(wq->format == cpu::ref::WeightFormat::mxfp4);
        REQUIRE(wp->format == cpu::ref::WeightFormat::bf16);
        REQUIRE(wq->rows == wp->rows);
        REQUIRE(wq->cols == wp->cols);
        // The whole matrix widened and quantized by storage/mxfp4.h, byte for byte.
        const int64_t R = wp->rows, C = wp->cols;
        std::vector<float> f(size_t(R * C));
        for (int64_t r = 0; r < R; ++r) wp->widen_row(r, f.data() + r * C);
        std::vector<uint8_t> packed(size_t(R * C / 2)), scale(size_t(R * C / 32));
        mxfp4::quantize(f.data(), R, C, packed.data(), scale.data());
        CHECK(std::memcmp(wq->data, packed.data(), packed.size()) == 0);
        CHECK(std::memcmp(wq->scale, scale.data(), scale.size()) == 0);
        ++checked;
      }
    }
    // The dense weights are the checkpoint's, untouched.
    CHECK(Lq.input_norm == Lp.input_norm);
    CHECK(Lq.moe->router.format == cpu::ref::WeightFormat::bf16);
  }
  CHECK(checked == 3 * c.num_moe_layers() * E);
}

// Tolerance. The quantized model is another model: MXFP4 keeps 3 bits per weight plus a shared
// power-of-two scale per 32 (a weight moves by up to a quarter of its block's top binade), so its
// logits differ from the bf16-expert model's by the quantization error, not by rounding noise.
// Routing is replayed from the bf16 run (a near-tie between two experts flips on any change and
// turns a small difference into an O(1) one in this random model, DESIGN "Comparing numerics
// paths"). Measured on this checkpoint (seed 5, 6 prompt + 2 decode positions; printed): relative
// RMS 0.226 (cpu-ref) and 0.227 (cpu) against the bf16-expert model, next to the bf16 model's own
// rounding noise (bf16 against fp32, exact experts) 0.016 — a per-weight MXFP4 error of ~15-20%
// carried through gate|up and down. Between numerics paths on the same MXFP4 experts the
// difference is rounding noise again: contract vs fp32-dequant (exact) 0.027, cpu vs cpu-ref
// 0.020. Bounds: 2x the measured values (0.45; 0.06); a wrong layout (a transposed or shifted
// expert) gives O(1), the byte-exact check above catches smaller slips.
TEST_CASE("experts quantize: kimi-linear-tiny runs contract on cpu and cpu-ref, near bf16 experts",
          "[engine][quantize]") {
  const fs::path dir = kimi_tiny("logits");
  auto plain = Model::load(dir);
  auto q = Model::load(dir, quantized());
  RoutingLog routing;
  SessionOptions rec = options(ExpertNumerics::exact);
  rec.record_routing = &routing;
  CpuRefBackend ref_bf16(*plain, rec.backend(), 1);
  const std::vector<float> want = logits(*plain, ref_bf16, rec);
  auto replayed = [&](ExpertNumerics n, Precision p = Precision::bf16) {
    SessionOptions so = options(n);
    so.precision = p;
    so.replay_routing = &routing;
    return so;
  };
  SessionOptions fp32 = replayed(ExpertNumerics::exact, Precision::fp32);
  CpuRefBackend ref_fp32(*plain, fp32.backend(), 1);
  const std::vector<float> noise = logits(*plain, ref_fp32, fp32);

  // Without quantization the contract is refused (bf16 experts are outside it).
  CHECK_THROWS_WITH(make_cpu_backend(*plain, options(ExpertNumerics::contract).backend(), 1),
                    Catch::Contains("bf16 experts"));

  const SessionOptions contract = replayed(ExpertNumerics::contract);
  CpuRefBackend ref_q(*q, contract.backend(), 1);
  const std::vector<float> got_ref = logits(*q, ref_q, contract);
  auto fast = make_cpu_backend(*q, contract.backend(), 1);
  const std::vector<float> got_fast = logits(*q, *fast, contract);
  const SessionOptions exact = replayed(ExpertNumerics::exact);
  CpuRefBackend exact_q(*q, exact.backend(), 1);
  const std::vector<float> got_exact = logits(*q, exact_q, exact);
  REQUIRE(got_ref.size() == want.size());
  REQUIRE(got_fast.size() == want.size());
  REQUIRE(got_exact.size() == want.size());
  for (float v : got_fast) REQUIRE(std::isfinite(v));
  const double e_noise = test::rel_l2(noise, want), e_ref = test::rel_l2(got_ref, want),
               e_fast = test::rel_l2(got_fast, want), e_contract = test::rel_l2(got_ref, got_exact),
               e_backends = test::rel_l2(got_fast, got_ref);
  std::printf(
      "[experts quantize] logits rel RMS against the bf16-expert model (routing replayed): "
      "cpu-ref contract %.3e, cpu contract %.3e (bf16 vs fp32 noise %.3e); on the MXFP4 experts: "
      "contract vs exact %.3e, cpu vs cpu-ref %.3e\n",
      e_ref, e_fast, e_noise, e_contract, e_backends);
  CHECK(e_ref < 0.45);
  CHECK(e_fast < 0.45);
  CHECK(e_ref > e_noise);  // really another model: the experts were quantized
  CHECK(e_contract < 0.06);
  CHECK(e_backends < 0.06);
}

TEST_CASE("experts quantize: refused for MXFP4 experts and widths not a multiple of 32",
          "[engine][quantize]") {
  {
    const fs::path d = test::scratch_dir("experts_quantize_mxfp4");
    SynthOptions o;
    o.preset = "k3-tiny";
    o.tokenizer = false;
    synth_checkpoint(o, d);
    CHECK_THROWS_WITH(Model::load(d, quantized()),
                      Catch::Contains("--experts-quantize mxfp4") &&
                          Catch::Contains("the routed experts are already MXFP4"));
  }
  {
    // kimi-linear-tiny with 80-wide experts (bf16 takes any width; MXFP4 blocks are 32).
    const fs::path d = test::scratch_dir("experts_quantize_width");
    SynthOptions base;
    base.preset = "kimi-linear-tiny";
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(synth_config_json(base));
    j["moe_intermediate_size"] = 80;
    const fs::path cfg = test::scratch_dir("experts_quantize_width_cfg") / "config.json";
    std::ofstream(cfg) << j.dump();
    SynthOptions o;
    o.config_path = cfg;
    o.tokenizer = false;
    synth_checkpoint(o, d);
    CHECK_NOTHROW(Model::load(d));
    CHECK_THROWS_WITH(Model::load(d, quantized()),
                      Catch::Contains("expert widths 256 and 80 must be multiples of 32"));
  }
}

TEST_CASE("experts quantize: a NaN weight in an unscanned expert is named, not encoded",
          "[engine][quantize]") {
  const fs::path d = kimi_tiny("nan");
  std::string name;
  uint64_t at = 0;
  fs::path shard;
  {
    Checkpoint ck(d);
    const TensorInfo& t = *ck.expert(1, 3).w3.weight;
    name = t.name;
    at = t.offset + 2 * (5 * uint64_t(t.shape[1]) + 7);  // row 5, column 7
    shard = ck.file_path(t.file);
  }
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(at));
    const char nan_bf16[2] = {char(0xC0), char(0x7F)};  // 0x7FC0, little endian
    f.write(nan_bf16, 2);
  }
  LoadOptions lo = quantized();
  lo.small_tensor_bytes = 0;  // the loader's scan would name it first
  CHECK_THROWS_WITH(Model::load(d, lo), Catch::Contains("tensor " + name + ", row 5") &&
                                            Catch::Contains("at column 7 is not finite") &&
                                            Catch::Contains("--experts-quantize mxfp4"));
}

TEST_CASE("strata logits --experts-quantize: start-up line, bad values and --host-mem refused",
          "[engine][quantize][cli]") {
  const fs::path dir = kimi_tiny("cli");
  const fs::path scratch = test::scratch_dir("experts_quantize_cli_out");
  const fs::path ids = scratch / "ids.json";
  std::ofstream(ids) << "[3, 1, 4, 1, 5]";
  const std::string base = "logits -m " + dir.string() + " --ids " + ids.string() +
                           " --threads 2 --device cpu -o " + (scratch / "l.st").string();
  auto ok = test::run_cli(base + " --experts-quantize mxfp4");
  INFO(ok.out);
  CHECK(ok.status == 0);
  CHECK(ok.out.find("112 bf16 routed experts quantized to MXFP4 at load") != std::string::npos);
  CHECK(ok.out.find("experts contract") != std::string::npos);  // the MXFP4 default numerics
  auto bad = test::run_cli(base + " --experts-quantize fp8");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("--experts-quantize: expected mxfp4, got 'fp8'") != std::string::npos);
  auto disk = test::run_cli(base + " --experts-quantize mxfp4 --host-mem 30%");
  CHECK(disk.status == 1);
  CHECK(disk.out.find("--host-mem with --experts-quantize") != std::string::npos);
}
