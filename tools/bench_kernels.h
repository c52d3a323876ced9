// `strata bench kernels`: the CUDA kernel benchmarks. Each kernel family adds its cases to one
// registry from its own file (STRATA_KERNEL_BENCH in tools/bench_kernels_<family>.cpp); the command
// measures the H200 peaks first (copy bandwidth, bf16 GEMM: kernels/peaks.h) and hands them to
// every case, so each line states its percentage of a peak measured in the same run.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tools/bench.h"

namespace strata::tools {

struct KernelBenchContext {
  double copy_gbps = 0;         // measured D2D copy bandwidth (read + write bytes), GB/s
  double gemm_tflops = 0;       // measured cuBLASLt bf16 GEMM rate, TFLOP/s
  int repeats = 10;             // timed repeats per line (cases may use fewer for long kernels)
  bool quick = false;           // --quick: smaller shapes (smoke runs)
  std::vector<int> moe_tokens;  // --tokens: the grouped MoE lines' T (empty: 64 256 1024 4096)
  std::vector<std::string> moe_paths;  // --paths: the grouped MoE lines' paths (empty: all)
};

struct KernelBenchCase {
  std::string name;  // "kda", "mla", "moe", ... (matched by --filter)
  std::function<void(const KernelBenchContext&, BenchReport&)> run;
};

std::vector<KernelBenchCase>& kernel_bench_cases();

struct KernelBenchRegistrar {
  KernelBenchRegistrar(std::string name,
                       std::function<void(const KernelBenchContext&, BenchReport&)> run) {
    kernel_bench_cases().push_back({std::move(name), std::move(run)});
  }
};

}  // namespace strata::tools

#define STRATA_KERNEL_BENCH(name, fn)                                                              \
  static ::strata::tools::KernelBenchRegistrar STRATA_BENCH_CONCAT(strata_kbench_, __LINE__)(name, \
                                                                                             fn)
