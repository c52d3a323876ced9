// The expert numerics contract (docs/numerics.md, DESIGN decision 7): the primitives every
// routed-expert implementation builds on — the scalar contract mode (cpu/expert_contract.h), the
// AVX-512/AVX2/AMX kernels (cpu/) and the CUDA kernels (kernels/). Header-only; usable from C++ and
// from CUDA host and device code. Every floating-point operation here goes through dadd/dsub/dmul/
// ddiv, which are the `__d*_rn` intrinsics on the device (nvcc cannot contract them into FMAs) and
// plain operators on the host (where -ffp-contract=off is a global flag).
//
// What this is not: a kernel. The loops here are the definition (scalar, one element at a time);
// fast kernels reorganise the work but must produce the same bits, and are tested for it.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_XC __host__ __device__ __forceinline__
#else
#define STRATA_XC inline
#endif

namespace strata {

// One routed expert in the released MXFP4 layout (compressed-tensors `mxfp4-pack-quantized`),
// used where it lies (mmapped shard, host cache slot, GPU cache slot) — never copied.
// w1 = gate, w3 = up: logical [I, H] → packed [I, H/2], scale [I, H/32].
// w2 = down:          logical [H, I] → packed [H, I/2], scale [H, I/32].
// H and I are multiples of 32. Scale bytes are E8M0 codes 0..254 (255 is rejected at load).
struct Mxfp4ExpertView {
  const uint8_t *w1_packed = nullptr, *w1_scale = nullptr;
  const uint8_t *w3_packed = nullptr, *w3_scale = nullptr;
  const uint8_t *w2_packed = nullptr, *w2_scale = nullptr;
  int hidden = 0;  // H: input width of w1/w3, output width of w2
  int inter = 0;   // I: output width of w1/w3, input width of w2
};

// The GLU of the routed experts (docs/numerics.md §4.2).
// situ = true (K3): h = (β1·tanh(g/β1)·sigmoid(g)) · (β2·tanh(u/β2)); beta2 <= 0: the up factor
// is u itself. situ = false (Kimi-Linear SiLU): h = (g·sigmoid(g)) · u.
struct GluParams {
  bool situ = true;
  double beta1 = 4.0;   // activation_situ_beta
  double beta2 = 25.0;  // activation_situ_linear_beta; 0 = none
};

namespace contract {

inline constexpr int kBlock = 32;  // elements per quantization block (weights and activations)
inline constexpr int kLanes = 32;  // lanes of the fixed-order fp64 reduction (§3)
// Every NaN the contract produces is this one (a poisoned block, a NaN GLU output): NaN payloads
// differ between executors, so they are canonicalised.
inline constexpr uint32_t kNaNBits = 0x7FC00000u;
// |block dot| ≤ 32 · 127 · 12.
inline constexpr int kMaxBlockDot = 48768;

// Doubled E2M1 values by code (§1); code 8 (−0) decodes to 0. Host only (SIMD LUT kernels);
// device code uses e2m1_x2().
inline constexpr int8_t kE2M1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// ------------------------------------------------------------------------------------------------
// Rounding-exact fp64 arithmetic (device: intrinsics that are never contracted).

STRATA_XC double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
STRATA_XC double dsub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
STRATA_XC double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
STRATA_XC double ddiv(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

STRATA_XC float canonical_nan() {
  uint32_t u = kNaNBits;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
STRATA_XC bool is_nan(double v) {
  return !(v == v);
}
STRATA_XC bool is_finite_f(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return (u & 0x7F800000u) != 0x7F800000u;
}

// Exact 2^k for −1022 ≤ k ≤ 1023 (built from the exponent bits); k = 1024 gives +Inf.
STRATA_XC double pow2(int k) {
  uint64_t bits = uint64_t(int64_t(k) + 1023) << 52;
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

// Round to nearest, ties to even, for |v| < 2^51 (adding and subtracting 1.5·2^52).
STRATA_XC double rne(double v) {
  const double kMagic = 6755399441055744.0;  // 1.5 · 2^52
  return dsub(dadd(v, kMagic), kMagic);
}

// ------------------------------------------------------------------------------------------------
// §1 Weights

// Doubled E2M1 value of a 4-bit code: magnitudes {0,1,2,3,4,6,8,12} packed as nibbles.
STRATA_XC int e2m1_x2(unsigned code) {
  int m = int((0xC8643210u >> (4 * (code & 7u))) & 0xFu);
  return (code & 8u) ? -m : m;
}
// Doubled weight of column c of a packed row (low nibble = even column).
STRATA_XC int weight_x2(const uint8_t* packed_row, int c) {
  unsigned byte = packed_row[c >> 1];
  return e2m1_x2((c & 1) ? (byte >> 4) : (byte & 0xFu));
}

// ------------------------------------------------------------------------------------------------
// §2 Activations

// Block exponent e_x = E − 7 where frexp(amax) = m·2^E, m in [0.5, 1). amax finite and > 0
// (subnormals included), computed from the bits (no libm).
STRATA_XC int block_exponent(float amax) {
  uint32_t u;
  std::memcpy(&u, &amax, 4);
  u &= 0x7FFFFFFFu;
  int eb = int(u >> 23);
  int E;
  if (eb != 0) {
    E = eb - 126;
  } else {  // subnormal: amax = mant · 2^−149, mant in [1, 2^23)
    int nbits = 0;
    for (uint32_t m = u; m != 0; m >>= 1) ++nbits;
    E = nbits - 149;
  }
  return E - 7;
}

// q = clamp(rne(x · 2^−e_x), −127, 127), the scaling exact in fp64. x finite.
// e_x lies in [−155, 121], so 2^−e_x is a normal fp64 number and the product is exact.
STRATA_XC int quantize_value(float x, int e_x) {
  double v = rne(dmul(double(x), pow2(-e_x)));
  if (v > 127.0) v = 127.0;
  if (v < -127.0) v = -127.0;
  return int(v);
}

// Quantize one 32-element block (§2): q[0..31] and *e_x. Returns false if the block is poisoned
// (amax Inf or NaN); then q is all 0 and *e_x = 0. amax == 0 gives q = 0, e_x = 0.
STRATA_XC bool quantize_block(const float* x, int8_t* q, int* e_x) {
  float amax = 0.0f;
  bool poisoned = false;
  for (int i = 0; i < kBlock; ++i) {
    float a = x[i] < 0.0f ? -x[i] : x[i];
    if (!is_finite_f(x[i])) poisoned = true;
    if (a > amax) amax = a;
  }
  if (poisoned || amax == 0.0f) {
    for (int i = 0; i < kBlock; ++i) q[i] = 0;
    *e_x = 0;
    return !poisoned;
  }
  int e = block_exponent(amax);
  for (int i = 0; i < kBlock; ++i) q[i] = int8_t(quantize_value(x[i], e));
  *e_x = e;
  return true;
}

// ------------------------------------------------------------------------------------------------
// §3 One output element

// Exact block term t_b = d_b · 2^(e_x + s_w − 128). The exponent lies in [−283, 247].
STRATA_XC double block_term(int32_t d, int e_x, int s_w) {
  return dmul(double(d), pow2(e_x + s_w - 128));
}

// Adds block b's term to the lane accumulators (lane b mod 32; blocks must come in increasing b
// per lane). L must start as 32 × +0.0.
STRATA_XC void lane_add(double* L, int b, double t) {
  L[b & (kLanes - 1)] = dadd(L[b & (kLanes - 1)], t);
}

// The butterfly of §3: for off in 16, 8, 4, 2, 1: L_j = L_j + L_{j+off} (j < off). Returns
// (float) L_0. Destroys L.
STRATA_XC float lane_finish(double* L) {
  for (int off = kLanes / 2; off >= 1; off >>= 1)
    for (int j = 0; j < off; ++j) L[j] = dadd(L[j], L[j + off]);
  return float(L[0]);
}

// The whole of §3 for one output row: block dots d[nb], activation exponents e_x[nb], weight
// scale codes s_w[nb]. Reference form; kernels interleave the same steps.
STRATA_XC float reduce_row(const int32_t* d, const int* e_x, const uint8_t* s_w, int nb) {
  double L[kLanes];
  for (int j = 0; j < kLanes; ++j) L[j] = 0.0;
  for (int b = 0; b < nb; ++b) lane_add(L, b, block_term(d[b], e_x[b], s_w[b]));
  return lane_finish(L);
}

// ------------------------------------------------------------------------------------------------
// Deterministic elementary functions in fp64 (§4.2): range reduction + fixed polynomials, only
// +, −, ×, ÷. Relative error a few ulp of fp64 — far below the fp32 output rounding.

// Taylor coefficients of det_expm1_small in Horner order: c[0] = 1/17!, c[1] = 1/16!, …,
// c[16] = 1/1!. One table for every implementation of the contract (scalar, AVX-512, CUDA).
struct Expm1Taylor {
  double c[17];
};
STRATA_XC constexpr Expm1Taylor expm1_taylor() {
  return {{1.0 / 355687428096000.0, 1.0 / 20922789888000.0, 1.0 / 1307674368000.0,
           1.0 / 87178291200.0, 1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0,
           1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0,
           1.0 / 24.0, 1.0 / 6.0, 1.0 / 2.0, 1.0}};
}

// e^x − 1 for |x| ≤ 0.35: Taylor to degree 17 (truncation < 1e-22 relative), Horner.
STRATA_XC double det_expm1_small(double x) {
  const Expm1Taylor t = expm1_taylor();
  double p = t.c[0];
  for (int k = 1; k < 17; ++k) p = dadd(dmul(p, x), t.c[k]);
  return dmul(p, x);
}

// e^x. NaN → NaN, x > 709.79 → +Inf, x < −745.2 → +0.
STRATA_XC double det_exp(double x) {
  if (is_nan(x)) return x;
  if (x > 709.782712893384) return pow2(1024);  // exponent field 2047: +Inf
  if (x < -745.2) return 0.0;
  const double kLog2e = 1.4426950408889634;
  const double kLn2Hi = 6.93147180369123816490e-01;  // 32 significant bits: n·kLn2Hi is exact
  const double kLn2Lo = 1.90821492927058770002e-10;
  double n = rne(dmul(x, kLog2e));
  double r = dsub(dsub(x, dmul(n, kLn2Hi)), dmul(n, kLn2Lo));  // |r| ≤ 0.3466 + tiny
  double p = dadd(det_expm1_small(r), 1.0);
  int k = int(n);  // −1075 … 1024
  // Scale in two exact steps (2^k alone is out of range at both ends).
  int k1 = k / 2;
  return dmul(dmul(p, pow2(k1)), pow2(k - k1));
}

// e^x − 1 with full relative accuracy near 0.
STRATA_XC double det_expm1(double x) {
  if (x > -0.35 && x < 0.35) return det_expm1_small(x);
  return dsub(det_exp(x), 1.0);
}

// tanh(x) = −expm1(−2|x|) / (2 + expm1(−2|x|)), sign restored; |x| ≥ 20 → ±1 (tanh(20) rounds
// to 1 in fp64). NaN → NaN.
STRATA_XC double det_tanh(double x) {
  if (is_nan(x)) return x;
  double a = x < 0.0 ? -x : x;
  double t;
  if (a >= 20.0) {
    t = 1.0;
  } else {
    double e = det_expm1(dmul(-2.0, a));
    t = ddiv(-e, dadd(2.0, e));
  }
  return x < 0.0 ? -t : t;
}

// sigmoid(x) = 1 / (1 + e^−x). NaN → NaN; ±Inf → 1 / 0.
STRATA_XC double det_sigmoid(double x) {
  if (is_nan(x)) return x;
  return ddiv(1.0, dadd(1.0, det_exp(-x)));
}

// §4.2: the GLU of one element, from the fp32 projections g and u; result canonicalised if NaN.
// It is three independent transcendental parts and a product: glu_part(k, …) for k = 0, 1, 2
// and glu_combine — split so that a parallel implementation can evaluate the parts apart (the
// same operations, so the same bits).
STRATA_XC bool glu_has_part(int k, const GluParams& p) {
  return p.situ ? (k < 2 || p.beta2 > 0.0) : k == 1;
}
STRATA_XC double glu_part(int k, float g, float u, const GluParams& p) {
  const double gd = double(g), ud = double(u);
  if (k == 0) return det_tanh(ddiv(gd, p.beta1));
  if (k == 1) return det_sigmoid(gd);
  return det_tanh(ddiv(ud, p.beta2));
}
STRATA_XC float glu_combine(float g, float u, double r0, double r1, double r2, const GluParams& p) {
  const double gd = double(g), ud = double(u);
  double h;
  if (p.situ) {
    double a = dmul(dmul(p.beta1, r0), r1);
    double b = p.beta2 > 0.0 ? dmul(p.beta2, r2) : ud;
    h = dmul(a, b);
  } else {
    h = dmul(dmul(gd, r1), ud);
  }
  float hf = float(h);
  return is_nan(h) ? canonical_nan() : hf;
}
STRATA_XC float glu(float g, float u, const GluParams& p) {
  const double r0 = glu_has_part(0, p) ? glu_part(0, g, u, p) : 0.0;
  const double r1 = glu_part(1, g, u, p);
  const double r2 = glu_has_part(2, p) ? glu_part(2, g, u, p) : 0.0;
  return glu_combine(g, u, r0, r1, r2, p);
}

}  // namespace contract
}  // namespace strata
