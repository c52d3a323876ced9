// Tests of the expert numerics contract primitives (storage/expert_contract.h, docs/numerics.md):
// each against an independent formulation (libm, std::frexp/ldexp/nearbyint) or a hand-derived
// value. Bit-exact wherever the contract defines bits.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "storage/expert_contract.h"
#include "storage/mxfp4.h"

namespace c = strata::contract;

namespace {
uint32_t bits(float f) {
  return std::bit_cast<uint32_t>(f);
}
uint64_t bits(double d) {
  return std::bit_cast<uint64_t>(d);
}
}  // namespace

TEST_CASE("contract: doubled E2M1 decode is twice the MXFP4 element value", "[contract]") {
  for (unsigned code = 0; code < 16; ++code) {
    const float twice = 2.0f * strata::mxfp4::kE2M1[code];
    CHECK(float(c::e2m1_x2(code)) == twice);
    CHECK(int(c::kE2M1x2[code]) == c::e2m1_x2(code));
  }
  // Low nibble = even column, high nibble = odd column.
  const uint8_t row[2] = {0x7A, 0xF1};  // byte 0: col 0 = code 0xA, col 1 = 0x7; byte 1: 0x1, 0xF
  CHECK(c::weight_x2(row, 0) == -2);    // code 0xA → −1.0 → doubled −2
  CHECK(c::weight_x2(row, 1) == 12);    // code 0x7 → 6.0
  CHECK(c::weight_x2(row, 2) == 1);     // code 0x1 → 0.5
  CHECK(c::weight_x2(row, 3) == -12);   // code 0xF → −6.0
}

TEST_CASE("contract: block exponent is frexp's exponent minus 7", "[contract]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any(1, 0x7F7FFFFFu);  // every positive finite float
  for (int i = 0; i < 200000; ++i) {
    const float a = std::bit_cast<float>(any(rng));
    int E = 0;
    std::frexp(a, &E);
    REQUIRE(c::block_exponent(a) == E - 7);
  }
  const float subnormals[] = {std::numeric_limits<float>::denorm_min(),
                              1e-40f,
                              5.8e-39f,
                              std::numeric_limits<float>::min(),
                              1.0f,
                              0.5f,
                              127.5f,
                              std::numeric_limits<float>::max()};
  for (float a : subnormals) {
    int E = 0;
    std::frexp(a, &E);
    CHECK(c::block_exponent(a) == E - 7);
  }
}

TEST_CASE("contract: activation block quantization (§2)", "[contract]") {
  float x[32];
  int8_t q[32];
  int e = 99;
  SECTION("zero block") {
    for (float& v : x) v = 0.0f;
    x[3] = -0.0f;
    CHECK(c::quantize_block(x, q, &e));
    CHECK(e == 0);
    for (int8_t v : q) CHECK(v == 0);
  }
  SECTION("Inf and NaN poison the block") {
    for (float bad :
         {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
          std::numeric_limits<float>::quiet_NaN()}) {
      for (int i = 0; i < 32; ++i) x[i] = float(i);
      x[17] = bad;
      CHECK_FALSE(c::quantize_block(x, q, &e));
      for (int8_t v : q) CHECK(v == 0);
    }
  }
  SECTION("ties to even and the 127.5 clamp") {
    for (float& v : x) v = 0.0f;
    x[0] = 127.5f;  // frexp: E = 7 → e_x = 0; 127.5 rounds to 128 and clamps to 127
    x[1] = 2.5f;
    x[2] = 3.5f;
    x[3] = -2.5f;
    x[4] = -127.5f;
    x[5] = 0.5f;
    x[6] = 1.5f;
    CHECK(c::quantize_block(x, q, &e));
    CHECK(e == 0);
    CHECK(q[0] == 127);
    CHECK(q[1] == 2);
    CHECK(q[2] == 4);
    CHECK(q[3] == -2);
    CHECK(q[4] == -127);
    CHECK(q[5] == 0);
    CHECK(q[6] == 2);
  }
  SECTION("random blocks against an fp64 libm formulation, exponents from subnormal to huge") {
    std::mt19937 rng(11);
    std::normal_distribution<float> nd;
    std::uniform_int_distribution<int> ex(-160, 120);
    for (int it = 0; it < 5000; ++it) {
      const int k = ex(rng);
      for (float& v : x) v = float(std::ldexp(double(nd(rng)), k));
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      bool ok = c::quantize_block(x, q, &e);
      REQUIRE(ok);
      if (amax == 0.0f) continue;
      int E;
      std::frexp(amax, &E);
      REQUIRE(e == E - 7);
      int qmax = 0;
      for (int i = 0; i < 32; ++i) {
        double want = std::nearbyint(std::ldexp(double(x[i]), -(E - 7)));
        want = std::min(127.0, std::max(-127.0, want));
        REQUIRE(int(q[i]) == int(want));
        qmax = std::max(qmax, std::abs(int(q[i])));
      }
      REQUIRE(qmax >= 64);  // amax ≥ 2^(E−1) = 64 · 2^e_x: the block uses 7 bits at least
    }
  }
}

TEST_CASE("contract: block terms are exact (§3)", "[contract]") {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> dd(-c::kMaxBlockDot, c::kMaxBlockDot), ex(-155, 121),
      sw(0, 254);
  for (int i = 0; i < 100000; ++i) {
    const int d = dd(rng), e = ex(rng), s = sw(rng);
    REQUIRE(bits(c::block_term(d, e, s)) == bits(std::ldexp(double(d), e + s - 128)));
  }
  CHECK(bits(c::block_term(0, -155, 0)) == bits(0.0));  // never −0
  CHECK(c::pow2(-1022) == std::ldexp(1.0, -1022));
  CHECK(c::pow2(1023) == std::ldexp(1.0, 1023));
}

