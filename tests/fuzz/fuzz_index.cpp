// Fuzz target: model.safetensors.index.json text → parse_shard_index, then every shard name
// through checked_shard_path against a scratch checkpoint directory that holds one shard, a
// subdirectory and a symlink pointing outside (names must stay inside the directory).
// Seeds: the synthetic k3-tiny's index (fuzz_seeds).
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fuzz_target.h"
#include "storage/checkpoint.h"

namespace {
const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    namespace fs = std::filesystem;
    const fs::path d =
        fs::temp_directory_path() / ("strata-fuzz-index-" + std::to_string(::getpid()));
    fs::create_directories(d / "sub");
    std::ofstream(d / "model-00001-of-00001.safetensors") << "x";
    std::ofstream(d / "sub" / "inner.safetensors") << "x";
    std::error_code ec;
    fs::create_symlink("/etc/hostname", d / "outside.safetensors", ec);
    return d;
  }();
  return dir;
}
}  // namespace

STRATA_FUZZ_TARGET(index) {
  const auto map = strata::parse_shard_index(strata::fuzz::as_string(data, size), "fuzz index");
  for (const auto& [tensor, shard] : map) {
    try {
      (void)strata::checked_shard_path(scratch(), scratch() / "model.safetensors.index.json",
                                       shard);
    } catch (const strata::Error&) {
      // a name that does not resolve or leaves the directory: reported, next one
    }
  }
}
