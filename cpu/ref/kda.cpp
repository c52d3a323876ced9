// fp32 reference KDA (spec §4): short conv + SiLU with conv state, both gate forms, beta, the naive
// recurrence (§4.4, the oracle) and the chunked WY/UT form (§4.5). State layout [H, V, K]
// (FLA state_v_first): row v of a head's state is S[:, v] of the spec's [K, V] matrix, so every
// per-token step of the recurrence works on one contiguous row.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/ref/ops.h"
#include "storage/bf16.h"
#include "storage/error.h"

namespace strata::cpu::ref {

namespace {

// Sequential fp32 dot product (K = 128 in every KDA use; the order is fixed).
float dotk(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

template <class F>
void parallel_for_n(int64_t n, F&& f) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 1),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t i = r.begin(); i < r.end(); ++i) f(i);
                    });
}

}  // namespace

void short_conv_silu(const float* x, const float* w, float* state, float* y, int64_t T, int64_t C,
                     int64_t W, Precision p) {
  STRATA_ASSERT(W >= 1 && x != y);
  const int64_t Wm = W - 1;
  // Channels are independent: split them across threads; each y element is one fixed-order sum.
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, C, 64), [&](const tbb::blocked_range<int64_t>& r) {
        std::vector<float> seq(
            static_cast<size_t>(Wm + T));  // history (oldest first) ++ this call's inputs
        for (int64_t c = r.begin(); c < r.end(); ++c) {
          for (int64_t j = 0; j < Wm; ++j) seq[size_t(j)] = state ? state[c * Wm + j] : 0.0f;
          for (int64_t t = 0; t < T; ++t) seq[size_t(Wm + t)] = x[t * C + c];
          const float* wc = w + c * W;
          for (int64_t t = 0; t < T; ++t) {
            float acc = 0.0f;
            for (int64_t j = 0; j < W; ++j) acc += wc[j] * seq[size_t(t + j)];
            const float v = silu(acc);
            y[t * C + c] = p == Precision::bf16 ? round_bf16(v) : v;
          }
          if (state) {
            for (int64_t j = 0; j < Wm; ++j) state[c * Wm + j] = seq[size_t(T + j)];
          }
        }
      });
}

void kda_gate(const KdaGate& gate, const float* z, float* g, int64_t T, int64_t H, int64_t K) {
  STRATA_ASSERT(gate.A_log != nullptr && gate.dt_bias != nullptr);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float a = std::exp(gate.A_log[h]);
      const float* zr = z + (t * H + h) * K;
      float* gr = g + (t * H + h) * K;
      const float* db = gate.dt_bias + h * K;
      for (int64_t d = 0; d < K; ++d) {
        const float x = zr[d] + db[d];
        gr[d] = gate.form == KdaGateForm::bounded ? gate.lower_bound * sigmoid(a * x)
                                                  : -a * softplus(x);
      }
    }
  }
}

void kda_beta(const float* b, float* beta, int64_t n) {
  for (int64_t i = 0; i < n; ++i) beta[i] = sigmoid(b[i]);
}

// Head h's recurrent state [V, K]: inside the caller's state, or a zero state in `local` when the
// caller passes none.
static float* head_state(float* state, std::vector<float>& local, int64_t h, int64_t V, int64_t K) {
  if (state) return state + h * V * K;
  local.assign(size_t(V * K), 0.0f);
  return local.data();
}

void kda_recurrent(const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* state, float* o, int64_t T, int64_t H, int64_t K,
                   int64_t V, float scale) {
  parallel_for_n(H, [&](int64_t h) {
    std::vector<float> local;
    float* S = head_state(state, local, h, V, K);  // [V, K]
    std::vector<float> qs(static_cast<size_t>(K)), alpha(static_cast<size_t>(K));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t th = t * H + h;
      const float* kt = k + th * K;
      const float* vt = v + th * V;
      const float bt = beta[th];
      for (int64_t d = 0; d < K; ++d) {
        qs[size_t(d)] = q[th * K + d] * scale;
        alpha[size_t(d)] = std::exp(g[th * K + d]);
      }
      float* ot = o + th * V;
      // Each state row v evolves on its own: decay → predict → write → read.
      for (int64_t j = 0; j < V; ++j) {
        float* row = S + j * K;
        for (int64_t d = 0; d < K; ++d) row[d] *= alpha[size_t(d)];
        const float pred = dotk(row, kt, K);
        const float u = bt * (vt[j] - pred);
        for (int64_t d = 0; d < K; ++d) row[d] += kt[d] * u;
        ot[j] = dotk(row, qs.data(), K);
      }
    }
  });
}

