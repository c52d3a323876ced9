// The CPU reference backend (engine/cpu_backend.h). Each sublayer names the spec section it
// implements; every rounding marked round(...) is a bf16 rounding point of §12.2 and a no-op in
// fp32 mode. Internal sites dumped (single-sequence steps with a Trace): blk.{l}.{kda_z, kda_q,
// kda_k, kda_v, kda_g, kda_beta, kda_o, mla_q, mla_latent, mla_attn, router_logits, moe_ids,
// moe_weights, moe_latent, moe_routed, moe_shared}.
#include "engine/cpu_backend.h"

#include "engine/finite_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/routing.h"
#include "storage/error.h"

namespace strata::engine {

namespace ref = cpu::ref;

namespace {
constexpr float kMlaNormEps = 1e-6f;  // q_a / kv_a layernorms (spec §3.1: class default)
constexpr float kL2Eps = 1e-6f;       // KDA q/k L2 norm (spec §3.3)

std::vector<float> linear(const float* x, const WeightView& W, int64_t T, Precision p) {
  std::vector<float> y(static_cast<size_t>(T * W.rows));
  ref::linear(x, W, y.data(), T);
  ref::round_if(p, y.data(), int64_t(y.size()));  // bf16 GEMM output
  return y;
}

void add_inplace(float* a, const float* b, int64_t n, Precision p) {
  for (int64_t i = 0; i < n; ++i) a[i] = a[i] + b[i];
  ref::round_if(p, a, n);  // bf16 residual add
}

const char* precision_label(Precision p) {
  return p == Precision::fp32 ? "fp32" : "bf16";
}
}  // namespace

void CpuSeqState::reset(const ModelConfig& c) {
  pos = 0;
  kda.assign(size_t(c.num_layers), {});
  mla.assign(size_t(c.num_layers), {});
  const int64_t H = c.kda.num_heads, d = c.kda.head_dim, P = c.kda.proj_dim(),
                W = c.kda.conv_kernel;
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.is_kda(l)) continue;
    KdaState& s = kda[size_t(l)];
    s.S.assign(size_t(H * d * d), 0.0f);
    s.conv_q.assign(size_t(P * (W - 1)), 0.0f);
    s.conv_k = s.conv_q;
    s.conv_v = s.conv_q;
  }
}

uint64_t CpuSeqState::bytes(const ModelConfig& c) const {
  uint64_t n = 0;
  for (const auto& s : kda)
    n += (s.S.size() + s.conv_q.size() + s.conv_k.size() + s.conv_v.size()) * sizeof(float);
  for (const auto& m : mla) n += uint64_t(m.len) * uint64_t(c.mla.latent_cache_dim()) * 4;
  return n;
}

CpuHostBackend::CpuHostBackend(const Model& model, BackendOptions options, int slots)
    : model_(model), c_(model.config()), opt_(std::move(options)) {
  STRATA_ASSERT(slots >= 1);
  if (opt_.experts == ExpertNumerics::bf16 && opt_.precision != Precision::bf16)
    throw Error(
        "--experts-numerics bf16 runs the bf16 model; --precision fp32 is the reference's (use "
        "--experts-numerics exact)");
  executor_ = make_expert_executor(opt_.experts, c_);
  if (opt_.wrap_executor) executor_ = opt_.wrap_executor(std::move(executor_));
  slots_.resize(size_t(slots));
  for (int i = 0; i < slots; ++i) reset_slot(i);
}

void CpuHostBackend::commit_step(const StepShape& s) {
  for (const SeqSpan& q : s.seqs) slots_[size_t(q.slot)].pos += q.T;
}

void CpuHostBackend::dump(int l, const char* site, const float* data, int64_t rows,
                          const std::vector<int64_t>& row_shape) const {
  if (!trace_ || !trace_->dumper) return;
  const std::string name = site_name(l, site);
  if (trace_->dumper->wants(name)) trace_->dumper->add(name, data, rows, row_shape);
}

