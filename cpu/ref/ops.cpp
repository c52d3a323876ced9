// fp32 reference ops: weight views, linear, norms, activations, AttnRes, router, expert FFNs.
// KDA lives in kda.cpp, MLA in mla.cpp. Reductions that feed a normalisation (Σx², softmax sums)
// accumulate in double so the oracle's own error stays far below any path it judges.
#include "cpu/ref/ops.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "storage/bf16.h"
#include "storage/error.h"
#include "storage/mxfp4.h"

namespace strata::cpu::ref {

namespace {

double sum_sq(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

template <class F>
void parallel_rows(int64_t rows, int64_t grain, F&& f) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, std::max<int64_t>(1, grain)),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t i = r.begin(); i < r.end(); ++i) f(i);
                    });
}

// Rows per parallel task so that each task does at least ~16k element operations.
int64_t grain_for(int64_t work_per_row) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, work_per_row));
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Weight views

WeightView WeightView::row_slice(int64_t r0, int64_t n) const {
  STRATA_ASSERT(r0 >= 0 && n >= 0 && r0 + n <= rows);
  WeightView v = *this;
  v.rows = n;
  switch (format) {
    case WeightFormat::f32:
      v.data = static_cast<const float*>(data) + r0 * cols;
      break;
    case WeightFormat::bf16:
      v.data = static_cast<const uint16_t*>(data) + r0 * cols;
      break;
    case WeightFormat::mxfp4:
      v.data = static_cast<const uint8_t*>(data) + r0 * (cols / 2);
      v.scale = scale + r0 * (cols / 32);
      break;
  }
  return v;
}

void WeightView::widen_row(int64_t r, float* out) const {
  STRATA_ASSERT(r >= 0 && r < rows);
  switch (format) {
    case WeightFormat::f32:
      std::memcpy(out, static_cast<const float*>(data) + r * cols, size_t(cols) * sizeof(float));
      break;
    case WeightFormat::bf16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_f32(p[c]);
      break;
    }
    case WeightFormat::mxfp4: {
      STRATA_ASSERT(cols % 32 == 0 && scale != nullptr);
      mxfp4::decode_row(static_cast<const uint8_t*>(data) + r * (cols / 2), scale + r * (cols / 32),
                        cols, out);
      break;
    }
  }
}

std::vector<float> WeightView::to_f32() const {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) widen_row(r, out.data() + r * cols);
  return out;
}

void round_bf16_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

void round_if(Precision p, float* x, int64_t n) {
  if (p == Precision::bf16) round_bf16_inplace(x, n);
}

// ------------------------------------------------------------------------------------------------
// Norms

void kimi_rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t D, float eps,
                   Precision p) {
  parallel_rows(rows, grain_for(D), [&](int64_t r) {
    const float* xr = x + r * D;
    float* o = out + r * D;
    const float ms = float(sum_sq(xr, D) / double(D));
    const float rs = 1.0f / std::sqrt(ms + eps);
    for (int64_t d = 0; d < D; ++d) {
      float y = xr[d] * rs;
      if (p == Precision::bf16) {
        o[d] = round_bf16(w[d] * round_bf16(y));
      } else {
        o[d] = w[d] * y;
      }
    }
  });
}

void rms_norm(const float* x, float* out, int64_t rows, int64_t D, float eps) {
  parallel_rows(rows, grain_for(D), [&](int64_t r) {
    const float* xr = x + r * D;
    float* o = out + r * D;
    const float rs = 1.0f / std::sqrt(float(sum_sq(xr, D) / double(D)) + eps);
    for (int64_t d = 0; d < D; ++d) o[d] = xr[d] * rs;
  });
}

void l2_norm(const float* x, float* out, int64_t rows, int64_t D, float eps, Precision p) {
  parallel_rows(rows, grain_for(D), [&](int64_t r) {
    const float* xr = x + r * D;
    float* o = out + r * D;
    const float rs = 1.0f / std::sqrt(float(sum_sq(xr, D)) + eps);
    for (int64_t d = 0; d < D; ++d) o[d] = xr[d] * rs;
    round_if(p, o, D);
  });
}

