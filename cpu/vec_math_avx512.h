// 16-lane fp32 math for the AVX-512 kernels of the fast CPU backend (cpu/mixer_kernels_avx512.cpp,
// cpu/row_ops_avx512.cpp): exp, sigmoid, tanh, SiLU and bf16 rounding, and the flush of subnormals.
// Include only from files compiled with the AVX-512 flags (*_avx512.cpp). Accuracy: exp and sigmoid
// within 2 ulp of the std:: functions the reference ops use, tanh within 3 ulp; bf16 rounding
// bit-identical to strata::round_bf16 (round to nearest even, NaN kept quiet). Not for the expert
// contract (its deterministic functions live in storage/expert_contract.h).
#pragma once
#include <immintrin.h>

namespace strata::cpu::detail {

// Flush-to-zero and denormals-are-zero (MXCSR) on this thread while in scope, the caller's mode
// restored after. For kernels whose products of decays can underflow: a KDA chunk multiplies
// factors e^(G_r − G_j) and cumulative decays, which fall below 2^−126 when the gates are strong
// (the tests' gates, up to e^−5 per step, reach e^−160 within a chunk), and each subnormal operand
// or result costs a microcode assist on Intel cores: on the H200 machine's Xeon the chunked core
// ran 14.0 instead of 2.0 ms at T = 256, 8 heads, on bench hw's synthetic probe inputs. Flushing
// changes a result by less than 2^−126 per term, far below the ulp of the O(1) sums they join.
class FlushSubnormals {
 public:
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ | DAZ
  ~FlushSubnormals() { _mm_setcsr(saved_); }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  unsigned saved_;
};

// e^x: x = n·ln2 + r (Cody-Waite, |r| ≤ ln2/2), e^r by its degree-7 Taylor polynomial
// (truncation < 1e-8 relative), times 2^n by vscalefps. Clamped to [−104, 88.38] (0 and the
// largest float below e^88.72 at the ends); NaN stays NaN.
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.3762626647949f), x);  // min/max return x when x is NaN
  x = _mm512_max_ps(_mm512_set1_ps(-103.972077f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 1 / (1 + e^−x).
inline __m512 sigmoid16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

inline __m512 silu16(__m512 x) {
  return _mm512_mul_ps(x, sigmoid16(x));
}

// tanh: odd Taylor polynomial to x⁹ below |x| = 1/16 (truncation < 1e-12 relative), else
// sign(x)·(1 − t)/(1 + t) with t = e^−2|x| (no cancellation worse than 2 ulp from |x| ≥ 1/16).
inline __m512 tanh16(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 t = exp16(_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 big = _mm512_div_ps(_mm512_sub_ps(one, t), _mm512_add_ps(one, t));
  big = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_castps_si512(big),
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u)))));
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(62.0f / 2835);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.0f / 315));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, x2), x, x);
  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.0625f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(is_small, big, small);
}

// Round to the nearest bf16 value (ties to even), as strata::round_bf16: u += 0x7FFF + bit 16,
// low half cleared; NaN: the quiet bit set, low half cleared.
inline __m512 round_bf16_16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(int(0xFFFF0000u))));
}

}  // namespace strata::cpu::detail
