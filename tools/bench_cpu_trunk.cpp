// `strata bench cpu-trunk`: the dense trunk on the CPU — the bf16 GEMV and the oneDNN GEMM of
// cpu/bf16_linear.h at K3's shapes, and with -m DIR the fast CPU backend
// (engine/cpu_fast_backend.h) decoding and prefilling that model — next to peaks measured in the
// same run: the streaming memory read (measured interleaved with each bandwidth line, so both see
// the same load on a shared machine) and oneDNN's bf16 matmul with pre-packed weights at the
// trunk's largest GEMM shape.
//
// Napkin (STYLE.md §17): decode reads every trunk weight once per token (K3: ≈ 113 GB of bf16;
// k3-mini: ≈ 0.47 GB, 70% of it the 163840 × 1024 lm_head) at 2 FLOP per 2-byte weight: memory
// bound by far (the ridge point of a 2-core VM is ≈ 100 FLOP/byte). Prefill of T tokens does
// 2·T FLOPs per weight: above T ≈ 100 the GEMMs are compute bound, and the largest trunk GEMM
// (K3: the dense MLP's 33792 × 7168 gate/up; k3-mini: 4096 × 1024) is where the peak is taken.
// The issue 23 targets: decode moves the token's weight bytes at ≥ 80% of the measured memory
// read; prefill's dense GEMMs reach ≥ 60% of the oneDNN bf16 peak.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "cpu/bf16_linear.h"
#include "cpu/topology.h"
#include "engine/cpu_fast_backend.h"
#include "engine/model.h"
#include "engine/session.h"
#include "storage/error.h"
#include "tools/bench.h"
#include "tools/bench_peaks.h"

