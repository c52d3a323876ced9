// `strata plan` and `strata bench hw` from the command line: the real K3 config with no weights on
// every reference machine, JSON and SVG output, refusals (exit 1, one reason), bad input (exit 1,
// one line naming the file and field), and a measured profile that plan reads back.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "storage/synth.h"
#include "test_util.h"

using strata::test::run_cli;
namespace fs = std::filesystem;

namespace {

fs::path k3_config() {
  return strata::test::shared_dir() / "configs" / "kimi-k3.config.json";
}
fs::path hw(const char* name) {
  return strata::test::source_dir() / "docs" / "hardware" / name;
}

std::string q(const fs::path& p) {
  return "'" + p.string() + "'";
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("plan: the real K3 config on the reference machines, without weights", "[plan][cli]") {
  strata::test::need_shared(k3_config());
  const auto dir = strata::test::scratch_dir("cmd_plan");
  for (const char* m : {"8xH200-2TB.json", "1xH200-1.5TB-4nvme.json", "4xH100-1TB.json",
                        "4node-2xH100-512GB.json"}) {
    INFO(m);
    const auto r = run_cli("plan --config " + q(k3_config()) + " --hardware " + q(hw(m)) +
                           " --context 32768 --json " + q(dir / "plan.json"));
    CHECK(r.status == 0);
    CHECK(r.out.find("decode ") != std::string::npos);
    CHECK(r.out.find("bottleneck: ") != std::string::npos);
    CHECK(r.out.find("what would help most") != std::string::npos);
    std::ifstream f(dir / "plan.json");
    const auto j = nlohmann::json::parse(f);
    CHECK(j["runnable"] == true);
    CHECK(j["decode"]["tokens_per_s"].get<double>() > 0);
    CHECK(j["placement"]["experts_total"] == 82432);
    CHECK(j["workload"]["context"] == 32768);
  }
  const auto r = run_cli("plan --config " + q(k3_config()) + " --hardware " +
                         q(hw("8xH200-2TB.json")) + " --svg " + q(dir / "chart.svg"));
  CHECK(r.status == 0);
  std::ifstream svg(dir / "chart.svg");
  std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  CHECK(text.rfind("<svg ", 0) == 0);
  CHECK(text.find("</svg>") != std::string::npos);
  CHECK(text.find("8 GPUs per node") != std::string::npos);
  CHECK(text.find("GPU: NVIDIA H200") != std::string::npos);
  CHECK(text.find("<path d=\"M") != std::string::npos);
}

TEST_CASE("plan: Kimi-Linear's bf16 experts on a GPU, as bf16 and quantized at load",
          "[plan][cli]") {
  const fs::path kl = strata::test::shared_dir() / "configs" / "kimi-linear-48b-a3b.config.json";
  strata::test::need_shared(kl);
  const auto dir = strata::test::scratch_dir("cmd_plan_kl");
  const std::string base = "plan --config " + q(kl) + " --hardware " + q(hw("1xH100-64GB.json"));
  const auto bf16 = run_cli(base + " --json " + q(dir / "bf16.json"));
  CHECK(bf16.status == 0);
  CHECK(bf16.out.find("note: the GPU engine") == std::string::npos);  // the engine runs them
  CHECK(bf16.out.find("top-8 bf16") != std::string::npos);
  const auto mx = run_cli(base + " --experts-quantize mxfp4 --json " + q(dir / "mx.json"));
  CHECK(mx.status == 0);
  CHECK(mx.out.find("note: the GPU engine") == std::string::npos);
  CHECK(mx.out.find("top-8 MXFP4") != std::string::npos);
  std::ifstream fb(dir / "bf16.json"), fm(dir / "mx.json");
  const auto jb = nlohmann::json::parse(fb), jm = nlohmann::json::parse(fm);
  // 3 × 2304 × 1024 weights: 14.2 MB in bf16, 3.76 MB in MXFP4 (4.25 bits per weight).
  CHECK(jm["placement"]["expert_bytes"].get<double>() * 3.5 <
        jb["placement"]["expert_bytes"].get<double>());
}

TEST_CASE("plan: machines that cannot run K3 are refused with the reason", "[plan][cli][errors]") {
  strata::test::need_shared(k3_config());
  const auto dir = strata::test::scratch_dir("cmd_plan_refuse");
  {
    std::ofstream(dir / "a100.json") << R"({"format": "strata-hardware-1",
      "gpu": {"count": 8, "name": "NVIDIA A100-SXM4-80GB", "memory": "80GB",
              "hbm_copy_gbps": 1800, "bf16_gemm_tflops": 280},
      "host": {"cores": 64, "dram": "2TB", "mem_read_gbps": 300}})";
    const auto r =
        run_cli("plan --config " + q(k3_config()) + " --hardware " + q(dir / "a100.json"));
    CHECK(r.status == 1);
    CHECK(r.out.find("strata plan: cannot run: GPU 'NVIDIA A100-SXM4-80GB' is sm_80; this build "
                     "targets sm_90") != std::string::npos);
  }
  {
    std::ofstream(dir / "one-h100.json") << R"({"format": "strata-hardware-1",
      "gpu": {"count": 1, "name": "NVIDIA H100 80GB HBM3", "memory": "80GB",
              "hbm_copy_gbps": 2950, "bf16_gemm_tflops": 790},
      "host": {"cores": 64, "dram": "2TB", "mem_read_gbps": 300}})";
    const auto r =
        run_cli("plan --config " + q(k3_config()) + " --hardware " + q(dir / "one-h100.json"));
    CHECK(r.status == 1);
    CHECK(r.out.find("cannot run: GPU memory too small") != std::string::npos);
  }
}

