// Bad input to the CLI (issue 17, item 4): each case that once aborted, hung, lost data or
// answered garbage now ends with one "strata: error: ..." line naming what was wrong and exit
// status 1 (or the documented behaviour). Every command runs under `timeout`, so a regression to
// a hang fails the test (status 124) instead of stalling the suite. docs/reliability.md lists
// these cases and points here.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "storage/safetensors.h"
#include "storage/synth.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Run {
  int status = -1;
  std::string out;  // stdout and stderr together
  double seconds = 0;
};

// The CLI with a 60 s limit (status 124 when it ran past it), stdout and stderr together.
Run cli(const std::string& args) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string cmd = "timeout 60 " + strata::test::strata_exe() + " " + args + " 2>&1";
  Run o;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) o.out.append(buf, n);
  const int st = pclose(p);
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

size_t count_lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// The run failed with exit status 1 and its output is exactly one error line containing `what`.
void require_one_line_error(const Run& r, const std::string& what) {
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(count_lines(r.out) == 1);
  CHECK_THAT(r.out, Catch::StartsWith("strata: error: "));
  CHECK_THAT(r.out, Catch::Contains(what));
}

// The run failed with exit status 1 and its last line is the error (start-up lines may precede).
void require_last_line_error(const Run& r, const std::string& what) {
  INFO(r.out);
  CHECK(r.status == 1);
  const size_t at = r.out.rfind("strata: error: ");
  REQUIRE(at != std::string::npos);
  CHECK(r.out.find('\n', at) == r.out.size() - 1);
  CHECK_THAT(r.out.substr(at), Catch::Contains(what));
}

using strata::test::slurp;
using strata::test::write_file;

// A synthetic k3-tiny written by the CLI (seed 3) into a directory of its own: ctest runs the
// cases as parallel processes, so no two cases share (or delete) a model directory.
fs::path copy_model(const std::string& name) {
  const fs::path d = strata::test::scratch_dir("bad_input_" + name) / "model";
  const Run r = cli("synth --preset k3-tiny --seed 3 -q -o " + d.string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  return d;
}

json read_json(const fs::path& p) {
  return json::parse(slurp(p));
}

void write_json(const fs::path& p, const json& j) {
  write_file(p, j.dump(2));
}

// The shard holding `tensor`, and its absolute byte offset there.
std::pair<fs::path, uint64_t> locate(const fs::path& model, const std::string& tensor) {
  const json idx = read_json(model / "model.safetensors.index.json");
  const fs::path shard = model / idx["weight_map"][tensor].get<std::string>();
  strata::SafetensorsFile f(shard);
  const strata::TensorInfo* t = f.find(tensor);
  REQUIRE(t != nullptr);
  return {shard, t->offset};
}

using strata::test::poke;

// A model whose first shard is cut short: loading it fails, so an error about anything else
// proves that thing was checked before the model was loaded.
fs::path broken_model(const std::string& name) {
  const fs::path d = copy_model(name);
  fs::resize_file(d / "model-00001-of-00004.safetensors", 100);
  return d;
}

fs::path ids_file(const fs::path& dir, const std::string& ids = "[1, 2, 3]") {
  const fs::path p = dir / "ids.json";
  write_file(p, ids);
  return p;
}

}  // namespace

TEST_CASE("bad input: option-parsing errors are one line with exit status 1", "[cli][bad-input]") {
  const std::string m = copy_model("parse").string();
  require_one_line_error(cli("run -m " + m + " --bogus"), "--bogus (see strata run --help)");
  require_one_line_error(cli("run -m " + m + " -p hi -n x"), "--n-predict");
  require_one_line_error(cli("bench io --qd"), "--qd");
  require_one_line_error(cli("nosuchcommand"), "nosuchcommand");
  require_one_line_error(cli("logits -m " + m), "--ids");  // a required option missing
  const Run h = cli("run --help");
  CHECK(h.status == 0);
  CHECK_THAT(h.out, Catch::Contains("--io-timeout"));
}

