// `strata bench cpu-experts`: the CPU routed-expert kernels (cpu/expert_kernels.h) at K3's expert
// shape (3584 → 3072 → 3584), E experts × M tokens per expert, next to two peaks measured in the
// same run: the machine's multi-threaded streaming memory read and oneDNN's bf16 matmul.
//
// Napkin (STYLE.md §17): one K3 expert is 3 × 3072 × 3584 MXFP4 weights = 16.5 MB of nibbles +
// 1.03 MB of scales = 17.55 MB; 16 experts = 281 MB per token per layer (≫ LLC, so every call
// reads DRAM). FLOPs = 2 · M · 3 · 3072 · 3584 per expert. Arithmetic intensity ≈ 3.8 · M FLOP
// per weight byte, so M = 1 is memory-bound and large M compute-bound; each line states the
// roofline peak that binds (memory below the ridge point, bf16 GEMM above).
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <vector>

#include "cpu/bf16_linear.h"
#include "cpu/expert_kernels.h"
#include "cpu/expert_kernels_impl.h"
#include "cpu/topology.h"
#include "engine/expert_executor.h"
#include "offload/hw_measure.h"
#include "storage/bf16.h"
#include "storage/error.h"
#include "tools/bench.h"
#include "tools/bench_peaks.h"

namespace strata::tools {

namespace {

constexpr int kH = offload::kK3ExpertHidden, kI = offload::kK3ExpertInter;

struct Options {
  int threads = 0;
  int experts = 16;
  std::vector<int> tokens = {1, 4, 16, 64, 256};
  std::string isa = "auto";
  std::vector<int> prefetch = {-1};
  std::vector<int> pass_tokens = {-1};
  bool no_workspace = false;
  bool no_few = false;
  bool bf16 = false;
  bool unpinned = false;
  std::vector<int> gap_us = {0};
  int repeats = 5;
  int gemm = 4096;
  int membw_mib = 2048;
  std::string json;
};

int run(const Options& o) {
  cpu::Topology topo;
  // Every option in range before memory is allocated (threads are pinned one per core).
  check_option("--threads", o.threads, 0, topo.cores());
  check_option("--experts", o.experts, 1, 1024);
  check_option("--repeats", o.repeats, 1, 10000);
  check_option("--gemm", o.gemm, 64, 32768);
  check_option("--membw-mib", o.membw_mib, 1, 1 << 20);
  for (int t : o.tokens) check_option("--tokens", t, 1, 1 << 16);
  for (int p : o.prefetch) check_option("--prefetch", p, -1, 1 << 20);
  for (int p : o.pass_tokens) check_option("--amx-pass-tokens", p, -1, 1 << 16);
  for (int g : o.gap_us) check_option("--gap-us", g, 0, 1000000);
  check_json_output(o.json);
  const int threads = o.threads > 0 ? o.threads : topo.cores();
  const cpu::ExpertIsa isa = cpu::resolve_isa(cpu::parse_isa(o.isa, "--isa"));
  if (o.experts < 1) throw Error("--experts: expected ≥ 1");
  cpu::PinnedArena arena(topo, threads);
  BenchReport rep("bench cpu-experts");
  rep.note("topology: " + topo.summary());
  rep.note(std::string("expert kernel ISA: ") + cpu::isa_name(isa) +
           " (best on this CPU: " + cpu::isa_name(cpu::best_isa()) +
           "); threads pinned one per core: " + std::to_string(threads));

  const double mem_gbps = measure_read_gbps(arena, topo, size_t(o.membw_mib) << 20, o.repeats, rep);
  const double bf16_tflops =
      measure_bf16_tflops(o.gemm, o.gemm, o.gemm, threads, std::max(3, o.repeats / 2), rep);
  const double ridge = bf16_tflops * 1e12 / (mem_gbps * 1e9);  // FLOP per byte
  {
    std::ostringstream ss;
    ss.precision(3);
    ss << "roofline ridge: " << ridge << " FLOP/byte (bf16 peak / memory read); expert "
       << "intensity 3.79·M FLOP/byte";
    rep.note(ss.str());
  }

  // The experts: released layout, random nibbles, scale codes near 2^-7, in hwloc-bound memory.
  offload::CpuExpertProbe probe(topo, arena, o.experts);
  cpu::CpuExpertOptions opt;
  opt.isa = isa;
  cpu::CpuExpertWorkspace workspace;  // reused by every call, as a layer executor would
  if (!o.no_workspace) opt.workspace = &workspace;
  opt.few_token_kernel = !o.no_few;
  tbb::task_arena plain(threads);  // --unpinned: the same thread count, as the engine's executor
  if (o.unpinned) opt.arena = &plain;

  for (int M : o.tokens) {
    if (M < 1) throw Error("--tokens: expected positive token counts");
    const int reps = M >= 64 ? std::max(1, o.repeats / 2) : o.repeats;
    for (int pf : o.prefetch)
      for (int pt : o.pass_tokens)
        for (int gap : o.gap_us) {
          opt.prefetch = pf;
          opt.amx_pass_tokens = pt;
          const cpu::detail::GemmCounts c0 = cpu::detail::gemm_counts();
          BenchLine l;
          l.name = "cpu-experts M=" + std::to_string(M);
          if (o.prefetch.size() > 1) l.name += " pf=" + std::to_string(pf);
          if (o.pass_tokens.size() > 1) l.name += " pass=" + std::to_string(pt);
          if (gap > 0) l.name += " gap=" + std::to_string(gap) + "us";
          l.shape = "3584->3072->3584 x" + std::to_string(o.experts) + " experts";
          // Every one of the M tokens is routed to every expert: M tokens per expert.
          std::function<void()> call = probe.prepare(M, opt);
          if (gap > 0) {
            // The engine's pattern: the caller busy-waits (as on the GPU's part of a layer) while
            // the workers idle, then calls; the gap is timed with the call and subtracted.
            const auto idle = std::chrono::microseconds(gap);
            call = [call, idle] {
              const auto until = std::chrono::steady_clock::now() + idle;
              while (std::chrono::steady_clock::now() < until) {
              }
              call();
            };
          }
          l.time = measure(call, reps, 1);
          for (double* t : {&l.time.median_s, &l.time.min_s, &l.time.max_s}) *t -= gap * 1e-6;
          l.bytes = double(offload::kK3ExpertBytes) * o.experts;
          l.flops = 2.0 * M * 3.0 * kI * kH * o.experts;
          l.peak_is_bandwidth = 3.79 * M < ridge;
          l.peak_name = l.peak_is_bandwidth ? "memory read (measured)" : "oneDNN bf16 (best rep.)";
          l.peak = l.peak_is_bandwidth ? mem_gbps : bf16_tflops;
          l.note =
              std::string(cpu::isa_name(isa)) + ", contract bits" +
              (o.no_workspace ? ", fresh buffers per call" : ", workspace reused") +
              (M >= 2 && M <= 4 ? (o.no_few ? ", register-tiled" : ", few-token kernel") : "") +
              (o.unpinned ? ", threads not pinned" : ", pinned threads") +
              (gap > 0 ? ", " + std::to_string(gap) + " us idle before each call" : "");
          const cpu::detail::GemmCounts c1 = cpu::detail::gemm_counts();
          if (c1.fast + c1.strict > c0.fast + c0.strict) {
            std::ostringstream ss;
            ss.precision(4);
            ss << ", any-order pairs "
               << 100.0 * double(c1.fast - c0.fast) /
                      double(c1.fast + c1.strict - c0.fast - c0.strict)
               << "%";
            l.note += ss.str();
          }
          rep.add(l);
        }
  }
  // bf16 routed experts (Kimi-Linear-48B: 2304 -> 1024 -> 2304, SiLU) through the bf16 executor
  // (ExpertNumerics::bf16: the trunk's GEMV / oneDNN kernels), every token to every expert.
  if (o.bf16) {
    constexpr int64_t H = 2304, I = 1024;
    const size_t per = size_t(3 * H * I);
    std::vector<uint16_t> w(per * size_t(o.experts));
    arena.arena().execute([&] {
      tbb::parallel_for(size_t(0), w.size(), size_t(1) << 20, [&](size_t i0) {
        const size_t i1 = std::min(w.size(), i0 + (size_t(1) << 20));
        for (size_t i = i0; i < i1; ++i)
          w[i] = f32_to_bf16(float(int(i * 2654435761u % 2001) - 1000) * 2e-5f);
      });
    });
    engine::MoeWeights moe;
    for (int e = 0; e < o.experts; ++e) {
      const uint16_t* b = w.data() + size_t(e) * per;
      moe.experts.push_back({cpu::ref::WeightView::bf16(b, I, H),
                             cpu::ref::WeightView::bf16(b + H * I, I, H),
                             cpu::ref::WeightView::bf16(b + 2 * H * I, H, I)});
    }
    ModelConfig cfg;
    cfg.source = "bench cpu-experts";
    engine::ExpertLayer layer;
    layer.weights = &moe;
    layer.config = &cfg;
    layer.glu.kind = cpu::ref::GluKind::silu;
    layer.in_dim = H;
    layer.intermediate = I;
    auto ex = engine::make_expert_executor(engine::ExpertNumerics::bf16, cfg);
    for (int M : o.tokens) {
      std::vector<float> x(size_t(M) * H), y(size_t(M) * size_t(o.experts) * H);
      for (size_t i = 0; i < x.size(); ++i) x[i] = round_bf16(float(int(i % 13) - 6) * 0.1f);
      std::vector<engine::ExpertTask> tasks(size_t(o.experts));
      int32_t slot = 0;
      for (int e = 0; e < o.experts; ++e) {
        tasks[size_t(e)].expert = e;
        for (int t = 0; t < M; ++t) {
          tasks[size_t(e)].tokens.push_back(t);
          tasks[size_t(e)].slots.push_back(slot++);
        }
      }
      BenchLine l;
      l.name = "cpu-experts bf16 M=" + std::to_string(M);
      l.shape = "2304->1024->2304 x" + std::to_string(o.experts) + " experts";
      l.time = measure(
          [&] {
            arena.arena().execute(
                [&] { ex->run(layer, tasks, x.data(), y.data(), cpu::ref::Precision::bf16); });
          },
          M >= 64 ? std::max(1, o.repeats / 2) : o.repeats, 1);
      l.bytes = double(per) * 2.0 * o.experts;
      l.flops = 2.0 * M * 3.0 * double(H) * double(I) * o.experts;
      l.peak_is_bandwidth = double(M) < ridge;  // M FLOP per weight byte
      l.peak_name = l.peak_is_bandwidth ? "memory read (measured)" : "oneDNN bf16 (best rep.)";
      l.peak = l.peak_is_bandwidth ? mem_gbps : bf16_tflops;
      l.note = "Kimi-Linear shape, bf16 executor (GEMV to " + std::to_string(cpu::kGemvMaxTokens) +
               " tokens, oneDNN above)";
      rep.add(l);
    }
  }
  if (!o.json.empty()) rep.write_json(o.json);
  return 0;
}

BenchSetup setup = [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("--threads", o->threads,
                 "worker threads, pinned one per core (default: all cores)");
  app.add_option("--experts", o->experts, "experts per call (default 16, K3's top-k)");
  app.add_option("--tokens", o->tokens, "tokens per expert to sweep (default 1 4 16 64 256)")
      ->delimiter(',');
  app.add_option("--isa", o->isa, "expert kernel: auto, scalar, avx2, avx512, amx (default auto)");
  app.add_option("--prefetch", o->prefetch,
                 "software prefetch distance(s) in bytes of the one-token kernel, a line each "
                 "(0 none; default: the kernel's default)")
      ->delimiter(',');
  app.add_option("--amx-pass-tokens", o->pass_tokens,
                 "AMX kernel: tokens per pass over 64 decoded weight rows, a line each (0: all "
                 "tokens per 16 rows, the old loop order; default: the kernel's default, 64)")
      ->delimiter(',');
  app.add_flag("--no-workspace", o->no_workspace,
               "allocate the kernels' buffers in every call (no CpuExpertWorkspace)");
  app.add_flag(
      "--no-few-token-kernel", o->no_few,
      "2 to 4 tokens per expert on the register-tiled kernel instead of the few-token one");
  app.add_flag(
      "--bf16", o->bf16,
      "also the bf16 routed experts of Kimi-Linear (2304 -> 1024 -> 2304) through the bf16 "
      "executor, the same experts and tokens");
  app.add_flag("--unpinned", o->unpinned,
               "run the expert kernels in an arena of unpinned threads (as the engine's executor "
               "does unless STRATA_PIN_EXPERT_THREADS=1)");
  app.add_option("--gap-us", o->gap_us,
                 "idle microseconds before each call, a line each (the engine's pattern: the "
                 "caller waits on the GPU between layers; default 0)")
      ->delimiter(',');
  app.add_option("--repeats", o->repeats, "timed repeats per line (default 5; half for M ≥ 64)");
  app.add_option("--gemm", o->gemm, "oneDNN bf16 peak matmul size N (N×N×N, default 4096)");
  app.add_option("--membw-mib", o->membw_mib, "memory read peak buffer in MiB (default 2048)");
  app.add_option("--json", o->json, "also write the lines as JSON to FILE");
  return [o] { return run(*o); };
};

STRATA_BENCH("cpu-experts",
             "CPU MXFP4 expert FFN at K3's shape vs measured memory read and oneDNN bf16 peaks",
             setup);

}  // namespace

}  // namespace strata::tools
