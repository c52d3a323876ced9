// Tests of the fast bf16 linear layers (cpu/bf16_linear.h): the GEMV on every ISA this CPU runs and
// the oneDNN GEMM, at K3's real shapes and odd small ones, against a double-precision evaluation.
//
// Tolerances: inputs are bf16 values, so every product x·w is exact in fp32 (8 + 8 significant
// bits); only the fp32 summation order differs from the oracle's linear. Any order of K fp32
// additions satisfies |ŷ − y| ≤ γ_K·Σ_k|x_k w_k|, γ_K = K·u/(1 − K·u), u = 2^-24 (Higham, Accuracy
// and Stability §3.1); that is the bound asserted per element (and the oracle meets it too). With
// small integer inputs every partial sum is an integer below 2^24, so every order is exact: those
// cases must match bit for bit, which catches indexing and tail bugs the bound could hide.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "cpu/bf16_linear.h"
#include "cpu/ref/ops.h"
#include "skip.h"
#include "storage/bf16.h"
#include "storage/error.h"
#include "test_data.h"

namespace cpu = strata::cpu;
namespace ref = strata::cpu::ref;

namespace {

std::vector<cpu::GemvIsa> supported_isas() {
  std::vector<cpu::GemvIsa> v;
  for (auto i :
       {cpu::GemvIsa::scalar, cpu::GemvIsa::avx2, cpu::GemvIsa::avx512bf16, cpu::GemvIsa::amx})
    if (cpu::gemv_isa_supported(i)) v.push_back(i);
  return v;
}

// bf16-valued data: random signs, mantissas and exponents (magnitudes in [2^-3, 2^1)·s, s a power
// of two), four values per generator step (the K3 matrices hold up to 176 M values), or small
// integers in [−r, r].
std::vector<uint16_t> bf16_normals(size_t n, uint64_t seed, float s = 1.0f) {
  strata::test::Rng g{seed};
  const int e0 = 124 + std::ilogb(s);
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; i += 4) {
    uint64_t r = g.next();
    for (size_t j = i; j < std::min(n, i + 4); ++j, r >>= 16)
      v[j] = uint16_t((r & 0x8000) | uint64_t(e0 + int((r >> 8) & 3)) << 7 | (r & 0x7F));
  }
  return v;
}
std::vector<uint16_t> bf16_ints(size_t n, uint64_t seed, int r) {
  strata::test::Rng g{seed};
  std::vector<uint16_t> v(n);
  for (auto& b : v) b = strata::f32_to_bf16(float(int(g.next() % uint64_t(2 * r + 1)) - r));
  return v;
}
std::vector<float> widen(const std::vector<uint16_t>& b) {
  std::vector<float> f(b.size());
  for (size_t i = 0; i < b.size(); ++i) f[i] = strata::bf16_to_f32(b[i]);
  return f;
}

struct Exact {
  std::vector<double> y, abs;  // [T, N]: Σ x·w and Σ|x·w| in double
};
Exact exact_product(const std::vector<float>& x, int64_t T, const std::vector<uint16_t>& W,
                    int64_t N, int64_t K) {
  Exact e;
  e.y.assign(size_t(T * N), 0.0);
  e.abs.assign(size_t(T * N), 0.0);
  tbb::parallel_for(int64_t(0), N, [&](int64_t n) {
    const uint16_t* w = W.data() + n * K;
    for (int64_t t = 0; t < T; ++t) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(x[size_t(t * K + k)]) * double(strata::bf16_to_f32(w[k]));
        s += p;
        a += std::fabs(p);
      }
      e.y[size_t(t * N + n)] = s;
      e.abs[size_t(t * N + n)] = a;
    }
  });
  return e;
}

double gamma(int64_t K) {
  const double u = std::ldexp(1.0, -24);
  return double(K) * u / (1.0 - double(K) * u);
}

// Largest |y − exact| / (γ_K·Σ|x·w|) over all elements (≤ 1 passes), and the relative L2 error.
struct Err {
  double worst = 0, rel_l2 = 0;
  int64_t nan = 0;
};
Err compare(const float* y, int64_t ldy, const Exact& e, int64_t T, int64_t N, int64_t K) {
  Err r;
  double num = 0, den = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      const double v = y[t * ldy + n], ex = e.y[size_t(t * N + n)];
      if (std::isnan(v)) {
        ++r.nan;
        continue;
      }
      const double bound = gamma(K) * e.abs[size_t(t * N + n)] + 1e-30;
      r.worst = std::max(r.worst, std::fabs(v - ex) / bound);
      num += (v - ex) * (v - ex);
      den += ex * ex;
    }
  r.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return r;
}

