// HardwareProfile JSON: every reference description in docs/hardware parses; a profile survives
// save → load; bad files give one line naming the file and the field; unknown = "not measured".
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "offload/cost_model.h"
#include "offload/hardware.h"
#include "storage/error.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
using namespace strata::offload;
using nlohmann::json;

namespace {

std::string parse_error(const std::string& text) {
  try {
    hardware_from_json(json::parse(text), "hw.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the reference hardware descriptions parse", "[hardware]") {
  int n = 0;
  for (auto& f : std::filesystem::directory_iterator(test::source_dir() / "docs" / "hardware")) {
    if (f.path().extension() != ".json") continue;
    INFO(f.path().string());
    const HardwareProfile hw = load_hardware(f.path());
    CHECK(hw.host.dram_bytes > 0);
    CHECK(hw.host.mem_read_gbps.known());
    CHECK(!hw.host.mem_read_gbps.source().empty());
    if (hw.gpu.count > 0) {
      CHECK(hw.gpu.compute_capability == 90);
      CHECK(hw.gpu.memory_bytes > 0);
      // The GPU's rates measured or stated together, or none: a host-only profile (`bench hw
      // --no-gpu` on a GPU machine, e.g. h200-k3mini-hw-1207.json) states the GPU it saw, and a
      // GPU plan from it is refused by name (checked below).
      CHECK(hw.gpu.hbm_copy_gbps.known() == hw.gpu.bf16_gemm_tflops.known());
    }
    ++n;
  }
  CHECK(n >= 5);
  const HardwareProfile a = load_hardware(test::source_dir() / "docs/hardware/8xH200-2TB.json");
  CHECK(a.gpu.count == 8);
  CHECK(a.host.dram_bytes == 2000000000000ull);
  CHECK(a.host.amx);
  CHECK(a.disk.total_read_gbps().value() == Approx(52));
  CHECK(a.kernels.gpu_expert.points.size() == 5);
  CHECK(!a.kernels.cpu_expert.known());  // not stated: the cost model assumes, and says so
  // A host-only profile of a GPU machine plans the CPU backends and refuses the GPU trunk.
  const auto host_only = test::source_dir() / "docs/hardware/h200-k3mini-hw-1207.json";
  const HardwareProfile h = load_hardware(host_only);
  REQUIRE(h.gpu.count == 1);
  CHECK(!h.gpu.hbm_copy_gbps.known());
  SynthOptions so;
  so.preset = "k3-mini";
  const ModelConfig mini = parse_config(synth_config_json(so), "k3-mini");
  CostOptions cpu;
  cpu.trunk = TrunkBackend::cpu_bf16;
  CHECK(CostModel(h, mini, cpu).decode_step(Placement{0, 1, 0}, 1, 80).tokens_per_s > 0);
  CostOptions gpu;
  gpu.trunk = TrunkBackend::gpu;
  try {
    CostModel(h, mini, gpu);
    FAIL("a GPU plan from a host-only profile was accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("h200-k3mini-hw-1207.json: gpu.hbm_copy_gbps") !=
          std::string::npos);
  }
}

TEST_CASE("a profile survives save and load, and save never replaces a file unasked",
          "[hardware]") {
  HardwareProfile hw;
  hw.description = "round trip";
  hw.nodes = 2;
  hw.network_gbps = Rate(50, "IB NDR");
  hw.gpu.count = 2;
  hw.gpu.name = "NVIDIA H100 80GB HBM3";
  hw.gpu.compute_capability = 90;
  hw.gpu.memory_bytes = 85520809984ull;
  hw.gpu.h2d_gbps = Rate(53.5, "measured: x");
  hw.host.cores = 56;
  hw.host.avx512 = hw.host.avx2 = hw.host.amx = true;
  hw.host.dram_bytes = 512ull << 30;
  hw.host.mem_read_gbps = Rate(240);
  hw.disk.count = 2;
  hw.disk.read_gbps = Rate(6.5);
  hw.kernels.cpu_expert.points = {{1, 200}, {16, 40}};
  hw.kernels.cpu_expert.source = "measured";
  hw.kernels.cpu_expert_small.points = {{1, 90}, {4, 30}, {16, 9}};
  hw.kernels.cpu_expert_small.source = "measured: small";
  hw.not_measured = {"GPU peer bandwidth"};
  const auto dir = test::scratch_dir("hardware_roundtrip");
  const auto file = dir / "hw.json";
  save_hardware(hw, file, false);
  const HardwareProfile b = load_hardware(file);
  CHECK(b.nodes == 2);
  CHECK(b.network_gbps.value() == 50);
  CHECK(b.network_gbps.source() == "IB NDR");
  CHECK(b.gpu.name == hw.gpu.name);
  CHECK(b.gpu.compute_capability == 90);
  CHECK(b.gpu.memory_bytes == hw.gpu.memory_bytes);
  CHECK(b.gpu.h2d_gbps.value() == 53.5);
  CHECK(!b.gpu.hbm_copy_gbps.known());  // not measured stays not measured, never 0
  CHECK(!b.gpu.d2h_gbps.known());
  CHECK(b.host.amx);
  CHECK(!b.host.avx512_bf16);
  CHECK(b.host.dram_bytes == hw.host.dram_bytes);
  CHECK(b.disk.total_read_gbps().value() == 13);
  REQUIRE(b.kernels.cpu_expert.points.size() == 2);
  CHECK(b.kernels.cpu_expert.points[1].tokens == 16);
  CHECK(b.kernels.cpu_expert.points[1].gbps == 40);
  REQUIRE(b.kernels.cpu_expert_small.points.size() == 3);
  CHECK(b.kernels.cpu_expert_small.points[2].tokens == 16);
  CHECK(b.kernels.cpu_expert_small.points[2].gbps == 9);
  CHECK(b.kernels.cpu_expert_small.source == "measured: small");
  CHECK(b.not_measured == hw.not_measured);
  try {
    save_hardware(hw, file, false);
    FAIL("replaced an existing file");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("exists; not replacing it") != std::string::npos);
  }
  save_hardware(hw, file, true);
}

TEST_CASE("bad hardware files give one line naming file and field", "[hardware][errors]") {
  CHECK(parse_error(R"({"gpu": {}})") ==
        "hw.json: format: missing; expected \"strata-hardware-1\"");
  CHECK(parse_error(R"({"format": "other"})") ==
        "hw.json: format: expected \"strata-hardware-1\", got \"other\"");
  CHECK(parse_error(R"({"format": "strata-hardware-1", "gpu": {"cuont": 2}})")
            .rfind("hw.json: gpu.cuont: unknown field (expected one of: count, name", 0) == 0);
  CHECK(parse_error(R"({"format": "strata-hardware-1", "host": {"mem_read_gbps": -3}})") ==
        "hw.json: host.mem_read_gbps: expected a positive number, got -3");
  CHECK(parse_error(R"({"format": "strata-hardware-1", "host": {"mem_read_gbps": "fast"}})") ==
        "hw.json: host.mem_read_gbps: expected a number");
  CHECK(parse_error(R"({"format": "strata-hardware-1", "host": {"dram": "lots"}})") ==
        "hw.json: host.dram: 'lots': expected a size such as 141GB, 1.5TB, 512GiB or 80e9 "
        "(bytes)");
  CHECK(parse_error(R"({"format": "strata-hardware-1", "host": {"isa": ["sse9"]}})") ==
        "hw.json: host.isa: unknown ISA \"sse9\" (expected avx2, avx512, avx512_vnni, "
        "avx512_bf16, amx)");
  CHECK(parse_error(R"({"format": "strata-hardware-1", "gpu": {"compute_capability": "nine"}})") ==
        "hw.json: gpu.compute_capability: expected \"major.minor\" such as \"9.0\", got \"nine\"");
  CHECK(parse_error(R"({"format": "strata-hardware-1", "gpu": {"count": 1.5}})") ==
        "hw.json: gpu.count: expected an integer ≥ 0");
  CHECK(parse_error(R"({"format": "strata-hardware-1", "kernels": {"cpu_expert":
        [{"tokens": 4, "gbps": 1}, {"tokens": 2, "gbps": 1}]}})") ==
        "hw.json: kernels.cpu_expert[1].tokens: points must be sorted by increasing tokens");
  CHECK(parse_error(R"({"format": "strata-hardware-1", "disk": {"read_gbps": {"value": 0}}})") ==
        "hw.json: disk.read_gbps.value: expected a positive number, got 0");
  CHECK(parse_error(R"([1, 2])") == "hw.json: (top level): expected an object");
  // Files: not there, not JSON.
  const auto dir = test::scratch_dir("hardware_bad");
  try {
    load_hardware(dir / "none.json");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          (dir / "none.json").string() + ": cannot open the hardware description");
  }
  std::ofstream(dir / "bad.json") << "{\"format\": ";
  try {
    load_hardware(dir / "bad.json");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).rfind((dir / "bad.json").string() + ": not valid JSON: ", 0) == 0);
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
  }
}

