// Checkpoint: the golden models load with every tensor claimed by model_tensor_specs, the expert
// index merges each expert into one span, and every malformed-directory class (path traversal in
// the index, shard/index disagreement, NaN scales, wrong shapes, unclaimed tensors) is reported
// naming the file or tensor.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "storage/checkpoint.h"
#include "storage/error.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Skips the case (or fails it under STRATA_REQUIRE_SHARED=1) without the golden model `name`.
void need_golden(const char* name) {
  test::need_shared(test::golden_dir() / name / "model.safetensors");
}

std::string open_error(const fs::path& dir, CheckpointOptions opt = {}) {
  try {
    Checkpoint ck(dir, opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// A copy of golden k3-tiny as one shard behind an index (name chosen by the caller).
fs::path indexed_copy(const std::string& scratch, const std::string& shard_name_in_index) {
  const fs::path dir = test::scratch_dir(scratch);
  const fs::path g = test::golden_dir() / "k3-tiny";
  fs::copy_file(g / "config.json", dir / "config.json");
  fs::copy_file(g / "model.safetensors", dir / "shard-1.safetensors");
  Checkpoint ck(g, {.validate_expert_scales = false});
  json wm = json::object();
  for (const TensorInfo* t : ck.tensors()) wm[t->name] = shard_name_in_index;
  write_text(dir / "model.safetensors.index.json",
             json{{"metadata", {{"total_size", 0}}}, {"weight_map", wm}}.dump());
  return dir;
}

}  // namespace

TEST_CASE("golden k3-tiny: every tensor claimed by the config's specs, and expert spans",
          "[checkpoint][golden]") {
  need_golden("k3-tiny");
  Checkpoint ck(test::golden_dir() / "k3-tiny");
  const ModelConfig& c = ck.config();
  CHECK(ck.num_files() == 1);
  CHECK(ck.num_tensors() == 1002);
  CHECK(model_tensor_specs(c).size() == 1002);
  ck.claim_all_specs();
  CHECK(ck.num_claimed() == 1002);
  CHECK_NOTHROW(ck.check_all_claimed());
  CHECK(ck.total_file_bytes() ==
        fs::file_size(test::golden_dir() / "k3-tiny" / "model.safetensors"));
  CHECK_FALSE(ck.has_experts(0));
  for (int l = 1; l < c.num_layers; ++l) {
    REQUIRE(ck.has_experts(l));
    for (int e = 0; e < c.moe.num_experts; ++e) {
      const ExpertTensors& x = ck.expert(l, e);
      // w1/w3 [96, 64] + [96, 4], w2 [128, 48] + [128, 3] U8.
      CHECK(x.nbytes == 2 * (96 * 64 + 96 * 4) + 128 * 48 + 128 * 3);
      CHECK(x.w1.weight->name == expert_tensor_name(c, l, e, "w1.weight_packed"));
      CHECK(x.w2.scale->shape == std::vector<int64_t>{128, 3});
      // The golden writer stores tensors in name order, so each expert is one contiguous span.
      REQUIRE(x.spans.size() == 1);
      CHECK(x.spans[0].nbytes == x.nbytes);
      CHECK(x.spans[0].offset == x.w1.weight->offset);
    }
  }
  // load_f32 widens exactly and checks the shape.
  const auto alog = ck.load_f32(c.layer_prefix(0) + "self_attn.A_log", {128});
  for (int i = 2; i < 128; ++i) CHECK(alog[i] == 0.0f);  // zero padding beyond the 2 heads
  CHECK_THROWS_WITH(ck.load_f32(c.layer_prefix(0) + "self_attn.A_log", {2}),
                    Catch::Contains("self_attn.A_log: expected shape [2], got [128]"));
  CHECK_THROWS_WITH(ck.load_f32(expert_tensor_name(c, 1, 0, "w1.weight_scale"), {96, 4}),
                    Catch::Contains("expected a floating-point tensor (BF16, F16, F32), got U8"));
}

TEST_CASE("golden kimi-linear-tiny: bf16 experts, per-head A_log, all claimed",
          "[checkpoint][golden]") {
  need_golden("kimi-linear-tiny");
  Checkpoint ck(test::golden_dir() / "kimi-linear-tiny");
  const ModelConfig& c = ck.config();
  CHECK(c.moe.router_form == RouterWeightForm::bias_in_place);
  CHECK(ck.num_tensors() == 493);
  ck.claim_all_specs();
  CHECK_NOTHROW(ck.check_all_claimed());
  const ExpertTensors& x = ck.expert(3, 15);
  CHECK(x.w1.scale == nullptr);
  CHECK(x.w1.weight->dtype == DType::BF16);
  CHECK(x.nbytes == 3 * 96 * 256 * 2);
  CHECK(x.spans.size() == 1);
  CHECK(ck.get(c.layer_prefix(0) + "self_attn.A_log").shape == std::vector<int64_t>{1, 1, 2, 1});
}

TEST_CASE("claims: unclaimed tensors are listed, and get() checks dtype and shape",
          "[checkpoint][errors]") {
  need_golden("k3-tiny");
  const fs::path dir = test::golden_dir() / "k3-tiny";
  Checkpoint ck(dir, {.validate_expert_scales = false});
  ck.claim("language_model.model.norm.weight");
  ck.claim("language_model.model.norm.weight");  // claiming twice counts once
  CHECK(ck.num_claimed() == 1);
  CHECK_THROWS_WITH(ck.check_all_claimed(),
                    Catch::StartsWith("checkpoint " + dir.string() +
                                      ": expected 1 tensors, got 1002; unclaimed: "
                                      "language_model.lm_head.weight, "));
  CHECK_THROWS_WITH(ck.get("language_model.model.nope"),
                    "checkpoint " + dir.string() + ": missing tensor language_model.model.nope");
  CHECK_THROWS_WITH(ck.get("language_model.model.norm.weight", DType::F32, {256}),
                    Catch::Contains("tensor language_model.model.norm.weight: expected F32 [256], "
                                    "got BF16 [256] (in model.safetensors)"));
  CHECK_THROWS_WITH(ck.claim("language_model.model.norm.weight", DType::BF16, {255}),
                    Catch::Contains("expected BF16 [255], got BF16 [256]"));
}

TEST_CASE("a checkpoint whose tensors disagree with its config is rejected",
          "[checkpoint][errors]") {
  need_golden("k3-tiny");
  const fs::path dir = test::scratch_dir("ck_wrong_shape");
  fs::copy_file(test::golden_dir() / "k3-tiny" / "model.safetensors", dir / "model.safetensors");
  std::ifstream in(test::golden_dir() / "k3-tiny" / "config.json");
  json cfg = json::parse(in);
  cfg["text_config"]["moe_intermediate_size"] = 64;  // experts in the file are 96 wide
  write_text(dir / "config.json", cfg.dump());
  CHECK_THAT(open_error(dir),
             Catch::Contains("checkpoint " + dir.string() +
                             ": tensor language_model.model.layers.1."
                             "block_sparse_moe.shared_experts.gate_proj.weight: expected BF16 "
                             "[128, 256], got BF16 [192, 256]"));
  cfg["text_config"]["moe_intermediate_size"] = 96;
  cfg["text_config"]["num_experts"] = 17;  // one expert more than stored
  cfg["text_config"]["quantization_config"]["format"] = "mxfp4-pack-quantized";
  write_text(dir / "config.json", cfg.dump());
  CHECK_THAT(open_error(dir), Catch::Contains("tensor language_model.model.layers.1.block_sparse_"
                                              "moe.gate.weight: expected BF16 [17, 256]"));
  // Shape validation off: the expert index still names the first missing tensor.
  CHECK_THAT(open_error(dir, {.validate_expert_scales = true, .validate_shapes = false}),
             Catch::Contains("missing tensor language_model.model.layers.1.block_sparse_moe."
                             "experts.16.w1.weight_packed"));
}

TEST_CASE("NaN (0xFF) expert scale is an error naming the tensor", "[checkpoint][errors]") {
  need_golden("k3-tiny");
  const fs::path dir = test::scratch_dir("ck_nan_scale");
  fs::copy_file(test::golden_dir() / "k3-tiny" / "config.json", dir / "config.json");
  fs::copy_file(test::golden_dir() / "k3-tiny" / "model.safetensors", dir / "model.safetensors");
  uint64_t off = 0;
  const std::string name =
      "language_model.model.layers.5.block_sparse_moe.experts.9.w2.weight_scale";
  {
    Checkpoint ck(dir);
    off = ck.get(name).offset + 2 * 3 + 1;  // row 2, block 1 of [128, 3]
  }
  {
    std::fstream f(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(off));
    f.put(char(0xFF));
  }
  CHECK(open_error(dir) == "checkpoint " + dir.string() + ": tensor " + name +
                               ": scale byte 0xFF (NaN) at row 2, block 1 (E8M0 0xFF is not a "
                               "valid weight scale)");
  // Validation can be turned off (then asked for one expert explicitly).
  Checkpoint ck(dir, {.validate_expert_scales = false});
  CHECK_NOTHROW(ck.validate_expert_scales(5, 8));
  CHECK_THROWS_WITH(ck.validate_expert_scales(5, 9), Catch::Contains("row 2, block 1"));
}

TEST_CASE("sharded index: shard names may not escape the directory", "[checkpoint][errors]") {
  need_golden("k3-tiny");
  SECTION("a plain shard name works") {
    const fs::path dir = indexed_copy("ck_index_ok", "shard-1.safetensors");
    Checkpoint ck(dir);
    CHECK(ck.num_files() == 1);
    CHECK(ck.file_path(0) == dir / "shard-1.safetensors");
    CHECK(ck.file_fd(0) >= 0);
  }
  SECTION("\"..\" in a shard name") {
    const fs::path dir = indexed_copy("ck_index_dotdot", "../ck_index_dotdot/shard-1.safetensors");
    CHECK_THAT(open_error(dir),
               Catch::Contains("model.safetensors.index.json: shard \"../ck_index_dotdot/"
                               "shard-1.safetensors\" contains \"..\""));
  }
  SECTION("absolute shard name") {
    const fs::path dir = indexed_copy("ck_index_abs", "/etc/passwd");
    CHECK_THAT(open_error(dir), Catch::Contains("shard \"/etc/passwd\" is an absolute path"));
  }
  SECTION("symlink pointing out of the directory") {
    const fs::path dir = indexed_copy("ck_index_symlink", "link.safetensors");
    const fs::path outside = test::scratch_dir("ck_index_symlink_target") / "x.safetensors";
    fs::copy_file(dir / "shard-1.safetensors", outside);
    fs::create_symlink(outside, dir / "link.safetensors");
    CHECK_THAT(open_error(dir), Catch::Contains("shard \"link.safetensors\" resolves (through a "
                                                "symlink) to " +
                                                outside.string() + ", outside the directory"));
  }
  SECTION("missing shard") {
    const fs::path dir = indexed_copy("ck_index_missing", "shard-2.safetensors");
    CHECK_THAT(open_error(dir), Catch::Contains("shard \"shard-2.safetensors\": cannot open"));
  }
  SECTION("index and shard disagree") {
    const fs::path dir = indexed_copy("ck_index_disagree", "shard-1.safetensors");
    std::ifstream in(dir / "model.safetensors.index.json");
    json j = json::parse(in);
    in.close();
    j["weight_map"].erase("language_model.model.norm.weight");
    j["weight_map"]["language_model.model.ghost"] = "shard-1.safetensors";
    write_text(dir / "model.safetensors.index.json", j.dump());
    CHECK_THAT(open_error(dir), Catch::Contains("tensor language_model.model.ghost is mapped to "
                                                "shard-1.safetensors, which has no such tensor"));
    j["weight_map"].erase("language_model.model.ghost");
    write_text(dir / "model.safetensors.index.json", j.dump());
    CHECK_THAT(open_error(dir), Catch::Contains("tensor language_model.model.norm.weight is not "
                                                "listed in model.safetensors.index.json"));
  }
  SECTION("index that is not JSON") {
    const fs::path dir = indexed_copy("ck_index_badjson", "shard-1.safetensors");
    write_text(dir / "model.safetensors.index.json", "{\"weight_map\": [");
    CHECK_THAT(open_error(dir), Catch::Contains("model.safetensors.index.json: invalid JSON"));
  }
}

TEST_CASE("missing directory, config or weights", "[checkpoint][errors]") {
  const fs::path dir = test::scratch_dir("ck_empty");
  CHECK(open_error(dir / "nope") ==
        "checkpoint " + (dir / "nope").string() + ": not a directory (expected a model directory)");
  CHECK(open_error(dir) == "checkpoint " + dir.string() + ": missing config.json");
  // Any valid config will do: synth's k3-tiny needs nothing from ../shared.
  SynthOptions k3tiny;
  k3tiny.preset = "k3-tiny";
  write_text(dir / "config.json", synth_config_json(k3tiny));
  CHECK(open_error(dir) ==
        "checkpoint " + dir.string() + ": no model.safetensors or model.safetensors.index.json");
}
