// strata synth (library level): presets produce checkpoints the loader accepts with every tensor
// claimed, experts contiguous, deterministic per seed, weights at the documented scales, routers
// decisive; overrides and bad inputs.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>

#include "storage/bf16.h"
#include "storage/checkpoint.h"
#include "storage/error.h"
#include "storage/mxfp4.h"
#include "storage/synth.h"
#include "storage/tiktoken_files.h"
#include "test_util.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

fs::path synth(const std::string& scratch, SynthOptions opt) {
  const fs::path dir = test::scratch_dir(scratch) / "model";
  synth_checkpoint(opt, dir);
  return dir;
}

SynthOptions preset(const std::string& p, uint64_t seed = 1) {
  SynthOptions o;
  o.preset = p;
  o.seed = seed;
  o.threads = 2;
  return o;
}

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return std::sqrt(s / double(v.size()));
}

}  // namespace

TEST_CASE("synth k3-tiny: golden dims, sharded index, all tensors claimed, experts contiguous",
          "[synth]") {
  const fs::path dir = synth("synth_k3tiny", preset("k3-tiny"));
  Checkpoint ck(dir);  // validates shapes and every expert scale
  const ModelConfig& c = ck.config();
  CHECK(c.wrapped);
  CHECK(c.moe.mxfp4);
  CHECK(c.num_layers == 9);
  CHECK(c.is_mla(3));
  CHECK(c.is_mla(7));
  CHECK(c.is_mla(8));
  CHECK(c.num_kda_layers() == 6);
  CHECK(ck.num_files() == 4);  // 13.8 MB in shards of 4 MiB
  for (int i = 0; i < ck.num_files(); ++i)
    CHECK(ck.file(i).file_size() - ck.file(i).data_start() <= (4u << 20));  // data bytes
  ck.claim_all_specs();
  CHECK_NOTHROW(ck.check_all_claimed());
  CHECK(ck.num_tensors() == 1002);
  for (int l = 1; l < 9; ++l)
    for (int e = 0; e < 16; ++e) CHECK(ck.expert(l, e).spans.size() == 1);
  // Stand-in tokenizer: loads, and the config's special ids are inside the vocabulary.
  const TokenizerFiles tf = load_tokenizer_files(dir);
  CHECK(tf.vocab_size() == c.vocab_size);
  CHECK(c.bos_token_id == tf.bos_id);
  CHECK(c.pad_token_id == tf.pad_id);
  CHECK(c.eos_token_id >= tf.num_mergeable);
  CHECK(c.eos_token_id < c.vocab_size);
}

TEST_CASE("synth k3-tiny has the golden k3-tiny's layer kinds, tensor names and shapes",
          "[synth][golden]") {
  // Only the token ids differ (the stand-in tokenizer's), so the config's tensors must match.
  const fs::path golden = test::golden_dir() / "k3-tiny" / "config.json";
  test::need_shared(golden);
  const fs::path dir = test::scratch_dir("synth_k3tiny_golden");
  std::ofstream(dir / "config.json") << synth_config_json(preset("k3-tiny"));
  const ModelConfig g = load_config(golden), c = load_config(dir / "config.json");
  CHECK(g.layer_kinds == c.layer_kinds);
  const auto gs = model_tensor_specs(g), cs = model_tensor_specs(c);
  REQUIRE(gs.size() == cs.size());
  for (size_t i = 0; i < gs.size(); ++i) {
    CHECK(gs[i].name == cs[i].name);
    CHECK(gs[i].shape == cs[i].shape);
    CHECK(gs[i].dtype == cs[i].dtype);
  }
}

