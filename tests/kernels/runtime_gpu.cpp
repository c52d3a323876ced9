// GPU presence: the CUDA runtime answers and reports a device, or the GPU tests skip.
#include <catch2/catch.hpp>

#include "gpu_test.h"
#include "kernels/runtime.h"

TEST_CASE("cuda runtime reports devices", "[gpu]") {
  strata::test::skip_without_gpu();
  const int n = strata::kernels::cuda_device_count();
  REQUIRE(n > 0);
  REQUIRE(strata::kernels::cuda_device_description(0).find("sm_") != std::string::npos);
}
