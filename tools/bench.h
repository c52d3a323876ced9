// `strata bench <name>`: the benchmark registry and the one reporting protocol (STYLE.md §14–15).
// A benchmark registers with STRATA_BENCH in its own tools/bench_<name>.cpp, measures with
// measure() (warm-up, repeats, median and spread), and reports BenchLines: every line carries bytes
// or FLOPs, the achieved rate and the percentage of a peak measured in the same run (or named with
// its source). The table goes to stdout; --json FILE writes the same lines as JSON.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace strata::tools {

struct BenchStats {
  double median_s = 0, min_s = 0, max_s = 0;
  int repeats = 0;
};

// Runs fn() `warmup` times, then `repeats` times, timing each; returns median/min/max seconds.
BenchStats measure(const std::function<void()>& fn, int repeats = 5, int warmup = 1);

struct BenchLine {
  std::string name;   // "cpu-experts/M=1"
  std::string shape;  // "3584->3072->3584, 16 experts"
  BenchStats time;
  double bytes = 0;       // bytes moved per call (0 if not a bandwidth line)
  double flops = 0;       // FLOPs per call (0 if not a compute line)
  std::string peak_name;  // "memory read (measured)" / "bf16 GEMM (measured)"
  double peak = 0;        // in GB/s for bandwidth lines, TFLOP/s for compute lines
  std::string note;
  double gbps() const { return time.median_s > 0 ? bytes / time.median_s / 1e9 : 0; }
  double tflops() const { return time.median_s > 0 ? flops / time.median_s / 1e12 : 0; }
  // Percentage of the stated peak: of GB/s when the peak is a bandwidth, else of TFLOP/s.
  double pct_of_peak() const;
  bool peak_is_bandwidth = true;
};

class BenchReport {
 public:
  explicit BenchReport(std::string title) : title_(std::move(title)) {}
  void add(const BenchLine& l);  // prints the line as it is added (progress on long runs)
  void note(const std::string& s);
  const std::vector<BenchLine>& lines() const { return lines_; }
  void write_json(const std::string& path) const;

 private:
  std::string title_;
  std::vector<BenchLine> lines_;
  std::vector<std::string> notes_;
  bool header_printed_ = false;
};

// The oneDNN bf16 matmul peak (N×N×N, `threads` OpenMP threads): adds its line to `rep` and
// returns the best repeat in TFLOP/s (tools/bench_cpu_experts.cpp).
double measure_onednn_bf16_tflops(int n, int threads, int repeats, BenchReport& rep);

using BenchSetup = std::function<std::function<int()>(CLI::App& app)>;
struct BenchInfo {
  std::string name, description;
  BenchSetup setup;
};
std::vector<BenchInfo>& bench_registry();
struct BenchRegistrar {
  BenchRegistrar(std::string name, std::string description, BenchSetup setup) {
    bench_registry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace strata::tools

#define STRATA_BENCH(name, description, setup)                                         \
  static ::strata::tools::BenchRegistrar STRATA_BENCH_CONCAT(strata_bench_, __LINE__)( \
      name, description, setup)
#define STRATA_BENCH_CONCAT2(a, b) a##b
#define STRATA_BENCH_CONCAT(a, b) STRATA_BENCH_CONCAT2(a, b)
