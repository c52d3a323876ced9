// Model loading (engine/model.h): every tensor the config implies is claimed with its dtype and
// shape (spec/model.md §2.3, golden/README.md §3.3/§4.3), then check_all_claimed() proves nothing
// in the checkpoint went unused.
#include "engine/model.h"

#include <algorithm>
#include <cmath>

#include "engine/finite_check.h"

#include "storage/error.h"

namespace strata::engine {

namespace {

// Claims tensors of one checkpoint and wraps them as views / fp32 vectors.
class Loader {
 public:
  Loader(Checkpoint& ckpt, const LoadOptions& opt) : ckpt_(ckpt), opt_(opt) {}
  uint64_t scanned_bytes() const { return scanned_; }

  [[noreturn]] void non_finite(const std::string& name, int64_t i, int64_t cols, bool nan) {
    throw Error("checkpoint " + ckpt_.dir().string() + ": tensor " + name + ": " +
                (nan ? "NaN" : "Inf") + " at row " + std::to_string(i / cols) + ", column " +
                std::to_string(i % cols) + " (a weight must be finite)");
  }

  // A matrix [rows, cols] stored BF16 (or F32), as a view into the mmapped shard.
  WeightView mat(const std::string& name, int64_t rows, int64_t cols) {
    const TensorInfo* t = ckpt_.find(name);
    DType dt = (t && t->dtype == DType::F32) ? DType::F32 : DType::BF16;
    const TensorInfo& info = ckpt_.claim(name, dt, {rows, cols});
    const uint8_t* p = ckpt_.bytes(info).data();
    if (reinterpret_cast<uintptr_t>(p) % dtype_size(dt) != 0)
      throw Error("checkpoint " + ckpt_.dir().string() + ": tensor " + name +
                  " is not aligned to its element size in its shard");
    if (opt_.check_weights || info.nbytes <= opt_.small_tensor_bytes) {
      const int64_t n = rows * cols;
      int64_t i;
      bool nan;
      if (dt == DType::F32) {
        const float* f = reinterpret_cast<const float*>(p);
        i = first_non_finite(f, n);
        nan = i >= 0 && std::isnan(f[i]);
      } else {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
        i = first_non_finite_bf16(h, n);
        nan = i >= 0 && (h[i] & 0x7F) != 0;
      }
      if (i >= 0) non_finite(name, i, cols, nan);
      scanned_ += info.nbytes;
    }
    if (dt == DType::F32) return WeightView::f32(reinterpret_cast<const float*>(p), rows, cols);
    return WeightView::bf16(reinterpret_cast<const uint16_t*>(p), rows, cols);
  }

  // A small tensor of the given dtype and shape, widened to fp32.
  std::vector<float> vec(const std::string& name, DType dt, const std::vector<int64_t>& shape) {
    const TensorInfo& info = ckpt_.claim(name, dt, shape);
    std::vector<float> v = ckpt_.load_f32(name, shape);
    const int64_t i = first_non_finite(v.data(), int64_t(v.size()));
    if (i >= 0) non_finite(name, i, shape.empty() ? 1 : shape.back(), std::isnan(v[size_t(i)]));
    scanned_ += info.nbytes;
    return v;
  }

  AttnResWeights attn_res(const std::string& prefix, int64_t D) {
    AttnResWeights w;
    w.norm = vec(prefix + "_norm.weight", DType::BF16, {D});
    w.proj = vec(prefix + "_proj.weight", DType::BF16, {1, D});
    return w;
  }

  cpu::ref::GluMlp glu_mlp(const std::string& prefix, int64_t I, int64_t D) {
    return {mat(prefix + "gate_proj.weight", I, D), mat(prefix + "up_proj.weight", I, D),
            mat(prefix + "down_proj.weight", D, I)};
  }

  // A routed expert projection: MXFP4 (weight_packed + weight_scale) or a bf16 matrix.
  WeightView expert_proj(const ExpertTensors::Proj& p, bool mxfp4, int64_t rows, int64_t cols) {
    if (!p.weight) throw Error("checkpoint " + ckpt_.dir().string() + ": expert tensor missing");
    if (!mxfp4) return mat(p.weight->name, rows, cols);
    if (!p.scale)
      throw Error("checkpoint " + ckpt_.dir().string() + ": tensor " + p.weight->name +
                  ": MXFP4 weight without weight_scale");
    const TensorInfo& w = ckpt_.claim(p.weight->name, DType::U8, {rows, cols / 2});
    const TensorInfo& s = ckpt_.claim(p.scale->name, DType::U8, {rows, cols / 32});
    return WeightView::mxfp4(ckpt_.bytes(w).data(), ckpt_.bytes(s).data(), rows, cols);
  }

