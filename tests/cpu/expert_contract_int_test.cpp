// The integer form of the expert contract (storage/expert_contract_int.h, docs/numerics.md §3.2),
// emulated on the CPU exactly as the GPU's grouped GEMM path computes it (shifted byte tables,
// two activation planes, one scaling per output), against the scalar contract bit for bit: the
// primitives exhaustively, projections at the edges of the window (token spans 7 and 8, weight
// spans 3 and 4, zero blocks, poison, E8M0 codes 0..3 and 251..254, the int32 bound at K = 4096)
// and whole experts on random data. Runs without a GPU (CI).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/expert_contract.h"
#include "expert_test_util.h"
#include "storage/expert_contract_int.h"

namespace {

namespace c = strata::contract;
namespace is = strata::contract::intsum;
using strata::GluParams;
using strata::Mxfp4ExpertView;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// One MXFP4 matrix [rows, K] with chosen scale codes.
struct Matrix {
  int rows = 0, K = 0;
  std::vector<uint8_t> packed, scale;
};

Matrix random_matrix(int rows, int K, uint32_t seed, int s_lo, int s_hi) {
  Matrix m;
  m.rows = rows, m.K = K;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), sc(s_lo, s_hi);
  m.packed.resize(size_t(rows) * K / 2);
  m.scale.resize(size_t(rows) * K / 32);
  for (auto& b : m.packed) b = uint8_t(byte(rng));
  for (auto& s : m.scale) s = uint8_t(sc(rng));
  return m;
}

// A token whose block b has amax exactly 1.5 · 2^k_b (e_x = k_b − 6); k = INT32_MIN: a zero block.
std::vector<float> token_with_exponents(const std::vector<int>& k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(k.size() * 32);
  for (size_t b = 0; b < k.size(); ++b) {
    if (k[b] == INT32_MIN) continue;
    for (int i = 0; i < 32; ++i) x[b * 32 + size_t(i)] = float(std::ldexp(double(u(rng)), k[b]));
    x[b * 32 + size_t(rng() % 32)] = float(std::ldexp(rng() % 2 ? 1.5 : -1.5, k[b]));
  }
  return x;
}

struct Result {
  int fast = 0;
  int64_t max_abs_d = 0;
};

// Projects x through m both ways and requires the same bits; returns how many rows were fast.
Result check_projection(const Matrix& m, const std::vector<float>& x) {
  const strata::cpu::QuantizedVector xq = strata::cpu::quantize_activation(x.data(), m.K);
  std::vector<float> want(size_t(m.rows)), got(size_t(m.rows), 1.0f);
  strata::cpu::project_contract(m.packed.data(), m.scale.data(), m.rows, m.K, xq, want.data());
  Result r;
  r.fast = is::project_emulated(m.packed.data(), m.scale.data(), m.rows, m.K, xq.q.data(),
                                xq.e.data(), xq.poisoned, got.data(), &r.max_abs_d);
  int bad = 0, first = -1;
  for (int o = 0; o < m.rows; ++o)
    if (bits(got[size_t(o)]) != bits(want[size_t(o)])) bad++, first = first < 0 ? o : first;
  INFO("first mismatch row " << first << ": emulated " << (first >= 0 ? got[size_t(first)] : 0)
                             << " contract " << (first >= 0 ? want[size_t(first)] : 0));
  CHECK(bad == 0);
  CHECK(r.max_abs_d < (int64_t(1) << 31));
  return r;
}

// The whole expert through the emulated projections (numerics.md §4 with §3.2 per projection).
std::vector<float> ffn_emulated(const Mxfp4ExpertView& v, const float* x, const GluParams& glu,
                                int& fast_rows) {
  const int H = v.hidden, I = v.inter;
  const strata::cpu::QuantizedVector xq = strata::cpu::quantize_activation(x, H);
  const size_t ni = static_cast<size_t>(I), nh = static_cast<size_t>(H);
  std::vector<float> g(ni), u(ni), h(ni), y(nh);
  fast_rows += is::project_emulated(v.w1_packed, v.w1_scale, I, H, xq.q.data(), xq.e.data(),
                                    xq.poisoned, g.data());
  fast_rows += is::project_emulated(v.w3_packed, v.w3_scale, I, H, xq.q.data(), xq.e.data(),
                                    xq.poisoned, u.data());
  for (int i = 0; i < I; ++i) h[size_t(i)] = c::glu(g[size_t(i)], u[size_t(i)], glu);
  const strata::cpu::QuantizedVector hq = strata::cpu::quantize_activation(h.data(), I);
  fast_rows += is::project_emulated(v.w2_packed, v.w2_scale, H, I, hq.q.data(), hq.e.data(),
                                    hq.poisoned, y.data());
  return y;
}

}  // namespace

