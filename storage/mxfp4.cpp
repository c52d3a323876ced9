// MXFP4 codec. Decisions (spec/building-blocks.md §1.1, §1.7):
// - Decode follows OCP MX v1.0 exactly: E8M0 code 0 is 2^−127 (not 0, unlike Marlin/Triton), 0xFF
//   is NaN (the checkpoint loader rejects it before any kernel sees it).
// - Quantize follows the OCP rule, as the K3 golden model was quantised: shared exponent
//   floor(log2 amax) − 2, clamped to the E8M0 range; elements divided by the scale (exact: a power
//   of two, done in double) and rounded to nearest E2M1 with ties to the even code (true RNE, not
//   ggml's ties-toward-smaller), saturating at ±6 (so the block max may clip, by design of the
//   rule).
// - An all-zero block gets scale code 0 and zero codes (as ggml; any code would decode to 0).
// - Signs are kept: −0 and small negative values encode as code 8 (−0); decode maps it to −0.0f,
//   which equals 0 in every arithmetic use.
#include "storage/mxfp4.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "storage/error.h"

namespace strata::mxfp4 {

float e8m0_to_f32(uint8_t code) {
  if (code == kScaleNaN) return std::numeric_limits<float>::quiet_NaN();
  uint32_t bits;
  if (code == 0)
    bits = 0x00400000u;  // 2^−127: subnormal, mantissa MSB
  else
    bits = uint32_t(code) << 23;  // exponent field = code → 2^(code − 127)
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void decode_row(const uint8_t* packed, const uint8_t* scale, int64_t cols, float* out) {
  STRATA_ASSERT(cols % kBlock == 0);
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    const float s = e8m0_to_f32(scale[b]);
    const uint8_t* p = packed + b * (kBlock / 2);
    float* o = out + b * kBlock;
    for (int j = 0; j < kBlock / 2; ++j) {
      o[2 * j] = kE2M1[p[j] & 0xF] * s;
      o[2 * j + 1] = kE2M1[p[j] >> 4] * s;
    }
  }
}

void dequantize(const uint8_t* packed, const uint8_t* scale, int64_t rows, int64_t cols,
                float* out) {
  for (int64_t r = 0; r < rows; ++r)
    decode_row(packed + r * (cols / 2), scale + r * (cols / kBlock), cols, out + r * cols);
}

uint8_t e2m1_encode(float v) {
  const uint8_t sign = std::signbit(v) ? 8 : 0;
  const float a = std::fabs(v);
  // Magnitude grid 0, .5, 1, 1.5, 2, 3, 4, 6 (codes 0..7). Between two neighbours the midpoint
  // goes to the even code (RNE on the 1-bit mantissa): the code is the number of midpoints below
  // a, where a midpoint above an odd code (0.75, 1.75, 3.5) counts when a reaches it and one above
  // an even code (0.25, 1.25, 2.5, 5) only when a passes it. Above 5 (and beyond 6): code 7.
  // Branch-free, so --experts-quantize's billions of calls vectorize.
  const int c = int(a > 0.25f) + int(a >= 0.75f) + int(a > 1.25f) + int(a >= 1.75f) +
                int(a > 2.5f) + int(a >= 3.5f) + int(a > 5.0f);
  return uint8_t(sign | c);
}

uint8_t block_scale_code(float amax) {
  if (!(amax > 0.f)) return 0;  // all-zero block
  int e;
  std::frexp(amax, &e);          // amax = m · 2^e, m in [0.5, 1) → floor(log2 amax) = e − 1
  int code = (e - 1) - 2 + 127;  // OCP: shared_exp = floor(log2 amax) − emax_elem (2)
  if (code < 0) code = 0;
  if (code > 254) code = 254;
  return uint8_t(code);
}

void quantize_row(const float* in, int64_t cols, uint8_t* packed, uint8_t* scale) {
  STRATA_ASSERT(cols % kBlock == 0);
  for (int64_t b = 0; b < cols / kBlock; ++b) {
    const float* x = in + b * kBlock;
    float amax = 0.f;
    for (int i = 0; i < kBlock; ++i) {
      if (!std::isfinite(x[i]))
        throw Error("mxfp4 quantize: value " + std::to_string(x[i]) + " at column " +
                    std::to_string(b * kBlock + i) + " is not finite (MXFP4 has no Inf/NaN)");
      amax = std::fmax(amax, std::fabs(x[i]));
    }
    const uint8_t s = block_scale_code(amax);
    scale[b] = s;
    // x / 2^(s−127) = x · 2^(127−s): s ≤ 252 for finite amax, so the factor is a normal float
    // (2^−125 … 2^127) and the product is exact unless it is below 2^−126, where it encodes ±0
    // whatever its rounding.
    const float mul = std::ldexp(1.0f, 127 - int(s));
    uint8_t* p = packed + b * (kBlock / 2);
    for (int j = 0; j < kBlock / 2; ++j) {
      const uint8_t lo = e2m1_encode(x[2 * j] * mul);
      const uint8_t hi = e2m1_encode(x[2 * j + 1] * mul);
      p[j] = uint8_t(lo | (hi << 4));
    }
  }
}

void quantize(const float* in, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scale) {
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(in + r * cols, cols, packed + r * (cols / 2), scale + r * (cols / kBlock));
}

int64_t find_nan_scale(const uint8_t* scale, int64_t n) {
  const void* p = std::memchr(scale, kScaleNaN, size_t(n));
  return p ? static_cast<const uint8_t*>(p) - scale : -1;
}

}  // namespace strata::mxfp4
