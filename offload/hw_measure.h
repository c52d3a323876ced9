// Measuring a HardwareProfile on this machine: the hardware peaks (host memory read, disk
// O_DIRECT, and on a CUDA build with a GPU the HBM copy, bf16 GEMM and pinned host↔device copies)
// and our kernels' rates (CPU MXFP4 expert kernel at a few M, the fp32 reference trunk, the
// reference KDA and MLA ops). `strata bench hw` prints and saves the result; the engine may call
// measure_hardware() for what a loaded profile lacks. The measurement loops live here once:
// `strata bench io` and `strata bench cpu-experts` run the same code for their peak lines.
//
// Not here: the JSON form (hardware.h), the time of work (cost_model.h), GPU kernel rates that
// need the tools' benchmark fixtures (`strata bench hw` adds those).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu/expert_kernels.h"
#include "offload/expert_store.h"
#include "offload/hardware.h"
#include "storage/config.h"

namespace strata::cpu {
class Topology;
class PinnedArena;
}  // namespace strata::cpu

namespace strata::offload {

struct RateSample {
  double median_s = 0, min_s = 0, max_s = 0;
  double cpu_median_s = 0;  // CPU seconds of the whole process (all threads) per repetition
  int repeats = 0;
  double bytes = 0;  // per repetition (set by the caller of time_repeats)
  double gbps() const { return median_s > 0 ? bytes / median_s / 1e9 : 0; }
  double best_gbps() const { return min_s > 0 ? bytes / min_s / 1e9 : 0; }  // a peak's rate
};

// One finished measurement, for a benchmark table (tools/bench.h's BenchLine carries the same).
struct MeasuredLine {
  std::string name, shape;
  RateSample time;
  double flops = 0;       // per repetition, 0 for a bandwidth line
  std::string peak_name;  // "itself" for a peak, else the peak it is compared with
  double peak = 0;        // GB/s (bandwidth lines) or TFLOP/s
  bool peak_is_bandwidth = true;
  std::string note;
};

struct MeasureOptions {
  bool quick = false;              // smaller buffers and fewer repeats (≈ 20 s on 2 cores)
  int threads = 0;                 // CPU threads, pinned one per core; 0 = all cores
  std::filesystem::path disk_dir;  // where the disk test file goes; empty = temp directory
  double disk_file_gib = 0;        // 0 = 1 GiB (quick: 0.5 GiB)
  bool disk = true, gpu = true, cpu_kernels = true;
  // CPU rates from CPU time instead of wall time: seconds = the process's CPU seconds / threads,
  // what the machine does when the process has its cores to itself. For a shared machine (the
  // dev VM), where wall-clock rates move 3× with other jobs; compare with the CPU seconds in
  // `strata run`'s stats line. Disk and GPU rates stay wall-clock.
  bool cpu_time = false;
  std::vector<int> expert_tokens;  // M for the CPU expert curve; empty = {1, 2, 4, 16, 64}
  // The model-shape probes (HardwareProfile::model_shapes): the fast CPU backend's pieces at this
  // model's shapes, when set (`strata bench hw -m DIR`). `model_name` says what was measured;
  // `model_tokens` the M of the curves (up to cpu::kGemvMaxTokens: decode steps of M sequences;
  // above: prefill prompts of M tokens), empty = {1, 2, 4, 8, 64, 256, 1024}; `model_context` the
  // cached positions of the MLA decode probe (0 = 80, bench e2e's decode after a 64-token prompt).
  const ModelConfig* model = nullptr;
  std::string model_name;
  std::vector<int> model_tokens;
  int64_t model_context = 0;
  // > 0: before each timed repeat of a model-shape probe (a step's worth of that part) the arena's
  // threads write this many bytes, untimed, so the part starts on caches full of other data as
  // inside the engine's step, where the other parts ran just before (bench hw --model-cold).
  // 0: warm, back to back.
  size_t model_cold_bytes = 0;
  // Called with a short status ("host memory read", "disk O_DIRECT 0.5 GiB") as each
  // measurement starts, and with the result line when it ends, for a progress display.
  std::function<void(const std::string&)> progress;
  // Called with every finished measurement.
  std::function<void(const MeasuredLine&)> line;
};

// Measures what it can; what it cannot (no GPU, no O_DIRECT on the filesystem, …) is listed in
// the profile's not_measured with the reason. Starts from probe_static().
HardwareProfile measure_hardware(const MeasureOptions& o);

// The model-shape probes alone (measure_hardware runs them when o.model is set): the fast CPU
// backend's trunk linear calls, KDA and MLA cores, CPU experts and row ops at cfg's shapes, in
// `arena` (unpinned, as the engine runs). `line` and `progress` of `o` are called as by
// measure_hardware; o.cpu_time applies.
ModelShapeRates measure_model_shapes(const ModelConfig& cfg, const MeasureOptions& o,
                                     tbb::task_arena& arena, const cpu::Topology& topo,
                                     int threads);

// --- the individual loops (shared with bench io / bench cpu-experts) ---

// Median, min and max of measured seconds (at least one), repeats = their count.
RateSample sample_of(std::vector<double> seconds);

// Runs fn() `warmup` times, then `repeats` times; median, min and max wall seconds. `before`,
// when set, runs ahead of every timed call, outside the timing.
RateSample time_repeats(const std::function<void()>& fn, int repeats, int warmup = 1,
                        const std::function<void()>& before = {});

// A buffer bound to memory through hwloc (interleaved over NUMA nodes), freed with it.
class BoundBuffer {
 public:
  BoundBuffer(const cpu::Topology& topo, size_t bytes);
  ~BoundBuffer();
  BoundBuffer(const BoundBuffer&) = delete;
  BoundBuffer& operator=(const BoundBuffer&) = delete;
  uint8_t* data() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  const cpu::Topology& topo_;
  size_t bytes_;
  uint8_t* p_;
};

// xorshift bytes in [lo, hi], filled in parallel (first touch from the calling arena's threads).
void fill_random(uint8_t* p, size_t n, uint64_t seed, int lo = 0, int hi = 255);

// All `arena` threads streaming reads over a `bytes` buffer bound through hwloc (AVX-512 loads
// where available, else 64-bit loads; the returned sample's `note` says which). `arena`: a
// cpu::PinnedArena's (threads pinned) or a plain one.
RateSample measure_host_read(tbb::task_arena& arena, const cpu::Topology& topo, size_t bytes,
                             int repeats, std::string* note = nullptr);

// MXFP4 experts (K3's shape unless told) with random nibbles and scale codes near 2^-7 in
// hwloc-bound memory, and the CPU expert kernel run over them: every one of M tokens to every
// expert of a group.
class CpuExpertProbe {
 public:
  // groups × experts MXFP4 experts of hidden → inter → hidden; each call runs one group of
  // `experts`, the next group on the next call (groups ≫ 1 keep small experts out of the caches).
  CpuExpertProbe(const cpu::Topology& topo, cpu::PinnedArena& arena, int experts,
                 int hidden = kK3ExpertHidden, int inter = kK3ExpertInter, int groups = 1);
  ~CpuExpertProbe();
  int experts() const { return experts_; }
  uint64_t expert_bytes() const { return expert_bytes_; }
  // A callable that runs one cpu::run_experts_cpu call at M tokens per expert with `opt` (in
  // opt.arena, or the probe's pinned arena when null); its buffers are prepared here and live as
  // long as the callable. Each call runs all of a group's experts, the groups in turn. The probe
  // must outlive it.
  std::function<void()> prepare(int M, cpu::CpuExpertOptions opt);
  // A callable that runs one MoE layer's routed experts as the engine does (cpu::RoutedExperts:
  // T tokens quantized once, each expert's tokens gathered, the rows copied to their slots with
  // their bf16 rounding), then the backend's merge (cpu::merge_routed_fast) — over a flat random
  // routing of T tokens to k distinct experts each (one of max(16, groups) routings per call,
  // each on its own group in turn). *experts: the mean distinct experts per routing (the bytes a
  // call touches).
  std::function<void()> prepare_routed(int T, int k, cpu::CpuExpertOptions opt, double* experts);

