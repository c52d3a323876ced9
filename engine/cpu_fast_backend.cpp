// The fast CPU backend (engine/cpu_fast_backend.h). The sublayers follow engine/cpu_backend.cpp
// step by step, with the same bf16 rounding points (each marked "round": spec §12.2) and the same
// dump sites; the linear layers go through cpu/bf16_linear.h with the GEMM-output rounding fused.
#include "engine/cpu_fast_backend.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cpu/mixer_kernels.h"
#include "cpu/row_ops.h"
#include "engine/finite_check.h"
#include "engine/routing.h"
#include "storage/bf16.h"
#include "storage/error.h"

namespace strata::engine {

namespace ref = cpu::ref;

namespace {
constexpr float kMlaNormEps = 1e-6f;  // q_a / kv_a layernorms (spec §3.1: class default)
constexpr float kL2Eps = 1e-6f;       // KDA q/k L2 norm (spec §3.3)
constexpr Precision kBf16 = Precision::bf16;

// Adds the wall time of its scope to one profile bucket.
class Timed {
 public:
  Timed(FastBackendProfile& p, FastBackendProfile::Kind k)
      : p_(p), k_(k), t0_(std::chrono::steady_clock::now()) {}
  ~Timed() {
    p_.seconds[k_] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  FastBackendProfile& p_;
  FastBackendProfile::Kind k_;
  std::chrono::steady_clock::time_point t0_;
};

void add_inplace(float* a, const float* b, int64_t n) {
  cpu::add_round_fast(a, b, n);  // round: residual add
}
}  // namespace

const char* FastBackendProfile::name(Kind k) {
  switch (k) {
    case gemv:
      return "linear (GEMV)";
    case gemm:
      return "linear (oneDNN)";
    case kda_core:
      return "KDA core";
    case mla_core:
      return "MLA core";
    case experts:
      return "routed experts";
    case row_ops:
      return "row ops";
    case kinds:
      break;
  }
  return "?";
}

namespace {
BackendOptions bf16_only(BackendOptions o) {
  if (o.precision != Precision::bf16)
    throw Error("the fast CPU backend computes the bf16 model; fp32 runs on the reference backend");
  return o;
}
}  // namespace

CpuFastBackend::CpuFastBackend(const Model& model, BackendOptions options, int slots,
                               cpu::GemvIsa isa)
    : CpuHostBackend(model, bf16_only(std::move(options)), slots), lin_(isa) {
  name_ = std::string("cpu-fast bf16, experts ") + expert_numerics_name(opt_.experts) + ", GEMV " +
          cpu::gemv_isa_name(lin_.isa()) + ", oneDNN above " + std::to_string(cpu::kGemvMaxTokens) +
          " rows";
}

// ---------------------------------------------------------------------------------------------
// Step arena

namespace {
// n floats whose pages are faulted in by every thread at once (zeros written in 1 MiB pieces): the
// arenas grow at the first step of a new shape, and one thread zero-filling or faulting in a
// prefill's buffers took most of that step's untimed time (k3-mini, 1024 tokens: 27.6 ms cold
// against 4.0 ms warm on the dev VM's 2 threads).
std::unique_ptr<float[]> touched_floats(size_t n) {
  std::unique_ptr<float[]> p(new float[n]);
  constexpr size_t kPiece = size_t(1) << 18;
  tbb::parallel_for(size_t(0), (n + kPiece - 1) / kPiece, [&](size_t i) {
    const size_t b = i * kPiece;
    std::fill(p.get() + b, p.get() + std::min(n, b + kPiece), 0.0f);
  });
  return p;
}
}  // namespace

void CpuFastBackend::begin_step(const StepShape&) {
  ++steps_;
  step_t0_ = std::chrono::steady_clock::now();
  acts_.reset();  // a step of a shape seen before fits in the blocks it grew to
}

CpuFastBackend::Scratch::Buf CpuFastBackend::Scratch::take(size_t n) {
  const size_t padded = (n + 15) / 16 * 16;  // 64-byte aligned starts
  while (block_ < blocks_.size() && used_ + padded > sizes_[block_]) {
    if (used_ == 0) {  // an empty block too small for n: replace it (nothing in it is live)
      blocks_[block_] = touched_floats(padded);
      sizes_[block_] = padded;
      break;
    }
    ++block_, used_ = 0;
  }
  if (block_ == blocks_.size()) {
    const size_t size = std::max(padded, size_t(1) << 22);
    blocks_.push_back(touched_floats(size));
    sizes_.push_back(size);
    used_ = 0;
  }
  float* p = blocks_[block_].get() + used_;
  used_ += padded;
  return {p, n};
}

void CpuFastBackend::commit_step(const StepShape& s) {
  CpuHostBackend::commit_step(s);
  prof_.step_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - step_t0_).count();
}

std::string CpuFastBackend::telemetry_line() const {
  if (steps_ == 0) return {};
  using P = FastBackendProfile;
  const double n = double(steps_);
  std::string s = "cpu fast backend: " + std::to_string(steps_) + " steps | ms per step:";
  char buf[96];
  for (int k = 0; k < P::kinds; ++k) {
    std::snprintf(buf, sizeof buf, "%s %s %.3f", k ? "," : "", P::name(P::Kind(k)),
                  prof_.seconds[size_t(k)] / n * 1e3);
    s += buf;
    if ((k == P::gemv || k == P::gemm) && prof_.seconds[size_t(k)] > 0) {
      std::snprintf(buf, sizeof buf, " (%.1f GB/s of weights)",
                    prof_.weight_bytes[size_t(k)] / prof_.seconds[size_t(k)] / 1e9);
      s += buf;
    }
  }
  double timed = 0;
  for (double t : prof_.seconds) timed += t;
  std::snprintf(buf, sizeof buf, ", other %.3f of a %.3f ms step",
                std::max(0.0, prof_.step_seconds - timed) / n * 1e3, prof_.step_seconds / n * 1e3);
  s += buf;
  if (prof_.moe_calls > 0) {
    std::snprintf(buf, sizeof buf, " | routed experts: group %.3f, run %.3f, merge %.3f ms",
                  prof_.expert_group_s / n * 1e3, prof_.expert_run_s / n * 1e3,
                  prof_.expert_merge_s / n * 1e3);
    s += buf;
    std::snprintf(buf, sizeof buf, "; per MoE layer %.1f pairs, %.1f experts, largest %.1f tokens",
                  prof_.expert_pairs / prof_.moe_calls, prof_.expert_tasks / prof_.moe_calls,
                  prof_.expert_max_tokens / prof_.moe_calls);
    s += buf;
    for (const auto& [k, v] : executor_->telemetry_values()) {
      std::snprintf(buf, sizeof buf, ", %s %.3f ms", k.c_str(), v / n * 1e3);
      s += buf;
    }
  }
  return s;
}

std::vector<std::pair<std::string, double>> CpuFastBackend::telemetry_values() const {
  using P = FastBackendProfile;
  std::vector<std::pair<std::string, double>> v = {{"steps", double(steps_)}};
  static const char* keys[P::kinds] = {"gemv_s",     "gemm_s",    "kda_core_s",
                                       "mla_core_s", "experts_s", "row_ops_s"};
  for (int k = 0; k < P::kinds; ++k) v.push_back({keys[k], prof_.seconds[size_t(k)]});
  v.push_back({"step_s", prof_.step_seconds});
  v.push_back({"experts_group_s", prof_.expert_group_s});
  v.push_back({"experts_run_s", prof_.expert_run_s});
  v.push_back({"experts_merge_s", prof_.expert_merge_s});
  v.push_back({"moe_calls", prof_.moe_calls});
  v.push_back({"expert_pairs", prof_.expert_pairs});
  v.push_back({"expert_tasks", prof_.expert_tasks});
  v.push_back({"expert_max_tokens", prof_.expert_max_tokens});
  for (const auto& [k, x] : executor_->telemetry_values()) v.push_back({"executor_" + k, x});
  v.push_back({"gemv_weight_bytes", prof_.weight_bytes[P::gemv]});
  v.push_back({"gemm_weight_bytes", prof_.weight_bytes[P::gemm]});
  return v;
}

Act CpuFastBackend::alloc(int64_t rows, int64_t cols) {
  return Act{acts_.take(size_t(rows * cols)).data(), rows, cols};
}

// ---------------------------------------------------------------------------------------------
// Linear layers and row ops

void CpuFastBackend::linear(const float* x, int64_t T, const WeightView& W, float* y, bool round) {
  const bool small = T <= cpu::kGemvMaxTokens;
  const auto kind = small ? FastBackendProfile::gemv : FastBackendProfile::gemm;
  Timed t(prof_, kind);
  prof_.weight_bytes[kind] += double(W.rows) * double(W.cols) * 2.0;
  prof_.flops[kind] += 2.0 * double(T) * double(W.rows) * double(W.cols);
  if (W.format == ref::WeightFormat::bf16) {
    lin_(x, T, W, y, round);
  } else {
    // F32-stored matrices (allowed by the loader): the reference linear, the same math.
    ref::linear(x, W, y, T);
    if (round) ref::round_bf16_inplace(y, T * W.rows);
  }
}

void CpuFastBackend::linear_multi(const float* x, int64_t T, std::span<const Proj> outs) {
  bool fused = T <= cpu::kGemvMaxTokens;
  for (const Proj& o : outs)
    fused &= o.W->format == ref::WeightFormat::bf16 && o.W->cols == outs[0].W->cols;
  if (!fused) {
    for (const Proj& o : outs) linear(x, T, *o.W, o.y, o.round_out);
    return;
  }
  Timed t(prof_, FastBackendProfile::gemv);
  std::vector<cpu::Bf16Linear::Out> lo;
  for (const Proj& o : outs) {
    prof_.weight_bytes[FastBackendProfile::gemv] += double(o.W->rows) * double(o.W->cols) * 2.0;
    prof_.flops[FastBackendProfile::gemv] +=
        2.0 * double(T) * double(o.W->rows) * double(o.W->cols);
    lo.push_back({o.W, o.y, o.round_out});
  }
  lin_.multi(x, T, outs[0].W->cols, lo);
}

void CpuFastBackend::glu_mlp(const float* x, const ref::GluMlp& m, float* y, int64_t T) {
  const int64_t I = m.gate.rows;
  const Scratch::Scope scope(scratch_);
  const Scratch::Buf g = scratch_.take(size_t(T * I)), u = scratch_.take(size_t(T * I));
  const Proj gu[2] = {{&m.gate, g.data(), true}, {&m.up, u.data(), true}};  // round: GEMM outputs
  linear_multi(x, T, gu);
  {
    Timed t(prof_, FastBackendProfile::row_ops);
    cpu::glu_fast(model_.glu(), g.data(), u.data(), g.data(), T * I);  // round: GLU output
  }
  linear(g.data(), T, m.down, y, true);
}

// Embedding (§9): bf16 rows widen exactly.
void CpuFastBackend::embed(std::span<const int32_t> ids, Act out) {
  Timed t(prof_, FastBackendProfile::row_ops);
  embed_rows(ids, out);
}

void CpuFastBackend::mix(int layer, MixSite site, std::span<const Act> sources, Act out) {
  Timed t(prof_, FastBackendProfile::row_ops);
  const AttnResWeights& m = mix_weights(layer, site);
  std::vector<const float*> src;
  for (const Act& a : sources) src.push_back(a.data);
  cpu::attn_res_mix_fast(src.data(), int64_t(src.size()), m.norm.data(), m.proj.data(), out.data,
                         out.rows, c_.hidden_size, c_.rms_norm_eps);
}

void CpuFastBackend::norm(int layer, NormSite site, Act x, Act out) {
  Timed t(prof_, FastBackendProfile::row_ops);
  cpu::kimi_rms_norm_fast(x.data, norm_weights(layer, site).data(), out.data, x.rows, x.cols,
                          c_.rms_norm_eps);
}

void CpuFastBackend::add(Act acc, Act b) {
  Timed t(prof_, FastBackendProfile::row_ops);
  STRATA_ASSERT(acc.size() == b.size());
  add_inplace(acc.data, b.data, acc.size());
}

void CpuFastBackend::logits(Act h, std::span<const int64_t> rows, float* out) {
  const int64_t D = c_.hidden_size;
  const Scratch::Scope scope(scratch_);
  const Scratch::Buf in = scratch_.take(rows.size() * size_t(D));
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(in.data() + i * size_t(D), h.data + rows[i] * D, size_t(D) * sizeof(float));
  linear(in.data(), int64_t(rows.size()), model_.weights().lm_head, out, true);  // round: GEMM
}

void CpuFastBackend::token_mixer(int l, const StepShape& s, Act x, Act out) {
  STRATA_ASSERT(x.rows == s.rows);
  if (c_.is_kda(l))
    kda(l, s, x.data, out.data);
  else
    mla(l, s, x.data, out.data);
}

void CpuFastBackend::ffn(int l, const StepShape& s, Act x, Act out) {
  const LayerWeights& L = model_.weights().layers[size_t(l)];
  if (L.moe)
    moe(l, s, x.data, out.data, x.rows);
  else
    glu_mlp(x.data, L.dense->mlp, out.data, x.rows);
}

// ---------------------------------------------------------------------------------------------
// KDA (§4.2). x: normed input [T, D]; out: [T, D].

void CpuFastBackend::kda(int l, const StepShape& s, const float* x, float* out) {
  const KdaWeights& w = *model_.weights().layers[size_t(l)].kda;
  const auto& k = c_.kda;
  const int64_t H = k.num_heads, d = k.head_dim, P = k.proj_dim(), W = k.conv_kernel;
  const int64_t T = s.rows;
  // The chunked form (and its rounding of the L2-normed q, k) for a sequence of several rows.
  const auto chunked_for = [&](int64_t n) {
    return opt_.kda_form == KdaForm::chunked || (opt_.kda_form == KdaForm::automatic && n > 1);
  };

  // 1–2. q, k, v projections (round: GEMM outputs), short causal conv + SiLU (round once).
  // Every projection of x in one pass (the GEMV path), each output rounded (GEMM outputs).
  const Scratch::Scope scope(scratch_);
  const auto buf = [&](int64_t n) { return scratch_.take(size_t(n)); };
  const Scratch::Buf pq = buf(T * P), pk = buf(T * P), pv = buf(T * P), q = buf(T * P),
                     kk = buf(T * P), v = buf(T * P), f = buf(T * w.f_a_proj.rows), g = buf(T * P),
                     beta = buf(T * H), G = buf(T * P);
  Scratch::Buf ga;
  std::vector<Proj> proj = {{&w.q_proj, pq.data(), true},
                            {&w.k_proj, pk.data(), true},
                            {&w.v_proj, pv.data(), true},
                            {&w.f_a_proj, f.data(), true},
                            {&w.b_proj, beta.data(), true}};
  if (k.full_rank_output_gate) {
    proj.push_back({&w.g_proj, G.data(), true});
  } else {
    ga = buf(T * w.g_a_proj.rows);
    proj.push_back({&w.g_a_proj, ga.data(), true});
  }
  linear_multi(x, T, proj);
  // 1–2. short causal conv (with each sequence's conv state) + SiLU (round once).
  {
    Timed t(prof_, FastBackendProfile::kda_core);
    // Every sequence of the step in one call per projection, each with its own conv state.
    std::vector<cpu::ConvSeq> cq, ck, cv;
    for (const SeqSpan& sq : s.seqs) {
      KdaState& st = slots_[size_t(sq.slot)].kda[size_t(l)];
      const int64_t o0 = sq.row0 * P;
      cq.push_back({pq.data() + o0, st.conv_q.data(), q.data() + o0, sq.T});
      ck.push_back({pk.data() + o0, st.conv_k.data(), kk.data() + o0, sq.T});
      cv.push_back({pv.data() + o0, st.conv_v.data(), v.data() + o0, sq.T});
    }
    cpu::short_conv_silu_seqs_fast(cq.data(), int64_t(cq.size()), w.q_conv.data(), P, W);
    cpu::short_conv_silu_seqs_fast(ck.data(), int64_t(ck.size()), w.k_conv.data(), P, W);
    cpu::short_conv_silu_seqs_fast(cv.data(), int64_t(cv.size()), w.v_conv.data(), P, W);
  }
  // 3. decay logits through the rank-R bottleneck (round: GEMM output), then the gate.
  linear(f.data(), T, w.f_b_proj, g.data(), true);
  dump(l, "kda_z", g.data(), T, {H, d});
  const Scratch::Buf o = buf(T * P);
  {
    Timed t(prof_, FastBackendProfile::kda_core);
    ref::KdaGate gate;
    gate.A_log = w.A_log.data();
    gate.dt_bias = w.dt_bias.data();
    if (k.gate == KdaGateKind::bounded_sigmoid) {
      gate.form = ref::KdaGateForm::bounded;
      gate.lower_bound = k.gate_lower_bound;
    } else {
      gate.form = ref::KdaGateForm::softplus;
    }
    cpu::kda_gate_fast(gate, g.data(), g.data(), T, H, d);
    // 4. beta.
    ref::kda_beta(beta.data(), beta.data(), T * H);
    // 5. L2 q, k (round in the chunk path only), the recurrence — per sequence, on its state.
    for (const SeqSpan& sq : s.seqs) {
      const bool chunked = chunked_for(sq.T);
      const int64_t o0 = sq.row0 * P;
      cpu::l2_norm_fast(q.data() + o0, q.data() + o0, sq.T * H, d, kL2Eps, chunked);
      cpu::l2_norm_fast(kk.data() + o0, kk.data() + o0, sq.T * H, d, kL2Eps, chunked);
    }
    dump(l, "kda_q", q.data(), T, {H, d});
    dump(l, "kda_k", kk.data(), T, {H, d});
    dump(l, "kda_v", v.data(), T, {H, d});
    dump(l, "kda_g", g.data(), T, {H, d});
    dump(l, "kda_beta", beta.data(), T, {H});
    const float scale = 1.0f / std::sqrt(float(d));
    // The recurrent sequences (decode rows) in one call; the chunked ones (prefill) one by one.
    std::vector<cpu::KdaSeq> rec;
    for (const SeqSpan& sq : s.seqs) {
      float* S = slots_[size_t(sq.slot)].kda[size_t(l)].S.data();
      const int64_t o0 = sq.row0 * P, b0 = sq.row0 * H;
      if (chunked_for(sq.T))
        cpu::kda_chunked_fast(q.data() + o0, kk.data() + o0, v.data() + o0, g.data() + o0,
                              beta.data() + b0, S, o.data() + o0, sq.T, H, d, d, scale);
      else
        rec.push_back({q.data() + o0, kk.data() + o0, v.data() + o0, g.data() + o0,
                       beta.data() + b0, S, o.data() + o0, sq.T});
    }
    cpu::kda_recurrent_seqs_fast(rec.data(), int64_t(rec.size()), H, d, d, scale);
    cpu::round_bf16_fast(o.data(), T * P);  // round: o is bf16 before o_norm (§4.9)
    dump(l, "kda_o", o.data(), T, {H, d});
  }
  // 6–7. output gate (low rank: its second GEMM, round) and the gated per-head RMSNorm (round).
  if (!k.full_rank_output_gate) linear(ga.data(), T, w.g_b_proj, G.data(), true);
  {
    Timed t(prof_, FastBackendProfile::kda_core);
    cpu::gated_rms_norm_fast(o.data(), G.data(), w.o_norm.data(), pq.data(), T * H, d,
                             c_.rms_norm_eps);
  }
  // 8. o_proj (round: GEMM output).
  linear(pq.data(), T, w.o_proj, out, true);
}

// ---------------------------------------------------------------------------------------------
// Gated MLA (§5.2), NoPE, latent cache (§5.3).

void CpuFastBackend::mla(int l, const StepShape& s, const float* x, float* out) {
  const int64_t T = s.rows;
  const MlaWeights& w = *model_.weights().layers[size_t(l)].mla;
  const auto& m = c_.mla;
  const int64_t H = m.num_heads;
  ref::MlaDims dims;
  dims.H = H;
  dims.nope = m.qk_nope_head_dim;
  dims.rope = m.qk_rope_head_dim;
  dims.v = m.v_head_dim;
  dims.kv_lora = m.kv_lora_rank;
  // 1. queries: q-LoRA (q_a → RMSNorm eps 1e-6 → q_b) or the direct q_proj (round: GEMM outputs
  // and the norm).
  // The projections of x in one pass (GEMV path): q_a or q_proj, kv_a, the output gate.
  const int64_t C = dims.cache_dim();
  const Scratch::Scope scope(scratch_);
  const Scratch::Buf q = scratch_.take(size_t(T * H * dims.q_dim())),
                     ckv = scratch_.take(size_t(T * C));
  Scratch::Buf cq, g;
  std::vector<Proj> proj;
  if (m.q_lora_rank > 0) {
    cq = scratch_.take(size_t(T * m.q_lora_rank));
    proj.push_back({&w.q_a_proj, cq.data(), true});
  } else {
    proj.push_back({&w.q_proj, q.data(), true});
  }
  proj.push_back({&w.kv_a_proj, ckv.data(), true});
  if (m.output_gate) {
    g = scratch_.take(size_t(T * H * dims.v));
    proj.push_back({&w.g_proj, g.data(), true});
  }
  linear_multi(x, T, proj);
  // 1. queries: q-LoRA (q_a → RMSNorm eps 1e-6 → q_b; round: the norm and the GEMM output).
  if (m.q_lora_rank > 0) {
    {
      Timed t(prof_, FastBackendProfile::row_ops);
      cpu::kimi_rms_norm_fast(cq.data(), w.q_a_norm.data(), cq.data(), T, m.q_lora_rank,
                              kMlaNormEps);
    }
    linear(cq.data(), T, w.q_b_proj, q.data(), true);
  }
  // 2–3. latent + shared rope key → normalised cache rows, appended to each sequence's cache of
  // this layer; 4–5. causal attention of its new queries over its whole cache.
  const Scratch::Buf o = scratch_.take(size_t(T * H * dims.v));
  {
    Timed t(prof_, FastBackendProfile::mla_core);
    const int64_t qd = H * dims.q_dim(), od = H * dims.v;
    // Decode rows in the absorbed form go through one batched call after the loop (kv_b read
    // once for all of them); the other sequences' attention runs in the loop.
    std::vector<cpu::MlaDecodeQuery> decode;
    for (const SeqSpan& sq : s.seqs) {
      MlaCache& cache = slots_[size_t(sq.slot)].mla[size_t(l)];
      STRATA_ASSERT(cache.len == sq.pos0);
      cache.rows.resize(size_t((cache.len + sq.T) * C));
      float* rows = cache.rows.data() + cache.len * C;
      ref::mla_latent_rows(ckv.data() + sq.row0 * C, w.kv_a_norm.data(), rows, sq.T, dims,
                           kMlaNormEps, kBf16);
      cache.len += sq.T;
      if (s.single()) {
        dump(l, "mla_q", q.data(), T, {H, dims.q_dim()});
        dump(l, "mla_latent", rows, T, {C});
      }
      const bool expanded =
          opt_.mla_form == MlaForm::expanded || (opt_.mla_form == MlaForm::automatic && sq.T > 1);
      if (expanded)
        cpu::mla_attention_expanded_fast(q.data() + sq.row0 * qd, cache.rows.data(), cache.len,
                                         w.kv_b_proj, dims, o.data() + sq.row0 * od, sq.T, kBf16,
                                         lin_);
      else if (sq.T == 1)
        decode.push_back(
            {q.data() + sq.row0 * qd, cache.rows.data(), cache.len, o.data() + sq.row0 * od});
      else
        cpu::mla_attention_absorbed_fast(q.data() + sq.row0 * qd, cache.rows.data(), cache.len,
                                         w.kv_b_proj, dims, o.data() + sq.row0 * od, sq.T, kBf16);
    }
    cpu::mla_attention_absorbed_batch_fast(decode.data(), int64_t(decode.size()), w.kv_b_proj, dims,
                                           kBf16);
    dump(l, "mla_attn", o.data(), T, {H, dims.v});
  }
  // 6. output gate sigmoid(g_proj x) before o_proj (K3; round: GEMM output, sigmoid, product),
  // 7. o_proj (round: GEMM output).
  if (m.output_gate) {
    Timed t(prof_, FastBackendProfile::row_ops);
    cpu::sigmoid_gate_fast(o.data(), g.data(), int64_t(o.size()));
  }
  linear(o.data(), T, w.o_proj, out, true);
}

// ---------------------------------------------------------------------------------------------
// MoE (§7.1, §7.2): every sequence of the step routed and grouped together.

void CpuFastBackend::moe(int l, const StepShape& s, const float* x, float* out, int64_t T) {
  if (opt_.on_moe_input) opt_.on_moe_input(l, x, T);
  const MoeWeights& w = *model_.weights().layers[size_t(l)].moe;
  const auto& m = c_.moe;
  const int64_t D = c_.hidden_size, E = m.num_experts, K = m.top_k, Din = c_.expert_in_dim();

  // All projections of x in one pass (GEMV path): the router's fp32 logits (never rounded), the
  // latent down-projection and the shared experts' gate and up (round: GEMM outputs).
  const Scratch::Scope scope(scratch_);
  const Scratch::Buf logits = scratch_.take(size_t(T * E));
  Scratch::Buf z, sg, su;
  std::vector<Proj> proj = {{&w.router, logits.data(), false}};
  if (m.latent_size > 0) {
    z = scratch_.take(size_t(T * Din));
    proj.push_back({&w.latent_down, z.data(), true});
  }
  if (w.shared) {
    sg = scratch_.take(size_t(T * w.shared->gate.rows));
    su = scratch_.take(sg.size());
    proj.push_back({&w.shared->gate, sg.data(), true});
    proj.push_back({&w.shared->up, su.data(), true});
  }
  linear_multi(x, T, proj);
  MoeRouting r;
  {
    Timed t(prof_, FastBackendProfile::row_ops);
    r = route_on_host(c_, logits.data(), w.router_bias.data(), T, trace_, s, l);
    dump(l, "router_logits", logits.data(), T, {E});
    if (trace_ && trace_->dumper) {
      std::vector<float> ids_f(r.ids.begin(), r.ids.end());
      dump(l, "moe_ids", ids_f.data(), T, {K});
      dump(l, "moe_weights", r.weights.data(), T, {K});
    }
  }
  // Expert inputs: the latent projection (LatentMoE; round: GEMM output) or x itself.
  const float* zin = x;
  if (m.latent_size > 0) {
    zin = z.data();
    dump(l, "moe_latent", zin, T, {Din});
  }
  // Routed experts through the executor, merged per token in increasing expert id, acc = acc +
  // w·y in fp32 (docs/numerics.md §5), one rounding at the end (round).
  const Scratch::Buf acc = scratch_.take(size_t(T * Din));
  {
    Timed t(prof_, FastBackendProfile::experts);
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    std::vector<ExpertTask> tasks = group_by_expert(r);
    const auto t1 = clock::now();
    prof_.moe_calls += 1;
    prof_.expert_pairs += double(T * K);
    prof_.expert_tasks += double(tasks.size());
    size_t largest = 0;
    for (const ExpertTask& task : tasks) largest = std::max(largest, task.tokens.size());
    prof_.expert_max_tokens += double(largest);
    const Scratch::Buf y = scratch_.take(size_t(T * K * Din));
    ExpertLayer el;
    el.layer = l;
    el.weights = &w;
    el.config = &c_;
    el.glu = model_.glu();
    el.in_dim = Din;
    el.intermediate = m.intermediate_size;
    executor_->run(el, tasks, zin, y.data(), kBf16);
    const auto t2 = clock::now();
    cpu::merge_routed_fast(y.data(), r.weights.data(), acc.data(), T, K, Din);
    const auto t3 = clock::now();
    prof_.expert_group_s += std::chrono::duration<double>(t1 - t0).count();
    prof_.expert_run_s += std::chrono::duration<double>(t2 - t1).count();
    prof_.expert_merge_s += std::chrono::duration<double>(t3 - t2).count();
  }
  dump(l, "moe_routed", acc.data(), T, {Din});
  // Stable LatentMoE: RMSNorm of the aggregate (round), then the up-projection (round: GEMM).
  if (m.latent_size > 0) {
    if (m.latent_norm) {
      Timed t(prof_, FastBackendProfile::row_ops);
      cpu::kimi_rms_norm_fast(acc.data(), w.latent_norm.data(), acc.data(), T, Din,
                              c_.rms_norm_eps);
    }
    linear(acc.data(), T, w.latent_up, out, true);
  } else {
    std::copy(acc.begin(), acc.end(), out);
  }
  // Shared experts: one GLU MLP on the full-width input, added unweighted (round: the add).
  if (w.shared) {
    const Scratch::Buf sh = scratch_.take(size_t(T * D));
    {
      Timed t(prof_, FastBackendProfile::row_ops);
      cpu::glu_fast(model_.glu(), sg.data(), su.data(), sg.data(), int64_t(sg.size()));  // round
    }
    linear(sg.data(), T, w.shared->down, sh.data(), true);  // round: GEMM output
    dump(l, "moe_shared", sh.data(), T, {D});
    Timed t(prof_, FastBackendProfile::row_ops);
    add_inplace(out, sh.data(), T * D);
  }
}

// ---------------------------------------------------------------------------------------------

std::unique_ptr<Backend> make_cpu_backend(const Model& model, BackendOptions options, int slots) {
  if (options.precision == Precision::bf16 && options.experts != ExpertNumerics::exact)
    return std::make_unique<CpuFastBackend>(model, std::move(options), slots);
  return std::make_unique<CpuRefBackend>(model, std::move(options), slots);
}

}  // namespace strata::engine
