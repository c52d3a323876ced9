// `strata bench hw`: measures this machine's HardwareProfile (offload/hardware.h) — the hardware
// peaks (host memory read, disk O_DIRECT; on a CUDA build with a GPU the HBM copy, bf16 GEMM and
// pinned host↔device copies) and our kernels' rates (CPU MXFP4 expert kernel at a few M, the fp32
// reference trunk, KDA and MLA; on the GPU the grouped experts and the trunk GEMM) — prints them as
// benchmark lines, says what it could not measure, and saves the profile (--save) for
// `strata plan --hardware FILE` and the engine. The loops are offload/hw_measure.cpp's (the same
// code as bench io's raw line and bench cpu-experts' memory-read line). With -m DIR it also times
// the fast CPU backend's pieces at that model's shapes (offload/hw_measure_model.cpp: the
// profile's model_shapes, which strata plan --device cpu uses for that model only).
//
// Napkin: --quick on the 2-core dev VM ≈ 15 s (0.5 GiB memory stream × 4, a 0.5 GiB disk file
// written and 16 experts read × 4, 8 K3 experts × (1 + 16 tokens), the reference linear on a
// 64 MiB weight); the full run about three times that. -m k3-mini adds ≈ 25 s on 2 cores (the
// trunk's 0.5 GB of calls at 7 token counts, the largest 1024 rows: ≈ 0.35 TFLOP per repeat).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>

#include "offload/hw_measure.h"
#include "storage/config.h"
#include "storage/error.h"
#include "storage/files.h"
#include "tools/bench.h"