void CpuHostBackend::to_host(Act a, float* dst) {
  std::memcpy(dst, a.data, size_t(a.size()) * sizeof(float));
}
int64_t CpuHostBackend::first_non_finite(Act a, const StepShape&) {
  return engine::first_non_finite(a.data, a.size());  // host memory: every row, in place
}
void CpuHostBackend::from_host(const float* src, Act a) {
  std::memcpy(a.data, src, size_t(a.size()) * sizeof(float));
}
void CpuHostBackend::copy(Act src, Act dst) {
  STRATA_ASSERT(src.size() == dst.size());
  std::memcpy(dst.data, src.data, size_t(src.size()) * sizeof(float));
}

// Embedding (§9): bf16 rows widen exactly.
void CpuHostBackend::embed_rows(std::span<const int32_t> ids, Act out) const {
  const int64_t D = c_.hidden_size;
  for (size_t t = 0; t < ids.size(); ++t)
    model_.weights().embed.widen_row(ids[t], out.data + int64_t(t) * D);
}

const AttnResWeights& CpuHostBackend::mix_weights(int layer, MixSite site) const {
  const auto& w = model_.weights();
  return site == MixSite::output ? *w.output_res
         : site == MixSite::attn ? *w.layers[size_t(layer)].attn_res
                                 : *w.layers[size_t(layer)].mlp_res;
}

const std::vector<float>& CpuHostBackend::norm_weights(int layer, NormSite site) const {
  const auto& w = model_.weights();
  return site == NormSite::final   ? w.final_norm
         : site == NormSite::input ? w.layers[size_t(layer)].input_norm
                                   : w.layers[size_t(layer)].post_norm;
}

CpuRefBackend::CpuRefBackend(const Model& model, BackendOptions options, int slots)
    : CpuHostBackend(model, std::move(options), slots) {
  name_ = std::string("cpu-ref ") + precision_label(opt_.precision) + ", experts " +
          expert_numerics_name(opt_.experts);
}

void CpuRefBackend::begin_step(const StepShape&) {
  arena_.clear();
}

Act CpuRefBackend::alloc(int64_t rows, int64_t cols) {
  arena_.emplace_back(size_t(rows * cols));
  return Act{arena_.back().data(), rows, cols};
}

void CpuRefBackend::embed(std::span<const int32_t> ids, Act out) {
  embed_rows(ids, out);
}

// AttnRes mix (§6.2) over [B…, P].
void CpuRefBackend::mix(int layer, MixSite site, std::span<const Act> sources, Act out) {
  const AttnResWeights& m = mix_weights(layer, site);
  std::vector<const float*> src;
  for (const Act& a : sources) src.push_back(a.data);
  ref::attn_res_mix(src.data(), int64_t(src.size()), m.norm.data(), m.proj.data(), out.data,
                    out.rows, c_.hidden_size, c_.rms_norm_eps, opt_.precision);
}

void CpuRefBackend::norm(int layer, NormSite site, Act x, Act out) {
  ref::kimi_rms_norm(x.data, norm_weights(layer, site).data(), out.data, x.rows, x.cols,
                     c_.rms_norm_eps, opt_.precision);
}

void CpuRefBackend::add(Act acc, Act b) {
  STRATA_ASSERT(acc.size() == b.size());
  add_inplace(acc.data, b.data, acc.size(), opt_.precision);
}

void CpuRefBackend::logits(Act h, std::span<const int64_t> rows, float* out) {
  const WeightView& W = model_.weights().lm_head;
  const int64_t D = c_.hidden_size, V = c_.vocab_size;
  // Consecutive rows (the common case: the last row, or all rows) in one call.
  std::vector<float> in(rows.size() * size_t(D));
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(in.data() + i * size_t(D), h.data + rows[i] * D, size_t(D) * sizeof(float));
  ref::linear(in.data(), W, out, int64_t(rows.size()));
  ref::round_if(opt_.precision, out, int64_t(rows.size()) * V);  // bf16 GEMM output
}

