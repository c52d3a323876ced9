// The `strata run` and `strata logits` commands end to end on the golden k3-tiny model: greedy
// ids equal the reference continuation, logits equal the reference, dumps and
// --stop-after-layer give the named intermediates, routing files round trip, and bad inputs give
// one clear line and exit status 1.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "storage/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

using Result = strata::test::CliResult;
Result run(const std::string& args) {
  return strata::test::run_cli(args);
}

// The golden k3-tiny directory; skips the case (or fails it under STRATA_REQUIRE_SHARED=1) when
// it is absent.
fs::path golden_k3() {
  fs::path d = test::golden_dir() / "k3-tiny";
  test::need_shared(d / "meta.json");
  return d;
}

nlohmann::json meta(const fs::path& d) {
  std::ifstream f(d / "meta.json");
  return nlohmann::json::parse(f);
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream f(p);
  f << s;
}

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  REQUIRE(t != nullptr);
  REQUIRE(t->dtype == DType::F32);
  std::vector<float> v(size_t(t->numel()));
  std::memcpy(v.data(), f.bytes(*t).data(), t->nbytes);
  return v;
}

}  // namespace

TEST_CASE("strata run --print-ids reproduces the golden greedy continuation", "[engine][cli]") {
  fs::path g = golden_k3();
  auto m = meta(g);
  fs::path dir = test::scratch_dir("cli-run");
  write_file(dir / "ids.json", m["prompt_ids"].dump());
  Result r = run("run -m " + g.string() + " --ids " + (dir / "ids.json").string() +
                 " --print-ids --ignore-eos -n 12 --temp 0 --threads 2 --precision fp32 "
                 "--experts-numerics exact");
  INFO(r.out);
  REQUIRE(r.status == 0);
  // stdout is the JSON array of generated ids (one line starting with '['); stderr has the
  // start-up config line and the stats line.
  const size_t at = r.out.find("\n[");
  REQUIRE(at != std::string::npos);
  auto line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
  CHECK(r.out.find("strata run: " + g.string()) == 0);
  CHECK(nlohmann::json::parse(line) == m["greedy_ids"]);
  CHECK(r.out.find("prefill") != std::string::npos);
  CHECK(r.out.find("decode") != std::string::npos);
  CHECK(r.out.find("peak RSS") != std::string::npos);
}

TEST_CASE("strata logits writes the golden prefill logits, dump and stop-after-layer",
          "[engine][cli]") {
  fs::path g = golden_k3();
  auto m = meta(g);
  fs::path dir = test::scratch_dir("cli-logits");
  write_file(dir / "ids.json", m["prompt_ids"].dump());
  // The golden data is the fp32 oracle's: the CLI defaults (bf16, contract) are overridden.
  const std::string base = "logits -m " + g.string() + " --ids " + (dir / "ids.json").string() +
                           " --precision fp32 --experts-numerics exact";
  Result r = run(base + " -o " + (dir / "out.safetensors").string() + " --dump " +
                 (dir / "dump").string() + " --dump-sites 'blk\\.3\\..*' --record-routing " +
                 (dir / "routing.json").string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  SafetensorsFile out(dir / "out.safetensors");
  SafetensorsFile expected(g / "expected.safetensors");
  std::vector<float> a = read_f32(out, "logits");
  std::vector<float> b = read_f32(expected, "logits_prefill_fp32");
  REQUIRE(a.size() == b.size());
  CHECK(out.find("logits")->shape == expected.find("logits_prefill_fp32")->shape);
  float d = 0, mx = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]));
    mx = std::max(mx, std::fabs(b[i]));
  }
  CHECK(d <= 1e-4f * mx);  // as the golden engine test (fp32 noise, README §7)

  // Dump: layer 3 is MLA in k3-tiny; every site of that layer and nothing else.
  SafetensorsFile dump(dir / "dump" / "dump.safetensors");
  for (const char* site : {"blk.3.mix_attn", "blk.3.attn_norm", "blk.3.mla_out", "blk.3.mix_mlp",
                           "blk.3.ffn_norm", "blk.3.moe_out", "blk.3.out", "blk.3.mla_latent"})
    CHECK(dump.find(site) != nullptr);
  CHECK(dump.find("blk.2.out") == nullptr);
  CHECK(dump.find("blk.3.kda_out") == nullptr);
  CHECK(dump.find("blk.3.out")->shape == std::vector<int64_t>{40, 256});

  // --stop-after-layer 3: the residual stream after layer 3 equals the golden one.
  Result s = run(base + " -o " + (dir / "h.safetensors").string() + " --stop-after-layer 3");
  INFO(s.out);
  REQUIRE(s.status == 0);
  SafetensorsFile hf(dir / "h.safetensors");
  std::vector<float> h = read_f32(hf, "hidden");
  std::vector<float> hall = read_f32(expected, "hidden_after_layer_fp32");
  REQUIRE(h.size() == 40 * 256);
  float hd = 0, hm = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    hd = std::max(hd, std::fabs(h[i] - hall[3 * 40 * 256 + i]));
    hm = std::max(hm, std::fabs(hall[3 * 40 * 256 + i]));
  }
  CHECK(hd <= 1e-4f * hm);
  std::vector<float> dumped = read_f32(dump, "blk.3.out");
  CHECK(dumped == h);  // the same computation, bit for bit

  // Replay the recorded routing in bf16: accepted, and recording it again gives the same file.
  Result p = run("logits -m " + g.string() + " --ids " + (dir / "ids.json").string() + " -o " +
                 (dir / "r.safetensors").string() + " --precision bf16 --replay-routing " +
                 (dir / "routing.json").string() + " --record-routing " +
                 (dir / "routing2.json").string());
  INFO(p.out);
  REQUIRE(p.status == 0);
  std::ifstream r1(dir / "routing.json"), r2(dir / "routing2.json");
  CHECK(nlohmann::json::parse(r1)["layers"] == nlohmann::json::parse(r2)["layers"]);
}

