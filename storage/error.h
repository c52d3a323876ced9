// Error kinds shared by every layer (STYLE.md §11): strata::Error for bad user input and
// operational failures that reach the CLI as one clear line; STRATA_ASSERT for programmer errors
// (always on, with file:line).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace strata {

// A failure to report to the user: the message names the file / tensor / field / line and what
// was expected. Thrown at the boundary where the bad input is detected.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "strata: assertion failed: %s at %s:%d\n", expr, file, line);
  std::abort();
}

}  // namespace strata

#define STRATA_ASSERT(x)                                     \
  do {                                                       \
    if (!(x)) ::strata::assert_fail(#x, __FILE__, __LINE__); \
  } while (0)