TEST_CASE("bad input: numeric options out of range fail before any work", "[cli][bad-input]") {
  const fs::path s = strata::test::scratch_dir("bad_input_numbers");
  const std::string m = copy_model("numbers_model").string(), ids = ids_file(s).string();
  const std::string run = "run -m " + m + " --ids " + ids + " --print-ids -n 2 ";
  require_one_line_error(cli(run + "--host-mem 50% --io-depth 0"),
                         "--io-depth 0: expected 1..4096");
  require_one_line_error(cli(run + "--threads 100000"),
                         "--threads 100000: expected 0 (all) or 1..");
  require_one_line_error(cli(run + "--threads -3"), "--threads -3");
  require_one_line_error(cli(run + "--host-mem 50% --prefetch-depth 1000"),
                         "--prefetch-depth 1000");
  require_one_line_error(cli(run + "--host-mem 50% --io-timeout nan"), "--io-timeout");
  require_one_line_error(cli(run + "--host-fill"), "--host-fill: fills the host expert cache");
  require_one_line_error(cli(run + "--temp nan"), "temperature");
  require_one_line_error(cli(run + "--stop ''"), "--stop");
  require_one_line_error(cli("synth --preset k3-tiny --threads 100000 -o " + (s / "x").string()),
                         "--threads 100000");
  CHECK_FALSE(fs::exists(s / "x"));
  // An explicit 0 is not "the preset's value" (synth used to write the preset's model for it).
  for (const char* flag : {"--layers", "--experts", "--vocab"}) {
    require_one_line_error(
        cli("synth --preset k3-tiny " + std::string(flag) + " 0 -o " + (s / "x").string()), flag);
    CHECK_FALSE(fs::exists(s / "x"));
  }
  // bench io used to write its 2 GiB file first, then abort on --repeats 0; --file-gib nan wrote
  // until the disk was full.
  const std::string io = "bench io --dir " + s.string() + " ";
  require_one_line_error(cli(io + "--repeats 0"), "--repeats 0: expected 1..10000");
  require_one_line_error(cli(io + "--file-gib nan"), "--file-gib nan");
  require_one_line_error(cli(io + "--file-gib 60000"), "free");
  require_one_line_error(cli(io + "--block-kib 6"), "--block-kib 6");
  require_one_line_error(cli("bench cpu-experts --repeats 0"), "--repeats 0");
  for (const auto& e : fs::directory_iterator(s))
    CHECK(e.path().filename().string().rfind("strata-bench-io", 0) == std::string::npos);
}

TEST_CASE("bad input: bench hw -m refuses what is not a model before measuring anything",
          "[cli][bad-input]") {
  const fs::path s = strata::test::scratch_dir("bad_input_bench_hw");
  require_one_line_error(cli("bench hw --no-disk -m " + (s / "none").string()),
                         (s / "none" / "config.json").string() + ": not found (is " +
                             (s / "none").string() + " a checkpoint directory?)");
  fs::create_directories(s / "bad");
  std::ofstream(s / "bad" / "config.json") << "{\"vocab_size\": 8";
  require_one_line_error(cli("bench hw --no-disk -m " + (s / "bad").string()),
                         (s / "bad" / "config.json").string());
  strata::SynthOptions so;
  so.preset = "k3-tiny";
  fs::create_directories(s / "tiny");
  std::ofstream(s / "tiny" / "config.json") << strata::synth_config_json(so);
  require_one_line_error(
      cli("bench hw --no-disk -m " + (s / "tiny").string() + " --model-tokens 0"),
      "--model-tokens: expected 1..65536, got 0");
  require_one_line_error(cli("bench hw --no-disk -m " + (s / "tiny").string() + " --context 0"),
                         "--context: expected ≥ 1, got 0");
  require_one_line_error(cli("bench hw --no-disk --context 80"),
                         "--model-tokens, --context and --model-cold go with -m DIR");
  require_one_line_error(cli("bench hw --no-disk --model-cold 64"),
                         "--model-tokens, --context and --model-cold go with -m DIR");
  require_one_line_error(cli("bench hw --no-disk -m " + (s / "tiny").string() + " --model-cold -1"),
                         "--model-cold -1: expected 0..65536");
}

