// The forward pass (spec/model.md §2.2) and per-sequence state (§11). Each step names the spec
// section it implements; every rounding marked round(...) is a bf16 rounding point of §12.2 and a
// no-op in fp32 mode. Sites dumped: blk.{l}.{mix_attn, attn_norm, kda_out|mla_out, mix_mlp,
// ffn_norm, moe_out|mlp_out, out} plus the internals named at each dump() call; embed, final_mix,
// final_norm, logits.
#include "engine/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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
}  // namespace

Session::Session(const Model& model, SessionOptions options)
    : model_(model), c_(model.config()), opt_(options) {
  if (opt_.stop_after_layer >= c_.num_layers)
    throw Error("--stop-after-layer " + std::to_string(opt_.stop_after_layer) +
                ": the model has layers 0.." + std::to_string(c_.num_layers - 1));
  executor_ = make_expert_executor(opt_.experts, c_);
  if (opt_.wrap_executor) executor_ = opt_.wrap_executor(std::move(executor_));
  reset();
}

void Session::reset() {
  pos_ = 0;
  kda_.assign(size_t(c_.num_layers), {});
  mla_.assign(size_t(c_.num_layers), {});
  const int64_t H = c_.kda.num_heads, d = c_.kda.head_dim, P = c_.kda.proj_dim(),
                W = c_.kda.conv_kernel;
  for (int l = 0; l < c_.num_layers; ++l) {
    if (!c_.is_kda(l)) continue;
    KdaState& s = kda_[size_t(l)];
    s.S.assign(size_t(H * d * d), 0.0f);
    s.conv_q.assign(size_t(P * (W - 1)), 0.0f);
    s.conv_k = s.conv_q;
    s.conv_v = s.conv_q;
  }
}

const KdaState* Session::kda_state(int l) const {
  return c_.is_kda(l) ? &kda_[size_t(l)] : nullptr;
}
const MlaCache* Session::mla_cache(int l) const {
  return c_.is_mla(l) ? &mla_[size_t(l)] : nullptr;
}

uint64_t Session::state_bytes() const {
  uint64_t n = 0;
  for (const auto& s : kda_)
    n += (s.S.size() + s.conv_q.size() + s.conv_k.size() + s.conv_v.size()) * sizeof(float);
  for (const auto& m : mla_) n += uint64_t(m.len) * uint64_t(c_.mla.latent_cache_dim()) * 4;
  return n;
}

void Session::dump(const std::string& name, const float* data, int64_t rows,
                   const std::vector<int64_t>& row_shape) const {
  if (opt_.dumper && opt_.dumper->wants(name)) opt_.dumper->add(name, data, rows, row_shape);
}
void Session::dump(int l, const char* site, const float* data, int64_t rows,
                   const std::vector<int64_t>& row_shape) const {
  if (opt_.dumper) dump(site_name(l, site), data, rows, row_shape);
}

// ---------------------------------------------------------------------------------------------
// Whole model (§2.2)

std::vector<float> Session::forward(std::span<const int32_t> ids, bool all_logits) {
  if (ids.empty()) throw Error("forward: empty token list");
  Stream s = embed(ids);
  for (int l = 0; l < c_.num_layers; ++l) {
    run_layer(l, s);
    if (l == opt_.stop_after_layer) {
      advance(s.T);
      return {};
    }
  }
  std::vector<float> logits = head(s, all_logits);
  advance(s.T);
  return logits;
}

Stream Session::embed(std::span<const int32_t> ids) const {
  const auto& w = model_.weights();
  const int64_t D = c_.hidden_size;
  Stream s;
  s.T = int64_t(ids.size());
  s.P.resize(static_cast<size_t>(s.T * D));
  for (int64_t t = 0; t < s.T; ++t) {
    const int32_t id = ids[size_t(t)];
    if (id < 0 || id >= c_.vocab_size)
      throw Error("token id " + std::to_string(id) + " at position " + std::to_string(pos_ + t) +
                  " is outside the vocabulary [0, " + std::to_string(c_.vocab_size) + ")");
    w.embed.widen_row(id, s.P.data() + t * D);  // bf16 rows widen exactly
  }
  dump("embed", s.P.data(), s.T, {D});
  return s;
}