TEST_CASE("plan and bench hw: bad input is one line and exit 1", "[plan][cli][errors]") {
  const auto dir = strata::test::scratch_dir("cmd_plan_bad");
  std::ofstream(dir / "typo.json") << R"({"format": "strata-hardware-1", "host": {"dram_gb": 1}})";
  const fs::path cfg = k3_config();
  std::ofstream(dir / "config.json") << "{}";  // a config that does not parse
  struct Case {
    std::string args, expect;
  };
  const fs::path any_cfg = fs::exists(cfg) ? cfg : dir / "config.json";
  const std::vector<Case> cases = {
      {"plan --hardware " + q(hw("8xH200-2TB.json")), "give the model with -m DIR or --config"},
      {"plan --config " + q(dir / "nope.json"), "nope.json: not found"},
      {"plan -m " + q(dir / "nodir"), "config.json: not found (is "},
      {"plan --config " + q(any_cfg) + " --hardware " + q(dir / "typo.json"),
       fs::exists(cfg) ? "typo.json: host.dram_gb: unknown field" : "config.json"},
      {"plan --config " + q(any_cfg) + " --hardware " + q(dir / "missing.json"),
       fs::exists(cfg) ? "missing.json: cannot open the hardware description" : "config.json"},
      {"plan --config " + q(any_cfg) + " --hardware " + q(hw("8xH200-2TB.json")) +
           " --concurrency 0",
       fs::exists(cfg) ? "--concurrency: expected ≥ 1" : "config.json"},
      {"plan --config " + q(any_cfg) + " --hardware " + q(hw("8xH200-2TB.json")) + " --backend tpu",
       fs::exists(cfg) ? "--backend 'tpu': expected auto, gpu, cpu-reference or cpu-bf16"
                       : "config.json"},
      {"plan --config " + q(any_cfg) + " --hardware " + q(hw("8xH200-2TB.json")) +
           " --experts-quantize mxfp4",
       fs::exists(cfg) ? "the routed experts are already MXFP4" : "config.json"},
      {"plan --config " + q(any_cfg) + " --hardware " + q(hw("8xH200-2TB.json")) +
           " --experts-quantize fp8",
       fs::exists(cfg) ? "--experts-quantize: expected mxfp4, got 'fp8'" : "config.json"},
      // Output files are checked before the plan is printed (the report used to come first).
      {"plan --config " + q(any_cfg) + " --hardware " + q(hw("8xH200-2TB.json")) + " --svg " +
           q(dir / "no" / "x.svg"),
       "--svg"},
      {"plan --config " + q(any_cfg) + " --hardware " + q(hw("8xH200-2TB.json")) + " --json " +
           q(dir),
       "--json"},
      {"plan --config " + q(any_cfg) + " --hardware " + q(hw("8xH200-2TB.json")) + " --json " +
           q(dir / "p.json") + " --svg " + q(dir / "p.json"),
       "another output option writes the same file"},
  };
  for (const Case& c : cases) {
    INFO(c.args);
    const auto r = run_cli(c.args);
    CHECK(r.status == 1);
    CHECK(r.out.find(c.expect) != std::string::npos);
    CHECK(count_lines(r.out) == 1);
  }
}

TEST_CASE("bench hw --quick saves a profile that plan reads, and never replaces one unasked",
          "[plan][cli]") {
  const auto dir = strata::test::scratch_dir("cmd_bench_hw");
  const auto r = run_cli("bench hw --quick --no-disk --save " + q(dir / "hw.json"));
  REQUIRE(r.status == 0);
  CHECK(r.out.find("hw/host memory read (peak)") != std::string::npos);
  CHECK(r.out.find("hw/cpu reference trunk M=1") != std::string::npos);
  CHECK(r.out.find("not measured: disk read: skipped") != std::string::npos);
  std::ifstream f(dir / "hw.json");
  const auto j = nlohmann::json::parse(f);
  CHECK(j["format"] == "strata-hardware-1");
  CHECK(j["host"]["mem_read_gbps"]["value"].get<double>() > 0);
  CHECK(j["kernels"]["cpu_trunk_ref"]["points"].size() == 2);
  CHECK(!j["disk"].contains("read_gbps"));  // not measured: absent, not 0
  const auto again = run_cli("bench hw --quick --no-disk --save " + q(dir / "hw.json"));
  CHECK(again.status == 1);
  CHECK(again.out.find("hw.json: exists; not replacing it") != std::string::npos);
  // The profile plans a small model on the CPU reference backend.
  const auto ck = dir / "k3-tiny";
  REQUIRE(run_cli("synth --preset k3-tiny -q -o " + q(ck)).status == 0);
  const auto p = run_cli("plan -m " + q(ck) + " --hardware " + q(dir / "hw.json") +
                         " --context 64 --prompt-len 16");
  CHECK(p.status == 0);
  CHECK(p.out.find("backend:   cpu-reference") != std::string::npos);
}

