// AVX-512 cores of cpu/mixer_kernels.h. One TBB task per head (per query and head for the
// expanded attention); within a task every vector op runs over 16 fp32 lanes of the head's
// key/latent dimension.
//
// KDA recurrence: a head's state row (K = 128 floats = 8 zmm) is loaded once per token, decayed,
// dotted with k, updated and dotted with q in registers, and stored once: the state (64 KiB per
// head) is read and written once per token instead of four passes of scalar code.
// MLA absorbed: q_lat = W_UKᵀ q_nope accumulates 256 latent columns in 16 zmm while streaming the
// bf16 rows of kv_b (widened by a 16-bit shift, exact); scores and the context run over the
// cache rows; the output reads the W_UV rows the same way.
//
// GCC 12 reports its own _mm512_undefined_* placeholders inside the intrinsics headers as
// (maybe-)uninitialized at -O3 (a known false positive); silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/mixer_kernels.h"
#include "cpu/vec_math_avx512.h"
#include "storage/bf16.h"
#include "storage/error.h"

namespace strata::cpu::detail {

namespace {

inline __m512 widen16(const uint16_t* p) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// Σ a[i]·b[i], n a multiple of 16.
inline float dot(const float* a, const float* b, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  if (i < n) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// Σ w[i]·x[i] with w bf16, n a multiple of 16.
inline float dot_bf16(const uint16_t* w, const float* x, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(widen16(w + i), _mm512_loadu_ps(x + i), s0);
    s1 = _mm512_fmadd_ps(widen16(w + i + 16), _mm512_loadu_ps(x + i + 16), s1);
  }
  if (i < n) s0 = _mm512_fmadd_ps(widen16(w + i), _mm512_loadu_ps(x + i), s0);
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

// The references' softmax (max-subtracted, std::exp, double denominator).
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

void round_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

// One head of the KDA recurrence with K = 16·KC (state rows of KC zmm).
template <int KC>
void kda_head(const float* q, const float* k, const float* v, const float* g, const float* beta,
              float* S, float* o, int64_t T, int64_t H, int64_t h, int64_t V, float scale) {
  constexpr int64_t K = 16 * KC;
  alignas(64) float alpha[K], qs[K];
  for (int64_t t = 0; t < T; ++t) {
    const int64_t th = t * H + h;
    const float* kt = k + th * K;
    const float* vt = v + th * V;
    const __m512 bt = _mm512_set1_ps(beta[th]);
    for (int64_t d = 0; d < K; ++d) {
      qs[d] = q[th * K + d] * scale;
      alpha[d] = std::exp(g[th * K + d]);
    }
    __m512 kv[KC];
    for (int i = 0; i < KC; ++i) kv[i] = _mm512_loadu_ps(kt + 16 * i);
    float* ot = o + th * V;
    for (int64_t j = 0; j < V; ++j) {
      float* row = S + j * K;
      __m512 r[KC];
      __m512 p = _mm512_setzero_ps();
      for (int i = 0; i < KC; ++i) {
        r[i] = _mm512_mul_ps(_mm512_loadu_ps(row + 16 * i), _mm512_load_ps(alpha + 16 * i));
        p = _mm512_fmadd_ps(r[i], kv[i], p);
      }
      // u = β(v_j − S_j·k), broadcast.
      const __m512 u = _mm512_mul_ps(
          bt, _mm512_sub_ps(_mm512_set1_ps(vt[j]), _mm512_set1_ps(_mm512_reduce_add_ps(p))));
      __m512 out = _mm512_setzero_ps();
      for (int i = 0; i < KC; ++i) {
        r[i] = _mm512_fmadd_ps(kv[i], u, r[i]);
        out = _mm512_fmadd_ps(r[i], _mm512_load_ps(qs + 16 * i), out);
        _mm512_storeu_ps(row + 16 * i, r[i]);
      }
      ot[j] = _mm512_reduce_add_ps(out);
    }
  }
}

}  // namespace

void kda_recurrent_avx512(const KdaSeq* seqs, int64_t n, int64_t H, int64_t K, int64_t V,
                          float scale) {
  STRATA_ASSERT(K == 64 || K == 128);
  // One task per (sequence, head).
  tbb::parallel_for(int64_t(0), n * H, [&](int64_t task) {
    const FlushSubnormals ftz;  // a state decayed over many steps holds subnormals
    const KdaSeq& s = seqs[task / H];
    const int64_t h = task % H;
    std::vector<float> local;
    float* S = s.state ? s.state + h * V * K : (local.assign(size_t(V * K), 0.0f), local.data());
    if (K == 128)
      kda_head<8>(s.q, s.k, s.v, s.g, s.beta, S, s.o, s.T, H, h, V, scale);
    else
      kda_head<4>(s.q, s.k, s.v, s.g, s.beta, S, s.o, s.T, H, h, V, scale);
  });
}

void mla_absorbed_avx512(const MlaDecodeQuery* qs, int64_t nq, const uint16_t* kv_b,
                         const ref::MlaDims& d, bool round_out) {
  const int64_t R = d.cache_dim(), Dq = d.q_dim(), Dkv = d.nope + d.v, C = d.kv_lora, H = d.H;
  STRATA_ASSERT(C % 16 == 0 && d.rope % 16 == 0);
  const float scale = d.scale();
  // Queries in groups of up to kGroup: kv_b's W_UK and W_UV rows are read from memory once per
  // group (each head's rows serve every query of the group while in L1/L2) — the decode steps of
  // B sequences share one pass over kv_b instead of B. A query's latent cache is streamed twice
  // (scores, context) in chunks of positions, each chunk's rows serving every head while in
  // L1/L2 — not 2·H times as with one task per head. Every output is computed by the same
  // operations in the same order whatever the grouping (a query alone gives the same bits).
  constexpr int64_t kGroup = 16;
  const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
  std::vector<float> qlat(static_cast<size_t>(kGroup * H * C));
  for (int64_t g0 = 0; g0 < nq; g0 += kGroup) {
    const int64_t ng = std::min(kGroup, nq - g0);
    const MlaDecodeQuery* gq = qs + g0;
    // Per query: its chunks of positions, and where its scores and context partials start.
    const size_t ngs = static_cast<size_t>(ng);
    std::vector<int64_t> chunks(ngs), per(ngs), sc_at(ngs + 1), part_at(ngs + 1), task_at(ngs + 1);
    sc_at[0] = part_at[0] = task_at[0] = 0;
    for (int64_t j = 0; j < ng; ++j) {
      const int64_t n = gq[j].len;
      STRATA_ASSERT(n >= 1);
      chunks[size_t(j)] = std::clamp<int64_t>(n / 128, 1, 4 * threads);
      per[size_t(j)] = (n + chunks[size_t(j)] - 1) / chunks[size_t(j)];
      sc_at[size_t(j) + 1] = sc_at[size_t(j)] + H * n;
      part_at[size_t(j) + 1] = part_at[size_t(j)] + chunks[size_t(j)] * H * C;
      task_at[size_t(j) + 1] = task_at[size_t(j)] + chunks[size_t(j)];
    }
    std::vector<float> sc(static_cast<size_t>(sc_at[ngs])), part(static_cast<size_t>(part_at[ngs]));
    // (query, chunk) of flattened task k.
    const auto chunk_task = [&](int64_t k, int64_t& j, int64_t& ck) {
      j = int64_t(std::upper_bound(task_at.begin(), task_at.end(), k) - task_at.begin()) - 1;
      ck = k - task_at[size_t(j)];
    };
    // q_lat = W_UKᵀ q_nope per head, 256 latent columns (16 zmm) per pass over the W_UK rows.
    tbb::parallel_for(int64_t(0), H, [&](int64_t h) {
      const uint16_t* wuk = kv_b + h * Dkv * C;  // [nope, C]
      for (int64_t c0 = 0; c0 < C; c0 += 256) {
        const int nc = int(std::min<int64_t>(256, C - c0) / 16);
        for (int64_t j = 0; j < ng; ++j) {
          const float* qh = gq[j].q + h * Dq;
          __m512 acc[16];
          for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
          for (int64_t i = 0; i < d.nope; ++i) {
            const __m512 qi = _mm512_set1_ps(qh[i]);
            const uint16_t* w = wuk + i * C + c0;
            for (int k = 0; k < nc; ++k) acc[k] = _mm512_fmadd_ps(qi, widen16(w + 16 * k), acc[k]);
          }
          float* ql = qlat.data() + (j * H + h) * C;
          for (int k = 0; k < nc; ++k) _mm512_storeu_ps(ql + c0 + 16 * k, acc[k]);
        }
      }
      if (round_out)  // a GEMM output in bf16 mode
        for (int64_t j = 0; j < ng; ++j) round_inplace(qlat.data() + (j * H + h) * C, C);
    });
    // Scores of every head, a chunk of one query's positions per task.
    tbb::parallel_for(int64_t(0), task_at[size_t(ng)], [&](int64_t k) {
      int64_t j, ck;
      chunk_task(k, j, ck);
      const MlaDecodeQuery& x = gq[j];
      const int64_t per_j = per[size_t(j)];
      float* scj = sc.data() + sc_at[size_t(j)];
      for (int64_t s = ck * per_j; s < std::min(x.len, (ck + 1) * per_j); ++s) {
        const float* row = x.cache + s * R;
        for (int64_t h = 0; h < H; ++h)
          scj[size_t(h * x.len + s)] = (dot(qlat.data() + (j * H + h) * C, row, C) +
                                        dot(x.q + h * Dq + d.nope, row + C, d.rope)) *
                                       scale;
      }
    });
    tbb::parallel_for(int64_t(0), ng * H, [&](int64_t k) {
      const int64_t j = k / H, h = k % H;
      softmax_inplace(sc.data() + sc_at[size_t(j)] + h * gq[j].len, gq[j].len);
    });
    // Context partial sums per chunk, then per head: their sum (chunk order) and W_UV.
    tbb::parallel_for(int64_t(0), task_at[size_t(ng)], [&](int64_t k) {
      int64_t j, ck;
      chunk_task(k, j, ck);
      const MlaDecodeQuery& x = gq[j];
      const int64_t per_j = per[size_t(j)];
      const float* scj = sc.data() + sc_at[size_t(j)];
      float* pc = part.data() + part_at[size_t(j)] + ck * H * C;
      std::fill(pc, pc + H * C, 0.0f);
      for (int64_t s = ck * per_j; s < std::min(x.len, (ck + 1) * per_j); ++s) {
        const float* row = x.cache + s * R;
        for (int64_t h = 0; h < H; ++h) {
          const __m512 ps = _mm512_set1_ps(scj[size_t(h * x.len + s)]);
          float* ch = pc + h * C;
          for (int64_t c = 0; c < C; c += 16)
            _mm512_storeu_ps(
                ch + c, _mm512_fmadd_ps(ps, _mm512_loadu_ps(row + c), _mm512_loadu_ps(ch + c)));
        }
      }
    });
    tbb::parallel_for(int64_t(0), H, [&](int64_t h) {
      const uint16_t* wuv = kv_b + h * Dkv * C + d.nope * C;  // [v, C]
      std::vector<float> ctx(static_cast<size_t>(C));
      for (int64_t j = 0; j < ng; ++j) {
        const float* pj = part.data() + part_at[size_t(j)];
        std::copy(pj + h * C, pj + (h + 1) * C, ctx.begin());
        for (int64_t ck = 1; ck < chunks[size_t(j)]; ++ck) {
          const float* pc = pj + (ck * H + h) * C;
          for (int64_t c = 0; c < C; c += 16)
            _mm512_storeu_ps(ctx.data() + c, _mm512_add_ps(_mm512_loadu_ps(ctx.data() + c),
                                                           _mm512_loadu_ps(pc + c)));
        }
        float* oh = gq[j].out + h * d.v;
        for (int64_t e = 0; e < d.v; ++e) oh[e] = dot_bf16(wuv + e * C, ctx.data(), C);
        if (round_out) round_inplace(oh, d.v);
      }
    });
  }
}

namespace {

// acc0 += Σ_{j0 ≤ j < n0} p0[j·ld] · V_j and, with p1, acc1 += Σ_{j0 ≤ j < n1} p1[j·ld] · V_j
// (n1 ≤ n0 + 1), V_j = vrow(j) of NV·16 floats; positions in increasing order, fp32 FMAs, the
// accumulators in registers for the range (NV ≤ 8 with p1, ≤ 16 without).
template <int NV, typename F>
void pv_range(const float* p0, const float* p1, int64_t ld, const F& vrow, int64_t j0, int64_t n0,
              int64_t n1, float* acc0, float* acc1) {
  static_assert(NV >= 1 && NV <= 16, "v in 16 … 256");
  __m512 a0[NV], a1[NV <= 8 ? NV : 1];
  for (int k = 0; k < NV; ++k) a0[k] = _mm512_loadu_ps(acc0 + 16 * k);
  if constexpr (NV <= 8) {
    if (p1) {
      for (int k = 0; k < NV; ++k) a1[k] = _mm512_loadu_ps(acc1 + 16 * k);
      int64_t j = j0;
      for (; j < n0; ++j) {
        const float* vs = vrow(j);
        const __m512 w0 = _mm512_set1_ps(p0[j * ld]), w1 = _mm512_set1_ps(p1[j * ld]);
        for (int k = 0; k < NV; ++k) {
          const __m512 vk = _mm512_loadu_ps(vs + 16 * k);
          a0[k] = _mm512_fmadd_ps(w0, vk, a0[k]);
          a1[k] = _mm512_fmadd_ps(w1, vk, a1[k]);
        }
      }
      for (; j < n1; ++j) {
        const float* vs = vrow(j);
        const __m512 w1 = _mm512_set1_ps(p1[j * ld]);
        for (int k = 0; k < NV; ++k)
          a1[k] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(vs + 16 * k), a1[k]);
      }
      for (int k = 0; k < NV; ++k) {
        _mm512_storeu_ps(acc0 + 16 * k, a0[k]);
        _mm512_storeu_ps(acc1 + 16 * k, a1[k]);
      }
      return;
    }
  }
  STRATA_ASSERT(!p1);
  for (int64_t j = j0; j < n0; ++j) {
    const float* vs = vrow(j);
    const __m512 w0 = _mm512_set1_ps(p0[j * ld]);
    for (int k = 0; k < NV; ++k) a0[k] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(vs + 16 * k), a0[k]);
  }
  for (int k = 0; k < NV; ++k) _mm512_storeu_ps(acc0 + 16 * k, a0[k]);
}

template <typename F>
void pv_columns(int nv, const float* p0, const float* p1, int64_t ld, const F& vrow, int64_t j0,
                int64_t n0, int64_t n1, float* acc0, float* acc1) {
  switch (nv) {
#define STRATA_PV_CASE(N) \
  case N:                 \
    return pv_range<N>(p0, p1, ld, vrow, j0, n0, n1, acc0, acc1);
    STRATA_PV_CASE(1)
    STRATA_PV_CASE(2)
    STRATA_PV_CASE(3)
    STRATA_PV_CASE(4)
    STRATA_PV_CASE(5)
    STRATA_PV_CASE(6)
    STRATA_PV_CASE(7)
    STRATA_PV_CASE(8)
    STRATA_PV_CASE(9)
    STRATA_PV_CASE(10)
    STRATA_PV_CASE(11)
    STRATA_PV_CASE(12)
    STRATA_PV_CASE(13)
    STRATA_PV_CASE(14)
    STRATA_PV_CASE(15)
    STRATA_PV_CASE(16)
#undef STRATA_PV_CASE
  }
  STRATA_ASSERT(false);
}

}  // namespace