// y with ldy = N + 3: the 3 padding columns hold NaN and must stay NaN (no write past N).
struct Out {
  int64_t T, N, ldy;
  std::vector<float> y;
  Out(int64_t T_, int64_t N_) : T(T_), N(N_), ldy(N_ + 3) {
    y.assign(size_t(T * ldy), std::numeric_limits<float>::quiet_NaN());
  }
  bool padding_untouched() const {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = N; j < ldy; ++j)
        if (!std::isnan(y[size_t(t * ldy + j)])) return false;
    return true;
  }
};

}  // namespace

TEST_CASE("bf16 linear: ISA names parse, and the best ISA is supported", "[bf16_linear]") {
  for (auto i : {cpu::GemvIsa::automatic, cpu::GemvIsa::scalar, cpu::GemvIsa::avx2,
                 cpu::GemvIsa::avx512bf16, cpu::GemvIsa::amx})
    CHECK(cpu::parse_gemv_isa(cpu::gemv_isa_name(i)) == i);
  CHECK_THROWS_AS(cpu::parse_gemv_isa("avx9"), strata::Error);
  CHECK(cpu::gemv_isa_supported(cpu::best_gemv_isa()));
  CHECK(cpu::resolve_gemv_isa(cpu::GemvIsa::automatic) == cpu::best_gemv_isa());
}

TEST_CASE("bf16 linear: to_bf16 rounds to nearest even like f32_to_bf16", "[bf16_linear]") {
  strata::test::Rng g{7};
  std::vector<float> x(1000);
  for (auto& v : x) v = g.normal() * 3.0f;
  x[3] = 1.0f + std::ldexp(1.0f, -8);             // a tie: rounds to even (1.0)
  x[4] = 1.0f + 3 * std::ldexp(1.0f, -8);         // a tie: rounds up to even
  x[5] = std::numeric_limits<float>::infinity();  // stays inf
  x[6] = -std::numeric_limits<float>::max();      // rounds to −inf
  std::vector<uint16_t> out(x.size());
  cpu::to_bf16(x.data(), out.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) CHECK(out[i] == strata::f32_to_bf16(x[i]));
}

TEST_CASE("bf16 GEMV: integer inputs give exact results at odd small shapes", "[bf16_linear]") {
  for (auto isa : supported_isas())
    for (int64_t K : {1, 2, 7, 31, 32, 33, 63, 65, 100, 129})
      for (int64_t N : {1, 3, 8, 9, 17})
        for (int64_t T : {1, 2, 3, 4, 5, 7, 8, 9, 13}) {
          const auto W = bf16_ints(size_t(N * K), uint64_t(K * 131 + N), 4);
          const auto x = widen(bf16_ints(size_t(T * K), uint64_t(K * 17 + T), 4));
          const Exact e = exact_product(x, T, W, N, K);
          Out o(T, N);
          cpu::gemv_bf16(x.data(), T, W.data(), N, K, K, o.y.data(), o.ldy, false, isa);
          INFO(cpu::gemv_isa_name(isa) << " T=" << T << " N=" << N << " K=" << K);
          bool exact = true;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; ++n)
              exact &= double(o.y[size_t(t * o.ldy + n)]) == e.y[size_t(t * N + n)];
          CHECK(exact);
          CHECK(o.padding_untouched());
        }
}

TEST_CASE("bf16 GEMV: weight row stride and fused output rounding", "[bf16_linear]") {
  const int64_t N = 37, K = 300, ldw = 320, T = 3;
  auto W = bf16_normals(size_t(N * ldw), 11);
  // The columns between K and ldw are NaN: reading them would poison the result.
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = K; k < ldw; ++k) W[size_t(n * ldw + k)] = 0x7FC0;
  const auto x = widen(bf16_normals(size_t(T * K), 12));
  for (auto isa : supported_isas()) {
    INFO(cpu::gemv_isa_name(isa));
    std::vector<float> y(size_t(T * N)), yr(size_t(T * N));
    cpu::gemv_bf16(x.data(), T, W.data(), N, K, ldw, y.data(), N, false, isa);
    cpu::gemv_bf16(x.data(), T, W.data(), N, K, ldw, yr.data(), N, true, isa);
    bool ok = true;
    for (size_t i = 0; i < y.size(); ++i)
      ok &= !std::isnan(y[i]) && yr[i] == strata::round_bf16(y[i]);
    CHECK(ok);
  }
}