void CpuRefBackend::token_mixer(int l, const StepShape& s, Act x, Act out) {
  const int64_t D = c_.hidden_size;
  for (const SeqSpan& q : s.seqs) {
    Slot& st = slots_[size_t(q.slot)];
    const float* xs = x.data + q.row0 * D;
    float* os = out.data + q.row0 * D;
    if (c_.is_kda(l))
      kda(l, st, xs, os, q.T);
    else
      mla(l, st, q.pos0, xs, os, q.T);
  }
}

void CpuRefBackend::ffn(int l, const StepShape& s, Act x, Act out) {
  const LayerWeights& L = model_.weights().layers[size_t(l)];
  if (L.moe)
    moe(l, s, x.data, out.data, x.rows);
  else
    ref::glu_mlp(x.data, L.dense->mlp, model_.glu(), out.data, x.rows, opt_.precision);
}

// ---------------------------------------------------------------------------------------------
// KDA (§4.2). x: normed input [T, D]; out: [T, D].

void CpuRefBackend::kda(int l, Slot& slot, const float* x, float* out, int64_t T) {
  const KdaWeights& w = *model_.weights().layers[size_t(l)].kda;
  const auto& k = c_.kda;
  const int64_t H = k.num_heads, d = k.head_dim, P = k.proj_dim(), W = k.conv_kernel,
                D = c_.hidden_size;
  const Precision p = opt_.precision;
  KdaState& st = slot.kda[size_t(l)];
  const bool chunked =
      opt_.kda_form == KdaForm::chunked || (opt_.kda_form == KdaForm::automatic && T > 1);

  // 1–2. q, k, v projections, short causal conv (with conv state) + SiLU.
  std::vector<float> q(static_cast<size_t>(T * P)), kk(static_cast<size_t>(T * P)),
      v(static_cast<size_t>(T * P));
  {
    std::vector<float> pre = linear(x, w.q_proj, T, p);
    ref::short_conv_silu(pre.data(), w.q_conv.data(), st.conv_q.data(), q.data(), T, P, W, p);
    pre = linear(x, w.k_proj, T, p);
    ref::short_conv_silu(pre.data(), w.k_conv.data(), st.conv_k.data(), kk.data(), T, P, W, p);
    pre = linear(x, w.v_proj, T, p);
    ref::short_conv_silu(pre.data(), w.v_conv.data(), st.conv_v.data(), v.data(), T, P, W, p);
  }
  // 3. decay logits through the rank-R bottleneck, then the gate (both forms, §4.3).
  std::vector<float> g;
  {
    std::vector<float> f = linear(x, w.f_a_proj, T, p);
    g = linear(f.data(), w.f_b_proj, T, p);
  }
  dump(l, "kda_z", g.data(), T, {H, d});
  ref::KdaGate gate;
  gate.A_log = w.A_log.data();
  gate.dt_bias = w.dt_bias.data();
  if (k.gate == KdaGateKind::bounded_sigmoid) {
    gate.form = ref::KdaGateForm::bounded;
    gate.lower_bound = k.gate_lower_bound;
  } else {
    gate.form = ref::KdaGateForm::softplus;
  }
  ref::kda_gate(gate, g.data(), g.data(), T, H, d);
  // 4. beta.
  std::vector<float> beta = linear(x, w.b_proj, T, p);
  ref::kda_beta(beta.data(), beta.data(), T * H);
  // 5. L2 q, k (the chunk path stores them in bf16; the decode path keeps fp32), recurrence.
  const Precision l2p = chunked ? p : Precision::fp32;
  ref::l2_norm(q.data(), q.data(), T * H, d, kL2Eps, l2p);
  ref::l2_norm(kk.data(), kk.data(), T * H, d, kL2Eps, l2p);
  dump(l, "kda_q", q.data(), T, {H, d});
  dump(l, "kda_k", kk.data(), T, {H, d});
  dump(l, "kda_v", v.data(), T, {H, d});
  dump(l, "kda_g", g.data(), T, {H, d});
  dump(l, "kda_beta", beta.data(), T, {H});
  std::vector<float> o(static_cast<size_t>(T * P));
  const float scale = 1.0f / std::sqrt(float(d));
  if (chunked)
    ref::kda_chunked(q.data(), kk.data(), v.data(), g.data(), beta.data(), st.S.data(), o.data(), T,
                     H, d, d, scale);
  else
    ref::kda_recurrent(q.data(), kk.data(), v.data(), g.data(), beta.data(), st.S.data(), o.data(),
                       T, H, d, d, scale);
  ref::round_if(p, o.data(), T * P);  // o is bf16 before o_norm (§4.9)
  dump(l, "kda_o", o.data(), T, {H, d});
  // 6–7. output gate (full rank or low rank) and the gated per-head RMSNorm.
  std::vector<float> G;
  if (k.full_rank_output_gate) {
    G = linear(x, w.g_proj, T, p);
  } else {
    std::vector<float> ga = linear(x, w.g_a_proj, T, p);
    G = linear(ga.data(), w.g_b_proj, T, p);
  }
  std::vector<float> y(static_cast<size_t>(T * P));
  ref::gated_rms_norm(o.data(), G.data(), w.o_norm.data(), y.data(), T * H, d, c_.rms_norm_eps, p);
  // 8. o_proj.
  ref::linear(y.data(), w.o_proj, out, T);
  ref::round_if(p, out, T * D);
}