TEST_CASE("strata run/logits: bad inputs give one clear line and exit 1", "[engine][cli]") {
  fs::path g = golden_k3();
  fs::path dir = test::scratch_dir("cli-bad");
  write_file(dir / "ok.json", "[1, 2, 3]");
  write_file(dir / "big.json", "[1, 2, 1024]");
  write_file(dir / "empty.json", "[]");
  write_file(dir / "text.json", "[1, \"x\"]");
  write_file(dir / "broken.json", "[1, 2");
  const std::string m = "-m " + g.string();
  const std::string o = " -o " + (dir / "x.safetensors").string();
  struct Case {
    std::string args, expect;
  } cases[] = {
      {"logits -m " + (dir / "missing").string() + " --ids " + (dir / "ok.json").string() + o,
       "missing"},
      {"logits " + m + " --ids " + (dir / "big.json").string() + o,
       "token id 1024 at index 2 is outside the vocabulary [0, 1024)"},
      {"logits " + m + " --ids " + (dir / "empty.json").string() + o, "empty prompt"},
      {"logits " + m + " --ids " + (dir / "text.json").string() + o, "element 1"},
      {"logits " + m + " --ids " + (dir / "broken.json").string() + o, "not valid JSON"},
      {"logits " + m + " --ids " + (dir / "nope.json").string() + o, "cannot open"},
      {"logits " + m + " --ids " + (dir / "ok.json").string() + o + " --precision fp16",
       "--precision: expected fp32 or bf16"},
      {"logits " + m + " --ids " + (dir / "ok.json").string() + o + " --stop-after-layer 9",
       "--stop-after-layer 9"},
      {"run " + m + " --ids " + (dir / "ok.json").string() + " --print-ids --top-p 0", "top-p"},
      {"run " + m + " --ids " + (dir / "ok.json").string() + " --print-ids --experts-numerics x",
       "--experts-numerics"},
      {"run " + m + " -p hello", "tokenizer"},
      {"logits " + m + " --ids " + (dir / "ok.json").string() + o + " --gpu-promote 0",
       "--gpu-promote: expected on, off or a step interval"},
      {"run " + m + " --ids " + (dir / "ok.json").string() + " --print-ids --gpu-promote often",
       "--gpu-promote: expected on, off or a step interval"},
      // The GPU flags' syntax is checked on every machine, before loading (a CPU-only run used to
      // ignore a malformed value).
      {"run " + m + " --ids " + (dir / "ok.json").string() + " --print-ids --gpu-mem 12XB",
       "--gpu-mem"},
      {"logits " + m + " --ids " + (dir / "ok.json").string() + o + " --gpu-experts 150%",
       "--gpu-experts: expected a share of the routed experts"},
      {"run " + m + " --ids " + (dir / "ok.json").string() + " --print-ids --max-context 0",
       "--max-context 0: expected 1..2^30"},
      {"run " + m + " --ids " + (dir / "ok.json").string() + " --print-ids --max-step-rows -3",
       "--max-step-rows -3"},
      {"logits " + m + " --ids " + (dir / "ok.json").string() + o + " --hardware " +
           (dir / "none.json").string(),
       "none.json: not found"},
  };
  for (const auto& c : cases) {
    Result r = run(c.args);
    INFO(c.args << "\n" << r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find(c.expect) != std::string::npos);
    CHECK(r.out.find("strata: error: ") == 0);
    CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  }
}
