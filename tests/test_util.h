// Helpers shared by the tests: where the sources, the shared/ folder and the strata binary are.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace strata::test {

inline std::filesystem::path source_dir() { return STRATA_SOURCE_DIR; }

// ../shared next to the checkout (CI lays a copy of shared/ beside the clone).
inline std::filesystem::path shared_dir() {
  if (const char* s = std::getenv("STRATA_SHARED_DIR")) return s;
  return source_dir().parent_path() / "shared";
}

inline std::filesystem::path golden_dir() { return shared_dir() / "golden"; }

inline std::string strata_exe() { return STRATA_EXE; }

// A fresh scratch directory under the build tree, removed and recreated.
inline std::filesystem::path scratch_dir(const std::string& name) {
  auto p = std::filesystem::path(STRATA_BINARY_DIR) / "test-scratch" / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace strata::test