TEST_CASE("sizes, GPU generations and the sm_90 rule", "[hardware]") {
  CHECK(parse_size_bytes("141GB") == 141000000000ull);
  CHECK(parse_size_bytes("1.5TB") == 1500000000000ull);
  CHECK(parse_size_bytes("512 GiB") == 512ull << 30);
  CHECK(parse_size_bytes("80e9") == 80000000000ull);
  CHECK_THROWS_AS(parse_size_bytes("12XB"), Error);
  CHECK_THROWS_AS(parse_size_bytes("-1GB"), Error);
  CHECK(compute_capability_of("H100-80GB") == 90);
  CHECK(compute_capability_of("NVIDIA GH200 480GB") == 90);
  CHECK(compute_capability_of("NVIDIA A100-SXM4-80GB") == 80);
  CHECK(compute_capability_of("NVIDIA GeForce RTX 4090") == 89);
  CHECK(compute_capability_of("NVIDIA B200") == 100);
  CHECK(compute_capability_of("Mystery Accelerator") == 0);
  GpuSpec g;
  g.count = 1;
  g.name = "NVIDIA A100";
  g.compute_capability = 80;
  CHECK(gpu_unsupported_reason(g) ==
        "GPU 'NVIDIA A100' is sm_80; this build targets sm_90 (H100/H200/GH200) only (sm_90a "
        "kernels: wgmma, TMA)");
  g.compute_capability = 90;
  CHECK(gpu_unsupported_reason(g).empty());
  g.compute_capability = 0;
  CHECK(gpu_unsupported_reason(g).find("compute capability unknown") != std::string::npos);
}

