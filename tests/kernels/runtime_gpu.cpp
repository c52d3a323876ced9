// GPU presence: the CUDA runtime answers and reports a device, or the GPU tests skip.
#include <catch2/catch.hpp>

#include "kernels/runtime.h"

TEST_CASE("cuda runtime reports devices", "[gpu]") {
  int n = strata::kernels::cuda_device_count();
  if (n == 0) {
    WARN("no CUDA device: skipping");
    return;
  }
  REQUIRE(n > 0);
  REQUIRE(strata::kernels::cuda_device_description(0).find("sm_") != std::string::npos);
}
