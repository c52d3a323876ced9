// MXFP4 codec against hand-computed vectors: E8M0 edge codes, E2M1 ties (to even), saturation,
// all-zero blocks, −0, tiny and huge scales, nibble order; and the golden k3-tiny experts decode
// to finite values.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "storage/checkpoint.h"
#include "storage/mxfp4.h"
#include "test_util.h"

using namespace strata;

namespace {
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

TEST_CASE("E8M0 decodes exactly, with the subnormal code 0 and NaN 0xFF", "[mxfp4]") {
  CHECK(mxfp4::e8m0_to_f32(127) == 1.0f);
  CHECK(mxfp4::e8m0_to_f32(128) == 2.0f);
  CHECK(mxfp4::e8m0_to_f32(120) == 1.0f / 128);
  CHECK(mxfp4::e8m0_to_f32(254) == std::ldexp(1.0f, 127));
  CHECK(mxfp4::e8m0_to_f32(1) == std::ldexp(1.0f, -126));
  CHECK(bits(mxfp4::e8m0_to_f32(0)) == 0x00400000u);  // 2^-127, subnormal
  CHECK(mxfp4::e8m0_to_f32(0) == std::ldexp(1.0f, -127));
  CHECK(std::isnan(mxfp4::e8m0_to_f32(0xFF)));
}

TEST_CASE("E2M1 encode: nearest, ties to even code, saturation, sign", "[mxfp4]") {
  struct Case {
    float v;
    uint8_t code;
  };
  const Case cases[] = {
      {0.0f, 0},   {0.25f, 0},                              // tie 0 | 0.5 → code 0 (even)
      {0.26f, 1},  {0.5f, 1},   {0.75f, 2},                 // tie 0.5 | 1 → code 2
      {1.0f, 2},   {1.25f, 2},                              // tie 1 | 1.5 → code 2
      {1.3f, 3},   {1.75f, 4},                              // tie 1.5 | 2 → code 4
      {2.5f, 4},                                            // tie 2 | 3 → code 4
      {2.6f, 5},   {3.5f, 6},                               // tie 3 | 4 → code 6
      {5.0f, 6},                                            // tie 4 | 6 → code 6
      {5.01f, 7},  {6.0f, 7},   {7.9f, 7},     {1e30f, 7},  // saturate to 6
      {-0.0f, 8},  {-0.1f, 8},                              // sign kept: −0
      {-1.5f, 11}, {-5.0f, 14}, {-100.0f, 15},
  };
  for (const Case& c : cases) {
    INFO("v = " << c.v);
    CHECK(int(mxfp4::e2m1_encode(c.v)) == int(c.code));
  }
  // One ulp either side of every midpoint goes to the nearer grid value.
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int i = 0; i < 7; ++i) {
    INFO("midpoint " << mids[i]);
    CHECK(int(mxfp4::e2m1_encode(std::nextafter(mids[i], 0.0f))) == i);
    CHECK(int(mxfp4::e2m1_encode(std::nextafter(mids[i], 8.0f))) == i + 1);
    CHECK(int(mxfp4::e2m1_encode(-std::nextafter(mids[i], 8.0f))) == 8 + i + 1);
  }
}

TEST_CASE("block scale follows the OCP floor rule and clamps to the E8M0 range", "[mxfp4]") {
  CHECK(mxfp4::block_scale_code(6.0f) == 127);  // floor(log2 6) = 2 → 2 − 2 + 127
  CHECK(mxfp4::block_scale_code(4.0f) == 127);
  CHECK(mxfp4::block_scale_code(7.99f) == 127);
  CHECK(mxfp4::block_scale_code(8.0f) == 128);
  CHECK(mxfp4::block_scale_code(0.75f) == 124);                 // floor(log2 .75) = −1
  CHECK(mxfp4::block_scale_code(0.0f) == 0);                    // all-zero block
  CHECK(mxfp4::block_scale_code(std::ldexp(1.0f, -130)) == 0);  // clamped at 2^-127
  CHECK(mxfp4::block_scale_code(3.4e38f) == 252);               // fp32 max: 127 − 2 + 127
}