void gated_rms_norm(const float* o, const float* gate, const float* w, float* out, int64_t rows,
                    int64_t D, float eps, Precision p) {
  parallel_rows(rows, grain_for(D), [&](int64_t r) {
    const float* orow = o + r * D;
    const float* g = gate + r * D;
    float* y = out + r * D;
    const float rs = 1.0f / std::sqrt(float(sum_sq(orow, D) / double(D)) + eps);
    for (int64_t d = 0; d < D; ++d) y[d] = ((orow[d] * rs) * w[d]) * sigmoid(g[d]);
    round_if(p, y, D);
  });
}

// ------------------------------------------------------------------------------------------------
// Activations

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
float silu(float x) {
  return x * sigmoid(x);
}
float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

void situ_glu(const float* g, const float* u, float* out, int64_t n, float beta1, float beta2,
              Precision p) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i], ui = u[i];
    const float a = (beta1 * std::tanh(gi / beta1)) * sigmoid(gi);
    const float up = beta2 > 0.0f ? beta2 * std::tanh(ui / beta2) : ui;
    const float v = a * up;
    out[i] = p == Precision::bf16 ? round_bf16(v) : v;
  }
}

void silu_glu(const float* g, const float* u, float* out, int64_t n, Precision p) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = silu(g[i]) * u[i];
    out[i] = p == Precision::bf16 ? round_bf16(v) : v;
  }
}

void glu(const Glu& act, const float* g, const float* u, float* out, int64_t n, Precision p) {
  if (act.kind == GluKind::situ) {
    situ_glu(g, u, out, n, act.beta1, act.beta2, p);
  } else {
    silu_glu(g, u, out, n, p);
  }
}

void sigmoid_gate_inplace(float* o, const float* g, int64_t n, Precision p) {
  for (int64_t i = 0; i < n; ++i) {
    if (p == Precision::bf16) {
      o[i] = round_bf16(o[i] * round_bf16(sigmoid(g[i])));
    } else {
      o[i] = o[i] * sigmoid(g[i]);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// AttnRes

void attn_res_mix(const float* const* sources, int64_t n, const float* norm_w, const float* proj_w,
                  float* out, int64_t T, int64_t D, float eps, Precision p) {
  STRATA_ASSERT(n >= 1);
  parallel_rows(T, grain_for(n * D * 2), [&](int64_t t) {
    std::vector<float> logit(static_cast<size_t>(n), 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float* v = sources[i] + t * D;
      const float rs = 1.0f / std::sqrt(float(sum_sq(v, D) / double(D)) + eps);
      double s = 0.0;
      for (int64_t d = 0; d < D; ++d) s += double((v[d] * rs) * (norm_w[d] * proj_w[d]));
      logit[size_t(i)] = float(s);
    }
    const float mx = *std::max_element(logit.begin(), logit.end());
    std::vector<float> prob(static_cast<size_t>(n));
    double den = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      prob[size_t(i)] = std::exp(logit[size_t(i)] - mx);
      den += prob[size_t(i)];
    }
    for (int64_t i = 0; i < n; ++i) prob[size_t(i)] = float(prob[size_t(i)] / den);
    float* o = out + t * D;
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (int64_t i = 0; i < n; ++i) acc += prob[size_t(i)] * sources[i][t * D + d];
      o[d] = p == Precision::bf16 ? round_bf16(acc) : acc;
    }
  });
}

// ------------------------------------------------------------------------------------------------
// Router

namespace {

// Weights of one token's selection (ids in the order given): score (+ bias in place for the
// Kimi-Linear form), summed in that order, renormalised (+1e-20), scaled.
void selection_weights(const float* lg, const RouterParams& rp, const int32_t* id, float* w) {
  float sum = 0.0f;
  for (int64_t j = 0; j < rp.topk; ++j) {
    float s = sigmoid(lg[id[j]]);
    if (rp.form == RouterForm::biased_in_place && rp.bias) s = s + rp.bias[id[j]];
    w[j] = s;
    sum += s;
  }
  for (int64_t j = 0; j < rp.topk; ++j) {
    if (rp.renormalize) w[j] = w[j] / (sum + 1e-20f);
    w[j] = w[j] * rp.scaling;
  }
}

}  // namespace

void route(const float* logits, const RouterParams& rp, int32_t* ids, float* weights,
           int32_t* ranked, int64_t T) {
  const int64_t E = rp.E, k = rp.topk;
  STRATA_ASSERT(k >= 1 && k <= E);
  parallel_rows(T, grain_for(E * 4), [&](int64_t t) {
    const float* lg = logits + t * E;
    std::vector<float> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      score[size_t(e)] = sigmoid(lg[e]);
      choice[size_t(e)] = rp.bias ? score[size_t(e)] + rp.bias[e] : score[size_t(e)];
    }
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    // Decreasing biased score, ties → lower id (a strict weak order: NaN scores sort last).
    auto better = [&](int32_t a, int32_t b) {
      const float ca = choice[size_t(a)], cb = choice[size_t(b)];
      if (std::isnan(ca) != std::isnan(cb)) return std::isnan(cb);
      if (ca != cb) return ca > cb;
      return a < b;
    };
    std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
    if (ranked) std::copy(order.begin(), order.begin() + k, ranked + t * k);
    int32_t* id = ids + t * k;
    float* w = weights + t * k;
    std::copy(order.begin(), order.begin() + k, id);
    std::sort(id, id + k);
    selection_weights(lg, rp, id, w);
  });
}

