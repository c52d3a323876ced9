// The model-shape probes of `strata bench hw -m DIR` (hw_measure.h measure_model_shapes): the fast
// CPU backend's pieces (engine/cpu_fast_backend.cpp) timed at one model's own shapes, so that the
// cost model's formulas for `--device cpu` get rates measured where that model runs — small
// matrices at 16 threads pay a fork/join per call that 64 MiB ones hide, a 0.31 MB expert's
// per-token work is a larger share than a 17.5 MB one's, and the attention cores at 8 heads and a
// short context are bound by per-call work, not by the bytes and FLOPs the K3-shaped probes see.
//
// Each probe runs the same cpu/ kernels the backend calls, in the order it calls them, on random
// weights of the model's shapes, cycled over as many layers as the model has (so the caches see a
// model's working set), and converts the time into the unit of the cost model's input it
// replaces (ModelShapeRates in hardware.h), with the fixed costs the cost model adds separately
// (one per linear call, one per CPU expert job) taken out. Not here: the engine itself (offload
// does not depend on engine/; `strata bench e2e` measures that), the untimed rest of a step, the
// embedding gather and the sampler.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "cpu/bf16_linear.h"
#include "cpu/mixer_kernels.h"
#include "cpu/ref/ops.h"
#include "cpu/row_ops.h"
#include "cpu/topology.h"
#include "offload/cost_model.h"
#include "offload/format.h"
#include "offload/hw_measure.h"
#include "storage/error.h"

namespace strata::offload {

namespace {

namespace fs = std::filesystem;

// A pool of bf16 weights the probes' matrices are carved from in turn, wrapping around when a
// model's trunk is larger than the pool (the pool stays ≫ the last-level cache either way). It is
// a file mapped MAP_SHARED, as the engine maps its checkpoint (storage/safetensors.cpp), so the
// page cache decides its page size for the probe as it does for the engine: on the dev VM (ext4,
// kernel 6.18) the checkpoint sits in 2 MB folios, and k3-mini's step of linear calls ran 5–10 %
// faster there than on 4 KiB anonymous pages. The file goes next to the model's config.json (the
// filesystem the engine will read) when that directory is writable, else into the temp
// directory, and is unlinked at once; anonymous memory only when neither can be written.
class WeightPool {
 public:
  WeightPool(size_t elems, const fs::path& near) : n_(std::max<size_t>(elems, 1)) {
    const size_t bytes = n_ * 2;
    for (const fs::path& dir : {near, fs::temp_directory_path()}) {
      if (dir.empty()) continue;
      const fs::path f = dir / (".strata-bench-hw-" + std::to_string(::getpid()) + ".weights");
      const int fd = ::open(f.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0) continue;
      ::unlink(f.c_str());
      std::vector<uint16_t> chunk(size_t(4) << 20);
      bool ok = true;
      for (size_t i0 = 0; i0 < n_ && ok; i0 += chunk.size()) {
        const size_t n = std::min(chunk.size(), n_ - i0);
        for (size_t i = 0; i < n; ++i) chunk[i] = value(i0 + i);
        ok = ::pwrite(fd, chunk.data(), n * 2, off_t(i0 * 2)) == ssize_t(n * 2);
      }
      void* m = ok ? ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
      ::close(fd);
      if (m == MAP_FAILED) continue;
      p_ = static_cast<const uint16_t*>(m);
      where_ = "mapped from a file in " + dir.string();
      return;
    }
    anon_.resize(n_);
    for (size_t i = 0; i < n_; ++i) anon_[i] = value(i);
    p_ = anon_.data();
    where_ = "anonymous memory (no writable directory for a mapped file)";
  }
  ~WeightPool() {
    if (anon_.empty()) ::munmap(const_cast<uint16_t*>(p_), n_ * 2);
  }
  WeightPool(const WeightPool&) = delete;
  WeightPool& operator=(const WeightPool&) = delete;
  cpu::ref::WeightView next(int64_t rows, int64_t cols) {
    const size_t n = size_t(rows * cols);
    STRATA_ASSERT(n <= n_);
    if (used_ + n > n_) used_ = 0;
    const uint16_t* p = p_ + used_;
    used_ += n;
    return cpu::ref::WeightView::bf16(p, rows, cols);
  }
  const std::string& where() const { return where_; }

