// One fuzz target = one function over an input of bytes that must never crash, hang, trip a
// sanitizer or throw anything but strata::Error (the "one clear line" of bad input). The same
// source builds two ways:
//   * -DSTRATA_FUZZ=ON (clang): a libFuzzer binary per target (fuzz_<name>), run by
//     scripts/ci-fuzz.sh on seeds made from real files (fuzz_seeds);
//   * every build: linked into test_fuzz, which replays tests/fuzz/regressions/<name>/* under
//     ctest — each finding is kept there as a regression input.
// Not here: the parsers themselves (storage/, engine/).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "storage/error.h"

namespace strata::fuzz {

using TargetFn = void (*)(const uint8_t* data, size_t size);
struct TargetInfo {
  const char* name;
  TargetFn fn;
};
// Replay build: every target registers here (static registrars).
TargetInfo* targets();
int num_targets();
int register_target(const char* name, TargetFn fn);

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace strata::fuzz

// STRATA_FUZZ_TARGET(name) { body using data, size } — a strata::Error thrown by the body is the
// expected outcome for bad input and is swallowed; any other exception escapes (a finding).
#ifdef STRATA_LIBFUZZER
#define STRATA_FUZZ_TARGET(name)                                            \
  static void strata_fuzz_body(const uint8_t* data, size_t size);           \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { \
    try {                                                                   \
      strata_fuzz_body(data, size);                                         \
    } catch (const ::strata::Error&) {                                      \
    }                                                                       \
    return 0;                                                               \
  }                                                                         \
  static void strata_fuzz_body(const uint8_t* data, size_t size)
#else
#define STRATA_FUZZ_TARGET(name)                                         \
  static void strata_fuzz_body_##name(const uint8_t* data, size_t size); \
  static void strata_fuzz_run_##name(const uint8_t* data, size_t size) { \
    try {                                                                \
      strata_fuzz_body_##name(data, size);                               \
    } catch (const ::strata::Error&) {                                   \
    }                                                                    \
  }                                                                      \
  [[maybe_unused]] static const int strata_fuzz_reg_##name =             \
      ::strata::fuzz::register_target(#name, strata_fuzz_run_##name);    \
  static void strata_fuzz_body_##name(const uint8_t* data, size_t size)
#endif