void route_weights(const float* logits, const RouterParams& rp, const int32_t* ids, float* weights,
                   int64_t T) {
  for (int64_t i = 0; i < T * rp.topk; ++i) {
    if (ids[i] < 0 || ids[i] >= rp.E) {
      throw Error("route_weights: expert id " + std::to_string(ids[i]) + " at token " +
                  std::to_string(i / rp.topk) + " is outside [0, " + std::to_string(rp.E) + ")");
    }
  }
  parallel_rows(T, grain_for(rp.topk * 8), [&](int64_t t) {
    selection_weights(logits + t * rp.E, rp, ids + t * rp.topk, weights + t * rp.topk);
  });
}

// ------------------------------------------------------------------------------------------------
// Expert FFNs

void glu_mlp(const float* x, const GluMlp& m, const Glu& act, float* y, int64_t T, Precision p) {
  const int64_t I = m.gate.rows, D = m.gate.cols;
  if (m.up.rows != I || m.up.cols != D || m.down.rows != D || m.down.cols != I) {
    throw Error("glu_mlp: inconsistent shapes gate [" + std::to_string(I) + ", " +
                std::to_string(D) + "], up [" + std::to_string(m.up.rows) + ", " +
                std::to_string(m.up.cols) + "], down [" + std::to_string(m.down.rows) + ", " +
                std::to_string(m.down.cols) + "]; expected up = gate and down = gateᵀ shape");
  }
  std::vector<float> g(static_cast<size_t>(T * I)), u(static_cast<size_t>(T * I));
  linear(x, m.gate, g.data(), T);
  linear(x, m.up, u.data(), T);
  round_if(p, g.data(), T * I);
  round_if(p, u.data(), T * I);
  glu(act, g.data(), u.data(), g.data(), T * I, p);
  linear(g.data(), m.down, y, T);
  round_if(p, y, T * D);
}

void expert_ffn_mxfp4(const float* x, const Mxfp4Expert& e, const Glu& act, float* y, int64_t T,
                      Precision p) {
  STRATA_ASSERT(e.w1.format == WeightFormat::mxfp4 && e.w3.format == WeightFormat::mxfp4 &&
                e.w2.format == WeightFormat::mxfp4);
  glu_mlp(x, GluMlp{e.w1, e.w3, e.w2}, act, y, T, p);
}

void expert_ffn_dense(const float* x, const GluMlp& e, const Glu& act, float* y, int64_t T,
                      Precision p) {
  glu_mlp(x, e, act, y, T, p);
}

void accumulate_weighted(float* acc, const float* y, float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + w * y[i];
}

}  // namespace strata::cpu::ref