TEST_CASE("contract: fixed lane-order reduction (§3)", "[contract]") {
  // Hand-derived: t_0 = 2^60, t_32 = 1, t_1 = −2^60. Lane 0 = 2^60 + 1 = 2^60 (rounded); lane 1 =
  // −2^60; the butterfly's last step adds them: 0. Sequential summation would give 1.
  int32_t d[33] = {};
  int ex[33] = {};
  uint8_t sw[33];
  for (auto& s : sw) s = 128;
  d[0] = 1;
  ex[0] = 60;
  d[1] = -1;
  ex[1] = 60;
  d[32] = 1;
  CHECK(c::reduce_row(d, ex, sw, 33) == 0.0f);
  CHECK(c::reduce_row(d, ex, sw, 32) == 0.0f);  // without t_32
  // Lanes 0 and 16 meet at the first butterfly step (off 16), before lanes 0 and 1 (off 1):
  // t_0 = 2^60, t_16 = 1, t_1 = −2^60, t_17 = 1 → (2^60 + 1) + (−2^60 + 1) = 2^60 − 2^60 = 0 with
  // the rounding at each step; grouping by adjacent lanes first would give 2.
  int32_t d2[18] = {};
  int ex2[18] = {};
  d2[0] = 1, ex2[0] = 60, d2[16] = 1, d2[1] = -1, ex2[1] = 60, d2[17] = 1;
  CHECK(c::reduce_row(d2, ex2, sw, 18) == 0.0f);
  // Rounding to fp32 is round-to-nearest-even of the fp64 lane sum.
  int32_t d3[1] = {(1 << 24) + 1};
  int ex3[1] = {0};
  CHECK(c::reduce_row(d3, ex3, sw, 1) == 16777216.0f);
}

TEST_CASE("contract: deterministic exp, tanh, sigmoid match libm to a few fp64 ulp", "[contract]") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> wide(-740.0, 709.0), mid(-30.0, 30.0), tiny(-1e-3, 1e-3);
  auto rel = [](double a, double b) {
    return b == 0 ? std::fabs(a) : std::fabs(a - b) / std::fabs(b);
  };
  double worst_exp = 0, worst_tanh = 0, worst_sig = 0;
  for (int i = 0; i < 100000; ++i) {
    const double x = (i % 3 == 0) ? wide(rng) : (i % 3 == 1 ? mid(rng) : tiny(rng));
    const double ex = c::det_exp(x), want = std::exp(x);
    if (want > 1e-300) worst_exp = std::max(worst_exp, rel(ex, want));  // normal range
    worst_tanh = std::max(worst_tanh, rel(c::det_tanh(x), std::tanh(x)));
    const double sg = 1.0 / (1.0 + std::exp(-x));
    if (sg > 1e-300) worst_sig = std::max(worst_sig, rel(c::det_sigmoid(x), sg));
  }
  // fp64 ulp is 2.2e-16; the budget (8 ulp) covers the polynomial and range reduction.
  CHECK(worst_exp < 2e-15);
  CHECK(worst_tanh < 2e-15);
  CHECK(worst_sig < 2e-15);
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(c::det_exp(0.0) == 1.0);
  CHECK(c::det_exp(800.0) == inf);
  CHECK(c::det_exp(-inf) == 0.0);
  CHECK(std::isnan(c::det_exp(std::nan(""))));
  CHECK(bits(c::det_tanh(0.0)) == bits(0.0));
  CHECK(bits(c::det_tanh(-0.0)) == bits(-0.0));
  CHECK(c::det_tanh(30.0) == 1.0);
  CHECK(c::det_tanh(-inf) == -1.0);
  CHECK(c::det_sigmoid(0.0) == 0.5);
  CHECK(c::det_sigmoid(inf) == 1.0);
  CHECK(c::det_sigmoid(-inf) == 0.0);
}

TEST_CASE("contract: GLU (§4.2) against libm within the fp32 output rounding", "[contract]") {
  const strata::GluParams situ{true, 4.0, 25.0}, situ_nob2{true, 4.0, 0.0}, silu{false, 0, 0};
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 6.0f);
  for (int i = 0; i < 20000; ++i) {
    const float g = nd(rng), u = nd(rng);
    const double gd = g, ud = u, sg = 1.0 / (1.0 + std::exp(-gd));
    const double want_situ = (4.0 * std::tanh(gd / 4.0) * sg) * (25.0 * std::tanh(ud / 25.0));
    const double want_nob2 = (4.0 * std::tanh(gd / 4.0) * sg) * ud;
    const double want_silu = (gd * sg) * ud;
    // One fp32 rounding of an fp64 value a few ulp off: at most one fp32 ulp apart.
    auto ulps = [](float a, float b) {
      return std::abs(int64_t(std::bit_cast<int32_t>(a)) - int64_t(std::bit_cast<int32_t>(b)));
    };
    REQUIRE(ulps(c::glu(g, u, situ), float(want_situ)) <= 1);
    REQUIRE(ulps(c::glu(g, u, situ_nob2), float(want_nob2)) <= 1);
    REQUIRE(ulps(c::glu(g, u, silu), float(want_silu)) <= 1);
  }
  // SiTU is bounded by β1·β2 even for infinite inputs; NaN comes out canonical.
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(c::glu(inf, inf, situ) == 100.0f);
  CHECK(bits(c::glu(std::nanf(""), 1.0f, situ)) == c::kNaNBits);
  CHECK(bits(c::glu(-std::nanf(""), 1.0f, silu)) == c::kNaNBits);
  CHECK(bits(c::glu(inf, 0.0f, silu)) == c::kNaNBits);  // Inf · 0
}