void mla_expanded_attention_avx512(const float* q, const float* cache, int64_t S, const float* kv,
                                   const ref::MlaDims& d, float* out, int64_t T, bool round_out) {
  const int64_t R = d.cache_dim(), Dq = d.q_dim(), Dkv = d.nope + d.v, C = d.kv_lora;
  STRATA_ASSERT(d.nope % 16 == 0 && d.rope % 16 == 0 && d.v % 16 == 0 && d.v <= 256 && T <= S);
  const float scale = d.scale();
  const int64_t base = S - T;
  // One task per head and block of Tb = 32 queries. The block's queries are held transposed
  // (qT [Dq, 32]), so a key's scores for all 32 queries are two zmm of FMAs with the key's
  // elements broadcast — no horizontal sums — four keys at a time (8 independent chains). Scores
  // are kept transposed too (scT [positions, 32]: each key row read once per block, the block's
  // scores in L2); the softmax is the reference's (std::exp, double denominator) over each
  // query's column; P·V runs two queries at a time with their outputs in registers, each key's
  // value row loaded once for both. Scores past a query's causal end are computed and never read.
  constexpr int64_t Tb = 32;
  const int64_t blocks = (T + Tb - 1) / Tb;
  const int nv = int(d.v / 16);
  tbb::parallel_for(int64_t(0), d.H * blocks, [&](int64_t task) {
    const int64_t h = task % d.H, t0 = (task / d.H) * Tb, t1 = std::min(T, t0 + Tb);
    const int64_t nt = t1 - t0, nmax = base + t1;  // the block's last query sees 0 .. nmax − 1
    std::vector<float> qT(static_cast<size_t>(Dq * Tb), 0.0f), scT(static_cast<size_t>(nmax * Tb));
    for (int64_t t = 0; t < nt; ++t) {
      const float* qh = q + ((t0 + t) * d.H + h) * Dq;
      for (int64_t i = 0; i < Dq; ++i) qT[size_t(i * Tb + t)] = qh[i];
    }
    const __m512 vscale = _mm512_set1_ps(scale);
    // Scores: dims 0 .. nope − 1 against the expanded k_nope, nope .. Dq − 1 against the cached
    // rope key.
    auto key_part = [&](const float* k, int64_t i0, int64_t n, __m512& lo, __m512& hi) {
      for (int64_t i = 0; i < n; ++i) {
        const __m512 ki = _mm512_set1_ps(k[i]);
        lo = _mm512_fmadd_ps(_mm512_loadu_ps(qT.data() + (i0 + i) * Tb), ki, lo);
        hi = _mm512_fmadd_ps(_mm512_loadu_ps(qT.data() + (i0 + i) * Tb + 16), ki, hi);
      }
    };
    int64_t s = 0;
    for (; s + 4 <= nmax; s += 4) {
      __m512 lo[4], hi[4];
      for (int u = 0; u < 4; ++u) lo[u] = hi[u] = _mm512_setzero_ps();
      for (int64_t i = 0; i < d.nope; ++i) {
        const __m512 qa = _mm512_loadu_ps(qT.data() + i * Tb),
                     qb = _mm512_loadu_ps(qT.data() + i * Tb + 16);
        for (int u = 0; u < 4; ++u) {
          const __m512 ki = _mm512_set1_ps(kv[((s + u) * d.H + h) * Dkv + i]);
          lo[u] = _mm512_fmadd_ps(qa, ki, lo[u]);
          hi[u] = _mm512_fmadd_ps(qb, ki, hi[u]);
        }
      }
      for (int64_t i = 0; i < d.rope; ++i) {
        const int64_t qi = d.nope + i;
        const __m512 qa = _mm512_loadu_ps(qT.data() + qi * Tb),
                     qb = _mm512_loadu_ps(qT.data() + qi * Tb + 16);
        for (int u = 0; u < 4; ++u) {
          const __m512 ki = _mm512_set1_ps(cache[(s + u) * R + C + i]);
          lo[u] = _mm512_fmadd_ps(qa, ki, lo[u]);
          hi[u] = _mm512_fmadd_ps(qb, ki, hi[u]);
        }
      }
      for (int u = 0; u < 4; ++u) {
        _mm512_storeu_ps(scT.data() + (s + u) * Tb, _mm512_mul_ps(lo[u], vscale));
        _mm512_storeu_ps(scT.data() + (s + u) * Tb + 16, _mm512_mul_ps(hi[u], vscale));
      }
    }
    for (; s < nmax; ++s) {
      __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
      key_part(kv + (s * d.H + h) * Dkv, 0, d.nope, lo, hi);
      key_part(cache + s * R + C, d.nope, d.rope, lo, hi);
      _mm512_storeu_ps(scT.data() + s * Tb, _mm512_mul_ps(lo, vscale));
      _mm512_storeu_ps(scT.data() + s * Tb + 16, _mm512_mul_ps(hi, vscale));
    }
    // Softmax of each query's column over its n_t = base + t + 1 positions, the reference's steps
    // per element (max, e = std::exp(s − max), a double denominator summed in position order,
    // float(e / den)); positions every query sees (j < base + t0 + 1) are walked for all 32
    // columns at once, the block's triangle query by query.
    const int64_t nall = base + t0 + 1;
    alignas(64) float mx[Tb];
    alignas(64) double den[Tb];
    std::fill(den, den + Tb, 1.0);  // columns past the block's queries: divided, never read
    {
      __m512 m0 = _mm512_loadu_ps(scT.data()), m1 = _mm512_loadu_ps(scT.data() + 16);
      for (int64_t j = 1; j < nall; ++j) {
        m0 = _mm512_max_ps(m0, _mm512_loadu_ps(scT.data() + j * Tb));
        m1 = _mm512_max_ps(m1, _mm512_loadu_ps(scT.data() + j * Tb + 16));
      }
      _mm512_store_ps(mx, m0);
      _mm512_store_ps(mx + 16, m1);
    }
    for (int64_t t = 0; t < nt; ++t) {
      for (int64_t j = nall; j < base + t0 + t + 1; ++j)
        mx[t] = std::max(mx[t], scT[size_t(j * Tb + t)]);
      den[t] = 0.0;
    }
    for (int64_t j = 0; j < nall; ++j) {
      float* row = scT.data() + j * Tb;
      for (int64_t t = 0; t < nt; ++t) {
        row[t] = std::exp(row[t] - mx[t]);
        den[t] += row[t];
      }
    }
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t j = nall; j < base + t0 + t + 1; ++j) {
        float& e = scT[size_t(j * Tb + t)];
        e = std::exp(e - mx[t]);
        den[t] += e;
      }
    {
      __m512d d[4];
      for (int k = 0; k < 4; ++k) d[k] = _mm512_load_pd(den + 8 * k);
      for (int64_t j = 0; j < nall; ++j) {
        float* row = scT.data() + j * Tb;
        for (int k = 0; k < 4; ++k) {
          const __m512d e = _mm512_cvtps_pd(_mm256_loadu_ps(row + 8 * k));
          _mm256_storeu_ps(row + 8 * k, _mm512_cvtpd_ps(_mm512_div_pd(e, d[k])));
        }
      }
    }
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t j = nall; j < base + t0 + t + 1; ++j) {
        float& e = scT[size_t(j * Tb + t)];
        e = float(e / den[t]);
      }
    // P·V in tiles of 64 positions (their value rows stay in L1 while every query of the block
    // takes them, so each row is read from memory once per block), queries t and t + 1 together
    // (v ≤ 128), positions in increasing order per query; the block's accumulators in acc.
    const auto vrow = [&](int64_t j) { return kv + (j * d.H + h) * Dkv + d.nope; };
    std::vector<float> acc(static_cast<size_t>(nt * d.v), 0.0f);
    constexpr int64_t kTile = 64;
    for (int64_t j0 = 0; j0 < nmax; j0 += kTile) {
      const int64_t j1 = std::min(nmax, j0 + kTile);
      for (int64_t t = 0; t < nt;) {
        const int64_t n0 = std::min(j1, base + t0 + t + 1);  // query t's end in this tile
        const bool pair = t + 1 < nt && nv <= 8;
        const int64_t n1 = pair ? std::min(j1, n0 + 1) : n0;
        if (j0 < n1)
          pv_columns(nv, scT.data() + t, pair ? scT.data() + t + 1 : nullptr, Tb, vrow, j0,
                     std::max(j0, n0), n1, acc.data() + t * d.v,
                     pair ? acc.data() + (t + 1) * d.v : nullptr);
        t += pair ? 2 : 1;
      }
    }
    for (int64_t t = 0; t < nt; ++t) {
      float* oh = out + ((t0 + t) * d.H + h) * d.v;
      std::copy(acc.begin() + t * d.v, acc.begin() + (t + 1) * d.v, oh);
      if (round_out) round_inplace(oh, d.v);
    }
  });
}