 private:
  static uint16_t value(size_t i) {
    return uint16_t(0x3C00 | ((i * 2654435761u >> 24) & 0xFF));  // ≈ 1.0 ± small
  }
  size_t n_;
  const uint16_t* p_ = nullptr;
  std::vector<uint16_t> anon_;
  size_t used_ = 0;
  std::string where_;
};

struct Probe {
  const ModelConfig& c;
  const MeasureOptions& o;
  tbb::task_arena& arena;
  int threads;
  int reps;
  std::string thr, basis;
  std::function<void()> cold;  // MeasureOptions::model_cold_bytes: the cache sweep, or empty

  RateSample time(const std::function<void()>& fn, int repeats) const {
    RateSample s = time_repeats([&] { arena.execute(fn); }, repeats, 1, cold);
    if (o.cpu_time && s.cpu_median_s > 0) {  // as measure_hardware's --cpu-time
      const double f = s.cpu_median_s / threads / s.median_s;
      s.median_s *= f, s.min_s *= f, s.max_s *= f;
    }
    return s;
  }
  void emit(const std::string& name, const std::string& shape, const RateSample& s, double flops,
            const std::string& note, bool bandwidth) const {
    if (!o.line) return;
    MeasuredLine l;
    l.name = "hw/model " + name;
    l.shape = shape;
    l.time = s;
    l.flops = flops;
    l.peak_name = "no peak (model-shape probe)";
    l.peak_is_bandwidth = bandwidth;
    l.note = note;
    o.line(l);
  }
  void progress(const std::string& s) const {
    if (o.progress) o.progress(s);
  }
};

// One linear call's fixed cost: cpu::Bf16Linear on a 64×1024 weight (cache resident), M = 1,
// as kernels.cpu_linear_call_us; measured again here so the trunk's rate and the cost taken out
// of it come from the same run.
Rate linear_call_rate(const Probe& p) {
  cpu::Bf16Linear lin;
  std::vector<uint16_t> w(64 * 1024, 0x3C00);
  const cpu::ref::WeightView W = cpu::ref::WeightView::bf16(w.data(), 64, 1024);
  std::vector<float> x(1024, 0.01f), y(64);
  RateSample s = p.time(
      [&] {
        for (int i = 0; i < 100; ++i) lin(x.data(), 1, W, y.data(), true);
      },
      p.reps);
  const double us = s.median_s / 100 * 1e6;
  p.emit("linear call", "bf16 [64, 1024] x100, " + p.thr, s, 0, fmt("%.2f us per call", us), false);
  return Rate(us, "measured: cpu::Bf16Linear on bf16 [64, 1024], M = 1, " + p.thr + p.basis);
}

// The step's linear calls at M rows (fast_step_linears: fused up to kGemvMaxTokens), lm_head at M
// rows in a decode step; GB/s of weights with the calls' fixed costs taken out.
RateCurve trunk_curve(const Probe& p, const std::vector<int>& Ms, double call_us) {
  const ModelConfig& c = p.c;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  size_t total = size_t(V * D), max_rows = 1, max_cols = size_t(D), max_outs = 1;  // layers'
  size_t largest = size_t(V * D);
  for (const FastLinearCall& call : fast_step_linears(c, true)) {
    max_outs = std::max(max_outs, call.matrices.size());
    for (auto [r, k] : call.matrices) {
      total += size_t(r * k), largest = std::max(largest, size_t(r * k));
      max_rows = std::max(max_rows, size_t(r)), max_cols = std::max(max_cols, size_t(k));
    }
  }
  // The whole trunk when it fits 1 GiB (512 MiB quick), else that much in turn (elements of 2 B),
  // and never less than the largest matrix (lm_head of a K3-wide model is 2.35 GB).
  const size_t cap = (p.o.quick ? size_t(256) : size_t(512)) << 20;
  WeightPool pool(std::max(largest, std::min(total, cap)), fs::path(c.source).parent_path());
  cpu::Bf16Linear lin;
  RateCurve curve;
  for (int M : Ms) {
    const bool decode = M <= cpu::kGemvMaxTokens;
    const std::vector<FastLinearCall> calls = fast_step_linears(c, decode);
    std::vector<float> x(size_t(M) * max_cols, 0.01f);
    std::vector<std::vector<float>> y(max_outs, std::vector<float>(size_t(M) * max_rows));
    std::vector<float> logits(decode ? size_t(M) * size_t(V) : 0);
    double bytes = decode ? double(V * D) * 2 : 0;
    for (const FastLinearCall& call : calls)
      for (auto [r, k] : call.matrices) bytes += double(r * k) * 2;
    const double n_calls = double(calls.size()) + (decode ? 1 : 0);
    RateSample s = p.time(
        [&] {
          for (const FastLinearCall& call : calls) {
            const int64_t K = call.matrices[0].second;
            if (call.matrices.size() == 1) {
              const auto [r, k] = call.matrices[0];
              lin(x.data(), M, pool.next(r, k), y[0].data(), true);
              continue;
            }
            std::vector<cpu::ref::WeightView> Ws;
            for (auto [r, k] : call.matrices) Ws.push_back(pool.next(r, k));
            std::vector<cpu::Bf16Linear::Out> outs;
            for (size_t i = 0; i < Ws.size(); ++i) outs.push_back({&Ws[i], y[i].data(), true});
            lin.multi(x.data(), M, K, outs);
          }
          if (decode) lin(x.data(), M, pool.next(V, D), logits.data(), true);
        },
        M >= 64 ? std::max(2, p.reps / 2) : p.reps);
    s.bytes = bytes;
    // The cost model adds call_us per call; never let that take more than 80 % of the time.
    const double net = std::max(0.2 * s.median_s, s.median_s - n_calls * call_us * 1e-6);
    curve.points.push_back({M, bytes / net / 1e9});
    p.emit("trunk M=" + std::to_string(M),
           fmt("%.0f calls, %.1f MB, ", n_calls, bytes / 1e6) + p.thr, s, bytes * M,
           fmt(decode ? "a decode step's calls (lm_head at M rows); %.1f GB/s net of calls"
                      : "a prefill chunk's calls (no lm_head); %.1f GB/s net of calls",
               bytes / net / 1e9),
           true);
  }
  curve.source =
      "measured: the fast CPU backend's linear calls of a step at this model's shapes "
      "(cpu::Bf16Linear), weights " +
      pool.where() + ", " + p.thr + p.basis + "; one call's fixed cost taken out";
  return curve;
}

// Tokens per expert M ↔ the step that gives it: the fewest tokens T whose flat routing gives at
// least M tokens per touched expert (T·k / U(T) ≥ M; U(T) → E, so T ≈ M·E / k for large M).
int step_tokens_for(const ModelConfig& c, int M) {
  const double k = c.moe.top_k;
  if (M <= 1) return 1;
  for (int T = 1;; ++T)
    if (T * k / flat_distinct_experts(c, T) >= M) return T;
}

// The CPU routed experts at the model's expert shape as the engine runs a MoE layer of them: a
// step of T tokens routed flat at random (each token to k distinct experts; the experts' token
// counts spread as a flat router's do), cpu::RoutedExperts (quantize once, gather, kernels, copy
// to slots with the bf16 rounding) and the backend's merge, the model's MoE layers in turn.
// (The form before timed the kernels alone on M consecutive rows per expert: on an H100
// machine's 16 threads the engine's routed experts took ≈ 1.8× its time from 2 tokens per
// expert — docs/planner.md, (2).) Two curves: `expert` (by tokens per expert M, each from a step
// of step_tokens_for(M) tokens) and `expert_decode` (by decode batch B ≤ kGemvMaxTokens, a step
// of B tokens), GB/s of the touched experts' weights with the CPU expert job's start taken out.
void expert_curves(const Probe& p, const cpu::Topology& topo, cpu::PinnedArena& pinned,
                   const std::vector<int>& Ms, const std::vector<int>& Bs, ModelShapeRates& ms) {
  const ModelConfig& c = p.c;
  const int E = c.moe.num_experts, k = c.moe.top_k, Din = c.expert_in_dim();
  const int I = c.moe.intermediate_size, layers = c.num_moe_layers();
  CpuExpertProbe probe(topo, pinned, E, Din, I, std::max(1, layers));
  cpu::CpuExpertWorkspace ws;
  cpu::CpuExpertOptions opt;
  opt.isa = cpu::best_isa();
  opt.workspace = &ws;
  // As the engine's executor runs (cpu::pin_expert_threads): the probe's pinned arena, or not.
  const bool pin = cpu::pin_expert_threads();
  opt.arena = pin ? nullptr : &p.arena;
  const int calls = std::clamp(layers, 1, 8);  // a step's MoE layers, up to 8
  const double job_s = CostAssumptions{}.cpu_expert_call_us * 1e-6;
  auto point = [&](const std::string& name, int T, int key, RateCurve& curve) {
    double touched = 0;  // distinct experts per routing (mean)
    std::function<void()> run = probe.prepare_routed(T, k, opt, &touched);
    // One repeat is a step's MoE layers, one call each (the routings rotate over the layers), in
    // one entry of the arena, as the backend calls them amid a step's other parallel work. A
    // repeat of one call, the arena entered for it alone, measured a per-call cost the engine
    // does not pay: 4 experts of k3-mini in 323 µs at 16 threads on an H100 machine's host, where
    // the engine's step spent 43 µs per layer on them (docs/planner.md, (2) on an H100 host) —
    // most likely the workers' wake-up on each entry; this form measured 33 µs there.
    RateSample s = p.time(
        [&] {
          for (int l = 0; l < calls; ++l) run();
        },
        T >= 256 ? std::max(2, p.reps / 2) : p.reps);
    s.median_s /= calls, s.min_s /= calls, s.max_s /= calls, s.cpu_median_s /= calls;
    s.bytes = double(probe.expert_bytes()) * touched;
    const double net = std::max(0.2 * s.median_s, s.median_s - job_s);
    curve.points.push_back({key, s.bytes / net / 1e9});
    p.emit(name,
           std::to_string(Din) + "->" + std::to_string(I) + "->" + std::to_string(Din) +
               fmt(", %.0f tokens x top-%.0f of %.0f (%.1f experts), ", T, k, E, touched) + p.thr,
           s, 2.0 * T * k * 3.0 * double(I) * Din,
           fmt("%.1f GB/s net of the job start", s.bytes / net / 1e9), true);
  };
  for (int M : Ms) point("expert M=" + std::to_string(M), step_tokens_for(c, M), M, ms.expert);
  for (int B : Bs) point("expert decode B=" + std::to_string(B), B, B, ms.expert_decode);
  const std::string src =
      std::string(
          "measured: cpu::RoutedExperts + merge at this model's expert shape, flat random "
          "routing, ") +
      cpu::isa_name(opt.isa) + ", " + p.thr + (pin ? " (pinned)" : " (not pinned)") + p.basis +
      "; the job start taken out";
  ms.expert.source = src + "; by tokens per expert";
  if (!Bs.empty()) ms.expert_decode.source = src + "; by decode batch (a step of B tokens)";
}

// The whole KDA core of one layer as the backend runs it, for B decode sequences (recurrent) or
// one prompt of T tokens (chunked): short convs of q, k, v with their states, the gate, beta, L2
// norms, the core, the rounding of o and the gated output norm.
void kda_curves(const Probe& p, const std::vector<int>& Ms, ModelShapeRates& ms) {
  const ModelConfig& c = p.c;
  const auto& kd = c.kda;
  const int64_t H = kd.num_heads, d = kd.head_dim, P = kd.proj_dim(), W = kd.conv_kernel;
  const int layers = std::max(1, c.num_kda_layers());
  std::vector<float> conv_w(size_t(P * W), 0.1f), A_log(size_t(H), -1.0f),
      dt_bias(size_t(H * d), 0.5f), o_norm(size_t(d), 1.0f);
  cpu::ref::KdaGate gate;
  gate.A_log = A_log.data();
  gate.dt_bias = dt_bias.data();
  gate.form = kd.gate == KdaGateKind::bounded_sigmoid ? cpu::ref::KdaGateForm::bounded
                                                      : cpu::ref::KdaGateForm::softplus;
  gate.lower_bound = kd.gate_lower_bound;
  const float scale = 1.0f / std::sqrt(float(d));
  for (int M : Ms) {
    const bool decode = M <= cpu::kGemvMaxTokens;
    const int64_t T = M, seqs = decode ? M : 1;
    // Every layer's states for every sequence, in turn (as a step touches them).
    const int64_t nst = int64_t(layers) * seqs;
    std::vector<std::vector<float>> S(size_t(nst), std::vector<float>(size_t(H * d * d), 0.0f)),
        cs(size_t(nst * 3), std::vector<float>(size_t(P * std::max<int64_t>(W - 1, 1)), 0.0f));
    std::vector<float> px(size_t(T * P), 0.02f), q(px.size()), k(px.size()), v(px.size()),
        g(px.size(), 0.1f), beta(size_t(T * H), 0.3f), o(px.size()), G(px.size(), 0.5f),
        out(px.size());
    int64_t layer = 0;
    RateSample s = p.time(
        [&] {
          const int64_t l = layer++ % layers;
          const int64_t rows = T / seqs;
          std::vector<cpu::ConvSeq> cq, ck, cv;
          for (int64_t i = 0; i < seqs; ++i) {
            const int64_t o0 = i * rows * P, st = (l * seqs + i) * 3;
            cq.push_back({px.data() + o0, cs[size_t(st)].data(), q.data() + o0, rows});
            ck.push_back({px.data() + o0, cs[size_t(st + 1)].data(), k.data() + o0, rows});
            cv.push_back({px.data() + o0, cs[size_t(st + 2)].data(), v.data() + o0, rows});
          }
          cpu::short_conv_silu_seqs_fast(cq.data(), seqs, conv_w.data(), P, W);
          cpu::short_conv_silu_seqs_fast(ck.data(), seqs, conv_w.data(), P, W);
          cpu::short_conv_silu_seqs_fast(cv.data(), seqs, conv_w.data(), P, W);
          std::fill(g.begin(), g.end(), 0.1f);
          cpu::kda_gate_fast(gate, g.data(), g.data(), T, H, d);
          cpu::ref::kda_beta(beta.data(), beta.data(), T * H);
          cpu::l2_norm_fast(q.data(), q.data(), T * H, d, 1e-6f, !decode);
          cpu::l2_norm_fast(k.data(), k.data(), T * H, d, 1e-6f, !decode);
          if (decode) {
            std::vector<cpu::KdaSeq> rec;
            for (int64_t i = 0; i < seqs; ++i) {
              const int64_t o0 = i * P, b0 = i * H;
              rec.push_back({q.data() + o0, k.data() + o0, v.data() + o0, g.data() + o0,
                             beta.data() + b0, S[size_t(l * seqs + i)].data(), o.data() + o0, 1});
            }
            cpu::kda_recurrent_seqs_fast(rec.data(), seqs, H, d, d, scale);
          } else {
            std::fill(S[size_t(l)].begin(), S[size_t(l)].end(), 0.0f);  // a fresh prompt
            cpu::kda_chunked_fast(q.data(), k.data(), v.data(), g.data(), beta.data(),
                                  S[size_t(l)].data(), o.data(), T, H, d, d, scale);
          }
          cpu::round_bf16_fast(o.data(), T * P);
          cpu::gated_rms_norm_fast(o.data(), G.data(), o_norm.data(), out.data(), T * H, d, 1e-5f);
        },
        M >= 256 ? std::max(2, p.reps / 2) : p.reps);
    const std::string shape = std::to_string(H) + " x " + std::to_string(d) + " x " +
                              std::to_string(d) + ", conv " + std::to_string(W) + ", " +
                              (decode ? "B=" : "T=") + std::to_string(M) + ", " + p.thr;
    if (decode) {
      s.bytes = 2.0 * double(H * d * d * 4) * seqs;
      ms.kda_decode_gbps.points.push_back({M, s.gbps()});
      p.emit("KDA core decode B=" + std::to_string(M), shape, s, 0,
             "GB/s of state read + written, convs/gates/norms included", true);
    } else {
      const double flops = double(T) * double(H) * (10.0 * 64 * d + 6.0 * d * d);
      ms.kda_prefill_gflops.points.push_back({M, flops / s.median_s / 1e9});
      p.emit("KDA core prefill T=" + std::to_string(M), shape, s, flops,
             "FLOPs as the cost model counts them", false);
    }
  }
  const std::string src =
      "measured: the fast backend's KDA core (convs, gate, beta, L2 norms, "
      "core, gated norm) at this model's heads, " +
      p.thr + p.basis;
  ms.kda_decode_gbps.source = src + "; GB/s of state";
  ms.kda_prefill_gflops.source = src + "; GFLOP/s";
}

// The MLA core of one layer: the latent rows appended to each sequence's cache, then the absorbed
// attention of B decode queries over `context` positions (one batched call) or the expanded
// attention of a T-token prompt.
void mla_curves(const Probe& p, const std::vector<int>& Ms, int64_t context, ModelShapeRates& ms) {
  const ModelConfig& c = p.c;
  const auto& m = c.mla;
  cpu::ref::MlaDims d;
  d.H = m.num_heads, d.nope = m.qk_nope_head_dim, d.rope = m.qk_rope_head_dim;
  d.v = m.v_head_dim, d.kv_lora = m.kv_lora_rank;
  const int layers = std::max(1, c.num_mla_layers());
  const int64_t C = d.cache_dim(), kvb_rows = d.H * (d.nope + d.v);
  std::vector<std::vector<uint16_t>> kvb(size_t(layers),
                                         std::vector<uint16_t>(size_t(kvb_rows * d.kv_lora)));
  for (auto& w : kvb)
    for (size_t i = 0; i < w.size(); ++i) w[i] = uint16_t(0x3C00 | ((i * 40503u >> 20) & 0x7F));
  std::vector<float> norm_w(size_t(d.kv_lora), 1.0f);
  cpu::Bf16Linear lin;
  for (int M : Ms) {
    const bool decode = M <= cpu::kGemvMaxTokens;
    const int64_t T = M, seqs = decode ? M : 1, S = decode ? context : T;
    std::vector<std::vector<float>> cache(size_t(layers * seqs),
                                          std::vector<float>(size_t((S + T) * C), 0.02f));
    std::vector<float> ckv(size_t(T * C), 0.03f), q(size_t(T * d.H * d.q_dim()), 0.01f),
        out(size_t(T * d.H * d.v));
    int64_t layer = 0;
    RateSample s = p.time(
        [&] {
          const int64_t l = layer++ % layers;
          const cpu::ref::WeightView kv_b =
              cpu::ref::WeightView::bf16(kvb[size_t(l)].data(), kvb_rows, d.kv_lora);
          if (decode) {
            std::vector<cpu::MlaDecodeQuery> qs;
            for (int64_t i = 0; i < seqs; ++i) {
              float* rows = cache[size_t(l * seqs + i)].data();
              cpu::ref::mla_latent_rows(ckv.data() + i * C, norm_w.data(), rows + (S - 1) * C, 1, d,
                                        1e-6f, cpu::ref::Precision::bf16);
              qs.push_back({q.data() + i * d.H * d.q_dim(), rows, S, out.data() + i * d.H * d.v});
            }
            cpu::mla_attention_absorbed_batch_fast(qs.data(), seqs, kv_b, d,
                                                   cpu::ref::Precision::bf16);
          } else {
            float* rows = cache[size_t(l)].data();
            cpu::ref::mla_latent_rows(ckv.data(), norm_w.data(), rows, T, d, 1e-6f,
                                      cpu::ref::Precision::bf16);
            cpu::mla_attention_expanded_fast(q.data(), rows, T, kv_b, d, out.data(), T,
                                             cpu::ref::Precision::bf16, lin);
          }
        },
        M >= 256 ? std::max(2, p.reps / 2) : p.reps);
    const std::string shape =
        std::to_string(d.H) + " heads, " + std::to_string(d.kv_lora) + "+" +
        std::to_string(d.rope) + ", " +
        (decode ? "B=" + std::to_string(M) + " at context " + std::to_string(S)
                : "T=S=" + std::to_string(M)) +
        ", " + p.thr;
    // FLOPs as the cost model counts them (offload/cost_model.cpp mla_decode_seconds,
    // mla_prefill_seconds).
    const double kvb_flops = 2.0 * double(d.kv_lora) * double(kvb_rows);  // per query / position
    double flops;
    if (decode) {
      flops = 2.0 * d.H * double(2 * d.kv_lora + d.rope) * double(S) * seqs + kvb_flops * seqs;
      ms.mla_decode_gflops.points.push_back({M, flops / s.median_s / 1e9});
    } else {
      const double pairs = double(T) * double(T + 1) / 2;
      flops = 2.0 * d.H * double(d.q_dim() + d.v) * pairs + kvb_flops * double(T);
      ms.mla_prefill_gflops.points.push_back({M, flops / s.median_s / 1e9});
    }
    p.emit(std::string("MLA core ") + (decode ? "decode B=" : "prefill T=") + std::to_string(M),
           shape, s, flops, "FLOPs as the cost model counts them", false);
  }
  const std::string src = "measured: the fast backend's MLA core (latent rows + " +
                          std::string("attention) at this model's heads, ") + p.thr + p.basis;
  ms.mla_decode_gflops.source = src + ", absorbed, context " + std::to_string(context);
  ms.mla_prefill_gflops.source = src + ", expanded";
}

// The row ops of every layer at M tokens, as the backend runs them: the AttnRes mixes over the
// layer's sources, two KimiRMSNorms, two residual adds; MLA: the q_a norm and the output gate;
// dense MLP: the GLU; MoE: the routing, the zero fill of the merge's accumulator, the latent norm,
// the shared experts' GLU and add. (The backend's other per-call buffers come from its scratch
// arena, neither allocated nor filled once warm.) ns per token, layer and 1024 of hidden width
// (the cost model's unit).
RateCurve row_ops_curve(const Probe& p, const std::vector<int>& Ms) {
  const ModelConfig& c = p.c;
  const int64_t D = c.hidden_size, L = c.expert_in_dim(), Is = c.moe.shared_intermediate();
  const int64_t E = c.moe.num_experts, K = c.moe.top_k, If = c.dense_intermediate_size;
  const int64_t Hv = c.mla.num_heads * c.mla.v_head_dim, Q = c.mla.q_lora_rank;
  const int bs = std::max(1, c.attn_res_block_size);
  const int64_t max_sources = c.has_attn_res() ? c.num_layers / bs + 2 : 1;
  std::vector<float> w_norm(size_t(std::max({D, L, Q, int64_t(1)})), 1.0f), proj(size_t(D), 0.01f),
      bias(size_t(E), 0.0f);
  RateCurve curve;
  for (int M : Ms) {
    const int64_t T = M;
    std::vector<std::vector<float>> src(size_t(max_sources),
                                        std::vector<float>(size_t(T * D), 0.5f));
    std::vector<float> x(size_t(T * D), 0.5f), h(x.size()), gu(size_t(T * std::max(If, Is)), 0.2f),
        up(gu.size(), 0.3f), lat(size_t(T * L), 0.1f),
        qa(size_t(T * std::max<int64_t>(Q, 1)), 0.1f), o(size_t(T * Hv), 0.1f), g(o.size(), 0.2f),
        logits(size_t(T * E), 0.0f), weights(size_t(T * K)), acc(size_t(T * L));
    std::vector<int32_t> ids(size_t(T * K));
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(i * 2654435761u % 1000) * 1e-3f;
    cpu::ref::RouterParams rp;
    rp.E = E, rp.topk = K, rp.bias = bias.data(), rp.scaling = c.moe.routed_scaling_factor;
    rp.renormalize = c.moe.renormalize;
    rp.form = c.moe.router_form == RouterWeightForm::bias_in_place
                  ? cpu::ref::RouterForm::biased_in_place
                  : cpu::ref::RouterForm::unbiased;
    cpu::ref::Glu glu;
    glu.kind = c.act == Activation::situ ? cpu::ref::GluKind::situ : cpu::ref::GluKind::silu;
    glu.beta1 = c.situ_beta, glu.beta2 = c.situ_linear_beta;
    RateSample s = p.time(
        [&] {
          for (int l = 0; l < c.num_layers; ++l) {
            if (c.has_attn_res()) {
              const int64_t n_attn = l == 0 ? 0 : (l - 1) / bs + 2, n_mlp = l / bs + 2;
              std::vector<const float*> ps;
              for (int64_t i = 0; i < std::max(n_attn, n_mlp); ++i)
                ps.push_back(src[size_t(i)].data());
              if (n_attn > 0)
                cpu::attn_res_mix_fast(ps.data(), n_attn, w_norm.data(), proj.data(), x.data(), T,
                                       D, 1e-5f);
              cpu::attn_res_mix_fast(ps.data(), n_mlp, w_norm.data(), proj.data(), x.data(), T, D,
                                     1e-5f);
            }
            cpu::kimi_rms_norm_fast(x.data(), w_norm.data(), h.data(), T, D, 1e-5f);
            cpu::kimi_rms_norm_fast(x.data(), w_norm.data(), h.data(), T, D, 1e-5f);
            cpu::add_round_fast(x.data(), h.data(), T * D);
            cpu::add_round_fast(x.data(), h.data(), T * D);
            if (c.is_mla(l)) {
              if (Q > 0) cpu::kimi_rms_norm_fast(qa.data(), w_norm.data(), qa.data(), T, Q, 1e-6f);
              if (c.mla.output_gate) cpu::sigmoid_gate_fast(o.data(), g.data(), T * Hv);
            }
            if (!c.is_moe(l)) {
              cpu::glu_fast(glu, gu.data(), up.data(), gu.data(), T * If);
              continue;
            }
            cpu::ref::route(logits.data(), rp, ids.data(), weights.data(), nullptr, T);
            std::fill(acc.begin(), acc.end(), 0.0f);  // the merge's accumulator (one thread)
            asm volatile("" : : "r"(acc.data()) : "memory");
            if (c.moe.latent_size > 0 && c.moe.latent_norm)
              cpu::kimi_rms_norm_fast(lat.data(), w_norm.data(), lat.data(), T, L, 1e-5f);
            if (Is > 0) {
              cpu::glu_fast(glu, gu.data(), up.data(), gu.data(), T * Is);
              cpu::add_round_fast(x.data(), h.data(), T * D);
            }
          }
        },
        p.reps);
    const double ns = s.median_s * 1e9 / double(T) / c.num_layers / (double(D) / 1024.0);
    curve.points.push_back({M, ns});
    p.emit("row ops M=" + std::to_string(M),
           std::to_string(c.num_layers) + " layers, D=" + std::to_string(D) + ", " + p.thr, s, 0,
           fmt("%.0f ns per token, layer and 1024 wide", ns), false);
  }
  curve.source =
      "measured: the fast backend's row ops of every layer at "
      "this model's widths, " +
      p.thr + p.basis + "; ns per token, layer and 1024 wide";
  return curve;
}

}  // namespace

ModelShapeRates measure_model_shapes(const ModelConfig& cfg, const MeasureOptions& o,
                                     tbb::task_arena& arena, const cpu::Topology& topo,
                                     int threads) {
  Probe p{cfg,
          o,
          arena,
          threads,
          o.quick ? 3 : 5,
          std::to_string(threads) + " thr",
          o.cpu_time ? ", CPU time / threads" : "",
          {}};
  // --model-cold: the arena's threads write one buffer (fill_random, a new seed each time, so no
  // line stays clean) before each timed repeat.
  std::vector<uint8_t> sweep(o.model_cold_bytes);
  if (!sweep.empty()) {
    p.basis += fmt(", caches swept (%.0f MiB written) before each repeat",
                   double(sweep.size()) / 1048576.0);
    p.cold = [&arena, &sweep, seed = uint64_t(0)]() mutable {
      ++seed;
      arena.execute([&] { fill_random(sweep.data(), sweep.size(), seed); });
    };
  }
  std::vector<int> Ms =
      o.model_tokens.empty() ? std::vector<int>{1, 2, 4, 8, 64, 256, 1024} : o.model_tokens;
  std::sort(Ms.begin(), Ms.end());
  Ms.erase(std::unique(Ms.begin(), Ms.end()), Ms.end());
  if (Ms.empty() || Ms.front() < 1) throw Error("model-shape probes: token counts must be ≥ 1");
  const int64_t context = o.model_context > 0 ? o.model_context : 80;
  ModelShapeRates ms;
  ms.signature = model_shape_signature(cfg);
  ms.model = (o.model_name.empty() ? cfg.source : o.model_name) + ": " + describe_config(cfg);
  ms.threads = threads;
  ms.context = context;
  p.progress("model-shape probes: linear call and trunk");
  ms.linear_call_us = linear_call_rate(p);
  ms.trunk = trunk_curve(p, Ms, ms.linear_call_us.value());
  if (cfg.num_moe_layers() > 0 && cfg.moe.mxfp4) {
    // The expert curve's M is tokens per expert: the mean each step of Ms gives (decode B: B·k /
    // U(B); a prompt of T: T·k / E), and 2 (batched decode's few-token kernel).
    std::vector<int> per_expert = {1, 2};
    for (int M : Ms)
      per_expert.push_back(
          std::max(1, int(std::lround(double(M) * cfg.moe.top_k / flat_distinct_experts(cfg, M)))));
    std::sort(per_expert.begin(), per_expert.end());
    per_expert.erase(std::unique(per_expert.begin(), per_expert.end()), per_expert.end());
    std::vector<int> decode;
    for (int M : Ms)
      if (M <= int(cpu::kGemvMaxTokens)) decode.push_back(M);
    p.progress("model-shape probes: CPU experts");
    cpu::PinnedArena pinned(topo, threads);
    expert_curves(p, topo, pinned, per_expert, decode, ms);
  }
  if (cfg.num_kda_layers() > 0) {
    p.progress("model-shape probes: KDA core");
    kda_curves(p, Ms, ms);
  }
  if (cfg.num_mla_layers() > 0) {
    p.progress("model-shape probes: MLA core");
    mla_curves(p, Ms, context, ms);
  }
  p.progress("model-shape probes: row ops");
  ms.row_ops_ns = row_ops_curve(p, Ms);
  return ms;
}

}  // namespace strata::offload