TEST_CASE("bf16 GEMV and oneDNN GEMM at K3 shapes vs the exact product", "[bf16_linear]") {
  // (N, K): KDA q/k/v/g [96·128, 7168] and o_proj; MLA q_a, q_b (96 heads × 192), kv_a (512 + 64),
  // kv_b (96 × 256 rows of the 512 latent), o_proj; LatentMoE down/up (latent 3584); router (896
  // experts); shared experts (2 × 3072); the dense MLP's down projection K = 33792 (N cut to 512
  // rows: the kernels see K, and a full 33792 × 7168 matrix is 484 MB); lm_head rows at k3-mini's
  // width (the vocabulary 163840 × 1024: the many-row split).
  struct Shape {
    int64_t N, K;
  };
  const std::vector<Shape> shapes = {{12288, 7168}, {7168, 12288}, {1536, 7168}, {18432, 1536},
                                     {576, 7168},   {24576, 512},  {3584, 7168}, {7168, 3584},
                                     {896, 7168},   {6144, 7168},  {512, 33792}, {163840, 1024}};
  cpu::OnednnBf16Gemm gemm;
  for (const Shape& s : shapes) {
    const auto W = bf16_normals(size_t(s.N * s.K), uint64_t(s.N * 7 + s.K));
    for (int64_t T : {int64_t(1), int64_t(3), int64_t(16)}) {
      // Several tokens on the smaller matrices only: the double reference costs T·N·K.
      if ((T == 3 && s.N * s.K > 50'000'000) || (T == 16 && s.N * s.K > 15'000'000)) continue;
      const auto x = widen(bf16_normals(size_t(T * s.K), uint64_t(T * 5 + s.K), 0.5f));
      const Exact e = exact_product(x, T, W, s.N, s.K);
      INFO("N=" << s.N << " K=" << s.K << " T=" << T);
      for (auto isa : supported_isas()) {
        if (isa == cpu::GemvIsa::scalar && s.N * s.K > 20'000'000) continue;  // slow, same code
        Out o(T, s.N);
        cpu::gemv_bf16(x.data(), T, W.data(), s.N, s.K, s.K, o.y.data(), o.ldy, false, isa);
        const Err r = compare(o.y.data(), o.ldy, e, T, s.N, s.K);
        INFO("gemv " << cpu::gemv_isa_name(isa) << ": worst " << r.worst << " of the bound, rel L2 "
                     << r.rel_l2);
        CHECK(r.nan == 0);
        CHECK(r.worst <= 1.0);
        CHECK(o.padding_untouched());
      }
      Out o(T, s.N);
      gemm.run(x.data(), T, W.data(), s.N, s.K, s.K, o.y.data(), o.ldy, false);
      const Err r = compare(o.y.data(), o.ldy, e, T, s.N, s.K);
      INFO("oneDNN (" << gemm.impl_info(T, s.N, s.K) << "): worst " << r.worst
                      << " of the bound, rel L2 " << r.rel_l2);
      CHECK(r.nan == 0);
      CHECK(r.worst <= 1.0);
      CHECK(o.padding_untouched());
    }
  }
}

