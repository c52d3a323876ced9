// AVX-512 row ops of cpu/row_ops.h. Elementwise ops run over chunks of 16 Ki elements, row ops over
// rows, in TBB tasks; each vector op follows the reference's formula (cpu/ref/ops.cpp) term for
// term, with the 16-lane exp / sigmoid / tanh of cpu/vec_math_avx512.h. Where the reference
// multiplies and adds separately (the AttnRes output sum, the norms' scalings) so does this code,
// so those results differ from the reference only through the fp64 sums of squares' order.
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

#include "cpu/row_ops.h"
#include "cpu/vec_math_avx512.h"
#include "storage/error.h"

namespace strata::cpu::detail {

namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}

// f(i0, i1) over [0, n) in chunks of 16 Ki elements (a multiple of 16).
template <class F>
void chunks(int64_t n, F&& f) {
  constexpr int64_t kChunk = 16 << 10;
  if (n <= kChunk) return f(int64_t(0), n);
  tbb::parallel_for(int64_t(0), (n + kChunk - 1) / kChunk,
                    [&](int64_t c) { f(c * kChunk, std::min(n, (c + 1) * kChunk)); });
}

template <class F>
void rows_parallel(int64_t rows, int64_t D, F&& f) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, D));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, grain),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t i = r.begin(); i < r.end(); ++i) f(i);
                    });
}

// Σ x² in fp64 (as the references' sum_sq), n a multiple of 16.
inline double sum_sq(const float* x, int64_t n) {
  __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    a = _mm512_fmadd_pd(lo, lo, a);
    b = _mm512_fmadd_pd(hi, hi, b);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(a, b));
}

}  // namespace

void glu_avx512(const ref::Glu& act, const float* g, const float* u, float* out, int64_t n) {
  const bool situ = act.kind == ref::GluKind::situ;
  const __m512 b1 = _mm512_set1_ps(act.beta1), b2 = _mm512_set1_ps(act.beta2);
  const bool cap = act.beta2 > 0.0f;
  chunks(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i += 16) {
      const __mmask16 m = tail_mask(i1 - i);
      const __m512 gi = _mm512_maskz_loadu_ps(m, g + i), ui = _mm512_maskz_loadu_ps(m, u + i);
      __m512 v;
      if (situ) {
        // (β1·tanh(g/β1))·σ(g) · (β2·tanh(u/β2) or u).
        const __m512 a =
            _mm512_mul_ps(_mm512_mul_ps(b1, tanh16(_mm512_div_ps(gi, b1))), sigmoid16(gi));
        const __m512 up = cap ? _mm512_mul_ps(b2, tanh16(_mm512_div_ps(ui, b2))) : ui;
        v = _mm512_mul_ps(a, up);
      } else {
        v = _mm512_mul_ps(silu16(gi), ui);
      }
      _mm512_mask_storeu_ps(out + i, m, round_bf16_16(v));
    }
  });
}

void add_round_avx512(float* a, const float* b, int64_t n) {
  chunks(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i += 16) {
      const __mmask16 m = tail_mask(i1 - i);
      const __m512 s =
          _mm512_add_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i));
      _mm512_mask_storeu_ps(a + i, m, round_bf16_16(s));
    }
  });
}

void round_bf16_avx512(float* x, int64_t n) {
  chunks(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i += 16) {
      const __mmask16 m = tail_mask(i1 - i);
      _mm512_mask_storeu_ps(x + i, m, round_bf16_16(_mm512_maskz_loadu_ps(m, x + i)));
    }
  });
}

void sigmoid_gate_avx512(float* o, const float* g, int64_t n) {
  chunks(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; i += 16) {
      const __mmask16 m = tail_mask(i1 - i);
      const __m512 s = round_bf16_16(sigmoid16(_mm512_maskz_loadu_ps(m, g + i)));
      _mm512_mask_storeu_ps(o + i, m,
                            round_bf16_16(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, o + i), s)));
    }
  });
}

void kimi_rms_norm_avx512(const float* x, const float* w, float* out, int64_t rows, int64_t D,
                          float eps) {
  rows_parallel(rows, D, [&](int64_t r) {
    const float* xr = x + r * D;
    float* o = out + r * D;
    const float ms = float(sum_sq(xr, D) / double(D));
    const __m512 rs = _mm512_set1_ps(1.0f / std::sqrt(ms + eps));
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 y = round_bf16_16(_mm512_mul_ps(_mm512_loadu_ps(xr + d), rs));
      _mm512_storeu_ps(o + d, round_bf16_16(_mm512_mul_ps(_mm512_loadu_ps(w + d), y)));
    }
  });
}

void l2_norm_avx512(const float* x, float* out, int64_t rows, int64_t D, float eps, bool round) {
  rows_parallel(rows, D, [&](int64_t r) {
    const float* xr = x + r * D;
    float* o = out + r * D;
    const __m512 rs = _mm512_set1_ps(1.0f / std::sqrt(float(sum_sq(xr, D)) + eps));
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 y = _mm512_mul_ps(_mm512_loadu_ps(xr + d), rs);
      _mm512_storeu_ps(o + d, round ? round_bf16_16(y) : y);
    }
  });
}