TEST_CASE("synth is deterministic per seed and weights sit at the documented scales", "[synth]") {
  const fs::path a = synth("synth_seed_a", preset("k3-tiny", 7));
  const fs::path b = synth("synth_seed_b", preset("k3-tiny", 7));
  const fs::path d = synth("synth_seed_c", preset("k3-tiny", 8));
  Checkpoint ca(a), cb(b), cd(d);
  const ModelConfig& c = ca.config();
  for (const TensorInfo* t : ca.tensors()) {
    const auto x = ca.bytes(*t), y = cb.bytes(cb.get(t->name));
    REQUIRE(x.size() == y.size());
    CHECK(std::memcmp(x.data(), y.data(), x.size()) == 0);
  }
  const std::string q = c.layer_prefix(0) + "self_attn.q_proj.weight";
  CHECK(std::memcmp(ca.bytes(ca.get(q)).data(), cd.bytes(cd.get(q)).data(), 256 * 256 * 2) != 0);

  // Projections: std 1/sqrt(fan_in); embedding std 1; norms 1 ± 0.1; A_log zero-padded.
  CHECK(rms(ca.load_f32(q, {256, 256})) == Approx(1.0 / 16).epsilon(0.05));
  CHECK(rms(ca.load_f32(c.tensor_prefix + "embed_tokens.weight", {1024, 256})) ==
        Approx(1.0).epsilon(0.05));
  const auto norm = ca.load_f32(c.layer_prefix(2) + "input_layernorm.weight", {256});
  for (float v : norm) CHECK(std::fabs(v - 1.0f) <= 0.1f + 1.0f / 128);  // + bf16 rounding
  const auto alog = ca.load_f32(c.layer_prefix(0) + "self_attn.A_log", {128});
  for (int i = 0; i < 128; ++i) CHECK(std::fabs(alog[i]) <= (i < 2 ? 0.1f : 0.0f));
  // MXFP4 expert: decoded std within a factor of 1.5 of 1/sqrt(fan_in) (two scale choices).
  const ExpertTensors& x = ca.expert(4, 11);
  std::vector<float> w(96 * 128);
  mxfp4::dequantize(ca.bytes(*x.w1.weight).data(), ca.bytes(*x.w1.scale).data(), 96, 128, w.data());
  const double want = 1.0 / std::sqrt(128.0);
  CHECK(rms(w) > want / 1.5);
  CHECK(rms(w) < want * 1.5);
}

TEST_CASE("synth routers are decisive: top-k picks one cluster with a clear margin", "[synth]") {
  const fs::path dir = synth("synth_router", preset("k3-tiny", 3));
  Checkpoint ck(dir);
  const ModelConfig& c = ck.config();
  const int E = c.moe.num_experts, K = c.moe.top_k, D = c.hidden_size;
  const auto W = ck.load_f32(c.layer_prefix(5) + "block_sparse_moe.gate.weight", {E, D});
  const auto bias =
      ck.load_f32(c.layer_prefix(5) + "block_sparse_moe.gate.e_score_correction_bias", {E});
  // Random unit-RMS inputs (what the post-attention RMSNorm feeds the router).
  uint64_t s = 12345;
  auto gauss = [&] {
    auto u = [&] {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return (double((s >> 11) & ((1ull << 53) - 1)) + 0.5) / double(1ull << 53);
    };
    return std::sqrt(-2 * std::log(u())) * std::cos(6.283185307179586 * u());
  };
  int whole_cluster = 0;
  std::vector<double> margins;
  const int trials = 400;
  for (int t = 0; t < trials; ++t) {
    std::vector<double> x(D);
    for (double& v : x) v = gauss();
    std::vector<double> score(E);
    for (int e = 0; e < E; ++e) {
      double z = 0;
      for (int d = 0; d < D; ++d) z += x[d] * W[e * D + d];
      score[e] = 1 / (1 + std::exp(-z)) + bias[e];
    }
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
    const int cl = order[0] / K;
    bool same = true;
    for (int j = 0; j < K; ++j) same = same && order[j] / K == cl;
    whole_cluster += same ? 1 : 0;
    margins.push_back(score[order[K - 1]] - score[order[K]]);
  }
  std::sort(margins.begin(), margins.end());
  INFO("whole-cluster selections " << whole_cluster << "/" << trials << ", median margin "
                                   << margins[trials / 2] << ", 5th percentile "
                                   << margins[trials / 20]);
  CHECK(whole_cluster >= trials * 95 / 100);
  // bf16 rounding of the router input moves a sigmoid score by well under 0.01.
  CHECK(margins[trials / 2] > 0.05);
  CHECK(margins[trials / 20] > 0.005);
}

