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
// (one per linear call, one per CPU expert job) taken out. Last, the parts run together as a
// step, layer by layer, against each timed alone: the ratio (step_factor) is what the parts lose
// to one another in a step (caches, the pool's wake-ups, clocks). Not here: the engine itself
// (offload does not depend on engine/; `strata bench e2e` measures that), the untimed rest of a
// step, the embedding gather and the sampler.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
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
      // Written back before any probe reads it, so that no writeback runs beside the probes (the
      // engine's checkpoint is clean in the page cache while it runs).
      ok = ok && ::fdatasync(fd) == 0;
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

// The elements of the pool the trunk's matrices come from: the whole trunk when it fits 1 GiB
// (512 MiB quick), else that much in turn (elements of 2 B), and never less than the largest
// matrix (lm_head of a K3-wide model is 2.35 GB).
size_t trunk_pool_elems(const ModelConfig& c, bool quick) {
  size_t total = size_t(c.vocab_size * c.hidden_size), largest = total;
  for (const FastLinearCall& call : fast_step_linears(c, true))
    for (auto [r, k] : call.matrices)
      total += size_t(r * k), largest = std::max(largest, size_t(r * k));
  const size_t cap = (quick ? size_t(256) : size_t(512)) << 20;
  return std::max(largest, std::min(total, cap));
}

// The trunk's linear calls of a step at M rows as the backend makes them (fast_step_linears:
// fused up to kGemvMaxTokens), layer by layer, and lm_head at M rows in a decode step; the
// weights come from `pool` in turn.
class TrunkStep {
 public:
  TrunkStep(const ModelConfig& c, WeightPool& pool, int M)
      : c_(c),
        pool_(pool),
        M_(M),
        decode_(M <= cpu::kGemvMaxTokens),
        calls_(fast_step_linears(c, decode_)) {
    size_t max_rows = 1, max_cols = size_t(c.hidden_size), max_outs = 1;
    bytes_ = decode_ ? double(c.vocab_size * c.hidden_size) * 2 : 0;
    for (const FastLinearCall& call : calls_) {
      max_outs = std::max(max_outs, call.matrices.size());
      for (auto [r, k] : call.matrices) {
        max_rows = std::max(max_rows, size_t(r)), max_cols = std::max(max_cols, size_t(k));
        bytes_ += double(r * k) * 2;
      }
    }
    x_.assign(size_t(M) * max_cols, 0.01f);
    y_.assign(max_outs, std::vector<float>(size_t(M) * max_rows));
    if (decode_) logits_.resize(size_t(M) * size_t(c.vocab_size));
  }
  // Layer l's attention (mlp false) or MLP calls.
  void half(int l, bool mlp) {
    for (const FastLinearCall& call : calls_)
      if (call.layer == l && call.mlp == mlp) run(call);
  }
  void head() {
    if (decode_)
      lin_(x_.data(), M_, pool_.next(c_.vocab_size, c_.hidden_size), logits_.data(), true);
  }
  void all() {
    for (const FastLinearCall& call : calls_) run(call);
    head();
  }
  double bytes() const { return bytes_; }
  double calls() const { return double(calls_.size()) + (decode_ ? 1 : 0); }
  bool decode() const { return decode_; }

 private:
  void run(const FastLinearCall& call) {
    if (call.matrices.size() == 1) {
      const auto [r, k] = call.matrices[0];
      lin_(x_.data(), M_, pool_.next(r, k), y_[0].data(), true);
      return;
    }
    std::vector<cpu::ref::WeightView> Ws;
    for (auto [r, k] : call.matrices) Ws.push_back(pool_.next(r, k));
    std::vector<cpu::Bf16Linear::Out> outs;
    for (size_t i = 0; i < Ws.size(); ++i) outs.push_back({&Ws[i], y_[i].data(), true});
    lin_.multi(x_.data(), M_, call.matrices[0].second, outs);
  }
  const ModelConfig& c_;
  WeightPool& pool_;
  int M_;
  bool decode_;
  std::vector<FastLinearCall> calls_;
  double bytes_ = 0;
  std::vector<float> x_, logits_;
  std::vector<std::vector<float>> y_;
  cpu::Bf16Linear lin_;
};

