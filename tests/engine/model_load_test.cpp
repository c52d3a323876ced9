// Model loading: the loader claims every tensor of the golden checkpoints, rejects a checkpoint
// holding a tensor nobody uses ("expected N tensors, got M") and a K3 A_log whose padding is not
// zero (spec §4.3), naming the tensor; per-sequence state has the sizes of spec §11.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <functional>

#include "engine/model.h"
#include "engine/session.h"
#include "storage/error.h"
#include "storage/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace strata;
using namespace strata::engine;

namespace {

// Copies golden `set` into a scratch dir as one model.safetensors, with `edit` applied to the
// bytes of each tensor and `extra` tensors (F32 [4], zeros) appended.
fs::path copy_model(const std::string& set, const std::string& name,
                    const std::function<void(const TensorInfo&, std::vector<uint8_t>&)>& edit,
                    const std::vector<std::string>& extra) {
  fs::path src = test::golden_dir() / set;
  fs::path dst = test::scratch_dir(name);
  fs::copy_file(src / "config.json", dst / "config.json");
  SafetensorsFile in(src / "model.safetensors");
  std::vector<TensorDecl> decls;
  for (const auto& t : in.tensors()) decls.push_back({t.name, t.dtype, t.shape});
  for (const auto& e : extra) decls.push_back({e, DType::F32, {4}});
  SafetensorsWriter w(dst / "model.safetensors", decls);
  for (const auto& t : in.tensors()) {
    auto b = in.bytes(t);
    std::vector<uint8_t> bytes(b.begin(), b.end());
    edit(t, bytes);
    w.write_tensor(t.name, bytes.data(), bytes.size());
  }
  float zeros[4] = {0, 0, 0, 0};
  for (const auto& e : extra) w.write_tensor(e, zeros, sizeof(zeros));
  w.finish();
  return dst;
}

// Skips (or fails under STRATA_REQUIRE_SHARED=1) without both golden models.
void need_golden() {
  test::need_shared(test::golden_dir() / "k3-tiny" / "model.safetensors");
  test::need_shared(test::golden_dir() / "kimi-linear-tiny" / "model.safetensors");
}

}  // namespace

TEST_CASE("the loader claims every tensor of both golden models", "[engine][load]") {
  need_golden();
  for (const char* set : {"k3-tiny", "kimi-linear-tiny"}) {
    auto m = Model::load(test::golden_dir() / set);
    CHECK(m->checkpoint().num_claimed() == m->checkpoint().num_tensors());
    const ModelConfig& c = m->config();
    // Variant switches come from the config: K3 has AttnRes and latent MoE, Kimi-Linear not.
    CHECK(bool(m->weights().output_res) == c.has_attn_res());
    CHECK(m->weights().layers[1].moe->experts.size() == size_t(c.moe.num_experts));
    // State sizes (spec §11): KDA [H, V, K] fp32 + 3 conv states; MLA cache grows per token.
    Session s(*m);
    const KdaState* k = s.kda_state(0);
    REQUIRE(k != nullptr);
    CHECK(k->S.size() == size_t(c.kda.num_heads * c.kda.head_dim * c.kda.head_dim));
    CHECK(k->conv_q.size() == size_t(c.kda.proj_dim() * (c.kda.conv_kernel - 1)));
    CHECK(s.kda_state(3) == nullptr);
    std::vector<int32_t> ids{5, 6, 7};
    s.forward(ids);
    CHECK(s.mla_cache(3)->len == 3);
    CHECK(s.mla_cache(3)->rows.size() == size_t(3 * c.mla.latent_cache_dim()));
    s.reset();
    CHECK(s.position() == 0);
    CHECK(s.mla_cache(3)->len == 0);
  }
}

TEST_CASE("a checkpoint with an unused tensor is rejected", "[engine][load]") {
  need_golden();
  fs::path d = copy_model("k3-tiny", "load-extra", [](const TensorInfo&, std::vector<uint8_t>&) {},
                          {"language_model.model.layers.0.mystery.weight"});
  CHECK_THROWS_WITH(Model::load(d),
                    Catch::Contains("expected 1002 tensors, got 1003") &&
                        Catch::Contains("language_model.model.layers.0.mystery.weight"));
}

TEST_CASE("K3 A_log with non-zero padding is rejected naming the tensor", "[engine][load]") {
  need_golden();
  const std::string bad = "language_model.model.layers.2.self_attn.A_log";
  fs::path d = copy_model("k3-tiny", "load-alog",
                          [&](const TensorInfo& t, std::vector<uint8_t>& b) {
                            if (t.name != bad) return;
                            float one = 1.0f;
                            std::memcpy(b.data() + 100 * sizeof(float), &one, sizeof(float));
                          },
                          {});
  CHECK_THROWS_WITH(Model::load(d), Catch::Contains(bad) && Catch::Contains("entry 100"));
}
