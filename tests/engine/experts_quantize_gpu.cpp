// Kimi-Linear on the CUDA backend through --experts-quantize mxfp4 (issue 18 item 11): a slice at
// Kimi-Linear-48B-A3B's real widths (../shared/configs/kimi-linear-48b-a3b.config.json; 5 layers:
// dense KDA layer 0, KDA MoE layers 1-2, MLA MoE layers 3-4; 16 experts per layer, top-8; a 4096
// vocabulary) whose bf16 routed experts are quantized to MXFP4 at load. The checks of
// tests/engine/cuda_backend_checks.h against the CPU bf16 + contract reference on the same
// quantized model: layer by layer on the same input, end to end with replayed routing, placement
// invariance bit for bit (the disk placement is not run: the disk tier serves the checkpoint's
// bf16 experts, so --host-mem is refused with --experts-quantize), CUDA graphs against eager
// launches. And without quantization the backend refuses the bf16 experts in one line.
#include <catch2/catch.hpp>

#include <filesystem>

#include "cuda_backend_checks.h"
#include "gpu_test.h"
#include "storage/error.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
using namespace strata::engine;
using namespace strata::test::cuda_checks;

// Tolerances: those of the K3 checks (tests/engine/cuda_backend_gpu.cpp and _e2e_gpu.cpp), whose
// sources of difference are the same here — bf16 rounding points on both sides, GEMM and KDA/MLA
// reductions in other orders, the contract's int8 activation levels moving with a one-ulp input
// change — at Kimi-Linear's widths (hidden 2304, 32 heads: narrower than K3's 7168) and without
// AttnRes mixes: 3e-2 per layer, 0.15 end to end over 17 steps.
TEST_CASE("cuda backend: Kimi-Linear slice with experts quantized at load matches the CPU",
          "[gpu][engine][quantize]") {
  test::skip_without_gpu();
  const std::filesystem::path cfg =
      test::shared_dir() / "configs" / "kimi-linear-48b-a3b.config.json";
  test::need_shared(cfg);
  const std::filesystem::path dir = test::scratch_dir("gpu_kimi_linear_slice");
  SynthOptions o;
  o.config_path = cfg;
  o.layers = 5;
  o.experts = 16;
  o.vocab = 4096;
  o.tokenizer = false;
  synth_checkpoint(o, dir);
  {
    auto plain = Model::load(dir);
    REQUIRE_FALSE(plain->config().moe.mxfp4);
    CHECK_THROWS_WITH(CudaBackend(*plain, bf16_contract(), quiet()),
                      Catch::Contains("routed experts must be MXFP4"));
  }
  LoadOptions lo;
  lo.quantize_experts = true;
  auto model = Model::load(dir, lo);
  const ModelConfig& c = model->config();
  REQUIRE(c.moe.mxfp4);
  REQUIRE(c.num_mla_layers() >= 1);
  REQUIRE(c.num_kda_layers() >= 1);
  check_layers(*model, "kimi-linear slice", 8, 3e-2);
  const Reference ref = reference_run(*model, 12, 16);
  check_replay(*model, "kimi-linear slice", ref, 0.15);
  check_placements(*model, "kimi-linear slice", ref, 32);
  check_graphs(*model, "kimi-linear slice, 10% GPU", ref, 0.1);
}