// The step's linear calls at M rows, lm_head at M rows in a decode step; GB/s of weights with the
// calls' fixed costs taken out.
RateCurve trunk_curve(const Probe& p, WeightPool& pool, const std::vector<int>& Ms,
                      double call_us) {
  RateCurve curve;
  for (int M : Ms) {
    TrunkStep step(p.c, pool, M);
    RateSample s = p.time([&] { step.all(); }, M >= 64 ? std::max(2, p.reps / 2) : p.reps);
    const double bytes = step.bytes();
    s.bytes = bytes;
    // The cost model adds call_us per call; never let that take more than 80 % of the time.
    const double net = std::max(0.2 * s.median_s, s.median_s - step.calls() * call_us * 1e-6);
    curve.points.push_back({M, bytes / net / 1e9});
    p.emit("trunk M=" + std::to_string(M),
           fmt("%.0f calls, %.1f MB, ", step.calls(), bytes / 1e6) + p.thr, s, bytes * M,
           fmt(step.decode() ? "a decode step's calls (lm_head at M rows); %.1f GB/s net of calls"
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

// The CPU routed experts at the model's expert shape as the engine's executor runs them
// (cpu::pin_expert_threads: the probe's pinned arena, or not), on random experts of every MoE
// layer.
struct ExpertRig {
  ExpertRig(const Probe& p, const cpu::Topology& topo)
      : pinned(topo, p.threads),
        probe(topo, pinned, p.c.moe.num_experts, p.c.expert_in_dim(), p.c.moe.intermediate_size,
              std::max(1, p.c.num_moe_layers())),
        pin(cpu::pin_expert_threads()) {
    opt.isa = cpu::best_isa();
    opt.workspace = &ws;
    opt.arena = pin ? nullptr : &p.arena;
  }
  // One MoE layer's routed step of T tokens routed flat at random (each call the next layer's).
  std::function<void()> routed(int T, int k, double* touched) {
    return probe.prepare_routed(T, k, opt, touched);
  }
  cpu::PinnedArena pinned;
  CpuExpertProbe probe;
  cpu::CpuExpertWorkspace ws;
  cpu::CpuExpertOptions opt;
  bool pin;
};

// The routed experts as the engine runs a MoE layer of them: a step of T tokens routed flat at
// random (each token to k distinct experts; the experts' token counts spread as a flat router's
// do), cpu::RoutedExperts (quantize once, gather, kernels, copy to slots with the bf16 rounding)
// and the backend's merge, the model's MoE layers in turn. (The form before timed the kernels
// alone on M consecutive rows per expert: on an H100 machine's 16 threads the engine's routed
// experts took ≈ 1.8× its time from 2 tokens per expert — docs/planner.md, "Earlier rounds".) Two
// curves: `expert` (by tokens per expert M, each from a step of step_tokens_for(M) tokens) and
// `expert_decode` (by decode batch B ≤ kGemvMaxTokens, a step of B tokens), GB/s of the touched
// experts' weights with the CPU expert job's start taken out.
void expert_curves(const Probe& p, ExpertRig& rig, const std::vector<int>& Ms,
                   const std::vector<int>& Bs, ModelShapeRates& ms) {
  const ModelConfig& c = p.c;
  const int E = c.moe.num_experts, k = c.moe.top_k, Din = c.expert_in_dim();
  const int I = c.moe.intermediate_size, layers = c.num_moe_layers();
  const int calls = std::clamp(layers, 1, 8);  // a step's MoE layers, up to 8
  const double job_s = CostAssumptions{}.cpu_expert_call_us * 1e-6;
  auto point = [&](const std::string& name, int T, int key, RateCurve& curve) {
    double touched = 0;  // distinct experts per routing (mean)
    std::function<void()> run = rig.routed(T, k, &touched);
    // One repeat is a step's MoE layers, one call each (the routings rotate over the layers), in
    // one entry of the arena, as the backend calls them amid a step's other parallel work. A
    // repeat of one call, the arena entered for it alone, measured a per-call cost the engine
    // does not pay: 4 experts of k3-mini in 323 µs at 16 threads on an H100 machine's host, where
    // the engine's step spent 43 µs per layer on them (docs/planner.md, "Earlier rounds", (2)) —
    // most likely the workers' wake-up on each entry; this form measured 33 µs there.
    RateSample s = p.time(
        [&] {
          for (int l = 0; l < calls; ++l) run();
        },
        T >= 256 ? std::max(2, p.reps / 2) : p.reps);
    s.median_s /= calls, s.min_s /= calls, s.max_s /= calls, s.cpu_median_s /= calls;
    s.bytes = double(rig.probe.expert_bytes()) * touched;
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
      cpu::isa_name(rig.opt.isa) + ", " + p.thr + (rig.pin ? " (pinned)" : " (not pinned)") +
      p.basis + "; the job start taken out";
  ms.expert.source = src + "; by tokens per expert";
  if (!Bs.empty()) ms.expert_decode.source = src + "; by decode batch (a step of B tokens)";
}

// The whole KDA core of one layer as the backend runs it, for B decode sequences (recurrent) or
// one prompt of T tokens (chunked): short convs of q, k, v with their states, the gate, beta, L2
// norms, the core, the rounding of o and the gated output norm. layer(i): the i-th KDA layer's
// states (every layer's, for every sequence, as a step touches them).
class KdaStep {
 public:
  KdaStep(const ModelConfig& c, int M)
      : kd_(c.kda),
        H_(kd_.num_heads),
        d_(kd_.head_dim),
        P_(kd_.proj_dim()),
        W_(kd_.conv_kernel),
        layers_(std::max(1, c.num_kda_layers())),
        decode_(M <= cpu::kGemvMaxTokens),
        T_(M),
        seqs_(decode_ ? M : 1),
        conv_w_(size_t(P_ * W_), 0.1f),
        A_log_(size_t(H_), -1.0f),
        dt_bias_(size_t(H_ * d_), 0.5f),
        o_norm_(size_t(d_), 1.0f),
        S_(size_t(layers_ * seqs_), std::vector<float>(size_t(H_ * d_ * d_), 0.0f)),
        cs_(size_t(layers_ * seqs_ * 3),
            std::vector<float>(size_t(P_ * std::max<int64_t>(W_ - 1, 1)), 0.0f)),
        px_(size_t(T_ * P_), 0.02f),
        q_(px_.size()),
        k_(px_.size()),
        v_(px_.size()),
        g_(px_.size(), 0.1f),
        beta_(size_t(T_ * H_), 0.3f),
        o_(px_.size()),
        G_(px_.size(), 0.5f),
        out_(px_.size()) {
    gate_.A_log = A_log_.data();
    gate_.dt_bias = dt_bias_.data();
    gate_.form = kd_.gate == KdaGateKind::bounded_sigmoid ? cpu::ref::KdaGateForm::bounded
                                                          : cpu::ref::KdaGateForm::softplus;
    gate_.lower_bound = kd_.gate_lower_bound;
  }
  void layer(int i) {
    const int64_t l = i % layers_, rows = T_ / seqs_;
    const float scale = 1.0f / std::sqrt(float(d_));
    std::vector<cpu::ConvSeq> cq, ck, cv;
    for (int64_t s = 0; s < seqs_; ++s) {
      const int64_t o0 = s * rows * P_, st = (l * seqs_ + s) * 3;
      cq.push_back({px_.data() + o0, cs_[size_t(st)].data(), q_.data() + o0, rows});
      ck.push_back({px_.data() + o0, cs_[size_t(st + 1)].data(), k_.data() + o0, rows});
      cv.push_back({px_.data() + o0, cs_[size_t(st + 2)].data(), v_.data() + o0, rows});
    }
    cpu::short_conv_silu_seqs_fast(cq.data(), seqs_, conv_w_.data(), P_, W_);
    cpu::short_conv_silu_seqs_fast(ck.data(), seqs_, conv_w_.data(), P_, W_);
    cpu::short_conv_silu_seqs_fast(cv.data(), seqs_, conv_w_.data(), P_, W_);
    std::fill(g_.begin(), g_.end(), 0.1f);
    cpu::kda_gate_fast(gate_, g_.data(), g_.data(), T_, H_, d_);
    cpu::ref::kda_beta(beta_.data(), beta_.data(), T_ * H_);
    cpu::l2_norm_fast(q_.data(), q_.data(), T_ * H_, d_, 1e-6f, !decode_);
    cpu::l2_norm_fast(k_.data(), k_.data(), T_ * H_, d_, 1e-6f, !decode_);
    if (decode_) {
      std::vector<cpu::KdaSeq> rec;
      for (int64_t s = 0; s < seqs_; ++s) {
        const int64_t o0 = s * P_, b0 = s * H_;
        rec.push_back({q_.data() + o0, k_.data() + o0, v_.data() + o0, g_.data() + o0,
                       beta_.data() + b0, S_[size_t(l * seqs_ + s)].data(), o_.data() + o0, 1});
      }
      cpu::kda_recurrent_seqs_fast(rec.data(), seqs_, H_, d_, d_, scale);
    } else {
      std::fill(S_[size_t(l)].begin(), S_[size_t(l)].end(), 0.0f);  // a fresh prompt
      cpu::kda_chunked_fast(q_.data(), k_.data(), v_.data(), g_.data(), beta_.data(),
                            S_[size_t(l)].data(), o_.data(), T_, H_, d_, d_, scale);
    }
    cpu::round_bf16_fast(o_.data(), T_ * P_);
    cpu::gated_rms_norm_fast(o_.data(), G_.data(), o_norm_.data(), out_.data(), T_ * H_, d_, 1e-5f);
  }
  bool decode() const { return decode_; }
  // Bytes of state read + written (decode), FLOPs as the cost model counts them (prefill).
  double state_bytes() const { return 2.0 * double(H_ * d_ * d_ * 4) * seqs_; }
  double flops() const { return double(T_) * double(H_) * (10.0 * 64 * d_ + 6.0 * d_ * d_); }
  std::string shape() const {
    return std::to_string(H_) + " x " + std::to_string(d_) + " x " + std::to_string(d_) +
           ", conv " + std::to_string(W_) + ", " + (decode_ ? "B=" : "T=") + std::to_string(T_);
  }

 private:
  const KdaConfig& kd_;
  int64_t H_, d_, P_, W_;
  int layers_;
  bool decode_;
  int64_t T_, seqs_;
  std::vector<float> conv_w_, A_log_, dt_bias_, o_norm_;
  cpu::ref::KdaGate gate_;
  std::vector<std::vector<float>> S_, cs_;
  std::vector<float> px_, q_, k_, v_, g_, beta_, o_, G_, out_;
};

void kda_curves(const Probe& p, const std::vector<int>& Ms, ModelShapeRates& ms) {
  for (int M : Ms) {
    KdaStep kda(p.c, M);
    int layer = 0;
    RateSample s = p.time([&] { kda.layer(layer++); }, M >= 256 ? std::max(2, p.reps / 2) : p.reps);
    const std::string shape = kda.shape() + ", " + p.thr;
    if (kda.decode()) {
      s.bytes = kda.state_bytes();
      ms.kda_decode_gbps.points.push_back({M, s.gbps()});
      p.emit("KDA core decode B=" + std::to_string(M), shape, s, 0,
             "GB/s of state read + written, convs/gates/norms included", true);
    } else {
      ms.kda_prefill_gflops.points.push_back({M, kda.flops() / s.median_s / 1e9});
      p.emit("KDA core prefill T=" + std::to_string(M), shape, s, kda.flops(),
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
// attention of a T-token prompt. layer(i): the i-th MLA layer's kv_b and caches.
class MlaStep {
 public:
  // Every MLA layer's kv_b weights (bf16), shared by the steps of every M.
  static std::vector<std::vector<uint16_t>> weights(const ModelConfig& c) {
    const cpu::ref::MlaDims d = dims(c);
    std::vector<std::vector<uint16_t>> kvb(
        size_t(std::max(1, c.num_mla_layers())),
        std::vector<uint16_t>(size_t(d.H * (d.nope + d.v) * d.kv_lora)));
    for (auto& w : kvb)
      for (size_t i = 0; i < w.size(); ++i) w[i] = uint16_t(0x3C00 | ((i * 40503u >> 20) & 0x7F));
    return kvb;
  }
  MlaStep(const ModelConfig& c, int M, int64_t context,
          const std::vector<std::vector<uint16_t>>& kvb)
      : d_(dims(c)),
        kvb_(kvb),
        layers_(int(kvb.size())),
        decode_(M <= cpu::kGemvMaxTokens),
        T_(M),
        seqs_(decode_ ? M : 1),
        S_(decode_ ? context : T_),
        cache_(size_t(layers_ * seqs_),
               std::vector<float>(size_t((S_ + T_) * d_.cache_dim()), 0.02f)),
        ckv_(size_t(T_ * d_.cache_dim()), 0.03f),
        q_(size_t(T_ * d_.H * d_.q_dim()), 0.01f),
        out_(size_t(T_ * d_.H * d_.v)),
        norm_w_(size_t(d_.kv_lora), 1.0f) {}
  void layer(int i) {
    const int64_t l = i % layers_, C = d_.cache_dim();
    const cpu::ref::WeightView kv_b =
        cpu::ref::WeightView::bf16(kvb_[size_t(l)].data(), d_.H * (d_.nope + d_.v), d_.kv_lora);
    if (decode_) {
      std::vector<cpu::MlaDecodeQuery> qs;
      for (int64_t s = 0; s < seqs_; ++s) {
        float* rows = cache_[size_t(l * seqs_ + s)].data();
        cpu::ref::mla_latent_rows(ckv_.data() + s * C, norm_w_.data(), rows + (S_ - 1) * C, 1, d_,
                                  1e-6f, cpu::ref::Precision::bf16);
        qs.push_back({q_.data() + s * d_.H * d_.q_dim(), rows, S_, out_.data() + s * d_.H * d_.v});
      }
      cpu::mla_attention_absorbed_batch_fast(qs.data(), seqs_, kv_b, d_, cpu::ref::Precision::bf16);
    } else {
      float* rows = cache_[size_t(l)].data();
      cpu::ref::mla_latent_rows(ckv_.data(), norm_w_.data(), rows, T_, d_, 1e-6f,
                                cpu::ref::Precision::bf16);
      cpu::mla_attention_expanded_fast(q_.data(), rows, T_, kv_b, d_, out_.data(), T_,
                                       cpu::ref::Precision::bf16, lin_);
    }
  }
  bool decode() const { return decode_; }
  // FLOPs as the cost model counts them (offload/cost_model.cpp mla_decode_seconds,
  // mla_prefill_seconds).
  double flops() const {
    const double kvb_flops = 2.0 * double(d_.kv_lora) * double(d_.H * (d_.nope + d_.v));
    if (decode_)
      return 2.0 * d_.H * double(2 * d_.kv_lora + d_.rope) * double(S_) * seqs_ + kvb_flops * seqs_;
    const double pairs = double(T_) * double(T_ + 1) / 2;
    return 2.0 * d_.H * double(d_.q_dim() + d_.v) * pairs + kvb_flops * double(T_);
  }
  std::string shape() const {
    return std::to_string(d_.H) + " heads, " + std::to_string(d_.kv_lora) + "+" +
           std::to_string(d_.rope) + ", " +
           (decode_ ? "B=" + std::to_string(T_) + " at context " + std::to_string(S_)
                    : "T=S=" + std::to_string(T_));
  }

 private:
  static cpu::ref::MlaDims dims(const ModelConfig& c) {
    cpu::ref::MlaDims d;
    d.H = c.mla.num_heads, d.nope = c.mla.qk_nope_head_dim, d.rope = c.mla.qk_rope_head_dim;
    d.v = c.mla.v_head_dim, d.kv_lora = c.mla.kv_lora_rank;
    return d;
  }
  cpu::ref::MlaDims d_;
  const std::vector<std::vector<uint16_t>>& kvb_;
  int layers_;
  bool decode_;
  int64_t T_, seqs_, S_;
  std::vector<std::vector<float>> cache_;
  std::vector<float> ckv_, q_, out_, norm_w_;
  cpu::Bf16Linear lin_;
};

void mla_curves(const Probe& p, const std::vector<std::vector<uint16_t>>& kvb,
                const std::vector<int>& Ms, int64_t context, ModelShapeRates& ms) {
  for (int M : Ms) {
    MlaStep mla(p.c, M, context, kvb);
    int layer = 0;
    RateSample s = p.time([&] { mla.layer(layer++); }, M >= 256 ? std::max(2, p.reps / 2) : p.reps);
    const double flops = mla.flops();
    (mla.decode() ? ms.mla_decode_gflops : ms.mla_prefill_gflops)
        .points.push_back({M, flops / s.median_s / 1e9});
    p.emit(
        std::string("MLA core ") + (mla.decode() ? "decode B=" : "prefill T=") + std::to_string(M),
        mla.shape() + ", " + p.thr, s, flops, "FLOPs as the cost model counts them", false);
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
// arena, neither allocated nor filled once warm.) layer(l): model layer l's.
class RowOpsStep {
 public:
  RowOpsStep(const ModelConfig& c, int M)
      : c_(c),
        D_(c.hidden_size),
        L_(c.expert_in_dim()),
        Is_(c.moe.shared_intermediate()),
        If_(c.dense_intermediate_size),
        Hv_(c.mla.num_heads * c.mla.v_head_dim),
        Q_(c.mla.q_lora_rank),
        K_(c.moe.top_k),
        bs_(std::max(1, c.attn_res_block_size)),
        T_(M),
        w_norm_(size_t(std::max({D_, L_, Q_, int64_t(1)})), 1.0f),
        proj_(size_t(D_), 0.01f),
        bias_(size_t(c.moe.num_experts), 0.0f),
        src_(size_t(c.has_attn_res() ? c.num_layers / bs_ + 2 : 1),
             std::vector<float>(size_t(T_ * D_), 0.5f)),
        x_(size_t(T_ * D_), 0.5f),
        h_(x_.size()),
        gu_(size_t(T_ * std::max(If_, Is_)), 0.2f),
        up_(gu_.size(), 0.3f),
        lat_(size_t(T_ * L_), 0.1f),
        qa_(size_t(T_ * std::max<int64_t>(Q_, 1)), 0.1f),
        o_(size_t(T_ * Hv_), 0.1f),
        g_(o_.size(), 0.2f),
        logits_(size_t(T_ * c.moe.num_experts), 0.0f),
        weights_(size_t(T_ * K_)),
        acc_(size_t(T_ * L_)),
        ids_(size_t(T_ * K_)) {
    for (size_t i = 0; i < logits_.size(); ++i) logits_[i] = float(i * 2654435761u % 1000) * 1e-3f;
    rp_.E = c.moe.num_experts, rp_.topk = K_, rp_.bias = bias_.data();
    rp_.scaling = c.moe.routed_scaling_factor;
    rp_.renormalize = c.moe.renormalize;
    rp_.form = c.moe.router_form == RouterWeightForm::bias_in_place
                   ? cpu::ref::RouterForm::biased_in_place
                   : cpu::ref::RouterForm::unbiased;
    glu_.kind = c.act == Activation::situ ? cpu::ref::GluKind::situ : cpu::ref::GluKind::silu;
    glu_.beta1 = c.situ_beta, glu_.beta2 = c.situ_linear_beta;
  }
  void layer(int l) {
    const int64_t T = T_, D = D_;
    if (c_.has_attn_res()) {
      const int64_t n_attn = l == 0 ? 0 : (l - 1) / bs_ + 2, n_mlp = l / bs_ + 2;
      std::vector<const float*> ps;
      for (int64_t i = 0; i < std::max(n_attn, n_mlp); ++i) ps.push_back(src_[size_t(i)].data());
      if (n_attn > 0)
        cpu::attn_res_mix_fast(ps.data(), n_attn, w_norm_.data(), proj_.data(), x_.data(), T, D,
                               1e-5f);
      cpu::attn_res_mix_fast(ps.data(), n_mlp, w_norm_.data(), proj_.data(), x_.data(), T, D,
                             1e-5f);
    }
    cpu::kimi_rms_norm_fast(x_.data(), w_norm_.data(), h_.data(), T, D, 1e-5f);
    cpu::kimi_rms_norm_fast(x_.data(), w_norm_.data(), h_.data(), T, D, 1e-5f);
    cpu::add_round_fast(x_.data(), h_.data(), T * D);
    cpu::add_round_fast(x_.data(), h_.data(), T * D);
    if (c_.is_mla(l)) {
      if (Q_ > 0) cpu::kimi_rms_norm_fast(qa_.data(), w_norm_.data(), qa_.data(), T, Q_, 1e-6f);
      if (c_.mla.output_gate) cpu::sigmoid_gate_fast(o_.data(), g_.data(), T * Hv_);
    }
    if (!c_.is_moe(l)) {
      cpu::glu_fast(glu_, gu_.data(), up_.data(), gu_.data(), T * If_);
      return;
    }
    cpu::ref::route(logits_.data(), rp_, ids_.data(), weights_.data(), nullptr, T);
    std::fill(acc_.begin(), acc_.end(), 0.0f);  // the merge's accumulator (one thread)
    asm volatile("" : : "r"(acc_.data()) : "memory");
    if (c_.moe.latent_size > 0 && c_.moe.latent_norm)
      cpu::kimi_rms_norm_fast(lat_.data(), w_norm_.data(), lat_.data(), T, L_, 1e-5f);
    if (Is_ > 0) {
      cpu::glu_fast(glu_, gu_.data(), up_.data(), gu_.data(), T * Is_);
      cpu::add_round_fast(x_.data(), h_.data(), T * D);
    }
  }
  void all() {
    for (int l = 0; l < c_.num_layers; ++l) layer(l);
  }

 private:
  const ModelConfig& c_;
  int64_t D_, L_, Is_, If_, Hv_, Q_, K_;
  int bs_;
  int64_t T_;
  std::vector<float> w_norm_, proj_, bias_;
  std::vector<std::vector<float>> src_;
  std::vector<float> x_, h_, gu_, up_, lat_, qa_, o_, g_, logits_, weights_, acc_;
  std::vector<int32_t> ids_;
  cpu::ref::RouterParams rp_;
  cpu::ref::Glu glu_;
};

// ns per token, layer and 1024 of hidden width (the cost model's unit).
RateCurve row_ops_curve(const Probe& p, const std::vector<int>& Ms) {
  const ModelConfig& c = p.c;
  RateCurve curve;
  for (int M : Ms) {
    RowOpsStep rows(c, M);
    RateSample s = p.time([&] { rows.all(); }, p.reps);
    const double ns =
        s.median_s * 1e9 / double(M) / c.num_layers / (double(c.hidden_size) / 1024.0);
    curve.points.push_back({M, ns});
    p.emit(
        "row ops M=" + std::to_string(M),
        std::to_string(c.num_layers) + " layers, D=" + std::to_string(c.hidden_size) + ", " + p.thr,
        s, 0, fmt("%.0f ns per token, layer and 1024 wide", ns), false);
  }
  curve.source =
      "measured: the fast backend's row ops of every layer at "
      "this model's widths, " +
      p.thr + p.basis + "; ns per token, layer and 1024 wide";
  return curve;
}

// The parts above run together as a step at M tokens (a decode step of M sequences, or an M-token
// prompt): layer by layer, its row ops, the attention half's linear calls, its KDA or MLA core,
// the MLP half's calls and the routed experts, then lm_head in a decode step — in one entry of the
// arena, as the backend runs a step. Each part is also timed alone over the same step (all its
// layers in one entry), in turn with the step, round by round (so drift falls on both alike). The
// ratio of the step's median to the sum of the parts' medians is how much slower (or faster) the
// parts run among one another: each evicts the others' weights and state from the caches, each
// fork-join wakes the pool, and sustained work may run at another clock than one part's burst.
// The cost model multiplies its CPU step by it (ModelShapeRates::step_factor).
RateCurve step_factor_curve(const Probe& p, WeightPool& pool, ExpertRig* rig,
                            const std::vector<std::vector<uint16_t>>& kvb,
                            const std::vector<int>& Ms, int64_t context) {
  const ModelConfig& c = p.c;
  RateCurve curve;
  for (int M : Ms) {
    TrunkStep trunk(c, pool, M);
    RowOpsStep rows(c, M);
    std::unique_ptr<KdaStep> kda;
    if (c.num_kda_layers() > 0) kda = std::make_unique<KdaStep>(c, M);
    std::unique_ptr<MlaStep> mla;
    if (c.num_mla_layers() > 0) mla = std::make_unique<MlaStep>(c, M, context, kvb);
    std::function<void()> experts;
    double touched = 0;
    if (rig && c.num_moe_layers() > 0) experts = rig->routed(M, c.moe.top_k, &touched);
    // fn(l, i): model layer l, the i-th of its kind (KDA or MLA).
    auto each_layer = [&](auto&& fn) {
      int n_kda = 0, n_mla = 0;
      for (int l = 0; l < c.num_layers; ++l) fn(l, c.is_kda(l) ? n_kda++ : n_mla++);
    };
    auto core = [&](int l, int i) {
      if (c.is_kda(l))
        kda->layer(i);
      else
        mla->layer(i);
    };
    std::vector<std::pair<std::string, std::function<void()>>> parts = {
        {"trunk", [&] { trunk.all(); }}, {"row ops", [&] { rows.all(); }}};
    if (kda || mla) parts.push_back({"attention cores", [&] { each_layer(core); }});
    if (experts)
      parts.push_back({"routed experts", [&] {
                         for (int l = 0; l < c.num_layers; ++l)
                           if (c.is_moe(l)) experts();
                       }});
    const std::function<void()> step = [&] {
      each_layer([&](int l, int i) {
        rows.layer(l);
        trunk.half(l, false);
        core(l, i);
        trunk.half(l, true);
        if (experts && c.is_moe(l)) experts();
      });
      trunk.head();
    };
    // Round by round: every part alone, then the step, each in its own entry of the arena (a
    // timed repeat of one, the cache sweep ahead of it when asked).
    std::vector<std::vector<double>> t(parts.size() + 1);
    auto timed = [&](const std::function<void()>& fn) {
      return time_repeats([&] { p.arena.execute(fn); }, 1, 0, p.cold).median_s;
    };
    for (int r = 0; r <= p.reps; ++r) {  // round 0 warms up
      for (size_t i = 0; i < parts.size(); ++i) {
        const double s = timed(parts[i].second);
        if (r > 0) t[i].push_back(s);
      }
      const double s = timed(step);
      if (r > 0) t.back().push_back(s);
    }
    double alone = 0;
    std::string split;
    for (size_t i = 0; i < parts.size(); ++i) {
      const double m = sample_of(t[i]).median_s;
      alone += m;
      split += ", " + parts[i].first + fmt(" %.3g ms", m * 1e3);
    }
    const RateSample s = sample_of(t.back());
    const double factor = s.median_s / alone;
    curve.points.push_back({M, factor});
    p.emit("step M=" + std::to_string(M),
           std::to_string(c.num_layers) + " layers, " + (trunk.decode() ? "decode" : "prefill") +
               ", " + p.thr,
           s, 0, fmt("%.2fx the parts alone (%.3g ms", factor, alone * 1e3) + split + ")", false);
  }
  curve.source =
      "measured: the probes' parts run together as a step (layer by layer) against each part "
      "alone, " +
      p.thr + p.basis + "; the step's time over the parts' sum";
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
  WeightPool pool(trunk_pool_elems(cfg, o.quick), fs::path(cfg.source).parent_path());
  ms.trunk = trunk_curve(p, pool, Ms, ms.linear_call_us.value());
  std::unique_ptr<ExpertRig> rig;
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
    rig = std::make_unique<ExpertRig>(p, topo);
    expert_curves(p, *rig, per_expert, decode, ms);
  }
  if (cfg.num_kda_layers() > 0) {
    p.progress("model-shape probes: KDA core");
    kda_curves(p, Ms, ms);
  }
  const std::vector<std::vector<uint16_t>> kvb =
      cfg.num_mla_layers() > 0 ? MlaStep::weights(cfg) : std::vector<std::vector<uint16_t>>{};
  if (cfg.num_mla_layers() > 0) {
    p.progress("model-shape probes: MLA core");
    mla_curves(p, kvb, Ms, context, ms);
  }
  p.progress("model-shape probes: row ops");
  ms.row_ops_ns = row_ops_curve(p, Ms);
  p.progress("model-shape probes: the parts together as a step");
  ms.step_factor = step_factor_curve(p, pool, rig.get(), kvb, Ms, context);
  return ms;
}

}  // namespace strata::offload