TEST_CASE("expert int contract: shifted E2M1 byte tables give w2 times 2^sw", "[cpu]") {
  for (int sw = 0; sw <= is::kMaxWeightShift; ++sw) {
    const is::ShiftedTables t = is::shifted_tables(sw);
    for (unsigned code = 0; code < 16; ++code) {
      INFO("sw " << sw << " code " << code);
      CHECK(is::shifted_weight(t, code) == c::e2m1_x2(code) * (1 << sw));
    }
  }
}

TEST_CASE("expert int contract: plane split is exact for every q and shift", "[cpu]") {
  int bad = 0;
  for (int sx = 0; sx <= is::kMaxActShift; ++sx)
    for (int q = -127; q <= 127; ++q) {
      int8_t hi, lo;
      is::split_plane(q, sx, hi, lo);
      bad += 128 * int(hi) + int(lo) != q * (1 << sx) || lo < 0;
    }
  CHECK(bad == 0);
}

TEST_CASE("expert int contract: token metadata ignores zero blocks and flags spans and poison",
          "[cpu]") {
  auto meta = [](const std::vector<int>& k) {
    std::vector<float> x = token_with_exponents(k, 5);
    const strata::cpu::QuantizedVector xq =
        strata::cpu::quantize_activation(x.data(), int(x.size()));
    is::TokenScan s;
    for (size_t b = 0; b < k.size(); ++b)
      is::token_scan_add(s, xq.e[b], is::block_nonzero(xq.q.data() + b * 32), false);
    return is::token_meta_finish(s);
  };
  const int Z = INT32_MIN;
  CHECK(meta({Z, Z, Z}).status == is::kTokenOk);
  CHECK(meta({Z, Z, Z}).e_min == 0);
  CHECK(meta({3, Z, 10, Z}).status == is::kTokenOk);  // span 7, zero blocks (e = 0) left out
  CHECK(meta({3, Z, 10, Z}).e_min == 3 - 6);
  CHECK(meta({3, Z, 11}).status == is::kTokenSpan);  // span 8
  CHECK(meta({-100, -93}).status == is::kTokenOk);
  is::TokenScan p;
  is::token_scan_add(p, 0, true, true);
  CHECK(is::token_meta_finish(p).status == is::kTokenPoisoned);
}