void Session::mix(const Stream& s, const AttnResWeights& w, float* out) const {
  std::vector<const float*> src;
  for (const auto& b : s.blocks) src.push_back(b.data());
  if (!s.P.empty()) src.push_back(s.P.data());
  ref::attn_res_mix(src.data(), int64_t(src.size()), w.norm.data(), w.proj.data(), out, s.T,
                    c_.hidden_size, c_.rms_norm_eps, opt_.precision);
}

void Session::run_layer(int l, Stream& s) {
  const LayerWeights& L = model_.weights().layers[size_t(l)];
  const int64_t T = s.T, D = c_.hidden_size, n = T * D;
  const Precision p = opt_.precision;
  std::vector<float> x(static_cast<size_t>(n)), h(static_cast<size_t>(n)),
      a(static_cast<size_t>(n));

  // (a) input to the token mixer: AttnRes over [B…, P] (layer 0: B empty → x = P), or P itself.
  if (c_.has_attn_res() && !s.blocks.empty())
    mix(s, *L.attn_res, x.data());
  else
    x = s.P;
  dump(l, "mix_attn", x.data(), T, {D});
  // (b) block boundary: bank the raw stream, restart the partial sum.
  if (c_.opens_block(l)) {
    s.blocks.push_back(std::move(s.P));
    s.P.clear();
  }
  // (c) token mixer on the normed input.
  ref::kimi_rms_norm(x.data(), L.input_norm.data(), h.data(), T, D, c_.rms_norm_eps, p);
  dump(l, "attn_norm", h.data(), T, {D});
  if (L.kda) {
    kda(l, h.data(), a.data(), T);
    dump(l, "kda_out", a.data(), T, {D});
  } else {
    mla(l, h.data(), a.data(), T);
    dump(l, "mla_out", a.data(), T, {D});
  }
  if (s.P.empty())
    s.P = a;
  else
    add_inplace(s.P.data(), a.data(), n, p);
  // (d) input to the FFN: AttnRes over [B…, P] (B is never empty here), or P.
  if (c_.has_attn_res())
    mix(s, *L.mlp_res, x.data());
  else
    x = s.P;
  dump(l, "mix_mlp", x.data(), T, {D});
  ref::kimi_rms_norm(x.data(), L.post_norm.data(), h.data(), T, D, c_.rms_norm_eps, p);
  dump(l, "ffn_norm", h.data(), T, {D});
  if (L.moe) {
    moe(l, h.data(), a.data(), T);
    dump(l, "moe_out", a.data(), T, {D});
  } else {
    dense(l, h.data(), a.data(), T);
    dump(l, "mlp_out", a.data(), T, {D});
  }
  add_inplace(s.P.data(), a.data(), n, p);
  dump(l, "out", s.P.data(), T, {D});
}

std::vector<float> Session::head(const Stream& s, bool all_logits) {
  const auto& w = model_.weights();
  const int64_t T = s.T, D = c_.hidden_size, V = c_.vocab_size;
  const Precision p = opt_.precision;
  std::vector<float> h(static_cast<size_t>(T * D));
  if (w.output_res)
    mix(s, *w.output_res, h.data());  // final AttnRes mix over [B…, P]
  else
    h = s.P;
  dump("final_mix", h.data(), T, {D});
  ref::kimi_rms_norm(h.data(), w.final_norm.data(), h.data(), T, D, c_.rms_norm_eps, p);
  dump("final_norm", h.data(), T, {D});
  const int64_t rows = all_logits ? T : 1;
  const float* in = h.data() + (T - rows) * D;
  std::vector<float> logits = linear(in, w.lm_head, rows, p);
  dump("logits", logits.data(), rows, {V});
  return logits;
}

// ---------------------------------------------------------------------------------------------
// KDA (§4.2). x: normed input [T, D]; out: [T, D].