namespace strata::tools {

namespace {

struct Options {
  int threads = 0;
  int repeats = 7;
  std::vector<int> tokens = {1, 2, 4, 8, 16, 32, 64};
  int gemm_tokens = 512;
  int membw_mib = 1024;
  std::string model;
  int prompt = 512;
  int decode = 16;
  bool no_kernels = false;
  std::string json;
  std::string gemv_isa = "auto";
  cpu::GemvIsa isa = cpu::GemvIsa::automatic;  // gemv_isa, parsed and resolved before any work
};

std::string fmt(double v, int prec = 3) {
  std::ostringstream ss;
  ss.precision(prec);
  ss << v;
  return ss.str();
}

// ------------------------------------------------------------------------------------------------
// Kernels at K3's shapes

struct Shape {
  const char* what;
  int64_t N, K;
};

void kernel_lines(const Options& o, cpu::PinnedArena& arena, const cpu::Topology& topo,
                  const BoundBuffer& rd, BenchReport& rep) {
  // One weight buffer viewed with every shape (the largest: the dense MLP gate, 484 MB).
  const Shape gemv_shapes[] = {{"KDA q|k|v|g", 12288, 7168},
                               {"KDA o_proj", 7168, 12288},
                               {"MLA q_b", 18432, 1536},
                               {"router", 896, 7168},
                               {"k3-mini lm_head", 163840, 1024}};
  const Shape largest = {"K3 dense gate", 33792, 7168};
  BoundBuffer w(topo, size_t(largest.N * largest.K * 2));
  // Bytes 0x3C..0x40: finite positive bf16 values (≈ 0.01 … 2), no NaN, no subnormals.
  arena.arena().execute([&] { offload::fill_random(w.data(), w.bytes(), 7, 0x3C, 0x40); });
  const auto* W = reinterpret_cast<const uint16_t*>(w.data());
  const int64_t Tmax =
      std::max<int64_t>(o.gemm_tokens, *std::max_element(o.tokens.begin(), o.tokens.end()));
  std::vector<float> x(size_t(Tmax * largest.K), 0.25f), y(size_t(Tmax * largest.N));
  const cpu::GemvIsa isa = o.isa;

  auto bandwidth_line = [&](const std::string& name, const Shape& s, int64_t T,
                            const std::function<void()>& fn, const std::string& note) {
    const size_t bytes = size_t(s.N * s.K * 2);
    auto [rs, fs] = measure_interleaved([&] { stream_read(arena, rd.data(), rd.bytes()); },
                                        [&] { arena.arena().execute(fn); }, o.repeats);
    BenchLine l;
    l.name = name;
    l.shape = std::string(s.what) + " " + std::to_string(s.N) + "x" + std::to_string(s.K) +
              " T=" + std::to_string(T);
    l.time = fs;
    l.bytes = double(bytes);
    l.flops = 2.0 * double(T) * double(s.N) * double(s.K);
    l.peak_name = "memory read (interleaved)";
    l.peak = double(rd.bytes()) / rs.median_s / 1e9;
    l.note = note;
    rep.add(l);
  };

  for (const Shape& s : gemv_shapes)
    bandwidth_line(
        "gemv T=1", s, 1,
        [&] { cpu::gemv_bf16(x.data(), 1, W, s.N, s.K, s.K, y.data(), s.N, true, isa); },
        std::string(cpu::gemv_isa_name(isa)) + ", bf16 out");

  // Where GEMV hands over to oneDNN: both kernels at small T on the KDA projection.
  cpu::OnednnBf16Gemm gemm;
  const Shape& q = gemv_shapes[0];
  for (int T : o.tokens) {
    bandwidth_line(
        "gemv T=" + std::to_string(T), q, T,
        [&] { cpu::gemv_bf16(x.data(), T, W, q.N, q.K, q.K, y.data(), q.N, true, isa); },
        cpu::gemv_isa_name(isa));
    bandwidth_line(
        "oneDNN T=" + std::to_string(T), q, T,
        [&] { gemm.run(x.data(), T, W, q.N, q.K, q.K, y.data(), q.N, true); },
        gemm.impl_info(T, q.N, q.K));
  }

  // The prefill GEMM at the trunk's largest shape against oneDNN's packed-weight peak.
  const int64_t M = o.gemm_tokens;
  const double peak = measure_bf16_tflops(M, largest.N, largest.K, arena.threads(),
                                          std::max(3, o.repeats / 2), rep, largest.what);
  BenchLine l;
  l.name = "oneDNN bf16 GEMM (trunk)";
  l.shape = std::string(largest.what) + " " + std::to_string(M) + "x" + std::to_string(largest.K) +
            "x" + std::to_string(largest.N);
  l.time = measure(
      [&] {
        arena.arena().execute([&] {
          gemm.run(x.data(), M, W, largest.N, largest.K, largest.K, y.data(), largest.N, true);
        });
      },
      std::max(3, o.repeats / 2), 1);
  l.flops = 2.0 * double(M) * double(largest.N) * double(largest.K);
  l.peak_is_bandwidth = false;
  l.peak_name = "oneDNN packed (best)";
  l.peak = peak;
  l.note = "weights in place ('ba'), slices over " + std::to_string(arena.threads()) +
           " TBB threads; impl " + gemm.impl_info(M, largest.N, largest.K);
  rep.add(l);
}

// ------------------------------------------------------------------------------------------------
// The fast backend on a model

// The trunk matrix with the most weights among those every prefill row multiplies (lm_head
// excluded: prefill computes the last row's logits only).
Shape largest_trunk_gemm(const engine::Model& m) {
  Shape best{"", 0, 0};
  auto see = [&](const cpu::ref::WeightView& w, const char* what) {
    if (w.data && w.rows * w.cols > best.N * best.K) best = {what, w.rows, w.cols};
  };
  for (const auto& L : m.weights().layers) {
    if (L.kda) {
      see(L.kda->q_proj, "KDA q_proj");
      see(L.kda->g_proj, "KDA g_proj");
      see(L.kda->o_proj, "KDA o_proj");
    }
    if (L.mla) {
      see(L.mla->q_b_proj, "MLA q_b_proj");
      see(L.mla->q_proj, "MLA q_proj");
      see(L.mla->o_proj, "MLA o_proj");
    }
    if (L.dense) {
      see(L.dense->mlp.gate, "dense gate");
      see(L.dense->mlp.down, "dense down");
    }
    if (L.moe) {
      see(L.moe->latent_down, "latent down");
      see(L.moe->latent_up, "latent up");
      if (L.moe->shared) see(L.moe->shared->gate, "shared gate");
    }
  }
  return best;
}

void model_lines(const Options& o, cpu::PinnedArena& arena, const BoundBuffer& rd,
                 BenchReport& rep) {
  auto model = engine::Model::load(o.model);
  const ModelConfig& c = model->config();
  engine::BackendOptions bo;
  bo.precision = engine::Precision::bf16;
  bo.experts = engine::ExpertNumerics::contract;
  std::unique_ptr<engine::CpuFastBackend> be;
  arena.arena().execute(
      [&] { be = std::make_unique<engine::CpuFastBackend>(*model, bo, 1, o.isa); });
  engine::Session s(*model, *be, 0);
  rep.note("model " + o.model + ": backend " + be->name());

  std::mt19937 rng(1);
  std::vector<int32_t> prompt(size_t(o.prompt));
  for (auto& id : prompt) id = int32_t(rng() % uint32_t(c.vocab_size));
  using P = engine::FastBackendProfile;
  auto run = [&](auto&& f) { arena.arena().execute(f); };

  // Warm-up: primitives created, pages of the mmapped weights touched.
  std::vector<float> logits;
  run([&] {
    logits = s.forward(prompt);
    int32_t t = 0;
    logits = s.forward(std::span(&t, 1));
  });

  // Prefill, repeated from a fresh slot.
  const Shape big = largest_trunk_gemm(*model);
  const double peak = measure_bf16_tflops(o.prompt, big.N, big.K, arena.threads(),
                                          std::max(3, o.repeats / 2), rep, big.what);
  const int prefill_reps = std::max(2, o.repeats / 3);
  std::vector<P> profs;
  BenchStats ps = measure(
      [&] {
        s.reset();
        be->reset_profile();
        run([&] { logits = s.forward(prompt); });
        profs.push_back(be->profile());
      },
      prefill_reps, 0);
  std::sort(profs.begin(), profs.end(),
            [](const P& a, const P& b) { return a.seconds[P::gemm] < b.seconds[P::gemm]; });
  const P& pm = profs[profs.size() / 2];
  BenchStats gs;
  gs.repeats = prefill_reps;
  gs.min_s = profs.front().seconds[P::gemm];
  gs.max_s = profs.back().seconds[P::gemm];
  gs.median_s = pm.seconds[P::gemm];
  BenchLine l;
  l.name = "prefill dense GEMMs";
  l.shape = std::to_string(o.prompt) + " tokens, all trunk linears";
  l.time = gs;
  l.flops = pm.flops[P::gemm];
  l.peak_is_bandwidth = false;
  l.peak_name = "oneDNN packed (best)";
  l.peak = peak;
  l.note = "time inside the linears only; peak at " + std::string(big.what) + " " +
           std::to_string(big.N) + "x" + std::to_string(big.K);
  rep.add(l);
  BenchLine w;
  w.name = "prefill (whole step)";
  w.shape = std::to_string(o.prompt) + " tokens";
  w.time = ps;
  w.flops = pm.flops[P::gemm];
  w.peak_is_bandwidth = false;
  w.peak_name = "oneDNN packed (best)";
  w.peak = peak;
  w.note = fmt(double(o.prompt) / ps.median_s, 4) + " tok/s; FLOPs of the linears only";
  rep.add(w);
  {
    std::string split = "prefill split (median repeat):";
    double total = 0;
    for (int k = 0; k < P::kinds; ++k) total += pm.seconds[size_t(k)];
    for (int k = 0; k < P::kinds; ++k)
      split += std::string(" ") + P::name(P::Kind(k)) + " " + fmt(pm.seconds[size_t(k)] * 1e3, 4) +
               " ms (" + fmt(100.0 * pm.seconds[size_t(k)] / total, 3) + "%);";
    rep.note(split);
  }

  // Decode: steps after a prefill, each interleaved with a memory read of the same bytes.
  // The token's weight bytes: every bf16 trunk matrix the step multiplies (the profile counts
  // them) plus the MXFP4 bytes of its top-k routed experts per MoE layer.
  const int64_t Din = c.expert_in_dim(), I = c.moe.intermediate_size;
  const double expert_bytes = 3.0 * (double(I) * double(Din) / 2 + double(I) * double(Din) / 32);
  int moe_layers = 0;
  for (int layer = 0; layer < c.num_layers; ++layer) moe_layers += c.is_moe(layer) ? 1 : 0;
  const double routed_bytes = double(moe_layers) * double(c.moe.top_k) * expert_bytes;
  s.reset();
  run([&] { logits = s.forward(prompt); });
  be->reset_profile();
  int32_t tok = 0;
  int steps = 0;
  auto [rs, ds] = measure_interleaved(
      [&] { stream_read(arena, rd.data(), rd.bytes()); },
      [&] {
        tok = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        run([&] { logits = s.forward(std::span(&tok, 1)); });
        ++steps;
      },
      o.decode);
  const P& pd = be->profile();
  const double trunk_bytes = pd.weight_bytes[P::gemv] / double(steps);
  BenchLine d;
  d.name = "decode step";
  d.shape = "pos " + std::to_string(o.prompt) + "+, " + fmt(trunk_bytes / 1e6, 4) + " MB trunk + " +
            fmt(routed_bytes / 1e6, 4) + " MB experts";
  d.time = ds;
  d.bytes = trunk_bytes + routed_bytes;
  d.peak_name = "memory read (interleaved)";
  d.peak = double(rd.bytes()) / rs.median_s / 1e9;
  d.note = fmt(1.0 / ds.median_s, 4) + " tok/s";
  rep.add(d);
  {
    std::string split = "decode split (per step):";
    double total = 0;
    for (int k = 0; k < P::kinds; ++k) total += pd.seconds[size_t(k)];
    for (int k = 0; k < P::kinds; ++k)
      split += std::string(" ") + P::name(P::Kind(k)) + " " +
               fmt(pd.seconds[size_t(k)] / steps * 1e3, 4) + " ms (" +
               fmt(100.0 * pd.seconds[size_t(k)] / total, 3) + "%);";
    rep.note(split);
    rep.note("decode GEMV alone: " + fmt(pd.weight_bytes[P::gemv] / pd.seconds[P::gemv] / 1e9, 4) +
             " GB/s over the trunk's bf16 weights");
  }
}

int run(const Options& o) {
  cpu::Topology topo;
  const int threads = o.threads > 0 ? o.threads : topo.cores();
  cpu::PinnedArena arena(topo, threads);
  BenchReport rep("bench cpu-trunk");
  rep.note("topology: " + topo.summary() + "; threads pinned one per core: " +
           std::to_string(threads) + "; GEMV ISA " + cpu::gemv_isa_name(cpu::best_gemv_isa()));
  BoundBuffer rd(topo, size_t(o.membw_mib) << 20);
  arena.arena().execute([&] { offload::fill_random(rd.data(), rd.bytes(), 99); });
  measure_read_gbps(arena, topo, rd.bytes(), o.repeats, rep);
  if (!o.no_kernels) kernel_lines(o, arena, topo, rd, rep);
  if (!o.model.empty()) model_lines(o, arena, rd, rep);
  if (!o.json.empty()) rep.write_json(o.json);
  return 0;
}

BenchSetup setup = [](CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("--threads", o->threads,
                 "worker threads, pinned one per core (default: all cores)");
  app.add_option("--repeats", o->repeats, "timed repeats per line (default 7)");
  app.add_option("--tokens", o->tokens,
                 "tokens per call of the GEMV / oneDNN crossover sweep (default 1,2,4,8,16,32,64)")
      ->delimiter(',');
  app.add_option("--gemm-tokens", o->gemm_tokens,
                 "rows of the prefill GEMM at K3's largest trunk shape (default 512)");
  app.add_option("--membw-mib", o->membw_mib, "memory read buffer in MiB (default 1024)");
  app.add_option("-m,--model", o->model,
                 "also run the fast CPU backend on this model: prefill and decode lines");
  app.add_option("--prompt", o->prompt, "prefill tokens with -m (default 512)");
  app.add_option("--decode", o->decode, "decode steps with -m (default 16)");
  app.add_flag("--no-kernels", o->no_kernels, "skip the kernel lines at K3's shapes");
  app.add_option("--json", o->json, "also write the lines as JSON to FILE");
  app.add_option("--gemv-isa", o->gemv_isa,
                 "GEMV kernels (kernel lines and -m): auto, scalar, avx2, avx512bf16 or amx");
  return [o] {
    o->isa = cpu::resolve_gemv_isa(cpu::parse_gemv_isa(o->gemv_isa, "--gemv-isa"));
    if (o->prompt < 1 || o->decode < 1 || o->repeats < 1 || o->gemm_tokens < 1)
      throw Error("bench cpu-trunk: --prompt, --decode, --repeats and --gemm-tokens must be ≥ 1");
    for (int t : o->tokens)
      if (t < 1) throw Error("bench cpu-trunk: --tokens: expected positive token counts");
    check_json_output(o->json);
    return run(*o);
  };
};

STRATA_BENCH("cpu-trunk",
             "bf16 GEMV / oneDNN GEMM of the dense trunk and the fast CPU backend (-m) vs the "
             "measured memory read and oneDNN bf16 peaks",
             setup);

}  // namespace

}  // namespace strata::tools