TEST_CASE("plan --bench-e2e predicts bench e2e's lines: its placements, its protocol",
          "[plan][cli]") {
  // The validation slice's config alone (`-m DIR` reads DIR/config.json; no weights).
  const auto dir = strata::test::scratch_dir("cmd_plan_e2e");
  const fs::path model = dir / "k3-slice8";
  fs::create_directories(model);
  strata::SynthOptions so;
  so.preset = "k3-slice";
  so.layers = 8;
  so.experts = 64;
  std::ofstream(model / "config.json") << strata::synth_config_json(so);
  const fs::path h200 = hw("h200-measured.json");
  const auto r = run_cli("plan -m " + q(model) + " --hardware " + q(h200) +
                         " --bench-e2e --device gpu --batch 1 8 --prefill 1024 --context 256 "
                         "--steps 16 --json " +
                         q(dir / "e2e.json"));
  REQUIRE(r.status == 0);
  std::ifstream f(dir / "e2e.json");
  const auto j = nlohmann::json::parse(f);
  CHECK(j["predicts"] == "bench e2e");
  CHECK(j["mean_context"] == 256 + 4 + 8);  // bench e2e: context, 4 warm-up steps, steps/2
  CHECK(j["prefill_chunk"] == 512);         // the engine's default step rows
  const auto& lines = j["lines"];
  REQUIRE(lines.size() == 4 * 3);  // 4 GPU placements × (decode B=1, B=8, prefill 1024)
  std::map<std::string, double> tps;
  for (const auto& l : lines)
    tps[l["placement"].get<std::string>() + "|" + l["measure"].get<std::string>()] =
        l["predicted_tokens_per_s"].get<double>();
  for (const char* p : {"all GPU", "10% GPU + host", "10% GPU + 30% host + disk", "all host"})
    for (const char* m : {"decode B=1", "decode B=8", "prefill 1024"}) {
      INFO(p << " " << m);
      CHECK(tps.count(std::string(p) + "|" + m) == 1);
    }
  // The engine caches whole experts per layer: 10% of 64 is 6, a share of 0.09375.
  for (const auto& l : lines)
    if (l["placement"] == "10% GPU + host") CHECK(l["share"]["gpu"].get<double>() == 0.09375);
  // Cached experts beat the CPU, memory beats the disk; 8 sequences beat 1 in total.
  CHECK(tps["all GPU|decode B=1"] > tps["10% GPU + host|decode B=1"]);
  CHECK(tps["10% GPU + host|decode B=1"] > tps["all host|decode B=1"]);
  CHECK(tps["all host|decode B=1"] > 10 * tps["10% GPU + 30% host + disk|decode B=1"]);
  CHECK(tps["all GPU|decode B=8"] > tps["all GPU|decode B=1"]);
  // An assumption replaced on the command line moves the prediction: slower small kernels.
  const auto slow = run_cli("plan -m " + q(model) + " --hardware " + q(h200) +
                            " --bench-e2e --device gpu --placements 'all GPU' --batch 1 "
                            "--prefill 512 --assume gpu_kernel_us=30 --json " +
                            q(dir / "slow.json"));
  REQUIRE(slow.status == 0);
  std::ifstream fs2(dir / "slow.json");
  const auto js = nlohmann::json::parse(fs2);
  REQUIRE(js["lines"].size() == 2);
  CHECK(js["lines"][0]["predicted_tokens_per_s"].get<double>() < tps["all GPU|decode B=1"] * 0.8);
  // The CPU reference backend gets bench e2e's CPU placements.
  const auto cpu = run_cli("plan -m " + q(model) + " --hardware " + q(h200) +
                           " --bench-e2e --device cpu-ref --batch 1 --prefill 64");
  CHECK(cpu.status == 0);
  CHECK(cpu.out.find("30% host + disk") != std::string::npos);
  CHECK(cpu.out.find("all GPU") == std::string::npos);
  // Bad input: one line, exit 1, before any output.
  for (const char* bad : {"--assume nope=1", "--assume gpu_sync_us=x", "--device tpu",
                          "--placements 'half GPU'", "--batch 0"}) {
    INFO(bad);
    const auto e =
        run_cli("plan -m " + q(model) + " --hardware " + q(h200) + " --bench-e2e " + bad);
    CHECK(e.status == 1);
    CHECK(count_lines(e.out) == 1);
  }
}
