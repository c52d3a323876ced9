// `strata bench cpu-experts`: the CPU routed-expert kernels (cpu/expert_kernels.h) at K3's expert
// shape (3584 → 3072 → 3584), E experts × M tokens per expert, next to two peaks measured in the
// same run: the machine's multi-threaded streaming memory read and oneDNN's bf16 matmul.
//
// Napkin (STYLE.md §17): one K3 expert is 3 × 3072 × 3584 MXFP4 weights = 16.5 MB of nibbles +
// 1.03 MB of scales = 17.55 MB; 16 experts = 281 MB per token per layer (≫ LLC, so every call
// reads DRAM). FLOPs = 2 · M · 3 · 3072 · 3584 per expert. Arithmetic intensity ≈ 3.8 · M FLOP
// per weight byte, so M = 1 is memory-bound and large M compute-bound; each line states the
// roofline peak that binds (memory below the ridge point, bf16 GEMM above).
#include <dlfcn.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <sstream>
#include <vector>

#include "cpu/expert_kernels.h"
#include "cpu/expert_kernels_impl.h"
#include "cpu/topology.h"
#include "offload/hw_measure.h"
#include "storage/error.h"
#include "tools/bench.h"

namespace strata::tools {

// oneDNN (OpenMP inside) gets as many threads as the benchmark; libgomp is already loaded with
// libdnnl, so its setter is found at run time (no -fopenmp needed here).
static void set_omp_threads(int n) {
  using Fn = void (*)(int);
  if (auto f = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) f(n);
}

double measure_onednn_bf16_tflops(int n, int threads, int repeats, BenchReport& rep) {
  using namespace dnnl;
  using dt = memory::data_type;
  using tag = memory::format_tag;
  set_omp_threads(threads);
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const memory::dims ad{n, n}, bd{n, n}, cd{n, n};
  auto pd = matmul::primitive_desc(
      matmul::desc(memory::desc(ad, dt::bf16, tag::ab), memory::desc(bd, dt::bf16, tag::any),
                   memory::desc(cd, dt::f32, tag::ab)),
      eng);
  memory a(pd.src_desc(), eng), b_user({bd, dt::bf16, tag::ab}, eng), b(pd.weights_desc(), eng),
      c(pd.dst_desc(), eng);
  // bf16 0x3F80 = 1.0 with small random low bits: finite values, no denormals.
  for (memory* m : {&a, &b_user}) {
    auto* p = static_cast<uint16_t*>(m->get_data_handle());
    for (size_t i = 0; i < size_t(n) * size_t(n); ++i)
      p[i] = uint16_t(0x3F80 | (i * 2654435761u >> 28));
  }
  reorder(b_user, b).execute(s, b_user, b);  // pack once (format_tag::any), as the experts would
  matmul mm(pd);
  auto run = [&] {
    mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    s.wait();
  };
  BenchLine l;
  l.name = "oneDNN bf16 matmul (peak)";
  l.shape = std::to_string(n) + "^3 bf16->f32, " + std::to_string(threads) + " thr";
  l.time = measure(run, repeats, 1);
  l.flops = 2.0 * double(n) * double(n) * double(n);
  l.peak_is_bandwidth = false;
  // The peak is the best repeat (not the median shown in the line), so that the experts' "% of
  // peak" is conservative: this line's own %peak is its median against its best.
  const double best = l.flops / l.time.min_s / 1e12;
  l.peak_name = "best repeat";
  l.peak = best;
  std::ostringstream ss;
  ss.precision(3);
  ss << "peak = best of " << l.time.repeats << " repeats, " << best << " TFLOP/s; impl "
     << pd.impl_info_str();
  l.note = ss.str();
  rep.add(l);
  return best;
}

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
  int repeats = 5;
  int gemm = 4096;
  int membw_mib = 2048;
  std::string json;
};

double measure_read_gbps(cpu::PinnedArena& arena, const cpu::Topology& topo, size_t bytes,
                         int repeats, BenchReport& rep) {
  std::string note;
  const offload::RateSample s = offload::measure_host_read(arena, topo, bytes, repeats, &note);
  BenchLine l;
  l.name = "memory read (peak)";
  l.shape =
      std::to_string(bytes >> 20) + " MiB stream, " + std::to_string(arena.threads()) + " thr";
  l.time = {s.median_s, s.min_s, s.max_s, s.repeats};
  l.bytes = s.bytes;
  l.peak_name = "itself";
  l.peak = l.gbps();
  l.note = note;
  rep.add(l);
  return l.gbps();
}

int run(const Options& o) {
  cpu::Topology topo;
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
      measure_onednn_bf16_tflops(o.gemm, threads, std::max(3, o.repeats / 2), rep);
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

  for (int M : o.tokens) {
    if (M < 1) throw Error("--tokens: expected positive token counts");
    const int reps = M >= 64 ? std::max(1, o.repeats / 2) : o.repeats;
    for (int pf : o.prefetch)
      for (int pt : o.pass_tokens) {
        opt.prefetch = pf;
        opt.amx_pass_tokens = pt;
        const cpu::detail::GemmCounts c0 = cpu::detail::gemm_counts();
        BenchLine l;
        l.name = "cpu-experts M=" + std::to_string(M);
        if (o.prefetch.size() > 1) l.name += " pf=" + std::to_string(pf);
        if (o.pass_tokens.size() > 1) l.name += " pass=" + std::to_string(pt);
        l.shape = "3584->3072->3584 x" + std::to_string(o.experts) + " experts";
        // Every one of the M tokens is routed to every expert: M tokens per expert.
        l.time = measure(probe.prepare(M, opt), reps, 1);
        l.bytes = double(offload::kK3ExpertBytes) * o.experts;
        l.flops = 2.0 * M * 3.0 * kI * kH * o.experts;
        l.peak_is_bandwidth = 3.79 * M < ridge;
        l.peak_name = l.peak_is_bandwidth ? "memory read (measured)" : "oneDNN bf16 (best rep.)";
        l.peak = l.peak_is_bandwidth ? mem_gbps : bf16_tflops;
        l.note = std::string(cpu::isa_name(isa)) + ", contract bits" +
                 (o.no_workspace ? ", fresh buffers per call" : ", workspace reused");
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
