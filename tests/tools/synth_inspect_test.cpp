// The CLI end to end: strata synth → strata inspect (--json) → the figures the spec gives for the
// real K3 config; bad inputs exit 1 with one "strata: error: ..." line naming the problem.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "storage/synth.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Run {
  int status = -1;
  std::string out, err;
};

using strata::test::slurp;

Run run(const std::string& args, const fs::path& scratch) {
  const fs::path o = scratch / "stdout.txt", e = scratch / "stderr.txt";
  const std::string cmd =
      strata::test::strata_exe() + " " + args + " >" + o.string() + " 2>" + e.string();
  const int rc = std::system(cmd.c_str());
  Run r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(o);
  r.err = slurp(e);
  return r;
}

}  // namespace

TEST_CASE("strata synth → inspect round trip for the tiny presets", "[cli][synth][inspect]") {
  for (const char* p : {"k3-tiny", "kimi-linear-tiny"}) {
    INFO(p);
    const fs::path s = strata::test::scratch_dir(std::string("cli_synth_") + p);
    const fs::path dir = s / "model";
    const Run a = run(std::string("synth --preset ") + p + " --seed 5 -q -o " + dir.string(), s);
    INFO(a.err);
    REQUIRE(a.status == 0);
    CHECK_THAT(a.out, Catch::StartsWith("wrote " + dir.string() + ": "));
    const Run b = run("inspect " + dir.string() + " --json", s);
    INFO(b.err);
    REQUIRE(b.status == 0);
    const json j = json::parse(b.out);
    CHECK(j["checkpoint"]["all_tensors_claimed"] == true);
    CHECK(j["checkpoint"]["tensors"] == (std::string(p) == "k3-tiny" ? 1002 : 493));
    CHECK(j["checkpoint"]["max_spans_per_expert"] == 1);
    CHECK(j["checkpoint"]["bytes_per_routed_expert"] == j["bytes_per_routed_expert"]);
    uint64_t files = 0;
    for (const auto& f : fs::directory_iterator(dir))
      if (f.path().extension() == ".safetensors") files += fs::file_size(f.path());
    CHECK(j["checkpoint"]["file_bytes"] == files);
    const Run c = run("inspect " + dir.string(), s);
    CHECK(c.status == 0);
    CHECK_THAT(c.out, Catch::Contains("all tensors claimed with the shapes the config implies"));
  }
}

TEST_CASE("strata synth --config-only writes the checkpoint's config.json alone, never over a file",
          "[cli][synth]") {
  const fs::path d = strata::test::scratch_dir("synth_config_only");
  const fs::path out = d / "k3-slice8";
  Run r = run("synth --preset k3-slice --layers 8 --experts 64 --config-only -o " + out.string(), d);
  REQUIRE(r.status == 0);
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(out)) files += f.is_regular_file();
  CHECK(files == 1);
  strata::SynthOptions so;
  so.preset = "k3-slice";
  so.layers = 8;
  so.experts = 64;
  CHECK(slurp(out / "config.json") == strata::synth_config_json(so));
  // `strata inspect` reads it as the 8-layer slice (no weights needed).
  r = run("inspect " + (out / "config.json").string() + " --json", d);
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  CHECK(j["architecture"]["layers"] == 8);
  CHECK(j["architecture"]["num_experts"] == 64);
  // The directory now holds a file: refused with one line, the file untouched.
  const std::string before = slurp(out / "config.json");
  r = run("synth --preset k3-mini --config-only -o " + out.string(), d);
  CHECK(r.status == 1);
  CHECK(r.err.find("exists and is not empty") != std::string::npos);
  CHECK(slurp(out / "config.json") == before);
}

TEST_CASE("strata inspect on the real K3 config prints the spec's figures", "[cli][inspect]") {
  const fs::path cfg = strata::test::shared_dir() / "configs" / "kimi-k3.config.json";
  strata::test::need_shared(cfg);
  const fs::path s = strata::test::scratch_dir("cli_inspect_k3");
  const Run r = run("inspect " + cfg.string() + " --json", s);
  REQUIRE(r.status == 0);
  const json j = json::parse(r.out);
  CHECK(j["bytes_per_routed_expert"] == 17547264);              // ≈ 17.5 MB per expert
  CHECK(j["routed_bytes_per_token"] == 17547264ull * 16 * 92);  // ≈ 25.8 GB per token
  CHECK(j["kda_state_bytes"] == 414ull << 20);                  // 414 MiB per sequence
  CHECK(j["mla_cache_bytes_per_token_per_layer"] == 1152);
  CHECK(j["architecture"]["mla_layers"] == 24);
  CHECK(j["mla_cache_bytes_per_token"] == 1152 * 24);
  CHECK(j.contains("checkpoint") == false);
  const Run t = run("inspect " + cfg.string(), s);
  REQUIRE(t.status == 0);
  CHECK_THAT(t.out, Catch::Contains("17.55 MB each (17547264 B)"));
  CHECK_THAT(t.out, Catch::Contains("all cold): 25.83 GB"));
  CHECK_THAT(t.out, Catch::Contains("KDA state 414.0 MiB (6.0 MiB x 69 layers)"));
  CHECK_THAT(t.out, Catch::Contains("MLA latent cache 1152 B x 24 layers = 27648 B per token"));
}

TEST_CASE("CLI bad inputs exit 1 with one clear line", "[cli][errors]") {
  const fs::path s = strata::test::scratch_dir("cli_bad");
  auto one_line = [](const Run& r) {
    return r.err.find('\n') == r.err.size() - 1 && r.err.rfind("strata: error: ", 0) == 0;
  };
  {
    const Run r = run("inspect " + (s / "nope").string(), s);
    CHECK(r.status == 1);
    CHECK(one_line(r));
    CHECK_THAT(r.err, Catch::Contains((s / "nope").string() + ": cannot open"));
  }
  {
    const Run r = run("synth --preset k3-huge -o " + (s / "x").string(), s);
    CHECK(r.status == 1);
    CHECK(one_line(r));
    CHECK_THAT(r.err, Catch::Contains("unknown preset \"k3-huge\""));
  }
  {
    // A truncated shard: inspect names the shard and the tensor running past its end.
    const fs::path dir = s / "trunc";
    REQUIRE(run("synth --preset k3-tiny -q -o " + dir.string(), s).status == 0);
    const fs::path shard = dir / "model-00002-of-00004.safetensors";
    fs::resize_file(shard, fs::file_size(shard) - 100);
    const Run r = run("inspect " + dir.string(), s);
    CHECK(r.status == 1);
    CHECK(one_line(r));
    CHECK_THAT(r.err,
               Catch::Contains(shard.string() + ": tensor ") && Catch::Contains("file truncated?"));
  }
  {
    const Run r = run("synth -o " + (s / "y").string(), s);
    CHECK(r.status == 1);
    CHECK_THAT(r.err, Catch::Contains("give --preset or --config"));
  }
}