void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                 float* state, float* o, int64_t T, int64_t H, int64_t K, int64_t V, float scale,
                 int64_t chunk) {
  STRATA_ASSERT(chunk >= 1);
  parallel_for_n(H, [&](int64_t h) {
    std::vector<float> local;
    float* S = head_state(state, local, h, V, K);  // [V, K]
    const int64_t C = chunk;
    std::vector<float> G(static_cast<size_t>(C * K));    // cumulative log decay inside the chunk
    std::vector<float> Qs(static_cast<size_t>(C * K));   // scaled q
    std::vector<float> GQ(static_cast<size_t>(C * K));   // Γ ⊙ Q
    std::vector<float> GK(static_cast<size_t>(C * K));   // Γ ⊙ K
    std::vector<float> L(static_cast<size_t>(C * C));    // strictly lower
    std::vector<float> Mi(static_cast<size_t>(C * C));   // (I + L)^-1, then M = (I + L)^-1 Diag(β)
    std::vector<float> A(static_cast<size_t>(C * C));    // A_qk, lower incl. diagonal
    std::vector<float> Wm(static_cast<size_t>(C * K));   // W = M (Γ ⊙ K)
    std::vector<float> U(static_cast<size_t>(C * V));    // U = M V, then Ṽ = U − W S
    std::vector<float> dec(static_cast<size_t>(C * K));  // exp(G_last − G_r) ⊙ k_r
    for (int64_t t0 = 0; t0 < T; t0 += C) {
      const int64_t n = std::min(C, T - t0);
      auto kr = [&](int64_t r) { return k + ((t0 + r) * H + h) * K; };
      auto vr = [&](int64_t r) { return v + ((t0 + r) * H + h) * V; };
      auto br = [&](int64_t r) { return beta[(t0 + r) * H + h]; };
      for (int64_t r = 0; r < n; ++r) {
        const float* gr = g + ((t0 + r) * H + h) * K;
        const float* qr = q + ((t0 + r) * H + h) * K;
        for (int64_t d = 0; d < K; ++d) {
          G[size_t(r * K + d)] = (r == 0 ? 0.0f : G[size_t((r - 1) * K + d)]) + gr[d];
          Qs[size_t(r * K + d)] = qr[d] * scale;
          const float gam = std::exp(G[size_t(r * K + d)]);
          GQ[size_t(r * K + d)] = Qs[size_t(r * K + d)] * gam;
          GK[size_t(r * K + d)] = kr(r)[d] * gam;
        }
      }
      // 1. L[r,i] = β_r Σ_d k_r k_i exp(G_r − G_i), i < r;  5. A[r,j] = Σ_d q_r k_j exp(G_r − G_j).
      // The exponent is formed from the difference (≤ 0 for j ≤ r), never as Γ_r / Γ_j, which
      // would overflow fp32 over a long chunk.
      for (int64_t r = 0; r < n; ++r) {
        const float* Gr = &G[size_t(r * K)];
        for (int64_t j = 0; j <= r; ++j) {
          const float* Gj = &G[size_t(j * K)];
          const float* kj = kr(j);
          const float* krr = kr(r);
          const float* qr = &Qs[size_t(r * K)];
          float lk = 0.0f, aq = 0.0f;
          for (int64_t d = 0; d < K; ++d) {
            const float e = std::exp(Gr[d] - Gj[d]);
            lk += krr[d] * kj[d] * e;
            aq += qr[d] * kj[d] * e;
          }
          if (j < r) L[size_t(r * C + j)] = br(r) * lk;
          A[size_t(r * C + j)] = aq;
        }
      }
      // 2. (I + L)^-1 by forward substitution (unit lower triangular), then M = · Diag(β).
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j < n; ++j) {
          float s = (j == r) ? 1.0f : 0.0f;
          if (j < r) {
            for (int64_t i = j; i < r; ++i) s -= L[size_t(r * C + i)] * Mi[size_t(i * C + j)];
          }
          Mi[size_t(r * C + j)] = j <= r ? s : 0.0f;
        }
      }
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t j = 0; j <= r; ++j) Mi[size_t(r * C + j)] *= br(j);
      }
      // 3. W = M (Γ ⊙ K), U = M V;  4. Ṽ = U − W S.
      for (int64_t r = 0; r < n; ++r) {
        float* wr = &Wm[size_t(r * K)];
        float* ur = &U[size_t(r * V)];
        std::fill(wr, wr + K, 0.0f);
        std::fill(ur, ur + V, 0.0f);
        for (int64_t j = 0; j <= r; ++j) {
          const float m = Mi[size_t(r * C + j)];
          const float* gkj = &GK[size_t(j * K)];
          const float* vj = vr(j);
          for (int64_t d = 0; d < K; ++d) wr[d] += m * gkj[d];
          for (int64_t e = 0; e < V; ++e) ur[e] += m * vj[e];
        }
        for (int64_t e = 0; e < V; ++e) ur[e] -= dotk(wr, S + e * K, K);
      }
      // 6. O = (Γ ⊙ Q) S + A_qk Ṽ.
      for (int64_t r = 0; r < n; ++r) {
        float* orow = o + ((t0 + r) * H + h) * V;
        const float* gq = &GQ[size_t(r * K)];
        for (int64_t e = 0; e < V; ++e) {
          float intra = 0.0f;
          for (int64_t j = 0; j <= r; ++j) intra += A[size_t(r * C + j)] * U[size_t(j * V + e)];
          orow[e] = dotk(gq, S + e * K, K) + intra;
        }
      }
      // 7. S ← Diag(exp G_last) S + (exp(G_last − G) ⊙ K)ᵀ Ṽ   (in [V, K]: row e, column d).
      const float* Gl = &G[size_t((n - 1) * K)];
      for (int64_t r = 0; r < n; ++r) {
        const float* Gr = &G[size_t(r * K)];
        const float* krr = kr(r);
        for (int64_t d = 0; d < K; ++d) dec[size_t(r * K + d)] = std::exp(Gl[d] - Gr[d]) * krr[d];
      }
      std::vector<float> gl(static_cast<size_t>(K));
      for (int64_t d = 0; d < K; ++d) gl[size_t(d)] = std::exp(Gl[d]);
      for (int64_t e = 0; e < V; ++e) {
        float* row = S + e * K;
        for (int64_t d = 0; d < K; ++d) {
          float acc = 0.0f;
          for (int64_t r = 0; r < n; ++r) acc += dec[size_t(r * K + d)] * U[size_t(r * V + e)];
          row[d] = gl[size_t(d)] * row[d] + acc;
        }
      }
    }
  });
}

}  // namespace strata::cpu::ref
