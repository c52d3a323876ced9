// Replays every input kept under tests/fuzz/regressions/<target>/ through its fuzz target: each
// one once crashed, hung, tripped a sanitizer or threw something other than strata::Error (or is
// a hand-found bad input of issue 17). Runs in every build — under ASan/UBSan in
// scripts/ci-sanitize.sh — so a fixed finding stays fixed.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fuzz_target.h"
#include "test_util.h"

namespace strata::fuzz {

TargetInfo* targets() {
  static TargetInfo t[16];
  return t;
}
static int g_num_targets = 0;
int num_targets() {
  return g_num_targets;
}
int register_target(const char* name, TargetFn fn) {
  STRATA_ASSERT(g_num_targets < 16);
  targets()[g_num_targets++] = {name, fn};
  return g_num_targets;
}

}  // namespace strata::fuzz

namespace fs = std::filesystem;

TEST_CASE("fuzz: every kept regression input replays cleanly", "[fuzz]") {
  using namespace strata::fuzz;
  REQUIRE(num_targets() == 6);  // config, safetensors, index, tokenizer, routing, batch
  for (int i = 0; i < num_targets(); ++i) {
    const TargetInfo& t = targets()[i];
    const fs::path dir = strata::test::source_dir() / "tests" / "fuzz" / "regressions" / t.name;
    INFO("target " << t.name << ", " << dir.string());
    REQUIRE(fs::is_directory(dir));
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (!e.is_regular_file()) continue;
      std::ifstream in(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string bytes = ss.str();
      INFO("input " << e.path().string());
      CHECK_NOTHROW(t.fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
      ++n;
    }
    CHECK(n > 0);  // every target keeps at least its hand-found cases
  }
}