TEST_CASE("oneDNN bf16 GEMM: exact at odd shapes, cached primitives, concurrent callers",
          "[bf16_linear]") {
  cpu::OnednnBf16Gemm gemm;
  for (int64_t M : {1, 9, 33, 100})
    for (int64_t N : {1, 5, 64, 65, 200})
      for (int64_t K : {1, 3, 32, 100}) {
        const auto W = bf16_ints(size_t(N * K), uint64_t(N * 3 + K), 4);
        const auto x = widen(bf16_ints(size_t(M * K), uint64_t(M * 7 + K), 4));
        const Exact e = exact_product(x, M, W, N, K);
        Out o(M, N);
        gemm.run(x.data(), M, W.data(), N, K, K, o.y.data(), o.ldy, false);
        INFO("M=" << M << " N=" << N << " K=" << K);
        bool exact = true;
        for (int64_t t = 0; t < M; ++t)
          for (int64_t n = 0; n < N; ++n)
            exact &= double(o.y[size_t(t * o.ldy + n)]) == e.y[size_t(t * N + n)];
        CHECK(exact);
        CHECK(o.padding_untouched());
      }
  // A shape seen again creates nothing.
  const int64_t M = 48, N = 640, K = 256;
  const auto W = bf16_normals(size_t(N * K), 5);
  const auto x = widen(bf16_normals(size_t(M * K), 6));
  std::vector<float> y1(size_t(M * N)), y2(size_t(M * N)), y3(size_t(M * N));
  gemm.run(x.data(), M, W.data(), N, K, K, y1.data(), N, true);
  const size_t cached = gemm.cached_primitives();
  gemm.run(x.data(), M, W.data(), N, K, K, y2.data(), N, true);
  CHECK(gemm.cached_primitives() == cached);
  CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0);
  for (float v : y1) CHECK(v == strata::round_bf16(v));
  // Two threads at once on the same object (per-thread scratchpads): the same bits.
  std::thread th([&] { gemm.run(x.data(), M, W.data(), N, K, K, y3.data(), N, true); });
  gemm.run(x.data(), M, W.data(), N, K, K, y2.data(), N, true);
  th.join();
  CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0);
  CHECK(std::memcmp(y1.data(), y3.data(), y1.size() * 4) == 0);
}

TEST_CASE("Bf16Linear dispatches GEMV up to its threshold and oneDNN above", "[bf16_linear]") {
  const int64_t N = 300, K = 520;
  const auto W = bf16_normals(size_t(N * K), 21);
  const auto wv = ref::WeightView::bf16(W.data(), N, K);
  cpu::Bf16Linear lin(cpu::GemvIsa::automatic, 4);
  for (int64_t T : {1, 4, 5, 12}) {
    const auto x = widen(bf16_normals(size_t(T * K), uint64_t(40 + T)));
    const Exact e = exact_product(x, T, W, N, K);
    std::vector<float> y(size_t(T * N)), g(size_t(T * N));
    const size_t before = lin.gemm().cached_primitives();
    lin(x.data(), T, wv, y.data(), false);
    INFO("T=" << T);
    CHECK((lin.gemm().cached_primitives() > before) == (T > 4));  // oneDNN ran iff T > 4
    CHECK(compare(y.data(), N, e, T, N, K).worst <= 1.0);
    // The oracle's linear meets the same bound (the bound is the contract, not our kernels').
    ref::linear(x.data(), wv, g.data(), T);
    CHECK(compare(g.data(), N, e, T, N, K).worst <= 1.0);
  }
}

TEST_CASE("bf16 GEMV over several matrices of one x equals one call per matrix", "[bf16_linear]") {
  // Odd row counts (groups of 8 cut inside a task), mixed rounding, a tiny and a large matrix.
  const int64_t K = 1000;
  const std::vector<int64_t> Ns = {13, 1, 600, 8, 2049};
  std::vector<std::vector<uint16_t>> W;
  for (size_t i = 0; i < Ns.size(); ++i) W.push_back(bf16_normals(size_t(Ns[i] * K), 70 + i));
  for (int64_t T : {1, 3, 6}) {
    const auto x = widen(bf16_normals(size_t(T * K), uint64_t(80 + T)));
    for (auto isa : supported_isas()) {
      std::vector<std::vector<float>> y(Ns.size()), ref_y(Ns.size());
      std::vector<cpu::GemvOut> outs;
      for (size_t i = 0; i < Ns.size(); ++i) {
        y[i].assign(size_t(T * Ns[i]), std::numeric_limits<float>::quiet_NaN());
        ref_y[i].resize(y[i].size());
        const bool round = i % 2 == 0;
        outs.push_back({W[i].data(), Ns[i], y[i].data(), round});
        cpu::gemv_bf16(x.data(), T, W[i].data(), Ns[i], K, K, ref_y[i].data(), Ns[i], round, isa);
      }
      cpu::gemv_bf16_multi(x.data(), T, K, outs, isa);
      INFO(cpu::gemv_isa_name(isa) << " T=" << T);
      for (size_t i = 0; i < Ns.size(); ++i)
        CHECK(std::memcmp(y[i].data(), ref_y[i].data(), y[i].size() * 4) == 0);
    }
  }
  // Bf16Linear::multi above the GEMV threshold: one oneDNN call per matrix, same as alone.
  cpu::Bf16Linear lin(cpu::GemvIsa::automatic, 2);
  const int64_t T = 5;
  const auto x = widen(bf16_normals(size_t(T * K), 90));
  const auto w0 = ref::WeightView::bf16(W[2].data(), Ns[2], K);
  const auto w1 = ref::WeightView::bf16(W[4].data(), Ns[4], K);
  std::vector<float> a0(size_t(T * Ns[2])), a1(size_t(T * Ns[4])), b0(a0.size()), b1(a1.size());
  const cpu::Bf16Linear::Out outs[2] = {{&w0, a0.data(), true}, {&w1, a1.data(), false}};
  lin.multi(x.data(), T, K, outs);
  lin(x.data(), T, w0, b0.data(), true);
  lin(x.data(), T, w1, b1.data(), false);
  CHECK(a0 == b0);
  CHECK(a1 == b1);
}