// ---------------------------------------------------------------------------------------------
// Gated MLA (§5.2), NoPE, latent cache (§5.3).

void CpuRefBackend::mla(int l, Slot& slot, int64_t pos0, const float* x, float* out, int64_t T) {
  const MlaWeights& w = *model_.weights().layers[size_t(l)].mla;
  const auto& m = c_.mla;
  const int64_t D = c_.hidden_size, H = m.num_heads;
  const Precision p = opt_.precision;
  ref::MlaDims dims;
  dims.H = H;
  dims.nope = m.qk_nope_head_dim;
  dims.rope = m.qk_rope_head_dim;
  dims.v = m.v_head_dim;
  dims.kv_lora = m.kv_lora_rank;
  // 1. queries: q-LoRA (q_a → RMSNorm eps 1e-6 → q_b) or the direct q_proj.
  std::vector<float> q;
  if (m.q_lora_rank > 0) {
    std::vector<float> cq = linear(x, w.q_a_proj, T, p);
    ref::kimi_rms_norm(cq.data(), w.q_a_norm.data(), cq.data(), T, m.q_lora_rank, kMlaNormEps, p);
    q = linear(cq.data(), w.q_b_proj, T, p);
  } else {
    q = linear(x, w.q_proj, T, p);
  }
  // 2–3. latent + shared rope key → normalised cache rows, appended to this layer's cache.
  MlaCache& cache = slot.mla[size_t(l)];
  const int64_t C = dims.cache_dim();
  std::vector<float> ckv = linear(x, w.kv_a_proj, T, p);
  STRATA_ASSERT(cache.len == pos0);
  cache.rows.resize(size_t((cache.len + T) * C));
  float* rows = cache.rows.data() + cache.len * C;
  ref::mla_latent_rows(ckv.data(), w.kv_a_norm.data(), rows, T, dims, kMlaNormEps, p);
  cache.len += T;
  dump(l, "mla_q", q.data(), T, {H, dims.q_dim()});
  dump(l, "mla_latent", rows, T, {C});
  // 4–5. causal attention of the T new queries over the whole cache.
  const bool expanded =
      opt_.mla_form == MlaForm::expanded || (opt_.mla_form == MlaForm::automatic && T > 1);
  std::vector<float> o(static_cast<size_t>(T * H * dims.v));
  if (expanded)
    ref::mla_attention_expanded(q.data(), cache.rows.data(), cache.len, w.kv_b_proj, dims, o.data(),
                                T, p);
  else
    ref::mla_attention_absorbed(q.data(), cache.rows.data(), cache.len, w.kv_b_proj, dims, o.data(),
                                T, p);
  dump(l, "mla_attn", o.data(), T, {H, dims.v});
  // 6. output gate sigmoid(g_proj x) before o_proj (K3), 7. o_proj.
  if (m.output_gate) {
    std::vector<float> g = linear(x, w.g_proj, T, p);
    ref::sigmoid_gate_inplace(o.data(), g.data(), int64_t(o.size()), p);
  }
  ref::linear(o.data(), w.o_proj, out, T);
  ref::round_if(p, out, T * D);
}