TEST_CASE("quantize_row packs low nibble = even column, hand-computed block", "[mxfp4]") {
  std::vector<float> x(64, 0.0f);
  // Block 0: amax 7 → scale 127 (×1). 7 saturates to 6; 5 ties to 4.
  const float b0[6] = {6.0f, 3.0f, -1.5f, 0.5f, 7.0f, 5.0f};
  for (int i = 0; i < 6; ++i) x[i] = b0[i];
  // Block 1: the same values × 2^-10 → scale 117, same codes.
  for (int i = 0; i < 6; ++i) x[32 + i] = std::ldexp(b0[i], -10);
  std::vector<uint8_t> packed(32), scale(2);
  mxfp4::quantize_row(x.data(), 64, packed.data(), scale.data());
  CHECK(int(scale[0]) == 127);
  CHECK(int(scale[1]) == 117);
  for (int b = 0; b < 2; ++b) {
    CHECK(int(packed[16 * b + 0]) == 0x57);  // lo 6 → 7, hi 3 → 5
    CHECK(int(packed[16 * b + 1]) == 0x1B);  // lo −1.5 → 0xB, hi 0.5 → 1
    CHECK(int(packed[16 * b + 2]) == 0x67);  // lo 7 → 7 (sat), hi 5 → 6 (tie to even)
    for (int j = 3; j < 16; ++j) CHECK(int(packed[16 * b + j]) == 0);
  }
  std::vector<float> y(64);
  mxfp4::decode_row(packed.data(), scale.data(), 64, y.data());
  const float want[6] = {6.0f, 3.0f, -1.5f, 0.5f, 6.0f, 4.0f};
  for (int i = 0; i < 6; ++i) {
    CHECK(y[i] == want[i]);
    CHECK(y[32 + i] == std::ldexp(want[i], -10));
  }
}

TEST_CASE("all-zero, tiny, huge and −0 blocks", "[mxfp4]") {
  std::vector<float> x(32, 0.0f);
  std::vector<uint8_t> p(16), s(1);
  std::vector<float> y(32);
  SECTION("all zero → scale 0, codes 0, decodes to 0") {
    mxfp4::quantize_row(x.data(), 32, p.data(), s.data());
    CHECK(int(s[0]) == 0);
    for (uint8_t b : p) CHECK(int(b) == 0);
    mxfp4::decode_row(p.data(), s.data(), 32, y.data());
    for (float v : y) CHECK(v == 0.0f);
  }
  SECTION("−0 keeps its sign bit, decodes to −0") {
    x[1] = -0.0f;
    mxfp4::quantize_row(x.data(), 32, p.data(), s.data());
    CHECK(int(p[0]) == 0x80);
    mxfp4::decode_row(p.data(), s.data(), 32, y.data());
    CHECK(y[1] == 0.0f);
    CHECK(std::signbit(y[1]));
  }
  SECTION("tiny values below the E8M0 range flush to zero codes") {
    for (float& v : x) v = std::ldexp(1.0f, -140);
    mxfp4::quantize_row(x.data(), 32, p.data(), s.data());
    CHECK(int(s[0]) == 0);                   // clamped scale 2^-127
    for (uint8_t b : p) CHECK(int(b) == 0);  // 2^-13 of the scale rounds to 0
  }
  SECTION("smallest representable: 0.5 · 2^-127 is exact (subnormal)") {
    x[0] = std::ldexp(1.0f, -128);
    mxfp4::quantize_row(x.data(), 32, p.data(), s.data());
    CHECK(int(s[0]) == 0);  // floor(log2 2^-128) − 2 = −130 → clamped
    CHECK(int(p[0] & 0xF) == 1);
    mxfp4::decode_row(p.data(), s.data(), 32, y.data());
    CHECK(y[0] == std::ldexp(1.0f, -128));
  }
  SECTION("huge values: 6 · 2^120 round-trips") {
    x[0] = std::ldexp(6.0f, 120);
    x[2] = std::ldexp(-4.0f, 120);
    mxfp4::quantize_row(x.data(), 32, p.data(), s.data());
    CHECK(int(s[0]) == 247);
    mxfp4::decode_row(p.data(), s.data(), 32, y.data());
    CHECK(y[0] == x[0]);
    CHECK(y[2] == x[2]);
  }
  SECTION("codes ≥ 253 times |E2M1| ≥ 4 overflow to Inf by arithmetic") {
    p[0] = 0x07;
    s[0] = 253;  // 6 · 2^126 > fp32 max
    mxfp4::decode_row(p.data(), s.data(), 32, y.data());
    CHECK(std::isinf(y[0]));
  }
  SECTION("non-finite input is an error") {
    x[5] = INFINITY;
    CHECK_THROWS_WITH(mxfp4::quantize_row(x.data(), 32, p.data(), s.data()),
                      Catch::Contains("column 5 is not finite"));
  }
}