TEST_CASE("synth kimi-linear-tiny: flat form, bf16 experts, per-head A_log", "[synth]") {
  const fs::path dir = synth("synth_kl", preset("kimi-linear-tiny"));
  Checkpoint ck(dir);
  const ModelConfig& c = ck.config();
  CHECK_FALSE(c.wrapped);
  CHECK_FALSE(c.moe.mxfp4);
  CHECK(c.moe.router_form == RouterWeightForm::bias_in_place);
  CHECK(ck.num_tensors() == 493);
  ck.claim_all_specs();
  CHECK_NOTHROW(ck.check_all_claimed());
  const auto alog = ck.load_f32(c.layer_prefix(0) + "self_attn.A_log", {1, 1, 2, 1});
  for (float v : alog) CHECK((v >= 0.0f && v <= std::log(16.0f) + 1e-6f));
  const auto dt = ck.load_f32(c.layer_prefix(0) + "self_attn.dt_bias", {256});
  for (float v : dt) CHECK((v < -2.2f && v > -7.0f));  // inverse softplus of 1e-3..1e-1
}

TEST_CASE("synth overrides: --layers keeps a final MLA layer, --experts clamps top-k", "[synth]") {
  SynthOptions o = preset("k3-tiny");
  o.layers = 3;
  o.experts = 3;
  const fs::path dir = synth("synth_override", o);
  Checkpoint ck(dir);
  const ModelConfig& c = ck.config();
  CHECK(c.num_layers == 3);
  CHECK(c.is_kda(0));
  CHECK(c.is_kda(1));
  CHECK(c.is_mla(2));
  CHECK(c.moe.num_experts == 3);
  CHECK(c.moe.top_k == 3);
  ck.claim_all_specs();
  CHECK_NOTHROW(ck.check_all_claimed());
}

TEST_CASE("k3-slice keeps K3's real widths (config only: the weights are GBs)", "[synth]") {
  SynthOptions o = preset("k3-slice");
  const ModelConfig c = parse_config(synth_config_json(o), "k3-slice");
  CHECK(c.num_layers == 2);
  CHECK(c.is_dense(0));
  CHECK(c.is_kda(0));
  CHECK(c.is_mla(1));
  CHECK(c.is_moe(1));
  CHECK(c.hidden_size == 7168);
  CHECK(c.moe.num_experts == 896);
  CHECK(c.moe.top_k == 16);
  CHECK(c.kda.num_heads == 96);
  CHECK(c.mla.num_heads == 96);
  CHECK(c.mla.q_lora_rank == 1536);
  CHECK(compute_costs(c).bytes_per_routed_expert == 17547264ull);
  o.layers = 4;
  o.experts = 8;
  const ModelConfig d = parse_config(synth_config_json(o), "k3-slice");
  CHECK(d.num_layers == 4);
  CHECK(d.is_mla(3));
  CHECK(d.num_kda_layers() == 3);
  CHECK(d.moe.num_experts == 8);
  CHECK(d.moe.top_k == 8);
}

TEST_CASE("synth bad inputs", "[synth][errors]") {
  const fs::path dir = test::scratch_dir("synth_bad");
  CHECK_THROWS_WITH(synth_checkpoint(preset("k3-huge"), dir / "x"),
                    Catch::Contains("synth: unknown preset \"k3-huge\" (expected one of: k3-tiny"));
  fs::create_directories(dir / "occupied");
  {
    std::ofstream f(dir / "occupied" / "f");
    f << "x";
  }
  CHECK_THROWS_WITH(synth_checkpoint(preset("k3-tiny"), dir / "occupied"),
                    Catch::Contains("occupied: exists and is not empty"));
  SynthOptions o;
  o.config_path = dir / "bad-config.json";
  {
    std::ofstream f(o.config_path);
    f << R"({"hidden_size": 12})";
  }
  CHECK_THROWS_WITH(synth_checkpoint(o, dir / "y"),
                    Catch::Contains("bad-config.json: vocab_size: missing field"));
  o.preset = "k3-tiny";
  CHECK_THROWS_WITH(synth_checkpoint(o, dir / "z"), Catch::Contains("either --preset or --config"));
}