 private:
  struct Call;
  cpu::PinnedArena& arena_;
  int experts_, hidden_;
  uint64_t expert_bytes_;
  BoundBuffer pool_;
  std::vector<Mxfp4ExpertView> views_;  // groups × experts
};

// A shard-like file of K3-sized experts (unaligned start, back to back) with pseudo-random
// bytes, written with O_DIRECT so the page cache holds none of it. Throws strata::Error naming
// the path (disk full, cannot create).
ExpertLayout write_expert_test_file(const std::filesystem::path& path, uint64_t bytes);

// A bare io_uring loop reading the 4 KiB-aligned spans of experts, `qd` reads of at most `block`
// bytes in flight, O_DIRECT, into one reused registered buffer: the raw disk reference.
class RawDirectReader {
 public:
  RawDirectReader(const ExpertLayout& L, uint64_t block, int qd);
  ~RawDirectReader();
  RawDirectReader(const RawDirectReader&) = delete;
  RawDirectReader& operator=(const RawDirectReader&) = delete;
  bool fixed() const { return fixed_; }                            // buffer registration succeeded
  uint64_t read(const std::vector<std::pair<int, int>>& experts);  // returns span bytes

 private:
  struct Ring;
  const ExpertLayout& L_;
  uint64_t block_;
  int qd_;
  std::vector<int> fds_;
  std::unique_ptr<Ring> ring_;
  uint8_t* buf_ = nullptr;
  bool fixed_ = false;
};

// write_expert_test_file under `dir`, then RawDirectReader over 16 random experts per repeat;
// the file is removed afterwards. Throws strata::Error naming the path when the filesystem
// refuses O_DIRECT or the disk is full.
RateSample measure_disk_read(const std::filesystem::path& dir, uint64_t file_bytes, int repeats,
                             uint64_t block = 1 << 20, int qd = 32);

}  // namespace strata::offload
