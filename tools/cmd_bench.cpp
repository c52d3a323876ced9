// `strata bench io|cpu-experts|kernels|...`: dispatches to the registered benchmarks and holds the
// shared measurement and reporting code (tools/bench.h).
#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "offload/hw_measure.h"
#include "storage/error.h"
#include "storage/files.h"
#include "tools/bench.h"
#include "tools/command.h"

namespace strata::tools {

std::vector<BenchInfo>& bench_registry() {
  static std::vector<BenchInfo> r;
  return r;
}

void check_option(const std::string& flag, double v, double lo, double hi) {
  if (v >= lo && v <= hi) return;
  auto num = [](double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return std::string(b);
  };
  throw Error(flag + " " + num(v) + ": expected " + num(lo) + ".." + num(hi));
}

void check_json_output(const std::string& path) {
  if (!path.empty()) OutputPath("--json", path, {});
}

BenchStats measure(const std::function<void()>& fn, int repeats, int warmup) {
  const offload::RateSample t = offload::time_repeats(fn, repeats, warmup);
  return {t.median_s, t.min_s, t.max_s, t.repeats};
}

double BenchLine::pct_of_peak() const {
  if (peak <= 0) return 0;
  return 100.0 * (peak_is_bandwidth ? gbps() : tflops()) / peak;
}

void BenchReport::add(const BenchLine& l) {
  if (!header_printed_) {
    std::printf("== %s ==\n%-34s %-34s %10s %10s %9s %9s %7s  %s\n", title_.c_str(), "benchmark",
                "shape", "median", "spread", "GB/s", "TFLOP/s", "%peak", "peak");
    header_printed_ = true;
  }
  char spread[32];
  std::snprintf(spread, sizeof spread, "±%.1f%%",
                l.time.median_s > 0 ? 50.0 * (l.time.max_s - l.time.min_s) / l.time.median_s : 0);
  char med[32];
  if (l.time.median_s >= 1e-3)
    std::snprintf(med, sizeof med, "%.3f ms", l.time.median_s * 1e3);
  else
    std::snprintf(med, sizeof med, "%.2f us", l.time.median_s * 1e6);
  std::printf("%-34s %-34s %10s %10s %9.2f %9.3f %6.1f%%  %s %.1f %s%s%s\n", l.name.c_str(),
              l.shape.c_str(), med, spread, l.gbps(), l.tflops(), l.pct_of_peak(),
              l.peak_name.c_str(), l.peak, l.peak_is_bandwidth ? "GB/s" : "TFLOP/s",
              l.note.empty() ? "" : " — ", l.note.c_str());
  std::fflush(stdout);
  lines_.push_back(l);
}

void BenchReport::note(const std::string& s) {
  std::printf("# %s\n", s.c_str());
  std::fflush(stdout);
  notes_.push_back(s);
}

void BenchReport::write_json(const std::string& path) const {
  nlohmann::json j;
  j["title"] = title_;
  j["notes"] = notes_;
  for (auto& l : lines_) {
    j["lines"].push_back({{"name", l.name},
                          {"shape", l.shape},
                          {"median_s", l.time.median_s},
                          {"min_s", l.time.min_s},
                          {"max_s", l.time.max_s},
                          {"repeats", l.time.repeats},
                          {"bytes", l.bytes},
                          {"flops", l.flops},
                          {"gbps", l.gbps()},
                          {"tflops", l.tflops()},
                          {"peak_name", l.peak_name},
                          {"peak", l.peak},
                          {"peak_unit", l.peak_is_bandwidth ? "GB/s" : "TFLOP/s"},
                          {"pct_of_peak", l.pct_of_peak()},
                          {"note", l.note}});
  }
  write_file_atomic(path, j.dump(2) + "\n", "--json " + path);
}

namespace {
CommandRun setup_bench(CLI::App& app) {
  app.require_subcommand(1);
  auto runs = std::make_shared<std::vector<std::pair<CLI::App*, std::function<int()>>>>();
  auto& reg = bench_registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (auto& b : reg) {
    CLI::App* sub = app.add_subcommand(b.name, b.description);
    runs->emplace_back(sub, b.setup(*sub));
  }
  return [runs]() {
    for (auto& [sub, run] : *runs)
      if (sub->parsed()) return run();
    return 1;
  };
}
}  // namespace

STRATA_COMMAND("bench", "benchmarks: achieved GB/s or TFLOP/s next to measured peaks", setup_bench);

}  // namespace strata::tools