TEST_CASE("model-shape rates survive save and load, and their errors name the field",
          "[hardware]") {
  HardwareProfile hw;
  hw.description = "model shapes";
  hw.host.cores = 2;
  ModelShapeRates& ms = hw.model_shapes;
  ms.signature = "D1024 | KeKe";
  ms.model = "/tmp/k3-mini: test";
  ms.threads = 2;
  ms.context = 80;
  ms.trunk = {{{1, 20}, {8, 12}, {256, 3}}, "measured: trunk"};
  ms.linear_call_us = Rate(3.5, "measured: call");
  ms.expert = {{{1, 5}, {16, 2}}, "measured: expert"};
  ms.kda_decode_gbps = {{{1, 40}, {8, 60}}, "measured: kda"};
  ms.kda_prefill_gflops = {{{256, 90}}, "measured: kda prefill"};
  ms.mla_decode_gflops = {{{1, 10}, {8, 30}}, "measured: mla"};
  ms.mla_prefill_gflops = {{{256, 100}, {1024, 150}}, "measured: mla prefill"};
  ms.row_ops_ns = {{{1, 9000}, {256, 3000}}, "measured: rows"};
  ms.step_factor = {{{1, 1.1}, {1024, 1.25}}, "measured: step"};
  const json j = to_json(hw);
  // Weight-byte curves in "gbps", the others (FLOP rates, times) in "value".
  CHECK(j.at("model_shapes").at("trunk").at("points").at(0).contains("gbps"));
  CHECK(j.at("model_shapes").at("row_ops_ns").at("points").at(0).at("value") == 9000);
  const auto dir = test::scratch_dir("hardware_model_shapes");
  save_hardware(hw, dir / "hw.json", true);
  const HardwareProfile b = load_hardware(dir / "hw.json");
  const ModelShapeRates& m = b.model_shapes;
  REQUIRE(m.known());
  CHECK(m.signature == ms.signature);
  CHECK(m.model == ms.model);
  CHECK(m.threads == 2);
  CHECK(m.context == 80);
  REQUIRE(m.trunk.points.size() == 3);
  CHECK(m.trunk.points[2].tokens == 256);
  CHECK(m.trunk.points[2].gbps == 3);
  CHECK(m.trunk.source == "measured: trunk");
  CHECK(m.linear_call_us.value() == 3.5);
  CHECK(m.expert.points[1].gbps == 2);
  CHECK(m.kda_decode_gbps.points[1].gbps == 60);
  CHECK(m.kda_prefill_gflops.points[0].tokens == 256);
  CHECK(m.mla_decode_gflops.points[0].gbps == 10);
  CHECK(m.mla_prefill_gflops.points[1].gbps == 150);
  CHECK(m.row_ops_ns.source == "measured: rows");
  // value_at: linear between points, clamped outside.
  CHECK(m.row_ops_ns.value_at(1) == 9000);
  CHECK(m.row_ops_ns.value_at(128.5) == Approx(6000));
  CHECK(m.row_ops_ns.value_at(4096) == 3000);
  CHECK(m.step_factor.source == "measured: step");
  CHECK(m.step_factor.value_at(1024) == 1.25);
  // A profile without them has none (not measured), and merge keeps one model's block whole.
  CHECK(!hardware_from_json(json{{"format", "strata-hardware-1"}}, "x").model_shapes.known());
  HardwareProfile empty;
  CHECK(merge(empty, b).model_shapes.signature == ms.signature);
  HardwareProfile other = b;
  other.model_shapes.signature = "other";
  CHECK(merge(other, b).model_shapes.signature == "other");
  // Errors: one line naming the field.
  CHECK(parse_error(R"({"format": "strata-hardware-1", "model_shapes": {"model": "x"}})") ==
        "hw.json: model_shapes.signature: missing: the model's shape signature (bench hw -m)");
  CHECK(parse_error(R"({"format": "strata-hardware-1", "model_shapes": {"signature": "s",
        "trunc": []}})")
            .rfind("hw.json: model_shapes.trunc: unknown field (expected one of: signature", 0) ==
        0);
  CHECK(parse_error(R"({"format": "strata-hardware-1", "model_shapes": {"signature": "s",
        "row_ops_ns": [{"tokens": 1, "gbps": 3}]}})") ==
        "hw.json: model_shapes.row_ops_ns[0].gbps: unknown field (expected one of: tokens, value)");
}
