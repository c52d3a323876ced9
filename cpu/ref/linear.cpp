// Reference linear y = x·Wᵀ over BF16 / F32 / MXFP4 weight views, fp32 accumulation.
//
// Summation order (fixed, the definition of this op's rounding): each y[t, n] is a dot product of
// x[t, :] and row n of W with 8 interleaved partial sums (lane j sums k ≡ j mod 8 over the leading
// multiple of 8, in increasing k), combined 4+4 → 2+2 → 1+1, plus the tail k ≥ 8·⌊K/8⌋ summed
// in order from 0, added last. Every path below (micro-kernels of any shape, the scalar tail
// routine) performs exactly these operations per output element, so the result does not depend
// on T, on how tokens are tiled, or on the number of threads — decode and prefill agree bit for
// bit.
//
// Speed (napkin): k3-mini decode is dominated by weight streaming (bf16 → fp32 widening + one
// multiply-add per weight per token); prefill by multiply-adds. Baseline x86-64 means SSE2
// (4 floats per vector): GCC vector extensions express 4-wide mul/add portably; no FMA (the
// build uses -ffp-contract=off) so products round before the add, as the scalar order does.
#include <emmintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu/ref/ops.h"
#include "storage/bf16.h"

namespace strata::cpu::ref {

namespace {

typedef float v4 __attribute__((vector_size(16)));

inline v4 load4(const float* p) {
  v4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Finish one output element from its two 4-lane accumulators (lanes 0–3 and 4–7) and the tail.
inline float finish(v4 lo, v4 hi, const float* x, const float* w, int64_t k0, int64_t K) {
  const v4 s4 = lo + hi;           // acc[j] += acc[j + 4]
  const float a0 = s4[0] + s4[2];  // acc[j] += acc[j + 2]
  const float a1 = s4[1] + s4[3];
  const float head = a0 + a1;  // acc[0] += acc[1]
  float tail = 0.0f;
  for (int64_t k = k0; k < K; ++k) tail += x[k] * w[k];
  return head + tail;
}

// R weight rows × C tokens, each element with its own 8-lane accumulator.
template <int R, int C>
void micro(const float* const* w, const float* const* x, int64_t K, float* const* y) {
  v4 lo[C][R], hi[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) lo[c][r] = hi[c][r] = v4{0.0f, 0.0f, 0.0f, 0.0f};
  const int64_t K8 = K / 8 * 8;
  for (int64_t k = 0; k < K8; k += 8) {
    v4 xl[C], xh[C];
    for (int c = 0; c < C; ++c) {
      xl[c] = load4(x[c] + k);
      xh[c] = load4(x[c] + k + 4);
    }
    for (int r = 0; r < R; ++r) {
      const v4 wl = load4(w[r] + k), wh = load4(w[r] + k + 4);
      for (int c = 0; c < C; ++c) {
        lo[c][r] += xl[c] * wl;
        hi[c][r] += xh[c] * wh;
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) y[c][r] = finish(lo[c][r], hi[c][r], x[c], w[r], K8, K);
}

// One token against R bf16 rows read directly (no widening buffer): the decode case, where each
// weight is used once. Same lanes, same operations, same bits as micro<R, 1> on widened rows.
template <int R>
void micro_bf16_t1(const uint16_t* const* w, const float* x, int64_t K, float* y) {
  v4 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = v4{0.0f, 0.0f, 0.0f, 0.0f};
  const __m128i zero = _mm_setzero_si128();
  const int64_t K8 = K / 8 * 8;
  for (int64_t k = 0; k < K8; k += 8) {
    const v4 xl = load4(x + k), xh = load4(x + k + 4);
    for (int r = 0; r < R; ++r) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[r] + k));
      const v4 wl = reinterpret_cast<v4>(_mm_castsi128_ps(_mm_unpacklo_epi16(zero, b)));
      const v4 wh = reinterpret_cast<v4>(_mm_castsi128_ps(_mm_unpackhi_epi16(zero, b)));
      lo[r] += xl * wl;
      hi[r] += xh * wh;
    }
  }
  for (int r = 0; r < R; ++r) {
    float tail = 0.0f;
    for (int64_t k = K8; k < K; ++k) tail += x[k] * bf16_to_f32(w[r][k]);
    const v4 s4 = lo[r] + hi[r];
    y[r] = ((s4[0] + s4[2]) + (s4[1] + s4[3])) + tail;
  }
}

// bf16 → fp32 for n values (exact: the bits shifted into the high half), SSE2.
void widen_bf16(const uint16_t* p, int64_t n, float* out) {
  int64_t i = 0;
  const __m128i zero = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_unpacklo_epi16(zero, v));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i + 4), _mm_unpackhi_epi16(zero, v));
  }
  for (; i < n; ++i) out[i] = bf16_to_f32(p[i]);
}

