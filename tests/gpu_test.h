// GPU cases start with skip_without_gpu(): without a CUDA device the case is reported as
// skipped (tests/skip.h), never as passed. STRATA_REQUIRE_GPU=1 (for runs on the GPU machine)
// turns the skip into a failure, so a device that is missing there cannot pass as a skip.
// Cases that check argument validation before any launch need no device and do not call it.
#pragma once
#include <catch2/catch.hpp>

#include "kernels/runtime.h"
#include "skip.h"
#include "test_util.h"

namespace strata::test {

inline void skip_without_gpu() {
  if (kernels::cuda_device_count() > 0) return;
  if (env_flag("STRATA_REQUIRE_GPU")) FAIL("no CUDA device, and STRATA_REQUIRE_GPU=1");
  STRATA_SKIP("no CUDA device");
}

}  // namespace strata::test