TEST_CASE("bad input: config dimensions are bounded, naming the field", "[cli][bad-input]") {
  const fs::path s = strata::test::scratch_dir("bad_input_config");
  const json base = read_json(copy_model("config_model") / "config.json");
  struct Case {
    const char* key;
    json value;
    const char* what;
  };
  const Case cases[] = {
      {"num_experts", 1000000000, "text_config.num_experts: expected an integer in 1..65536"},
      {"num_experts", 1e300, "text_config.num_experts: expected an integer"},
      {"num_experts", 40000, "more than strata's limit"},  // 40000 x 8 MoE layers
      {"hidden_size", 1 << 30, "text_config.hidden_size"},
      {"vocab_size", -5, "text_config.vocab_size"},
      {"rms_norm_eps", 1e300, "text_config.rms_norm_eps"},
      {"rms_norm_eps", 0.5, "text_config.rms_norm_eps: expected a small positive number"},
      {"routed_scaling_factor", -1, "text_config.routed_scaling_factor"},
      {"eos_token_id", 4294967298.0, "text_config.eos_token_id"},
  };
  for (const Case& c : cases) {
    INFO(c.key << " = " << c.value.dump());
    json j = base;
    j["text_config"][c.key] = c.value;
    write_json(s / "config.json", j);
    const Run r = cli("inspect " + (s / "config.json").string());
    require_one_line_error(r, c.what);
    CHECK(r.seconds < 10);  // num_experts 1e9 once allocated for 36 s, then died of bad_alloc
  }
  // Widths near 2^30 printed as negative numbers (int overflow) before the limits.
  json j = base;
  j["text_config"]["linear_attn_config"]["num_heads"] = (1 << 30) - 1;
  write_json(s / "config.json", j);
  require_one_line_error(cli("inspect " + (s / "config.json").string()),
                         "text_config.linear_attn_config.num_heads");
  // The real K3 config stays within every limit.
  const fs::path k3 = strata::test::shared_dir() / "configs" / "kimi-k3.config.json";
  if (fs::exists(k3)) {
    const Run r = cli("inspect " + k3.string());
    INFO(r.out);
    CHECK(r.status == 0);
  }
}

TEST_CASE("bad input: directories and FIFOs where files belong never hang", "[cli][bad-input]") {
  const fs::path s = strata::test::scratch_dir("bad_input_fifo");
  const std::string m = copy_model("fifo_model").string();
  REQUIRE(::mkfifo((s / "fifo").c_str(), 0644) == 0);
  fs::create_directory(s / "dir");
  require_one_line_error(cli("tokenize -m " + m + " -f " + (s / "dir").string()),
                         "is a directory, expected a regular file");
  require_one_line_error(cli("tokenize -m " + m + " -f " + (s / "fifo").string()), "FIFO");
  require_one_line_error(cli("run -m " + m + " --ids " + (s / "fifo").string()), "FIFO");
  require_one_line_error(cli("inspect " + (s / "fifo").string()), "FIFO");
  // A shard that is a FIFO: the index names it, the open must not wait for a writer.
  const fs::path d = copy_model("fifo_shard");
  json idx = read_json(d / "model.safetensors.index.json");
  const std::string first = idx["weight_map"].begin().key();
  const std::string shard = idx["weight_map"][first];
  fs::remove(d / shard);
  REQUIRE(::mkfifo((d / shard).c_str(), 0644) == 0);
  const Run r = cli("inspect " + d.string());
  require_one_line_error(r, shard + ": not a regular file");
}