void gated_rms_norm_avx512(const float* o, const float* gate, const float* w, float* out,
                           int64_t rows, int64_t D, float eps) {
  rows_parallel(rows, D, [&](int64_t r) {
    const float* orow = o + r * D;
    const float* g = gate + r * D;
    float* y = out + r * D;
    const __m512 rs = _mm512_set1_ps(1.0f / std::sqrt(float(sum_sq(orow, D) / double(D)) + eps));
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 a =
          _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(orow + d), rs), _mm512_loadu_ps(w + d));
      _mm512_storeu_ps(y + d, round_bf16_16(_mm512_mul_ps(a, sigmoid16(_mm512_loadu_ps(g + d)))));
    }
  });
}

void short_conv_silu_avx512(const ConvSeq* seqs, int64_t n, const float* w, int64_t C, int64_t W) {
  STRATA_ASSERT(C % 16 == 0 && W >= 1 && W <= 8);
  const int64_t Wm = W - 1, blocks = C / 16;
  // One task per (sequence, 16 channels).
  tbb::parallel_for(int64_t(0), n * blocks, [&](int64_t task) {
    const ConvSeq& sq = seqs[task / blocks];
    const float* x = sq.x;
    float* state = sq.state;
    float* y = sq.y;
    const int64_t T = sq.T, c = (task % blocks) * 16;
    STRATA_ASSERT(x != y);
    // 16 channels at a time: taps and history gathered from their per-channel rows.
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512 wt[8], h[8];
    for (int64_t j = 0; j < W; ++j)
      wt[j] =
          _mm512_i32gather_ps(_mm512_add_epi32(_mm512_mullo_epi32(lane, _mm512_set1_epi32(int(W))),
                                               _mm512_set1_epi32(int(c * W + j))),
                              w, 4);
    for (int64_t j = 0; j < Wm; ++j)
      h[j] = state ? _mm512_i32gather_ps(
                         _mm512_add_epi32(_mm512_mullo_epi32(lane, _mm512_set1_epi32(int(Wm))),
                                          _mm512_set1_epi32(int(c * Wm + j))),
                         state, 4)
                   : _mm512_setzero_ps();
    for (int64_t t = 0; t < T; ++t) {
      const __m512 xt = _mm512_loadu_ps(x + t * C + c);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t j = 0; j < Wm; ++j) acc = _mm512_fmadd_ps(wt[j], h[j], acc);
      acc = _mm512_fmadd_ps(wt[Wm], xt, acc);
      _mm512_storeu_ps(y + t * C + c, round_bf16_16(silu16(acc)));
      for (int64_t j = 0; j + 1 < Wm; ++j) h[j] = h[j + 1];
      if (Wm > 0) h[Wm - 1] = xt;
    }
    if (state) {
      alignas(64) float buf[16];
      for (int64_t j = 0; j < Wm; ++j) {
        _mm512_store_ps(buf, h[j]);
        for (int i = 0; i < 16; ++i) state[(c + i) * Wm + j] = buf[i];
      }
    }
  });
}

void kda_gate_bounded_avx512(const ref::KdaGate& gate, const float* z, float* g, int64_t T,
                             int64_t H, int64_t K) {
  STRATA_ASSERT(gate.A_log != nullptr && gate.dt_bias != nullptr && K % 16 == 0);
  const __m512 lb = _mm512_set1_ps(gate.lower_bound);
  rows_parallel(T * H, K, [&](int64_t th) {
    const int64_t h = th % H;
    const __m512 a = _mm512_set1_ps(std::exp(gate.A_log[h]));
    const float* zr = z + th * K;
    const float* db = gate.dt_bias + h * K;
    float* gr = g + th * K;
    for (int64_t d = 0; d < K; d += 16) {
      const __m512 xv = _mm512_add_ps(_mm512_loadu_ps(zr + d), _mm512_loadu_ps(db + d));
      _mm512_storeu_ps(gr + d, _mm512_mul_ps(lb, sigmoid16(_mm512_mul_ps(a, xv))));
    }
  });
}

void attn_res_mix_avx512(const float* const* sources, int64_t n, const float* norm_w,
                         const float* proj_w, float* out, int64_t T, int64_t D, float eps) {
  STRATA_ASSERT(n >= 1 && n <= 64 && D % 16 == 0);
  std::vector<float> f(static_cast<size_t>(D));  // the folded pseudo-query norm_w·proj_w
  for (int64_t d = 0; d < D; ++d) f[size_t(d)] = norm_w[d] * proj_w[d];
  rows_parallel(T, n * D * 2, [&](int64_t t) {
    float logit[64], prob[64];
    for (int64_t i = 0; i < n; ++i) {
      const float* v = sources[i] + t * D;
      const __m512 rs = _mm512_set1_ps(1.0f / std::sqrt(float(sum_sq(v, D) / double(D)) + eps));
      __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
      for (int64_t d = 0; d < D; d += 16) {
        const __m512 p =
            _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(v + d), rs), _mm512_loadu_ps(f.data() + d));
        a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
        b = _mm512_add_pd(
            b, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1))));
      }
      logit[i] = float(_mm512_reduce_add_pd(_mm512_add_pd(a, b)));
    }
    const float mx = *std::max_element(logit, logit + n);
    double den = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      prob[i] = std::exp(logit[i] - mx);
      den += prob[i];
    }
    for (int64_t i = 0; i < n; ++i) prob[i] = float(prob[i] / den);
    float* o = out + t * D;
    for (int64_t d = 0; d < D; d += 16) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < n; ++i)
        acc = _mm512_add_ps(
            acc, _mm512_mul_ps(_mm512_set1_ps(prob[i]), _mm512_loadu_ps(sources[i] + t * D + d)));
      _mm512_storeu_ps(o + d, round_bf16_16(acc));
    }
  });
}

}  // namespace strata::cpu::detail