// ------------------------------------------------------------------------------------------------
// Chunked KDA (the WY/UT form of ref::kda_chunked, same steps and names). Per head and chunk of
// n ≤ 64 rows, with Γ_r = exp(G_r) the cumulative decay from the chunk start:
//  1. L[r,j] = β_r Σ_d k_r k_j e^(G_r − G_j) (j < r), A[r,j] = Σ_d q_r k_j e^(G_r − G_j) (j ≤ r).
//     Pairs inside a block of 16 rows take the exponent of the difference directly; a pair with j
//     in an earlier block factors it at the block start b: e^(G_r − G_b)·e^(G_b − G_j), both
//     exponents ≤ 0 (G never increases), so nothing overflows, and each factor is computed once
//     per row (or per row and block) instead of once per pair: the pairs become dot products.
//  2. M = (I + L)^-1 Diag(β) by forward substitution, a row at a time over its 64 columns.
//  3.–6. W = M(Γ ⊙ K), U = MV, Ṽ = U − W Sᵀ, O = (Γ ⊙ Q)Sᵀ + A Ṽ, S ← Diag(Γ_last) S + …: row
//     times matrix products over the transposed state Sᵗ [K, V], kept for the whole call.
namespace {

struct ChunkBuffers {
  static constexpr int64_t C = 64;
  std::vector<float> G, qs, ak, aq, GQ, GK, cj, L, A, M, W, U, St, dec;
  ChunkBuffers(int64_t K, int64_t V)
      : G(size_t(C * K)),
        qs(size_t(C * K)),
        ak(size_t(C * K)),
        aq(size_t(C * K)),
        GQ(size_t(C * K)),
        GK(size_t(C * K)),
        cj(size_t(C * K)),
        L(size_t(C * C)),
        A(size_t(C * C)),
        M(size_t(C * C)),
        W(size_t(C * K)),
        U(size_t(C * V)),
        St(size_t(K * V)),
        dec(size_t(C * K)) {}
};

inline float dot_k(const float* a, const float* b, int KC) {
  __m512 s = _mm512_setzero_ps();
  for (int i = 0; i < KC; ++i)
    s = _mm512_fmadd_ps(_mm512_loadu_ps(a + 16 * i), _mm512_loadu_ps(b + 16 * i), s);
  return _mm512_reduce_add_ps(s);
}

// y[0 .. 16·NC) (+)= Σ_i c[i]·X[i, :] over i < m (rows of X with stride ldx).
inline void row_combo(const float* c, int64_t m, const float* X, int64_t ldx, float* y, int NC,
                      bool accumulate) {
  __m512 acc[8];
  for (int j = 0; j < NC; ++j)
    acc[j] = accumulate ? _mm512_loadu_ps(y + 16 * j) : _mm512_setzero_ps();
  for (int64_t i = 0; i < m; ++i) {
    const __m512 ci = _mm512_set1_ps(c[i]);
    const float* x = X + i * ldx;
    for (int j = 0; j < NC; ++j) acc[j] = _mm512_fmadd_ps(ci, _mm512_loadu_ps(x + 16 * j), acc[j]);
  }
  for (int j = 0; j < NC; ++j) _mm512_storeu_ps(y + 16 * j, acc[j]);
}

void kda_chunked_head(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, float* S, float* o, int64_t T, int64_t H, int64_t h,
                      int64_t K, int64_t V, float scale, ChunkBuffers& B) {
  constexpr int64_t C = ChunkBuffers::C;
  const int KC = int(K / 16), VC = int(V / 16);
  for (int64_t e = 0; e < V; ++e)
    for (int64_t d = 0; d < K; ++d) B.St[size_t(d * V + e)] = S[e * K + d];
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t t0 = 0; t0 < T; t0 += C) {
    const int64_t n = std::min(C, T - t0);
    auto kr = [&](int64_t r) { return k + ((t0 + r) * H + h) * K; };
    auto vr = [&](int64_t r) { return v + ((t0 + r) * H + h) * V; };
    auto br = [&](int64_t r) { return beta[(t0 + r) * H + h]; };
    // Cumulative decay, scaled q, Γ ⊙ q, Γ ⊙ k, and the block-start factors of step 1.
    for (int64_t r = 0; r < n; ++r) {
      const float* gr = g + ((t0 + r) * H + h) * K;
      const float* qr = q + ((t0 + r) * H + h) * K;
      const int64_t b = r / 16 * 16;
      for (int i = 0; i < KC; ++i) {
        const int64_t o16 = 16 * i;
        __m512 G = _mm512_loadu_ps(gr + o16);
        if (r > 0) G = _mm512_add_ps(G, _mm512_loadu_ps(&B.G[size_t((r - 1) * K + o16)]));
        _mm512_storeu_ps(&B.G[size_t(r * K + o16)], G);
        const __m512 qs = _mm512_mul_ps(_mm512_loadu_ps(qr + o16), vscale);
        const __m512 kk = _mm512_loadu_ps(kr(r) + o16);
        const __m512 gam = exp16(G);
        _mm512_storeu_ps(&B.qs[size_t(r * K + o16)], qs);
        _mm512_storeu_ps(&B.GQ[size_t(r * K + o16)], _mm512_mul_ps(qs, gam));
        _mm512_storeu_ps(&B.GK[size_t(r * K + o16)], _mm512_mul_ps(kk, gam));
        const __m512 eb = exp16(_mm512_sub_ps(G, _mm512_loadu_ps(&B.G[size_t(b * K + o16)])));
        _mm512_storeu_ps(&B.ak[size_t(r * K + o16)], _mm512_mul_ps(kk, eb));
        _mm512_storeu_ps(&B.aq[size_t(r * K + o16)], _mm512_mul_ps(qs, eb));
      }
    }
    // 1. L and A.
    for (int64_t b = 0; b < n; b += 16) {
      const int64_t bend = std::min(n, b + 16);
      for (int64_t r = b; r < bend; ++r) {
        const float* Gr = &B.G[size_t(r * K)];
        for (int64_t j = b; j <= r; ++j) {
          const float* Gj = &B.G[size_t(j * K)];
          const float* kj = kr(j);
          __m512 lk = _mm512_setzero_ps(), aq = _mm512_setzero_ps();
          for (int i = 0; i < KC; ++i) {
            const int64_t o16 = 16 * i;
            const __m512 kje = _mm512_mul_ps(
                _mm512_loadu_ps(kj + o16),
                exp16(_mm512_sub_ps(_mm512_loadu_ps(Gr + o16), _mm512_loadu_ps(Gj + o16))));
            lk = _mm512_fmadd_ps(_mm512_loadu_ps(kr(r) + o16), kje, lk);
            aq = _mm512_fmadd_ps(_mm512_loadu_ps(&B.qs[size_t(r * K + o16)]), kje, aq);
          }
          if (j < r) B.L[size_t(r * C + j)] = br(r) * _mm512_reduce_add_ps(lk);
          B.A[size_t(r * C + j)] = _mm512_reduce_add_ps(aq);
        }
      }
      if (b == 0) continue;
      for (int64_t j = 0; j < b; ++j)
        for (int i = 0; i < KC; ++i) {
          const int64_t o16 = 16 * i;
          const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(&B.G[size_t(b * K + o16)]),
                                               _mm512_loadu_ps(&B.G[size_t(j * K + o16)])));
          _mm512_storeu_ps(&B.cj[size_t(j * K + o16)],
                           _mm512_mul_ps(_mm512_loadu_ps(kr(j) + o16), e));
        }
      for (int64_t r = b; r < bend; ++r)
        for (int64_t j = 0; j < b; ++j) {
          const float* c = &B.cj[size_t(j * K)];
          B.L[size_t(r * C + j)] = br(r) * dot_k(&B.ak[size_t(r * K)], c, KC);
          B.A[size_t(r * C + j)] = dot_k(&B.aq[size_t(r * K)], c, KC);
        }
    }
    // 2. M = (I + L)^-1 Diag(β): row r = e_r − Σ_{i<r} L[r,i]·row i (rows zero past the diagonal).
    const int NC = int((n + 15) / 16);
    for (int64_t r = 0; r < n; ++r) {
      float* mr = &B.M[size_t(r * C)];
      for (int64_t j = 0; j < 16 * NC; ++j) mr[j] = 0.0f;
      __m512 acc[4];
      for (int j = 0; j < NC; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t i = 0; i < r; ++i) {
        const __m512 l = _mm512_set1_ps(B.L[size_t(r * C + i)]);
        for (int j = 0; j < NC; ++j)
          acc[j] = _mm512_fnmadd_ps(l, _mm512_loadu_ps(&B.M[size_t(i * C + 16 * j)]), acc[j]);
      }
      for (int j = 0; j < NC; ++j) _mm512_storeu_ps(mr + 16 * j, acc[j]);
      mr[r] = 1.0f;
      for (int64_t j = r + 1; j < 16 * NC; ++j) mr[j] = 0.0f;
    }
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j <= r; ++j) B.M[size_t(r * C + j)] *= br(j);
    // 3. W = M (Γ ⊙ K), U = M V;  4. Ṽ = U − W Sᵀ;  6. O = (Γ ⊙ Q) Sᵀ + A Ṽ.
    for (int64_t r = 0; r < n; ++r) {
      const float* mr = &B.M[size_t(r * C)];
      row_combo(mr, r + 1, B.GK.data(), K, &B.W[size_t(r * K)], KC, false);
      float* ur = &B.U[size_t(r * V)];
      __m512 acc[8];
      for (int j = 0; j < VC; ++j) acc[j] = _mm512_setzero_ps();
      for (int64_t i = 0; i <= r; ++i) {
        const __m512 c = _mm512_set1_ps(mr[i]);
        const float* x = vr(i);
        for (int j = 0; j < VC; ++j)
          acc[j] = _mm512_fmadd_ps(c, _mm512_loadu_ps(x + 16 * j), acc[j]);
      }
      const float* wr = &B.W[size_t(r * K)];
      for (int64_t d = 0; d < K; ++d) {
        const __m512 c = _mm512_set1_ps(wr[d]);
        const float* x = &B.St[size_t(d * V)];
        for (int j = 0; j < VC; ++j)
          acc[j] = _mm512_fnmadd_ps(c, _mm512_loadu_ps(x + 16 * j), acc[j]);
      }
      for (int j = 0; j < VC; ++j) _mm512_storeu_ps(ur + 16 * j, acc[j]);
    }
    for (int64_t r = 0; r < n; ++r) {
      float* orow = o + ((t0 + r) * H + h) * V;
      row_combo(&B.GQ[size_t(r * K)], K, B.St.data(), V, orow, VC, false);
      row_combo(&B.A[size_t(r * C)], r + 1, B.U.data(), V, orow, VC, true);
    }
    // 7. Sᵗ[d, :] ← exp(G_last[d])·Sᵗ[d, :] + Σ_r exp(G_last[d] − G_r[d])·k_r[d]·Ṽ[r, :].
    const float* Gl = &B.G[size_t((n - 1) * K)];
    for (int64_t r = 0; r < n; ++r)
      for (int i = 0; i < KC; ++i) {
        const int64_t o16 = 16 * i;
        const __m512 e = exp16(
            _mm512_sub_ps(_mm512_loadu_ps(Gl + o16), _mm512_loadu_ps(&B.G[size_t(r * K + o16)])));
        _mm512_storeu_ps(&B.dec[size_t(r * K + o16)],
                         _mm512_mul_ps(_mm512_loadu_ps(kr(r) + o16), e));
      }
    alignas(64) float gl[128];
    for (int i = 0; i < KC; ++i) _mm512_store_ps(gl + 16 * i, exp16(_mm512_loadu_ps(Gl + 16 * i)));
    for (int64_t d = 0; d < K; ++d) {
      float* sd = &B.St[size_t(d * V)];
      __m512 acc[8];
      const __m512 gd = _mm512_set1_ps(gl[d]);
      for (int j = 0; j < VC; ++j) acc[j] = _mm512_mul_ps(gd, _mm512_loadu_ps(sd + 16 * j));
      for (int64_t r = 0; r < n; ++r) {
        const __m512 c = _mm512_set1_ps(B.dec[size_t(r * K + d)]);
        const float* x = &B.U[size_t(r * V)];
        for (int j = 0; j < VC; ++j)
          acc[j] = _mm512_fmadd_ps(c, _mm512_loadu_ps(x + 16 * j), acc[j]);
      }
      for (int j = 0; j < VC; ++j) _mm512_storeu_ps(sd + 16 * j, acc[j]);
    }
  }
  for (int64_t e = 0; e < V; ++e)
    for (int64_t d = 0; d < K; ++d) S[e * K + d] = B.St[size_t(d * V + e)];
}

}  // namespace

void kda_chunked_avx512(const float* q, const float* k, const float* v, const float* g,
                        const float* beta, float* state, float* o, int64_t T, int64_t H, int64_t K,
                        int64_t V, float scale) {
  STRATA_ASSERT(K % 16 == 0 && V % 16 == 0 && K <= 128 && V <= 128);
  tbb::parallel_for(int64_t(0), H, [&](int64_t h) {
    const FlushSubnormals ftz;
    ChunkBuffers B(K, V);
    std::vector<float> local;
    float* S = state ? state + h * V * K : (local.assign(size_t(V * K), 0.0f), local.data());
    kda_chunked_head(q, k, v, g, beta, S, o, T, H, h, K, V, scale, B);
  });
}

}  // namespace strata::cpu::detail
