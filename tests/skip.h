// Skipping a test case that cannot run here (no GPU, no ../shared data, an ISA the CPU lacks), so
// that it is reported as skipped and never counted as passed. Catch2 v2 has no skip of its own:
// STRATA_SKIP ends the running case and tests/main.cpp reports it ("SKIPPED: case: reason") and,
// when every case the process ran skipped, exits with kSkipExitCode, which CMake hands to ctest as
// SKIP_RETURN_CODE (ctest runs one case per test, so ctest prints "Skipped" for it).
// A case that failed an assertion before skipping stays failed, and so does a skip raised inside
// an assertion's expression (call it as a statement). Not here: deciding what to skip
// (test_util.h's need_shared, tests/gpu_test.h's skip_without_gpu).
#pragma once
#include <sstream>
#include <string>

namespace strata::test {

inline constexpr int kSkipExitCode = STRATA_TEST_SKIP_CODE;  // set by CMake, also given to ctest

// Ends the running test case as skipped (defined in tests/main.cpp). Call it on the test's own
// thread only, like every Catch2 macro.
[[noreturn]] void skip_case(const std::string& reason);

}  // namespace strata::test

// STRATA_SKIP("no CUDA device") or STRATA_SKIP(path << " not found"): the reason is streamed.
#define STRATA_SKIP(reason)                               \
  do {                                                    \
    std::ostringstream strata_skip_reason_;               \
    strata_skip_reason_ << reason;                        \
    ::strata::test::skip_case(strata_skip_reason_.str()); \
  } while (0)