 private:
  Checkpoint& ckpt_;
  LoadOptions opt_;
  uint64_t scanned_ = 0;
};

KdaWeights load_kda(Loader& ld, const ModelConfig& c, const std::string& p) {
  const auto& k = c.kda;
  const int64_t D = c.hidden_size, H = k.num_heads, d = k.head_dim, P = k.proj_dim(),
                W = k.conv_kernel, R = k.gate_rank > 0 ? k.gate_rank : k.head_dim;
  KdaWeights w;
  w.q_proj = ld.mat(p + "q_proj.weight", P, D);
  w.k_proj = ld.mat(p + "k_proj.weight", P, D);
  w.v_proj = ld.mat(p + "v_proj.weight", P, D);
  w.q_conv = ld.vec(p + "q_conv1d.weight", DType::F32, {P, 1, W});
  w.k_conv = ld.vec(p + "k_conv1d.weight", DType::F32, {P, 1, W});
  w.v_conv = ld.vec(p + "v_conv1d.weight", DType::F32, {P, 1, W});
  w.f_a_proj = ld.mat(p + "f_a_proj.weight", R, D);
  w.f_b_proj = ld.mat(p + "f_b_proj.weight", P, R);
  if (k.gate == KdaGateKind::bounded_sigmoid) {
    // Released K3 layout: [max(128, H)] per head, zero-padded (spec §4.3: assert the padding).
    const int64_t n = std::max<int64_t>(128, H);
    std::vector<float> a = ld.vec(p + "A_log", DType::F32, {n});
    for (int64_t i = H; i < n; ++i)
      if (a[i] != 0.0f)
        throw Error("tensor " + p + "A_log: entries " + std::to_string(H) + ".." +
                    std::to_string(n - 1) + " must be 0 (per-head A_log, zero padded), entry " +
                    std::to_string(i) + " is " + std::to_string(a[i]));
    a.resize(static_cast<size_t>(H));
    w.A_log = std::move(a);
  } else {
    w.A_log = ld.vec(p + "A_log", DType::F32, {1, 1, H, 1});
  }
  w.dt_bias = ld.vec(p + "dt_bias", DType::F32, {P});
  w.b_proj = ld.mat(p + "b_proj.weight", H, D);
  if (k.full_rank_output_gate) {
    w.g_proj = ld.mat(p + "g_proj.weight", P, D);
  } else {
    w.g_a_proj = ld.mat(p + "g_a_proj.weight", R, D);
    w.g_b_proj = ld.mat(p + "g_b_proj.weight", P, R);
  }
  w.o_norm = ld.vec(p + "o_norm.weight", DType::F32, {d});
  w.o_proj = ld.mat(p + "o_proj.weight", D, P);
  return w;
}

MlaWeights load_mla(Loader& ld, const ModelConfig& c, const std::string& p) {
  const auto& m = c.mla;
  const int64_t D = c.hidden_size, H = m.num_heads, qd = m.q_head_dim();
  MlaWeights w;
  if (m.q_lora_rank > 0) {
    w.q_a_proj = ld.mat(p + "q_a_proj.weight", m.q_lora_rank, D);
    w.q_a_norm = ld.vec(p + "q_a_layernorm.weight", DType::BF16, {m.q_lora_rank});
    w.q_b_proj = ld.mat(p + "q_b_proj.weight", H * qd, m.q_lora_rank);
  } else {
    w.q_proj = ld.mat(p + "q_proj.weight", H * qd, D);
  }
  w.kv_a_proj = ld.mat(p + "kv_a_proj_with_mqa.weight", m.latent_cache_dim(), D);
  w.kv_a_norm = ld.vec(p + "kv_a_layernorm.weight", DType::BF16, {m.kv_lora_rank});
  w.kv_b_proj =
      ld.mat(p + "kv_b_proj.weight", H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
  if (m.output_gate) w.g_proj = ld.mat(p + "g_proj.weight", H * m.v_head_dim, D);
  w.o_proj = ld.mat(p + "o_proj.weight", D, H * m.v_head_dim);
  return w;
}

MoeWeights load_moe(Loader& ld, Checkpoint& ckpt, const ModelConfig& c, int l,
                    const std::string& p) {
  const auto& m = c.moe;
  const int64_t D = c.hidden_size, E = m.num_experts, I = m.intermediate_size,
                Din = c.expert_in_dim();
  MoeWeights w;
  w.router = ld.mat(p + "gate.weight", E, D);
  w.router_bias = ld.vec(p + "gate.e_score_correction_bias", DType::F32, {E});
  if (m.latent_size > 0) {
    w.latent_down = ld.mat(p + "routed_expert_down_proj.weight", m.latent_size, D);
    if (m.latent_norm)
      w.latent_norm = ld.vec(p + "routed_expert_norm.weight", DType::BF16, {m.latent_size});
    w.latent_up = ld.mat(p + "routed_expert_up_proj.weight", D, m.latent_size);
  }
  if (m.num_shared_experts > 0)
    w.shared = ld.glu_mlp(p + "shared_experts.", m.shared_intermediate(), D);
  if (!ckpt.has_experts(l))
    throw Error("checkpoint " + ckpt.dir().string() + ": layer " + std::to_string(l) +
                " is a MoE layer but holds no routed experts");
  w.experts.reserve(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    const ExpertTensors& t = ckpt.expert(l, e);
    ExpertWeights x;
    x.w1 = ld.expert_proj(t.w1, m.mxfp4, I, Din);
    x.w3 = ld.expert_proj(t.w3, m.mxfp4, I, Din);
    x.w2 = ld.expert_proj(t.w2, m.mxfp4, Din, I);
    w.experts.push_back(x);
  }
  return w;
}

}  // namespace

cpu::ref::Glu Model::glu() const {
  cpu::ref::Glu g;
  if (config_.act == Activation::situ) {
    g.kind = cpu::ref::GluKind::situ;
    g.beta1 = config_.situ_beta;
    g.beta2 = config_.situ_linear_beta;  // 0 → no cap (ops: beta2 <= 0)
  } else {
    g.kind = cpu::ref::GluKind::silu;
  }
  return g;
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, LoadOptions opt) {
  std::unique_ptr<Model> m(new Model());
  m->ckpt_ = std::make_unique<Checkpoint>(dir);
  Checkpoint& ckpt = *m->ckpt_;
  m->config_ = ckpt.config();
  const ModelConfig& c = m->config_;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  Loader ld(ckpt, opt);
  ModelWeights& w = m->weights_;
  w.embed = ld.mat(c.tensor_prefix + "embed_tokens.weight", V, D);
  w.lm_head = ld.mat(c.lm_head_name, V, D);
  w.final_norm = ld.vec(c.tensor_prefix + "norm.weight", DType::BF16, {D});
  if (c.has_attn_res()) w.output_res = ld.attn_res(c.tensor_prefix + "output_attn_res", D);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = c.layer_prefix(l);
    LayerWeights L;
    L.index = l;
    L.kind = c.layer_kinds[size_t(l)];
    L.input_norm = ld.vec(p + "input_layernorm.weight", DType::BF16, {D});
    L.post_norm = ld.vec(p + "post_attention_layernorm.weight", DType::BF16, {D});
    if (c.has_attn_res()) {
      // Layer 0's attention-side pair exists but is unused (spec §2.2): claimed all the same.
      L.attn_res = ld.attn_res(p + "self_attention_res", D);
      L.mlp_res = ld.attn_res(p + "mlp_res", D);
    }
    if (c.is_kda(l))
      L.kda = load_kda(ld, c, p + "self_attn.");
    else
      L.mla = load_mla(ld, c, p + "self_attn.");
    if (c.is_moe(l))
      L.moe = load_moe(ld, ckpt, c, l, p + "block_sparse_moe.");
    else
      L.dense = DenseMlpWeights{ld.glu_mlp(p + "mlp.", c.dense_intermediate_size, D)};
    w.layers.push_back(std::move(L));
  }
  ckpt.check_all_claimed();
  m->scanned_bytes_ = ld.scanned_bytes();
  return m;
}

}  // namespace strata::engine
