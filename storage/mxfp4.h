// MXFP4 codec (OCP MX v1.0 E2M1 elements, E8M0 scales, blocks of 32) in the K3 release layout
// (compressed-tensors `mxfp4-pack-quantized`): packed[o, j] holds column 2j in the low nibble and
// 2j+1 in the high nibble; scale[o, b] is the E8M0 code of columns 32b..32b+31.
// Decode is exact: every value is E2M1 · 2^(s − 127) computed in fp32 (code 0 is the subnormal
// 2^−127; 0xFF is NaN; codes ≥ 253 times |E2M1| ≥ 4 overflow to ±Inf by arithmetic).
// Quantize (used by `strata synth` and tests) follows the OCP rule; decisions in mxfp4.cpp.
// Not here: the integer numerics of the expert kernels (storage/expert_contract.h).
#pragma once
#include <cstdint>

namespace strata::mxfp4 {

inline constexpr int kBlock = 32;  // elements per scale
inline constexpr uint8_t kScaleNaN = 0xFF;

// E2M1 code → value (bit 3 = sign; code 8 is −0).
inline constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(code − 127), exact (code 0 → 2^−127 subnormal, 1 → 2^−126); 0xFF → quiet NaN.
float e8m0_to_f32(uint8_t code);

// Decode one row of `cols` values (cols a multiple of 32): packed has cols/2 bytes, scale cols/32.
void decode_row(const uint8_t* packed, const uint8_t* scale, int64_t cols, float* out);
// Decode a [rows, cols] matrix: packed [rows, cols/2], scale [rows, cols/32] → out [rows, cols].
void dequantize(const uint8_t* packed, const uint8_t* scale, int64_t rows, int64_t cols,
                float* out);

// E2M1 code of v (already divided by the block scale): round to nearest, ties to even code,
// saturate to ±6, sign kept (−0 and negative values rounding to 0 give code 8). v must be finite.
uint8_t e2m1_encode(float v);
// E8M0 code of a block whose max |value| is amax: floor(log2 amax) − 2 + 127, clamped to 0..254;
// amax == 0 gives code 0 (decision: the smallest scale, all elements encode ±0).
uint8_t block_scale_code(float amax);

// Quantize one row / a matrix (the inverse layout of dequantize). Throws strata::Error if a value
// is not finite (MXFP4 cannot encode Inf/NaN). cols must be a multiple of 32.
void quantize_row(const float* in, int64_t cols, uint8_t* packed, uint8_t* scale);
void quantize(const float* in, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scale);

// Index of the first 0xFF (NaN) scale byte in [scale, scale + n), or −1.
int64_t find_nan_scale(const uint8_t* scale, int64_t n);

}  // namespace strata::mxfp4