TEST_CASE("bf16 GEMV: a token's outputs do not depend on the token groups of its call",
          "[bf16_linear]") {
  // Every (row, token) of the multi-token kernels accumulates the same vdpbf16ps sequence whether
  // the call holds 2, 4, 5 or 8 tokens (4 rows × up to 4 tokens, 2 rows × 5 to 8): a call of T
  // tokens equals, bit for bit, calls of 2 (and 3) tokens over the same rows. Odd N and K (a masked
  // tail).
  const int64_t N = 37, K = 1000;
  const auto W = bf16_normals(size_t(N * K), 101);
  for (auto isa : supported_isas()) {
    if (isa == cpu::GemvIsa::amx) continue;  // below: its groups of ≥ 5 tokens
    for (int64_t T : {4, 5, 6, 7, 8, 12}) {
      const auto x = widen(bf16_normals(size_t(T * K), uint64_t(110 + T)));
      std::vector<float> y(size_t(T * N)), pairs(size_t(T * N));
      cpu::gemv_bf16(x.data(), T, W.data(), N, K, K, y.data(), N, false, isa);
      for (int64_t t = 0; t < T;) {  // groups of 2, the last of 3 when T is odd
        const int64_t g = T - t == 3 ? 3 : 2;
        cpu::gemv_bf16(x.data() + t * K, g, W.data(), N, K, K, pairs.data() + t * N, N, false, isa);
        t += g;
      }
      INFO(cpu::gemv_isa_name(isa) << " T=" << T);
      CHECK(std::memcmp(y.data(), pairs.data(), y.size() * 4) == 0);
    }
  }
}

TEST_CASE("bf16 GEMV, AMX: a token's outputs do not depend on the other tokens of its call",
          "[bf16_linear]") {
  // The AMX kernel serves calls of 5 tokens or more: each output element of its 16 × 16 tile
  // depends only on its row of W and its token, in 32-column steps in increasing order — so a
  // call of T tokens equals calls of groups of ≥ 5 over the same rows, bit for bit, across the
  // 16-token tile boundary too. Fewer than 5 tokens take the AVX-512 kernel: equal to it. Odd N,
  // a K tail, a row stride.
  if (!cpu::gemv_isa_supported(cpu::GemvIsa::amx)) STRATA_SKIP("no AMX-BF16 here");
  const int64_t N = 45, K = 1000, ldw = 1016;
  const auto W = bf16_normals(size_t(N * ldw), 103);
  for (int64_t T : {1, 3, 4, 10, 16, 21, 37}) {
    const auto x = widen(bf16_normals(size_t(T * K), uint64_t(120 + T)));
    std::vector<float> y(size_t(T * N)), parts(size_t(T * N));
    cpu::gemv_bf16(x.data(), T, W.data(), N, K, ldw, y.data(), N, false, cpu::GemvIsa::amx);
    if (T < 5) {
      cpu::gemv_bf16(x.data(), T, W.data(), N, K, ldw, parts.data(), N, false,
                     cpu::GemvIsa::avx512bf16);
    } else {
      for (int64_t t = 0; t < T;) {  // groups of 5, the last of 5 to 9
        const int64_t g = T - t < 10 ? T - t : 5;
        cpu::gemv_bf16(x.data() + t * K, g, W.data(), N, K, ldw, parts.data() + t * N, N, false,
                       cpu::GemvIsa::amx);
        t += g;
      }
    }
    INFO("T=" << T);
    CHECK(std::memcmp(y.data(), parts.data(), y.size() * 4) == 0);
  }
}