// ---------------------------------------------------------------------------------------------
// MoE (§7.1 Stable LatentMoE / Kimi-Linear MoE, §7.2). Rows of every sequence of the step are
// routed and grouped together, so an expert chosen by several sequences is computed once.

void CpuRefBackend::moe(int l, const StepShape& s, const float* x, float* out, int64_t T) {
  if (opt_.on_moe_input) opt_.on_moe_input(l, x, T);
  const MoeWeights& w = *model_.weights().layers[size_t(l)].moe;
  const auto& m = c_.moe;
  const int64_t D = c_.hidden_size, E = m.num_experts, K = m.top_k, Din = c_.expert_in_dim();
  const Precision p = opt_.precision;

  // Router: fp32 logits of the full-width input, sigmoid, top-k with the selection bias.
  std::vector<float> logits(static_cast<size_t>(T * E));
  ref::linear(x, w.router, logits.data(), T);  // fp32, never rounded
  const MoeRouting r = route_on_host(c_, logits.data(), w.router_bias.data(), T, trace_, s, l);
  dump(l, "router_logits", logits.data(), T, {E});
  if (trace_ && trace_->dumper) {
    std::vector<float> ids_f(r.ids.begin(), r.ids.end());
    dump(l, "moe_ids", ids_f.data(), T, {K});
    dump(l, "moe_weights", r.weights.data(), T, {K});
  }

  // Expert inputs: the latent projection (LatentMoE) or x itself.
  std::vector<float> z;
  const float* zin = x;
  if (m.latent_size > 0) {
    z = linear(x, w.latent_down, T, p);
    zin = z.data();
    dump(l, "moe_latent", zin, T, {Din});
  }
  // Routed experts through the executor, then the merge in one place: per token, experts in
  // increasing id, acc = acc + w·y in fp32 (docs/numerics.md §5), one rounding at the end.
  std::vector<ExpertTask> tasks = group_by_expert(r);
  std::vector<float> y(static_cast<size_t>(T * K * Din));
  ExpertLayer el;
  el.layer = l;
  el.weights = &w;
  el.config = &c_;
  el.glu = model_.glu();
  el.in_dim = Din;
  el.intermediate = m.intermediate_size;
  executor_->run(el, tasks, zin, y.data(), p);
  std::vector<float> acc(size_t(T * Din), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j)
      ref::accumulate_weighted(acc.data() + t * Din, y.data() + (t * K + j) * Din,
                               r.weights[size_t(t * K + j)], Din);
  ref::round_if(p, acc.data(), T * Din);
  dump(l, "moe_routed", acc.data(), T, {Din});
  // Stable LatentMoE: RMSNorm of the aggregate, then the up-projection back to D.
  if (m.latent_size > 0) {
    if (m.latent_norm)
      ref::kimi_rms_norm(acc.data(), w.latent_norm.data(), acc.data(), T, Din, c_.rms_norm_eps, p);
    ref::linear(acc.data(), w.latent_up, out, T);
    ref::round_if(p, out, T * D);
  } else {
    std::copy(acc.begin(), acc.end(), out);
  }
  // Shared experts: one GLU MLP on the full-width input, added unweighted.
  if (w.shared) {
    std::vector<float> sh(static_cast<size_t>(T * D));
    ref::glu_mlp(x, *w.shared, model_.glu(), sh.data(), T, p);
    dump(l, "moe_shared", sh.data(), T, {D});
    add_inplace(out, sh.data(), T * D, p);
  }
}

}  // namespace strata::engine