TEST_CASE("expert int contract: projections at the window edges are bit-identical", "[cpu]") {
  const int K = 3584, nb = K / 32, rows = 64;
  std::vector<int> k(static_cast<size_t>(nb));
  SECTION("token span 7 (integer method) and 8 (strict)") {
    const Matrix m = random_matrix(rows, K, 1, 120, 123);
    for (int b = 0; b < nb; ++b) k[size_t(b)] = -3 + b % 8;  // span 7
    Result r = check_projection(m, token_with_exponents(k, 11));
    CHECK(r.fast == rows);
    k[17] = 5;  // span 8
    r = check_projection(m, token_with_exponents(k, 12));
    CHECK(r.fast == 0);
  }
  SECTION("weight span 3 (integer method) and 4 (strict), per row") {
    Matrix m = random_matrix(rows, K, 2, 100, 103);
    for (int o = 0; o < rows; o += 3) m.scale[size_t(o) * nb + size_t(o % nb)] = 104;  // span 4
    for (int b = 0; b < nb; ++b) k[size_t(b)] = b % 3;
    const Result r = check_projection(m, token_with_exponents(k, 13));
    CHECK(r.fast == rows - (rows + 2) / 3);
  }
  SECTION("zero blocks around a span-7 token, and an all-zero token") {
    const Matrix m = random_matrix(rows, K, 3, 126, 129);
    for (int b = 0; b < nb; ++b) k[size_t(b)] = b % 5 == 0 ? INT32_MIN : (b % 2 ? -40 : -33);
    Result r = check_projection(m, token_with_exponents(k, 14));
    CHECK(r.fast == rows);
    r = check_projection(m, std::vector<float>(size_t(K), 0.0f));
    CHECK(r.fast == rows);
  }
  SECTION("poisoned token: the canonical NaN everywhere") {
    const Matrix m = random_matrix(rows, K, 4, 120, 123);
    for (int b = 0; b < nb; ++b) k[size_t(b)] = b % 4;
    std::vector<float> x = token_with_exponents(k, 15);
    x[100] = NAN;
    check_projection(m, x);
  }
  SECTION("extreme scale codes 0..3 and 251..254 with tiny and huge activations") {
    for (int s_lo : {0, 251})
      for (int kx : {-140, -100, 0, 60, 120}) {
        INFO("codes " << s_lo << ".." << s_lo + 3 << " activation exponent " << kx);
        const Matrix m = random_matrix(rows, K, uint32_t(5 + s_lo + kx), s_lo, s_lo + 3);
        for (int b = 0; b < nb; ++b) k[size_t(b)] = kx + (b * 7) % 8 - 7;
        const Result r = check_projection(m, token_with_exponents(k, uint32_t(16 + kx)));
        CHECK(r.fast == rows);
      }
  }
  SECTION("the int32 bound: K = 4096, every product at its largest") {
    const int K4 = 4096, nb4 = K4 / 32;
    Matrix m;
    m.rows = 2, m.K = K4;
    m.packed.assign(size_t(2) * K4 / 2, 0x77);  // code 7: +12
    m.scale.assign(size_t(2) * nb4, 203);
    m.scale[0] = 200;  // row 0: s_min 200, every other block sw = 3
    std::fill(m.packed.begin() + K4 / 2, m.packed.end(), 0xFF);  // row 1: code 15, −12
    m.scale[size_t(nb4)] = 200;
    // Block 0: amax 0.99, e_x = −7, q = −127; the others: amax 127.99, e_x = 0 (sx = 7), q = −127
    // (clamped), so a = −127 · 2^7 = −16,256 and hi = −127.
    std::vector<float> x(size_t(K4), -127.99f);
    for (int i = 0; i < 32; ++i) x[size_t(i)] = -0.99f;
    const Result r = check_projection(m, x);
    CHECK(r.fast == 2);
    // Near the worst case the header's bounds allow (4096 · 127 · 96 = 49.9 M): hi ≈ −127.
    CHECK(r.max_abs_d > 45000000);
  }
}

TEST_CASE("expert int contract: whole experts bit-identical to cpu::expert_ffn_contract", "[cpu]") {
  struct Shape {
    int H, I, s_lo, s_hi;
    GluParams glu;
  };
  GluParams situ, silu, situ_nob2;
  silu.situ = false;
  situ_nob2.beta2 = 0.0;
  // Scale windows of 4 codes (integer method for most rows) and 9 codes (strict for most rows).
  const Shape shapes[] = {{96, 160, 118, 121, silu},
                          {64, 2080, 120, 123, situ_nob2},
                          {4128, 96, 118, 121, situ},
                          {3584, 3072, 118, 121, situ},
                          {256, 192, 118, 126, situ}};
  for (const Shape& s : shapes) {
    DYNAMIC_SECTION("H=" << s.H << " I=" << s.I << " codes " << s.s_lo << ".." << s.s_hi) {
      const strata::test::RandomExpert e =
          strata::test::random_expert(s.H, s.I, uint32_t(s.H + s.I), s.s_lo, s.s_hi);
      const int T = s.H * s.I > 1000000 ? 2 : 6;
      std::vector<float> x = strata::test::random_activations(T, s.H, 77, false);
      if (T > 2) {
        // Token 1 spans many binades (strict path), token 2 is poisoned.
        std::vector<float> w = strata::test::random_activations(1, s.H, 78, true);
        std::copy(w.begin(), w.end(), x.begin() + s.H);
        x[size_t(2) * s.H + 3] = INFINITY;
      }
      int fast = 0, bad = 0;
      std::vector<float> want(size_t(s.H));
      for (int t = 0; t < T; ++t) {
        strata::cpu::expert_ffn_contract(e.view(), x.data() + size_t(t) * s.H, want.data(), s.glu);
        const std::vector<float> got =
            ffn_emulated(e.view(), x.data() + size_t(t) * s.H, s.glu, fast);
        for (int o = 0; o < s.H; ++o) bad += bits(got[size_t(o)]) != bits(want[size_t(o)]);
      }
      CHECK(bad == 0);
      if (s.s_hi - s.s_lo <= is::kMaxWeightShift) CHECK(fast > 0);
    }
  }
}
