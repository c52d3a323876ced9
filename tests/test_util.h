// Helpers shared by the tests: where the sources, the shared/ folder and the strata binary are,
// and need_shared(), which skips (or, under STRATA_REQUIRE_SHARED=1, fails) a case whose data
// under ../shared is absent.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "skip.h"

namespace strata::test {

inline std::filesystem::path source_dir() {
  return STRATA_SOURCE_DIR;
}

// ../shared next to the checkout (CI lays a copy of shared/ beside the clone).
inline std::filesystem::path shared_dir() {
  if (const char* s = std::getenv("STRATA_SHARED_DIR")) return s;
  return source_dir().parent_path() / "shared";
}

inline std::filesystem::path golden_dir() {
  return shared_dir() / "golden";
}

// Relative L2 distance ‖a − ref‖ / ‖ref‖ in double (a and ref of one size).
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double n = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = double(a[i]) - double(ref[i]);
    n += e * e;
    d += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(n / d);
}

// True when the environment variable is set to anything but "" or "0".
inline bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// Cases that read ../shared (golden data, the released configs) start with need_shared(path):
// without it the case is reported as skipped — visibly, never as passed — and under
// STRATA_REQUIRE_SHARED=1 (set by .ci/run, which lays ../shared beside the clone) it fails, so a
// lost or misplaced ../shared cannot turn into a green run.
inline void need_shared(const std::filesystem::path& path) {
  if (std::filesystem::exists(path)) return;
  if (env_flag("STRATA_REQUIRE_SHARED"))
    FAIL(path.string() << " not found, and STRATA_REQUIRE_SHARED=1 requires ../shared "
                          "(lay it beside the checkout or set STRATA_SHARED_DIR)");
  STRATA_SKIP(path.string() << " not found (needs ../shared beside the checkout, or set "
                               "STRATA_SHARED_DIR; STRATA_REQUIRE_SHARED=1 makes this a failure)");
}

inline std::string strata_exe() {
  return STRATA_EXE;
}

// A fresh scratch directory under the build tree, removed and recreated.
// A fresh directory for `name`, private to this process: ctest runs the cases of one binary as
// parallel processes, and a directory shared by name would be removed under a running case.
// Directories of the same name left by processes that are gone are removed on the way.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const auto root = std::filesystem::path(STRATA_BINARY_DIR) / "test-scratch";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string f = e.path().filename().string();
    if (f.size() <= name.size() + 1 || f.compare(0, name.size() + 1, name + ".") != 0) continue;
    const std::string pid = f.substr(name.size() + 1);
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(pid_t(std::stol(pid)), 0) != 0 && errno == ESRCH)
      std::filesystem::remove_all(e.path(), ec);
  }
  auto p = root / (name + "." + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

// The whole contents of a file, "" when it cannot be read (the case then fails on the content).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes s to p, created or replaced.
inline void write_file(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

// Overwrites bytes of an existing file in place (a corrupt weight, a bad header field).
inline void poke(const std::filesystem::path& file, uint64_t offset,
                 const std::vector<uint8_t>& bytes) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekp(std::streamoff(offset));
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  REQUIRE(f);
}

// Runs the strata CLI with `args` (shell syntax) and returns its exit status and its stdout and
// stderr together. status is -1 when the process could not be started or did not exit normally.
struct CliResult {
  int status = -1;
  std::string out;
};

inline CliResult run_cli(const std::string& args) {
  const std::string cmd = strata_exe() + " " + args + " 2>&1";
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace strata::test
