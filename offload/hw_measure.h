// Measuring a HardwareProfile on this machine: the hardware peaks (host memory read, disk
// O_DIRECT, and on a CUDA build with a GPU the HBM copy, bf16 GEMM and pinned host↔device copies)
// and our kernels' rates (CPU MXFP4 expert kernel at a few M, the fp32 reference trunk, the
// reference KDA and MLA ops). `strata bench hw` prints and saves the result; the engine calls
// measure_hardware() for what a loaded profile lacks. The measurement loops themselves live here
// once: `strata bench io` and `strata bench cpu-experts` use the same functions.
//
// Not here: the JSON form (hardware.h), the time of work (cost_model.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "offload/hardware.h"

namespace strata::cpu {
class Topology;
class PinnedArena;
}  // namespace strata::cpu

namespace strata::offload {

struct MeasureOptions {
  bool quick = false;              // smaller buffers and fewer repeats (≈ 20 s on 2 cores)
  int threads = 0;                 // CPU threads, pinned one per core; 0 = all cores
  std::filesystem::path disk_dir;  // where the disk test file goes; empty = temp directory
  double disk_file_gib = 0;        // 0 = 1 GiB (quick: 0.5 GiB)
  bool disk = true, gpu = true, cpu_kernels = true;
  std::vector<int> expert_tokens;  // M for the CPU expert curve; empty = {1, 4, 16, 64}
  // Called with a short status ("host memory read…", "disk O_DIRECT 0.5 GiB…") as each
  // measurement starts, for a progress line.
  std::function<void(const std::string&)> progress;
};

// Measures what it can; what it cannot (no GPU, no O_DIRECT on the filesystem, …) is listed in
// the profile's not_measured with the reason. Starts from probe_static().
HardwareProfile measure_hardware(const MeasureOptions& o);

// --- the individual loops (shared with bench io / bench cpu-experts) ---

struct RateSample {
  double median_s = 0, min_s = 0, max_s = 0;
  double bytes = 0;  // per repetition
  double gbps() const { return median_s > 0 ? bytes / median_s / 1e9 : 0; }
};

// All `arena` threads streaming reads over a `bytes` buffer bound through hwloc (AVX-512 loads
// where available).
RateSample measure_host_read(cpu::PinnedArena& arena, const cpu::Topology& topo, size_t bytes,
                             int repeats);

// O_DIRECT io_uring reads of a file of `bytes` written (O_DIRECT) under `dir`, in `block`-byte
// reads with `qd` in flight; the file is removed afterwards. Throws strata::Error naming the path
// when the filesystem refuses O_DIRECT or the disk is full.
RateSample measure_disk_read(const std::filesystem::path& dir, uint64_t bytes, int repeats,
                             uint64_t block = 1 << 20, int qd = 32);

}  // namespace strata::offload