namespace strata::tools {

#ifdef STRATA_HAVE_CUDA
// tools/bench_kernels_moe.cpp: the GPU expert and trunk kernel curves.
void bench_hw_gpu_kernels(BenchReport& r, offload::HardwareProfile& hw, bool quick,
                          const ModelConfig* model, const std::string& model_name);
#endif

namespace {

struct Options {
  std::string save, json, dir, model;
  std::vector<int> model_tokens;
  std::optional<int64_t> context;
  bool quick = false, force = false, no_disk = false, no_gpu = false, cpu_time = false;
  int threads = 0;
  double disk_gib = 0;
  int model_cold_mib = 0;
};

int run(const Options& o) {
  // Refuse an existing --save target before spending the time measuring.
  std::error_code ec;
  if (!o.save.empty() && !o.force && std::filesystem::exists(o.save, ec))
    throw Error(o.save + ": exists; not replacing it (remove it or pass --force)");
  // Both outputs' directories writable, neither a directory, device or FIFO — before measuring.
  if (!o.save.empty()) OutputPath("--save", o.save, {});
  check_json_output(o.json);
  // -m: the model whose shapes the model-shape probes take (its config.json only), parsed
  // before anything is measured so a bad directory fails at once.
  ModelConfig model;
  if (!o.model.empty()) {
    const std::filesystem::path cfg = std::filesystem::path(o.model) / "config.json";
    if (!std::filesystem::is_regular_file(cfg, ec))
      throw Error(cfg.string() + ": not found (is " + o.model + " a checkpoint directory?)");
    model = load_config(cfg);
    for (int M : o.model_tokens)
      if (M < 1 || M > 65536)
        throw Error("--model-tokens: expected 1..65536, got " + std::to_string(M));
    if (o.context && *o.context < 1)
      throw Error("--context: expected ≥ 1, got " + std::to_string(*o.context));
    check_option("--model-cold", o.model_cold_mib, 0, 65536);
  } else if (!o.model_tokens.empty() || o.context || o.model_cold_mib) {
    throw Error(
        "--model-tokens, --context and --model-cold go with -m DIR (the model-shape probes)");
  }
  BenchReport rep("bench hw: hardware peaks and our kernels' rates");
  const auto t0 = std::chrono::steady_clock::now();
  const bool tty = ::isatty(STDERR_FILENO);
  offload::MeasureOptions mo;
  mo.quick = o.quick;
  mo.threads = o.threads;
  mo.disk_dir = o.dir;
  mo.disk_file_gib = o.disk_gib;
  mo.disk = !o.no_disk;
  mo.gpu = !o.no_gpu;
  mo.cpu_time = o.cpu_time;
  if (!o.model.empty()) {
    mo.model = &model;
    mo.model_name = o.model;
    mo.model_tokens = o.model_tokens;
    mo.model_context = o.context.value_or(0);
    mo.model_cold_bytes = size_t(o.model_cold_mib) << 20;
  }
  mo.progress = [&](const std::string& s) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // One status line, rewritten on a terminal; a log line otherwise.
    std::fprintf(stderr, tty ? "\r\033[K[%5.1f s] %s..." : "[%5.1f s] %s...\n", t, s.c_str());
    std::fflush(stderr);
  };
  mo.line = [&](const offload::MeasuredLine& m) {
    if (tty) std::fprintf(stderr, "\r\033[K");
    BenchLine l;
    l.name = m.name;
    l.shape = m.shape;
    l.time = {m.time.median_s, m.time.min_s, m.time.max_s, m.time.repeats};
    l.bytes = m.time.bytes;
    l.flops = m.flops;
    l.peak_name = m.peak_name;
    l.peak = m.peak;
    l.peak_is_bandwidth = m.peak_is_bandwidth;
    l.note = m.note;
    rep.add(l);
  };
  offload::HardwareProfile hw = offload::measure_hardware(mo);
#ifdef STRATA_HAVE_CUDA
  if (!o.no_gpu && hw.gpu.count > 0) {
    mo.progress("GPU 0: grouped experts and trunk GEMM at M tokens");
    if (tty) std::fprintf(stderr, "\r\033[K");
    try {
      bench_hw_gpu_kernels(rep, hw, o.quick, o.model.empty() ? nullptr : &model, o.model);
    } catch (const Error& e) {
      hw.not_measured.push_back(std::string("GPU kernel rates: ") + e.what());
    }
  }
#else
  hw.not_measured.push_back("GPU kernel rates: this build has no CUDA");
#endif
  if (tty) std::fprintf(stderr, "\r\033[K");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char took[64];
  std::snprintf(took, sizeof took, "measured in %.1f s", secs);
  rep.note(took);
  for (const std::string& n : hw.not_measured) rep.note("not measured: " + n);
  std::printf("\n%s", offload::describe(hw).c_str());
  if (!o.save.empty()) {
    offload::save_hardware(hw, o.save, o.force);
    std::printf("saved: %s (use with strata plan --hardware %s)\n", o.save.c_str(), o.save.c_str());
  }
  if (!o.json.empty()) rep.write_json(o.json);
  return 0;
}

BenchSetup setup = [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("--save", o->save, "save the hardware profile as JSON to FILE (for strata plan)");
  app.add_flag("--force", o->force, "replace an existing --save FILE");
  app.add_option("--json", o->json, "also write the benchmark lines as JSON to FILE");
  app.add_flag("--quick", o->quick, "smaller buffers and fewer repeats (about 15 s on 2 cores)");
  app.add_option("--threads", o->threads, "CPU threads, pinned one per core (default: all cores)");
  app.add_option("--dir", o->dir, "where the disk test file goes (default: the temp directory)");
  app.add_option("--disk-gib", o->disk_gib, "disk test file size in GiB (default 1, quick 0.5)");
  app.add_flag("--no-disk", o->no_disk, "skip the disk measurement");
  app.add_flag("--no-gpu", o->no_gpu, "skip the GPU measurements");
  app.add_option("-m,--model", o->model,
                 "also time the fast CPU backend's pieces at this model's shapes (a checkpoint "
                 "directory; only its config.json is read): the profile's model_shapes, used by "
                 "strata plan --device cpu for that model");
  app.add_option("--model-tokens", o->model_tokens,
                 "with -m: token counts of the model-shape probes (default 1 2 4 8 64 256 1024; "
                 "up to 8: decode steps of that many sequences, above: prompts)");
  app.add_option("--context", o->context,
                 "with -m: cached positions of the MLA decode probe (default 80: bench e2e's "
                 "decode after a 64-token prompt)");
  app.add_option("--model-cold", o->model_cold_mib,
                 "with -m: MiB the threads write before each timed repeat of a model-shape probe "
                 "(untimed), so each part starts on cold caches as inside the engine's step "
                 "(default 0: warm, back to back)");
  app.add_flag("--cpu-time", o->cpu_time,
               "CPU rates from CPU seconds / threads instead of wall time (a shared machine: "
               "what it does with its cores to itself; compare with strata run's CPU seconds)");
  return [o] { return run(*o); };
};

STRATA_BENCH("hw",
             "this machine's hardware peaks and our kernels' rates, saved as a profile for plan",
             setup);

}  // namespace

}  // namespace strata::tools
