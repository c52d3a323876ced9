// Model loading (engine/model.h): every tensor the config implies is claimed with its dtype and
// shape (spec/model.md §2.3, golden/README.md §3.3/§4.3), then check_all_claimed() proves nothing
// in the checkpoint went unused.
#include "engine/model.h"

#include <tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>

#include "engine/finite_check.h"
#include "storage/error.h"
#include "storage/mxfp4.h"

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

void check_experts_quantizable(const ModelConfig& c, const std::string& what) {
  const std::string q = "--experts-quantize mxfp4: " + what;
  if (c.num_moe_layers() == 0) throw Error(q + " has no routed experts");
  if (c.moe.mxfp4) throw Error(q + ": the routed experts are already MXFP4");
  if (c.expert_in_dim() % mxfp4::kBlock != 0 || c.moe.intermediate_size % mxfp4::kBlock != 0)
    throw Error(q + ": expert widths " + std::to_string(c.expert_in_dim()) + " and " +
                std::to_string(c.moe.intermediate_size) + " must be multiples of " +
                std::to_string(mxfp4::kBlock) + " (the MXFP4 block)");
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& dir, LoadOptions opt) {
  std::unique_ptr<Model> m(new Model());
  m->ckpt_ = std::make_unique<Checkpoint>(dir);
  Checkpoint& ckpt = *m->ckpt_;
  m->config_ = ckpt.config();
  const ModelConfig& c = m->config_;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  if (opt.quantize_experts) check_experts_quantizable(c, dir.string());  // before any read
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
  if (opt.quantize_experts) m->quantize_experts(opt.progress);
  return m;
}

// Per MoE layer one buffer of E experts, each laid out w1 packed | w1 scales | w3 … | w2 …; the
// expert views are repointed at it. Experts are independent: one TBB task each.
void Model::quantize_experts(bool progress) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto secs = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  const ModelConfig& c = config_;
  const int64_t E = c.moe.num_experts, I = c.moe.intermediate_size, Din = c.expert_in_dim();
  const size_t elems = size_t(I * Din);  // elements of one projection
  const size_t proj_bytes = elems / 2 + elems / size_t(mxfp4::kBlock);
  const size_t expert_bytes = 3 * proj_bytes;
  std::vector<uint8_t*> base(weights_.layers.size(), nullptr);
  std::vector<std::pair<int, int>> jobs;  // (layer, expert)
  for (const LayerWeights& L : weights_.layers) {
    if (!L.moe) continue;
    quantized_.emplace_back(new uint8_t[size_t(E) * expert_bytes]);
    base[size_t(L.index)] = quantized_.back().get();
    quantized_bytes_ += uint64_t(E) * expert_bytes;
    for (int e = 0; e < E; ++e) jobs.emplace_back(L.index, e);
  }
  const bool tty = progress && ::isatty(STDERR_FILENO);
  std::atomic<size_t> done{0};
  std::mutex print_mu;
  double last_print = 0;
  bool printed = false;
  const std::string dir = ckpt_->dir().string();
  tbb::parallel_for(size_t(0), jobs.size(), [&](size_t j) {
    const auto [l, e] = jobs[j];
    ExpertWeights& x = weights_.layers[size_t(l)].moe->experts[size_t(e)];
    const ExpertTensors& t = ckpt_->expert(l, e);
    uint8_t* p = base[size_t(l)] + size_t(e) * expert_bytes;
    std::vector<float> row(size_t(std::max(I, Din)));
    auto quantize = [&](WeightView& w, const ExpertTensors::Proj& src) {
      uint8_t* packed = p;
      uint8_t* scale = p + elems / 2;
      p += proj_bytes;
      for (int64_t r = 0; r < w.rows; ++r) {
        w.widen_row(r, row.data());
        try {
          mxfp4::quantize_row(row.data(), w.cols, packed + r * w.cols / 2,
                              scale + r * (w.cols / mxfp4::kBlock));
        } catch (const Error& err) {  // a NaN/Inf weight (the loader scans small tensors only)
          throw Error("checkpoint " + dir + ": tensor " + src.weight->name + ", row " +
                      std::to_string(r) + ": " + err.what() + " (--experts-quantize mxfp4)");
        }
      }
      w = WeightView::mxfp4(packed, scale, w.rows, w.cols);
    };
    quantize(x.w1, t.w1);
    quantize(x.w3, t.w3);
    quantize(x.w2, t.w2);
    const size_t n = ++done;
    if (!progress) return;
    std::unique_lock<std::mutex> lk(print_mu, std::try_to_lock);
    const double s = secs();
    if (!lk || s < 1.0 || s - last_print < (tty ? 0.25 : 2.0)) return;
    last_print = s;
    printed = true;
    std::fprintf(stderr,
                 tty ? "\r\033[Kstrata: quantizing routed experts to MXFP4: %zu of %zu (%.0f%%), "
                       "%.1f s"
                     : "strata: quantizing routed experts to MXFP4: %zu of %zu (%.0f%%), %.1f s\n",
                 n, jobs.size(), 100.0 * double(n) / double(jobs.size()), s);
  });
  config_.moe.mxfp4 = true;
  quantize_s_ = secs();
  if (!progress) return;
  if (printed && tty) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr,
               "strata: --experts-quantize mxfp4: %zu bf16 routed experts quantized to MXFP4 at "
               "load: +%.3f GB of host memory, %.1f s\n",
               jobs.size(), double(quantized_bytes_) / 1e9, quantize_s_);
}

}  // namespace strata::engine