TEST_CASE("quantize ∘ dequantize is the identity on grid values, and the matrix layout",
          "[mxfp4]") {
  const int rows = 3, cols = 96;
  std::vector<float> x(rows * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const int code = (r * 7 + c * 5) % 16;
      const int e = (c / 32) * 3 - r;  // different scale per block and row
      x[r * cols + c] = std::ldexp(mxfp4::kE2M1[code], e);
    }
  // Make each block's max exactly 6·2^e so the floor rule picks scale e.
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < cols / 32; ++b) x[r * cols + b * 32 + 31] = std::ldexp(6.0f, b * 3 - r);
  std::vector<uint8_t> p(rows * cols / 2), s(rows * cols / 32);
  mxfp4::quantize(x.data(), rows, cols, p.data(), s.data());
  std::vector<float> y(rows * cols);
  mxfp4::dequantize(p.data(), s.data(), rows, cols, y.data());
  for (int i = 0; i < rows * cols; ++i) CHECK(y[i] == x[i]);
  CHECK(int(s[1 * 3 + 2]) == 127 + 2 * 3 - 1);  // row 1, block 2
}

TEST_CASE("find_nan_scale", "[mxfp4]") {
  std::vector<uint8_t> s(100, 127);
  CHECK(mxfp4::find_nan_scale(s.data(), 100) == -1);
  s[42] = 0xFF;
  CHECK(mxfp4::find_nan_scale(s.data(), 100) == 42);
}

TEST_CASE("golden k3-tiny experts decode to finite, varied values", "[mxfp4][golden]") {
  const auto dir = test::golden_dir() / "k3-tiny";
  test::need_shared(dir / "model.safetensors");
  Checkpoint ck(dir);
  const ModelConfig& c = ck.config();
  int checked = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    if (!ck.has_experts(l)) continue;
    for (int e = 0; e < c.moe.num_experts; ++e) {
      const ExpertTensors& x = ck.expert(l, e);
      for (const ExpertTensors::Proj* pr : {&x.w1, &x.w3, &x.w2}) {
        const int64_t rows = pr->weight->shape[0], cols = pr->weight->shape[1] * 2;
        std::vector<float> w(size_t(rows * cols));
        mxfp4::dequantize(ck.bytes(*pr->weight).data(), ck.bytes(*pr->scale).data(), rows, cols,
                          w.data());
        double sumsq = 0;
        int64_t nonfinite = 0;
        for (float v : w) {
          nonfinite += std::isfinite(v) ? 0 : 1;
          sumsq += double(v) * v;
        }
        INFO(pr->weight->name);
        CHECK(nonfinite == 0);
        CHECK(sumsq > 0);
        ++checked;
      }
    }
  }
  CHECK(checked == 8 * 16 * 3);
}