constexpr int64_t kTile = 8;  // weight rows widened together and reused for every token

// y[t, n0 .. n0+nn) for all t from the widened tile rows.
void tile_product(const float* const* rows, int64_t nn, const float* x, int64_t T, int64_t K,
                  float* y, int64_t N, int64_t n0) {
  int64_t t = 0;
  for (; t + 2 <= T; t += 2) {
    const float* xs[2] = {x + t * K, x + (t + 1) * K};
    int64_t i = 0;
    for (; i + 3 <= nn; i += 3) {
      float* ys[2] = {y + t * N + n0 + i, y + (t + 1) * N + n0 + i};
      micro<3, 2>(rows + i, xs, K, ys);
    }
    for (; i < nn; ++i) {
      float* ys[2] = {y + t * N + n0 + i, y + (t + 1) * N + n0 + i};
      micro<1, 2>(rows + i, xs, K, ys);
    }
  }
  for (; t < T; ++t) {
    const float* xs[1] = {x + t * K};
    int64_t i = 0;
    for (; i + 4 <= nn; i += 4) {
      float* ys[1] = {y + t * N + n0 + i};
      micro<4, 1>(rows + i, xs, K, ys);
    }
    for (; i < nn; ++i) {
      float* ys[1] = {y + t * N + n0 + i};
      micro<1, 1>(rows + i, xs, K, ys);
    }
  }
}

}  // namespace

void linear(const float* x, const WeightView& W, float* y, int64_t T) {
  const int64_t N = W.rows, K = W.cols;
  if (T == 0 || N == 0) return;
  const int64_t tiles = (N + kTile - 1) / kTile;
  if (T == 1 && W.format == WeightFormat::bf16) {
    // Decode: stream the bf16 rows straight into the multiply (each weight is used once).
    const uint16_t* base = static_cast<const uint16_t*>(W.data);
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, tiles),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        for (int64_t tile = r.begin(); tile < r.end(); ++tile) {
                          const int64_t n0 = tile * kTile, nn = std::min(kTile, N - n0);
                          const uint16_t* rows[kTile];
                          for (int64_t i = 0; i < nn; ++i) rows[i] = base + (n0 + i) * K;
                          int64_t i = 0;
                          for (; i + 4 <= nn; i += 4) micro_bf16_t1<4>(rows + i, x, K, y + n0 + i);
                          for (; i < nn; ++i) micro_bf16_t1<1>(rows + i, x, K, y + n0 + i);
                        }
                      });
    return;
  }
  // TBB splits over weight-row tiles only: each y element is computed whole by one thread.
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, tiles),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      std::vector<float> buf;
                      if (W.format != WeightFormat::f32) buf.resize(size_t(kTile * K));
                      for (int64_t tile = r.begin(); tile < r.end(); ++tile) {
                        const int64_t n0 = tile * kTile, nn = std::min(kTile, N - n0);
                        const float* rows[kTile];
                        for (int64_t i = 0; i < nn; ++i) {
                          switch (W.format) {
                            case WeightFormat::f32:
                              rows[i] = static_cast<const float*>(W.data) + (n0 + i) * K;
                              break;
                            case WeightFormat::bf16:
                              widen_bf16(static_cast<const uint16_t*>(W.data) + (n0 + i) * K, K,
                                         buf.data() + i * K);
                              rows[i] = buf.data() + i * K;
                              break;
                            case WeightFormat::mxfp4:
                              W.widen_row(n0 + i, buf.data() + i * K);
                              rows[i] = buf.data() + i * K;
                              break;
                          }
                        }
                        tile_product(rows, nn, x, T, K, y, N, n0);
                      }
                    });
}

}  // namespace strata::cpu::ref