TEST_CASE("bad input: logits -o never replaces what it must not", "[cli][bad-input]") {
  const fs::path s = strata::test::scratch_dir("bad_input_output");
  const fs::path d = copy_model("output");
  const fs::path ids = ids_file(s);
  const std::string logits = "logits -m " + d.string() + " --ids " + ids.string() + " -o ";
  const fs::path shard = d / "model-00002-of-00004.safetensors";
  const std::string shard_bytes = slurp(shard);
  REQUIRE(::mkfifo((s / "fifo").c_str(), 0644) == 0);
  fs::create_directory(s / "dir");
  fs::create_symlink(shard, s / "link-to-shard");
  require_one_line_error(cli(logits + "/dev/null"), "is a character device");
  require_one_line_error(cli(logits + (s / "fifo").string()), "FIFO");
  require_one_line_error(cli(logits + (s / "dir").string()), "is a directory");
  require_one_line_error(cli(logits + shard.string()), "is a file this command reads");
  require_one_line_error(cli(logits + (s / "link-to-shard").string()), "this command reads");
  require_one_line_error(cli(logits + ids.string()), "is a file this command reads");
  require_one_line_error(cli(logits + (d / "config.json").string()), "this command reads");
  require_one_line_error(cli(logits + (s / "no" / "such" / "dir.st").string()), "does not exist");
  struct stat st {};
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  REQUIRE(::stat((s / "fifo").c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  CHECK(fs::is_directory(s / "dir"));
  CHECK(slurp(shard) == shard_bytes);
  CHECK(fs::is_symlink(s / "link-to-shard"));
  // An existing regular file is what -o asks to replace (documented in --help and the README).
  write_file(s / "old.st", "old contents");
  const Run ok = cli(logits + (s / "old.st").string());
  INFO(ok.out);
  REQUIRE(ok.status == 0);
  strata::SafetensorsFile f(s / "old.st");
  CHECK(f.find("logits") != nullptr);
  CHECK_FALSE(fs::exists(s / "old.st.partial"));
}

TEST_CASE("bad input: unwritable outputs fail before the model is loaded", "[cli][bad-input]") {
  const fs::path s = strata::test::scratch_dir("bad_input_unwritable");
  // broken_model() cannot be loaded: an error about the output proves it came first.
  const std::string run = "run -m " + broken_model("unwritable_model").string() + " --ids " +
                          ids_file(s).string() + " --print-ids -n 2 ";
  require_one_line_error(cli(run + "--host-mem 50% --stats-json /proc/strata-x.json"),
                         "--stats-json /proc/strata-x.json: cannot create");
  require_one_line_error(cli(run + "--record-routing /proc/strata-x.json"), "--record-routing");
  require_one_line_error(cli(run + "--dump /proc/strata-dump"), "--dump /proc/strata-dump");
  require_one_line_error(cli(run + "--record-routing " + (s / "a.json").string() +
                             " --host-mem 50% --stats-json " + (s / "a.json").string()),
                         "the same file");
  // The model error itself, once the outputs are fine.
  require_one_line_error(cli(run), "model-00001-of-00004.safetensors");
  // Benchmarks check their --json / --save targets before measuring (they used to fail after the
  // whole run): broken_model() again proves the check came first for the ones that load a model.
  const std::string none = (s / "no" / "such" / "dir.json").string();
  require_one_line_error(cli("bench hw --no-disk --save " + none), "--save " + none);
  require_one_line_error(cli("bench hw --no-disk --json " + none), "--json " + none);
  require_one_line_error(cli("bench cpu-trunk --json " + none), "--json " + none);
  require_one_line_error(
      cli("bench e2e -m " + broken_model("unwritable_model").string() + " --json " + none),
      "--json " + none);
  require_one_line_error(
      cli("bench batch -m " + broken_model("unwritable_model").string() + " --json " + none),
      "--json " + none);
  require_one_line_error(
      cli("bench e2e -m " + broken_model("unwritable_model").string() + " --prefill-repeats 0"),
      "--prefill-repeats 0: expected 1..100");
}

TEST_CASE("bad input: a host budget below one expert is refused before loading",
          "[cli][bad-input]") {
  const fs::path s = strata::test::scratch_dir("bad_input_host_mem");
  const std::string run = "run -m " + broken_model("host_mem_model").string() + " --ids " +
                          ids_file(s).string() + " --print-ids -n 2 ";
  require_one_line_error(cli(run + "--host-mem 1KiB"), "holds no routed expert");
  require_one_line_error(cli(run + "--host-mem 0.0001%"), "holds no routed expert");
  require_one_line_error(cli(run + "--host-mem 1e300GiB"), "--host-mem '1e300GiB'");
  require_one_line_error(cli(run + "--host-mem lots"), "--host-mem 'lots'");
}

TEST_CASE("bad input: replayed routing must match the model and the run", "[cli][bad-input]") {
  const fs::path s = strata::test::scratch_dir("bad_input_replay");
  const std::string m = copy_model("replay_model").string();
  const fs::path ids3 = ids_file(s, "[1, 2, 3]");
  const fs::path rec = s / "rec.json";
  const Run r0 = cli("logits -m " + m + " --ids " + ids3.string() + " -o " + (s / "a.st").string() +
                     " --record-routing " + rec.string());
  INFO(r0.out);
  REQUIRE(r0.status == 0);
  const json good = read_json(rec);
  const std::string logits =
      "logits -m " + m + " --ids " + ids3.string() + " -o " + (s / "b.st").string() + " ";
  REQUIRE(cli(logits + "--replay-routing " + rec.string()).status == 0);
  auto replay = [&](const json& j) {
    write_json(s / "bad.json", j);
    return cli(logits + "--replay-routing " + (s / "bad.json").string());
  };
  json j = good;
  j["layers"]["1"][0][0] = 4294967296;  // was read as expert 0
  require_one_line_error(replay(j), "4294967296, not an expert id");
  j = good;
  j["layers"]["1"][0] = {0, 1, 2, 99};
  require_one_line_error(replay(j), "expert 99 does not exist");
  j = good;
  j["layers"]["1"][0] = {0, 1, 2};
  require_one_line_error(replay(j), "has 3 ids, expected top_k = 4");
  j = good;
  j["layers"]["1"].erase(2);  // a missing row
  require_one_line_error(replay(j), "has 3 rows, layer 1 has 2");
  j = good;
  for (auto& [l, rows] : j["layers"].items()) rows.push_back(rows[0]);  // an extra row everywhere
  require_one_line_error(replay(j), "4 positions per layer, but this run uses 3");
  j = good;
  j["layers"].erase("2");
  require_one_line_error(replay(j), "no routing for MoE layer 2");
  j = good;
  j["layers"]["0"] = j["layers"]["1"];  // layer 0 is the dense layer
  require_one_line_error(replay(j), "layer 0 is not a MoE layer");
  // run: the file covers 3 prompt + up to n−1 decode positions. -n 1 uses exactly the prompt;
  // -n 3 would reach position 4, which the file does not hold: stopped there, not routed freely.
  const std::string run = "run -m " + m + " --ids " + ids3.string() + " --print-ids --ignore-eos ";
  CHECK(cli(run + "-n 1 --temp 0 --replay-routing " + rec.string()).status == 0);
  require_last_line_error(cli(run + "-n 3 --temp 0 --replay-routing " + rec.string()),
                          "no routing for layer 1 position 3");
}

TEST_CASE("bad input: non-finite weights are named at load, overflowing activations stop the run",
          "[cli][bad-input]") {
  const fs::path s = strata::test::scratch_dir("bad_input_nan");
  const std::string ids = ids_file(s).string();
  {  // A NaN in a bf16 norm weight: named at load (small tensors are always scanned).
    const fs::path d = copy_model("nan_norm");
    const std::string t = "language_model.model.layers.2.input_layernorm.weight";
    auto [shard, off] = locate(d, t);
    poke(shard, off + 2 * 5, {0xC0, 0x7F});  // bf16 NaN at element 5
    const Run r = cli("run -m " + d.string() + " --ids " + ids + " --print-ids -n 2");
    require_one_line_error(r, "tensor " + t + ": NaN at row 0, column 5");
  }
  {  // +Inf in a projection (k3-tiny's are small, so also scanned by default).
    const fs::path d = copy_model("inf_proj");
    const std::string t = "language_model.model.layers.0.self_attn.q_proj.weight";
    auto [shard, off] = locate(d, t);
    poke(shard, off + 2 * 300, {0x80, 0x7F});  // bf16 +Inf at row 1, column 44 (D = 256)
    require_one_line_error(
        cli("logits -m " + d.string() + " --ids " + ids + " -o " + (s / "x.st").string()),
        "tensor " + t + ": Inf at row 1, column 44");
    CHECK_FALSE(fs::exists(s / "x.st"));
  }
  {  // MXFP4 scales whose products overflow fp32: code 0xFD (2^126, a valid scale) times an
    // E2M1 value of 4 or 6 is beyond FLT_MAX. Every expert's down projection in layer 1 (the
    // gate and up projections pass through SiTU's tanh caps, which would hide the overflow).
    // The run stops at the first step, naming the layer and the site, instead of sampling
    // token 0 from NaN logits with exit status 0.
    const fs::path d = copy_model("scale_overflow");
    for (int e = 0; e < 16; ++e) {
      const std::string t = "language_model.model.layers.1.block_sparse_moe.experts." +
                            std::to_string(e) + ".w2.weight_scale";
      auto [shard, off] = locate(d, t);
      poke(shard, off, std::vector<uint8_t>(128 * 3, 0xFD));  // [128, 96/32] scale bytes
    }
    const Run r = cli("run -m " + d.string() + " --ids " + ids + " --print-ids -n 4 --temp 0");
    require_last_line_error(r, "non-finite activation");
    CHECK_THAT(r.out, Catch::Contains("at blk.1.moe_out (position 0"));
    CHECK(r.out.find("\n[") == std::string::npos);  // no ids were printed
  }
}

// --stats-json (issue 18 item 10) is written for every run, not only with the expert store: the
// run's rates, the backend's telemetry object, and the tiers' telemetry when --host-mem is on.
TEST_CASE("run: --stats-json holds the run's rates, and the tiers with --host-mem", "[cli]") {
  const fs::path s = strata::test::scratch_dir("run_stats_json");
  const std::string m = copy_model("stats_model").string(), ids = ids_file(s).string();
  const std::string run = "run -m " + m + " --ids " + ids + " --print-ids -n 4 --device cpu ";
  const Run a = cli(run + "--stats-json " + (s / "a.json").string());
  INFO(a.out);
  REQUIRE(a.status == 0);
  const json ja = json::parse(slurp(s / "a.json"));
  CHECK(ja.at("run").at("prompt_tokens").get<int>() == 3);
  const int gen = ja.at("run").at("generated_tokens").get<int>();  // ≤ 4: EOS may stop it
  CHECK((gen >= 1 && gen <= 4));
  CHECK(ja.at("run").at("decode_steps").get<int>() >= gen - 1);
  CHECK(ja.at("run").at("decode_steps").get<int>() <= gen);
  CHECK(ja.at("run").at("decode_tokens_per_s").get<double>() > 0);
  CHECK(ja.at("run").at("prefill_tokens_per_s").get<double>() > 0);
  CHECK(ja.at("backend").is_object());
  CHECK_FALSE(ja.contains("experts"));
  const Run b = cli(run + "--host-mem 50% --stats-json " + (s / "b.json").string());
  INFO(b.out);
  REQUIRE(b.status == 0);
  const json jb = json::parse(slurp(s / "b.json"));
  CHECK(jb.at("run").at("generated_tokens").get<int>() == gen);  // the same greedy tokens
  CHECK(jb.at("experts").is_object());
}
