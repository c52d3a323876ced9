// The CUDA backend at K3's widths (hidden 7168, KDA 96×128, MLA 96 heads, experts 3584 → 3072 of
// 896-style MXFP4 layout, top-16): the checks of tests/engine/cuda_backend_checks.h on a k3-slice
// (4 layers: dense KDA layer 0, two KDA MoE layers, one MLA MoE layer; 32 experts per layer so
// 10% of them is 3, a 32K vocabulary to keep synthesis short). Label e2e (not gpu): about 10 GB
// of weights, minutes of CPU reference time, so `ctest -L gpu` stays short. STRATA_E2E_MODEL
// names an existing checkpoint to use instead of synthesizing one.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>

#include "cuda_backend_checks.h"
#include "gpu_test.h"
#include "storage/synth.h"
#include "test_util.h"

using namespace strata;
using namespace strata::engine;
using namespace strata::test::cuda_checks;

namespace {
std::filesystem::path slice() {
  if (const char* m = std::getenv("STRATA_E2E_MODEL")) return m;
  static std::filesystem::path dir = [] {
    std::filesystem::path d = test::scratch_dir("e2e_k3_slice");
    SynthOptions o;
    o.preset = "k3-slice";
    o.layers = 4;
    o.experts = 32;
    o.vocab = 32768;
    o.tokenizer = false;
    synth_checkpoint(o, d);
    return d;
  }();
  return dir;
}
}  // namespace

TEST_CASE("cuda backend at K3 widths: layers, replayed routing, placement invariance", "[e2e]") {
  test::skip_without_gpu();
  auto model = Model::load(slice());
  // Same sources of difference as on k3-mini (tests/engine/cuda_backend_gpu.cpp), at 7x the
  // width: reductions of 7168-12288 terms in other orders; the bounds are k3-mini's.
  check_layers(*model, "k3-slice", 8, 3e-2);
  const Reference ref = reference_run(*model, 12, 16);
  check_replay(*model, "k3-slice", ref, 0.15);
  check_placements(*model, "k3-slice", ref, 64);
  check_graphs(*model, "k3-slice, 10% GPU", ref, 0.1);
}
