// fp32 reference MLA without RoPE (spec §5): latent-cache rows, the expanded attention (§5.2, the
// HF order: per-head keys and values materialised from the latent) and the absorbed attention
// (§5.3: queries mapped into the latent space, attention over the 512+64 cache rows).
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/ref/ops.h"
#include "storage/error.h"

namespace strata::cpu::ref {

namespace {

float dotn(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void check_kv_b(const WeightView& kv_b, const MlaDims& d) {
  if (kv_b.rows != d.H * (d.nope + d.v) || kv_b.cols != d.kv_lora) {
    throw Error("mla: kv_b_proj has shape [" + std::to_string(kv_b.rows) + ", " +
                std::to_string(kv_b.cols) + "], expected [" + std::to_string(d.H * (d.nope + d.v)) +
                ", " + std::to_string(d.kv_lora) + "] (heads·(qk_nope+v), kv_lora_rank)");
  }
}

// Softmax over n fp32 scores in place (max-subtracted, double denominator).
void softmax_inplace(float* s, int64_t n) {
  float mx = s[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, s[i]);
  double den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - mx);
    den += s[i];
  }
  for (int64_t i = 0; i < n; ++i) s[i] = float(s[i] / den);
}

}  // namespace

float MlaDims::scale() const {
  return 1.0f / std::sqrt(float(nope + rope));
}

void mla_latent_rows(const float* ckv, const float* w_norm, float* cache_rows, int64_t T,
                     const MlaDims& d, float eps, Precision p) {
  const int64_t R = d.cache_dim();
  for (int64_t t = 0; t < T; ++t) {
    kimi_rms_norm(ckv + t * R, w_norm, cache_rows + t * R, 1, d.kv_lora, eps, p);
    if (cache_rows != ckv) {
      std::copy(ckv + t * R + d.kv_lora, ckv + (t + 1) * R, cache_rows + t * R + d.kv_lora);
    }
  }
}

void mla_attention_expanded(const float* q, const float* cache, int64_t S, const WeightView& kv_b,
                            const MlaDims& d, float* out, int64_t T, Precision p) {
  check_kv_b(kv_b, d);
  STRATA_ASSERT(T <= S);
  const int64_t R = d.cache_dim(), Dq = d.q_dim(), Dkv = d.nope + d.v;
  // kv = ĉ · kv_bᵀ for every cached position: [S, H, nope + v] (a bf16 GEMM output in HF).
  std::vector<float> lat(static_cast<size_t>(S * d.kv_lora));
  for (int64_t s = 0; s < S; ++s) {
    std::copy(cache + s * R, cache + s * R + d.kv_lora, lat.begin() + s * d.kv_lora);
  }
  std::vector<float> kv(static_cast<size_t>(S * d.H * Dkv));
  linear(lat.data(), kv_b, kv.data(), S);
  round_if(p, kv.data(), int64_t(kv.size()));
  // k = [k_nope | k_pe] per head: [S, H, nope + rope].
  std::vector<float> key(static_cast<size_t>(S * d.H * Dq));
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t h = 0; h < d.H; ++h) {
      float* kk = &key[size_t((s * d.H + h) * Dq)];
      const float* src = &kv[size_t((s * d.H + h) * Dkv)];
      std::copy(src, src + d.nope, kk);
      std::copy(cache + s * R + d.kv_lora, cache + (s + 1) * R, kk + d.nope);
    }
  }
  const float scale = d.scale();
  const int64_t base = S - T;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, T * d.H, 1),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      std::vector<float> sc(static_cast<size_t>(S));
                      for (int64_t th = r.begin(); th < r.end(); ++th) {
                        const int64_t t = th / d.H, h = th % d.H;
                        const int64_t n = base + t + 1;  // causal: positions 0 .. base + t
                        const float* qh = q + th * Dq;
                        for (int64_t s = 0; s < n; ++s) {
                          sc[size_t(s)] = dotn(qh, &key[size_t((s * d.H + h) * Dq)], Dq) * scale;
                        }
                        softmax_inplace(sc.data(), n);
                        // Positions outer, values inner: each value row is read once (the
                        // same ascending-s sum per output element as values outer, without a
                        // strided pass over the cache per element — 100× slower at 128K).
                        float* oh = out + th * d.v;
                        std::fill(oh, oh + d.v, 0.0f);
                        for (int64_t s = 0; s < n; ++s) {
                          const float ps = sc[size_t(s)];
                          const float* vs = &kv[size_t((s * d.H + h) * Dkv + d.nope)];
                          for (int64_t e = 0; e < d.v; ++e) oh[e] += ps * vs[e];
                        }
                        round_if(p, oh, d.v);
                      }
                    });
}

void mla_attention_absorbed(const float* q, const float* cache, int64_t S, const WeightView& kv_b,
                            const MlaDims& d, float* out, int64_t T, Precision p) {
  check_kv_b(kv_b, d);
  STRATA_ASSERT(T <= S);
  const int64_t R = d.cache_dim(), Dq = d.q_dim(), Dkv = d.nope + d.v, C = d.kv_lora;
  const float scale = d.scale();
  const int64_t base = S - T;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, d.H, 1), [&](const tbb::blocked_range<int64_t>& r) {
        std::vector<float> wuk(static_cast<size_t>(d.nope * C)), wuv(static_cast<size_t>(d.v * C));
        std::vector<float> qlat(static_cast<size_t>(C)), ctx(static_cast<size_t>(C)),
            sc(static_cast<size_t>(S));
        for (int64_t h = r.begin(); h < r.end(); ++h) {
          // W_UK_h = kv_b rows h·(nope+v) .. +nope; W_UV_h = the following v rows.
          for (int64_t i = 0; i < d.nope; ++i) kv_b.widen_row(h * Dkv + i, &wuk[size_t(i * C)]);
          for (int64_t i = 0; i < d.v; ++i)
            kv_b.widen_row(h * Dkv + d.nope + i, &wuv[size_t(i * C)]);
          for (int64_t t = 0; t < T; ++t) {
            const float* qh = q + (t * d.H + h) * Dq;
            // q_lat = W_UKᵀ q_nope (a GEMM output: rounded in bf16 mode).
            std::fill(qlat.begin(), qlat.end(), 0.0f);
            for (int64_t i = 0; i < d.nope; ++i) {
              const float qi = qh[i];
              const float* w = &wuk[size_t(i * C)];
              for (int64_t c = 0; c < C; ++c) qlat[size_t(c)] += qi * w[c];
            }
            round_if(p, qlat.data(), C);
            const int64_t n = base + t + 1;
            for (int64_t s = 0; s < n; ++s) {
              const float* row = cache + s * R;
              sc[size_t(s)] =
                  (dotn(qlat.data(), row, C) + dotn(qh + d.nope, row + C, d.rope)) * scale;
            }
            softmax_inplace(sc.data(), n);
            std::fill(ctx.begin(), ctx.end(), 0.0f);
            for (int64_t s = 0; s < n; ++s) {
              const float ps = sc[size_t(s)];
              const float* row = cache + s * R;
              for (int64_t c = 0; c < C; ++c) ctx[size_t(c)] += ps * row[c];
            }
            float* oh = out + (t * d.H + h) * d.v;
            for (int64_t e = 0; e < d.v; ++e) oh[e] = dotn(&wuv[size_t(e * C)], ctx.data(), C);
            round_if(p, oh, d.v);
          }
        }
      });
}

}  // namespace strata::cpu::ref