void Session::kda(int l, const float* x, float* out, int64_t T) {
  const KdaWeights& w = *model_.weights().layers[size_t(l)].kda;
  const auto& k = c_.kda;
  const int64_t H = k.num_heads, d = k.head_dim, P = k.proj_dim(), W = k.conv_kernel,
                D = c_.hidden_size;
  const Precision p = opt_.precision;
  KdaState& st = kda_[size_t(l)];
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

void Session::mla(int l, const float* x, float* out, int64_t T) {
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
  MlaCache& cache = mla_[size_t(l)];
  const int64_t C = dims.cache_dim();
  std::vector<float> ckv = linear(x, w.kv_a_proj, T, p);
  STRATA_ASSERT(cache.len == pos_);
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
// FFNs: dense GLU MLP (§7.4) and the MoE (§7.1 Stable LatentMoE / Kimi-Linear MoE, §7.2).

void Session::dense(int l, const float* x, float* out, int64_t T) {
  const DenseMlpWeights& w = *model_.weights().layers[size_t(l)].dense;
  ref::glu_mlp(x, w.mlp, model_.glu(), out, T, opt_.precision);
}

void Session::moe(int l, const float* x, float* out, int64_t T) {
  if (opt_.on_moe_input) opt_.on_moe_input(l, x, T);
  const MoeWeights& w = *model_.weights().layers[size_t(l)].moe;
  const auto& m = c_.moe;
  const int64_t D = c_.hidden_size, E = m.num_experts, K = m.top_k, Din = c_.expert_in_dim();
  const Precision p = opt_.precision;

  // Router: fp32 logits of the full-width input, sigmoid, top-k with the selection bias.
  std::vector<float> logits(static_cast<size_t>(T * E));
  ref::linear(x, w.router, logits.data(), T);  // fp32, never rounded
  ref::RouterParams rp;
  rp.E = E;
  rp.topk = K;
  rp.form = m.router_form == RouterWeightForm::bias_in_place ? ref::RouterForm::biased_in_place
                                                             : ref::RouterForm::unbiased;
  rp.renormalize = m.renormalize;
  rp.scaling = m.routed_scaling_factor;
  rp.bias = w.router_bias.data();
  MoeRouting r;
  r.T = T;
  r.top_k = K;
  r.ids.resize(static_cast<size_t>(T * K));
  r.weights.resize(static_cast<size_t>(T * K));
  ref::route(logits.data(), rp, r.ids.data(), r.weights.data(), nullptr, T);
  if (opt_.replay_routing) {
    // Forced selection: the weights are those the router gives the forced experts (the same
    // formula as ref::route applied to another selection: score, optional in-place bias,
    // renormalise, scale).
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<int>* forced = opt_.replay_routing->forced(l, int(pos_ + t));
      if (!forced) continue;
      if (int64_t(forced->size()) != K)
        throw Error("--replay-routing: layer " + std::to_string(l) + " position " +
                    std::to_string(pos_ + t) + " has " + std::to_string(forced->size()) +
                    " experts, the model routes to " + std::to_string(K));
      float sum = 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        const int e = (*forced)[size_t(j)];
        if (e >= E)
          throw Error("--replay-routing: layer " + std::to_string(l) + " position " +
                      std::to_string(pos_ + t) + ": expert " + std::to_string(e) +
                      " does not exist (" + std::to_string(E) + " experts)");
        float s = ref::sigmoid(logits[size_t(t * E + e)]);
        if (rp.form == ref::RouterForm::biased_in_place) s = s + rp.bias[e];
        r.ids[size_t(t * K + j)] = e;
        r.weights[size_t(t * K + j)] = s;
        sum = sum + s;
      }
      for (int64_t j = 0; j < K; ++j) {
        float& wt = r.weights[size_t(t * K + j)];
        if (m.renormalize) wt = wt / (sum + 1e-20f);
        wt = wt * m.routed_scaling_factor;
      }
    }
  }
  if (opt_.record_routing) {
    opt_.record_routing->top_k = int(K);
    for (int64_t t = 0; t < T; ++t)
      opt_.record_routing->record(
          l, int(pos_ + t), std::vector<int>(r.ids.begin() + t * K, r.ids.begin() + (t + 1) * K));
  }
  dump(l, "router_logits", logits.data(), T, {E});
  if (opt_.dumper) {
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
