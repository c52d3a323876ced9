// Every ISA path of the layer-level CPU expert kernels (cpu/expert_kernels.h) against the scalar
// contract mode (cpu/expert_contract.h), bit for bit: K3's expert shape, odd shapes, many tokens
// per expert, scale codes over the whole E8M0 range and activation blocks over many binades,
// poisoned tokens. An ISA this CPU lacks is reported as "not supported" (a WARN), never a pass.
#include <catch2/catch.hpp>

#include <tbb/task_arena.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "cpu/expert_contract.h"
#include "cpu/expert_kernels.h"
#include "cpu/expert_kernels_impl.h"
#include "expert_test_util.h"
#include "skip.h"
#include "storage/error.h"

using strata::GluParams;
using strata::cpu::ExpertIsa;
using strata::cpu::ExpertTask;
namespace c = strata::contract;

namespace {

const ExpertIsa kIsas[] = {ExpertIsa::scalar, ExpertIsa::avx2, ExpertIsa::avx512, ExpertIsa::amx};

struct Layer {
  std::vector<strata::test::RandomExpert> experts;
  std::vector<std::vector<int>> rows;  // token rows per expert
  std::vector<float> x;                // [T, H]
  int T = 0, H = 0, I = 0;
};

Layer make_layer(int H, int I, int T, const std::vector<std::vector<int>>& rows, bool wide,
                 uint32_t seed, int s_lo = 118, int s_hi = 126) {
  Layer L;
  L.H = H;
  L.I = I;
  L.T = T;
  L.rows = rows;
  for (size_t e = 0; e < rows.size(); ++e)
    L.experts.push_back(wide ? strata::test::random_expert(H, I, seed + uint32_t(e), 0, 254)
                             : strata::test::random_expert(H, I, seed + uint32_t(e), s_lo, s_hi));
  L.x = strata::test::random_activations(T, H, seed * 7 + 1, wide);
  return L;
}

// Runs the layer with `isa` and compares every output bit with expert_ffn_contract.
void check_layer(const Layer& L, const GluParams& glu, ExpertIsa isa,
                 strata::cpu::CpuExpertWorkspace* ws = nullptr, int pass_tokens = -1,
                 bool few = true) {
  std::vector<std::vector<float>> y(L.experts.size());
  std::vector<ExpertTask> tasks;
  for (size_t e = 0; e < L.experts.size(); ++e) {
    y[e].assign(L.rows[e].size() * size_t(L.H), -1.0f);
    tasks.push_back({L.experts[e].view(), L.rows[e].data(), int(L.rows[e].size()), y[e].data()});
  }
  strata::cpu::CpuExpertOptions opt;
  opt.isa = isa;
  opt.workspace = ws;
  opt.amx_pass_tokens = pass_tokens;
  opt.few_token_kernel = few;
  strata::cpu::run_experts_cpu(tasks, L.x.data(), L.T, glu, opt);
  std::vector<float> want(size_t(L.H));
  size_t mismatches = 0, nan_rows = 0;
  for (size_t e = 0; e < L.experts.size(); ++e)
    for (size_t i = 0; i < L.rows[e].size(); ++i) {
      strata::cpu::expert_ffn_contract(
          L.experts[e].view(), L.x.data() + size_t(L.rows[e][i]) * size_t(L.H), want.data(), glu);
      nan_rows += std::isnan(want[0]) ? 1 : 0;
      for (int o = 0; o < L.H; ++o)
        if (std::bit_cast<uint32_t>(want[size_t(o)]) !=
            std::bit_cast<uint32_t>(y[e][i * size_t(L.H) + size_t(o)])) {
          if (mismatches < 5)
            UNSCOPED_INFO("expert " << e << " token " << L.rows[e][i] << " row " << o << ": want "
                                    << want[size_t(o)] << " got "
                                    << y[e][i * size_t(L.H) + size_t(o)]);
          ++mismatches;
        }
    }
  INFO("isa " << strata::cpu::isa_name(isa) << ", shape " << L.H << "->" << L.I << "->" << L.H
              << ", NaN rows " << nan_rows << ", few-token kernel " << few);
  CHECK(mismatches == 0);
}

bool supported_or_warn(ExpertIsa isa) {
  if (strata::cpu::isa_supported(isa)) return true;
  WARN("expert kernels: ISA " << strata::cpu::isa_name(isa) << " not supported on this CPU");
  return false;
}

// For cases that test one ISA's code only: skipped (never passed) on a CPU without it.
void skip_without(ExpertIsa isa) {
  if (!strata::cpu::isa_supported(isa))
    STRATA_SKIP("this CPU has no " << strata::cpu::isa_name(isa));
}

}  // namespace

TEST_CASE("expert kernels: K3 expert shape, every ISA, bit-identical to the contract", "[expert]") {
  // 3584 → 3072 → 3584; expert 0 gets one token (decode), expert 1 three (one repeated).
  const Layer L = make_layer(3584, 3072, 3, {{1}, {0, 2, 0}}, false, 21);
  for (ExpertIsa isa : kIsas)
    if (supported_or_warn(isa)) check_layer(L, GluParams{true, 4.0, 25.0}, isa);
}

TEST_CASE("expert kernels: 2 to 4 tokens per expert, few-token and register-tiled kernels",
          "[expert]") {
  // Batched decode: experts with 2, 3 and 4 tokens (and 1 beside them), K3's shape and odd widths
  // (a partial 16-block chunk, a partial 64-byte piece), narrow and full-range scale codes.
  struct Shape {
    int H, I;
  };
  const GluParams situ{true, 4.0, 25.0}, silu{false, 0, 0};
  for (Shape s : {Shape{3584, 3072}, Shape{160, 96}, Shape{1184, 608}, Shape{544, 1056}})
    for (bool wide : {false, true}) {
      const std::vector<std::vector<int>> rows = {{0, 1}, {2, 0, 3}, {1}, {3, 2, 1, 0}};
      const Layer L = make_layer(s.H, s.I, 4, rows, wide, uint32_t(s.H * 3 + s.I + wide));
      for (ExpertIsa isa : {ExpertIsa::avx512, ExpertIsa::amx})
        if (supported_or_warn(isa))
          for (bool few : {true, false}) check_layer(L, wide ? silu : situ, isa, nullptr, -1, few);
    }
}

TEST_CASE("expert kernels: odd shapes and token counts, every ISA", "[expert]") {
  struct Shape {
    int H, I;
  };
  const GluParams situ{true, 4.0, 25.0}, silu{false, 0, 0};
  for (Shape s : {Shape{32, 32}, Shape{160, 96}, Shape{1184, 608}, Shape{544, 1056}}) {
    std::vector<std::vector<int>> rows = {{0}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {}, {9, 3, 3, 0, 7}};
    const Layer L = make_layer(s.H, s.I, 10, rows, false, uint32_t(s.H + s.I));
    for (ExpertIsa isa : kIsas)
      if (supported_or_warn(isa)) {
        check_layer(L, situ, isa);
        check_layer(L, silu, isa);
      }
  }
}

TEST_CASE("expert kernels: scales over the whole E8M0 range, blocks over many binades",
          "[expert]") {
  // Scale codes 0..254 and activation blocks scaled by 2^−60 … 2^60 (plus zero and subnormal
  // blocks): block terms span ≈ 2^−280 … 2^240, some projections overflow fp32 (SiLU then
  // gives canonical NaN rows, which must match too).
  const GluParams situ{true, 4.0, 25.0}, silu{false, 0, 0};
  const Layer L = make_layer(1024, 512, 6, {{0, 1, 2}, {3, 4, 5, 0}}, true, 77);
  for (ExpertIsa isa : kIsas)
    if (supported_or_warn(isa)) {
      check_layer(L, situ, isa);
      check_layer(L, silu, isa);
    }
}

TEST_CASE("expert kernels: poisoned tokens give canonical NaN rows and spare the others",
          "[expert]") {
  Layer L = make_layer(256, 128, 4, {{0, 1, 2, 3}, {2}}, false, 5);
  L.x[size_t(2) * 256 + 77] = std::numeric_limits<float>::quiet_NaN();
  for (ExpertIsa isa : kIsas)
    if (supported_or_warn(isa)) check_layer(L, GluParams{true, 4.0, 25.0}, isa);
}

TEST_CASE("expert kernels: results do not depend on the thread count", "[expert]") {
  const Layer L = make_layer(512, 256, 8, {{0, 1, 2, 3, 4, 5, 6, 7}, {1}, {2, 5}}, false, 9);
  auto run = [&](int threads) {
    std::vector<float> y(size_t(11) * 512);
    std::vector<ExpertTask> tasks;
    size_t off = 0;
    for (size_t e = 0; e < L.experts.size(); ++e) {
      tasks.push_back(
          {L.experts[e].view(), L.rows[e].data(), int(L.rows[e].size()), y.data() + off});
      off += L.rows[e].size() * 512;
    }
    tbb::task_arena arena(threads);
    strata::cpu::CpuExpertOptions opt;
    opt.arena = &arena;
    strata::cpu::run_experts_cpu(tasks, L.x.data(), L.T, GluParams{}, opt);
    return y;
  };
  const auto y1 = run(1), y2 = run(2);
  CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0);
}

TEST_CASE("expert kernels: quantized activation layout matches the contract quantization",
          "[expert]") {
  const int T = 3, K = 608;  // 19 blocks: padded to 32
  auto x = strata::test::random_activations(T, K, 3, true);
  x[size_t(1) * K + 40] = std::numeric_limits<float>::infinity();    // token 1 poisoned
  x[size_t(2) * K + 600] = -std::numeric_limits<float>::infinity();  // token 2 too
  strata::cpu::QuantizedActivations xq;
  xq.quantize(x.data(), T, K);
  CHECK(xq.padded_blocks() == 32);
  for (int t = 0; t < T; ++t) {
    const auto ref = strata::cpu::quantize_activation(x.data() + size_t(t) * K, K);
    CHECK(xq.poisoned(t) == ref.poisoned);
    for (int b = 0; b < xq.padded_blocks(); ++b) {
      int32_t sum = 0;
      for (int i = 0; i < 32; ++i) {
        const int8_t got = xq.q(t)[(b / 4) * 128 + (i % 2) * 64 + (b % 4) * 16 + i / 2];
        const int8_t want = b < K / 32 ? ref.q[size_t(b) * 32 + size_t(i)] : 0;
        REQUIRE(got == want);
        sum += want;
      }
      REQUIRE(xq.exponents(t)[b] == (b < K / 32 ? ref.e[size_t(b)] : 0));
      REQUIRE(xq.block_bias(t)[b] == 12 * sum);
    }
  }
}

TEST_CASE("expert kernels: ISA names and unsupported choices", "[expert]") {
  CHECK(strata::cpu::parse_isa("avx2") == ExpertIsa::avx2);
  CHECK(strata::cpu::parse_isa("auto") == ExpertIsa::automatic);
  CHECK_THROWS_AS(strata::cpu::parse_isa("sse9", "--isa"), strata::Error);
  CHECK(strata::cpu::isa_supported(strata::cpu::best_isa()));
  for (ExpertIsa isa : kIsas)
    if (!strata::cpu::isa_supported(isa))
      CHECK_THROWS_AS(strata::cpu::resolve_isa(isa), strata::Error);
}

TEST_CASE("expert kernels: vectorised GLU has the contract GLU's bits", "[expert]") {
  skip_without(ExpertIsa::avx512);
  // Random values over many binades plus the branch points of det_exp / det_expm1 / det_tanh and
  // the special values.
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> ex(-30, 12);
  std::normal_distribution<float> nd;
  std::vector<float> g, u;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const float special[] = {0.0f,    -0.0f,   inf,     -inf,    nan,     0.35f * 4, -0.35f * 4,
                           0.175f,  -0.175f, 80.0f,   -80.0f,  40.0f,   -40.0f,    709.7f,
                           -709.7f, 745.0f,  -745.0f, 1e-30f,  -1e-30f, 3e38f,     -3e38f,
                           250.0f,  -250.0f, 500.0f,  -500.0f, 87.5f,   -1490.0f,  1490.0f};
  for (float a : special)
    for (float b : special) g.push_back(a), u.push_back(b);
  for (int i = 0; i < 200000; ++i) {
    g.push_back(std::ldexp(nd(rng), ex(rng)));
    u.push_back(std::ldexp(nd(rng), ex(rng)));
  }
  std::vector<float> h(g.size());
  for (const GluParams& p :
       {GluParams{true, 4.0, 25.0}, GluParams{true, 4.0, 0.0}, GluParams{false, 0, 0}}) {
    strata::cpu::detail::glu_avx512(g.data(), u.data(), h.data(), int(g.size()), p);
    size_t bad = 0;
    for (size_t i = 0; i < g.size(); ++i)
      if (std::bit_cast<uint32_t>(h[i]) != std::bit_cast<uint32_t>(c::glu(g[i], u[i], p))) {
        if (bad++ < 5)
          UNSCOPED_INFO("g " << g[i] << " u " << u[i] << ": got " << h[i] << " want "
                             << c::glu(g[i], u[i], p));
      }
    CHECK(bad == 0);
  }
}

TEST_CASE("expert kernels: the any-order exactness bound", "[expert]") {
  using strata::cpu::detail::exact_span_limit;
  for (int nb : {1, 2, 3, 96, 112, 128, 1000, 4096}) {
    const int s = exact_span_limit(nb);
    REQUIRE(s >= 0);
    CHECK(double(nb) * c::kMaxBlockDot * std::ldexp(1.0, s) <= std::ldexp(1.0, 53));
    CHECK(double(nb) * c::kMaxBlockDot * std::ldexp(1.0, s + 1) > std::ldexp(1.0, 53));
  }
  CHECK(exact_span_limit(112) == 30);  // K = 3584
  CHECK(exact_span_limit(96) == 30);   // K = 3072
  // The lemma itself: block terms d·2^e with |d| ≤ kMaxBlockDot and exponents spanning exactly
  // the bound (nonzero terms) sum to the contract's bits in any order (here: shuffled
  // sequential sums and the fp64 FMA form the kernel uses), zero terms anywhere.
  std::mt19937 rng(4242);
  for (int nb : {7, 96, 112}) {
    const int s = exact_span_limit(nb);
    std::uniform_int_distribution<int> dd(-c::kMaxBlockDot, c::kMaxBlockDot), ee(0, s), z(0, 9);
    for (int trial = 0; trial < 2000; ++trial) {
      const int base = std::uniform_int_distribution<int>(-280, 200)(rng);
      std::vector<int32_t> d(static_cast<size_t>(nb));
      std::vector<int> ex(static_cast<size_t>(nb));
      for (int b = 0; b < nb; ++b) {
        // Extreme terms often: ±max dot at both ends of the span.
        d[size_t(b)] =
            z(rng) == 0 ? 0 : (z(rng) < 3 ? (z(rng) < 5 ? 1 : -1) * c::kMaxBlockDot : dd(rng));
        ex[size_t(b)] = base + (b == 0 ? 0 : b == 1 ? s : ee(rng));
      }
      double L[c::kLanes] = {};
      for (int b = 0; b < nb; ++b)
        c::lane_add(L, b, c::block_term(d[size_t(b)], ex[size_t(b)], 128));
      const float want = c::lane_finish(L);
      std::vector<int> order(static_cast<size_t>(nb));
      for (int b = 0; b < nb; ++b) order[size_t(b)] = b;
      std::shuffle(order.begin(), order.end(), rng);
      double acc = 0.0, acc_fma = 0.0;
      for (int b : order) {
        acc += double(d[size_t(b)]) * std::ldexp(1.0, ex[size_t(b)]);
        acc_fma = std::fma(double(d[size_t(b)]) * std::ldexp(1.0, ex[size_t(b)] - base),
                           std::ldexp(1.0, base), acc_fma);
      }
      REQUIRE(std::bit_cast<uint32_t>(float(acc)) == std::bit_cast<uint32_t>(want));
      REQUIRE(std::bit_cast<uint32_t>(float(acc_fma)) == std::bit_cast<uint32_t>(want));
    }
  }
}

TEST_CASE("expert kernels: many tokens per expert, register tiles and strict fallback",
          "[expert]") {
  using strata::cpu::detail::gemm_counts;
  const GluParams situ{true, 4.0, 25.0};
  // 21 tokens: register tiles of 8, 8 and 5; a 2-token expert; K3's widths.
  std::vector<int> all(21);
  for (int i = 0; i < 21; ++i) all[size_t(i)] = i;
  {
    const Layer L = make_layer(3584, 3072, 21, {all, {4, 17}}, false, 31);
    const auto before = gemm_counts();
    for (ExpertIsa isa : kIsas)
      if (supported_or_warn(isa)) check_layer(L, situ, isa);
    if (strata::cpu::isa_supported(ExpertIsa::avx512)) {
      const auto after = gemm_counts();
      CHECK(after.fast > before.fast);  // normal data: (almost) every pair in any order
    }
  }
  {
    // Scale codes spanning 24 binades per row, and every third token's blocks over 2^±60 (plus
    // zero and subnormal blocks): those tokens fail the span check and take the strict order,
    // the others pass (24 + a few ≤ 30). Some outputs of the wide tokens overflow.
    Layer L = make_layer(1184, 608, 21, {all, {0, 3, 6}}, false, 57, 106, 130);
    const auto wide = strata::test::random_activations(21, 1184, 99, true);
    for (int t = 0; t < 21; t += 3)
      std::copy(wide.begin() + t * 1184, wide.begin() + (t + 1) * 1184, L.x.begin() + t * 1184);
    const auto before = gemm_counts();
    for (ExpertIsa isa : kIsas)
      if (supported_or_warn(isa)) {
        check_layer(L, situ, isa);
        check_layer(L, GluParams{false, 0, 0}, isa);
      }
    if (strata::cpu::isa_supported(ExpertIsa::avx512)) {
      const auto after = gemm_counts();
      CHECK(after.fast > before.fast);
      CHECK(after.strict > before.strict);
    }
  }
}

namespace {

// One projection (w1 of `ex`: [I, H]) of n tokens through `kernel` against the scalar kernel, bit
// for bit; the tokens packed for AMX as the layer driver does.
void check_projection(const strata::test::RandomExpert& ex, const std::vector<float>& x, int n,
                      void (*kernel)(const strata::cpu::detail::ProjArgs&), int pass_groups = 0,
                      int r0 = 0, int r1 = -1) {
  namespace d = strata::cpu::detail;
  strata::cpu::QuantizedActivations xq;
  xq.quantize(x.data(), n, ex.H);
  std::vector<const int8_t*> q;
  std::vector<const int32_t*> e, bias, nbias;
  std::vector<const double*> px;
  std::vector<int> span;
  for (int t = 0; t < n; ++t) {
    REQUIRE(!xq.poisoned(t));
    q.push_back(xq.q(t));
    e.push_back(xq.exponents(t));
    bias.push_back(xq.block_bias(t));
    nbias.push_back(xq.neg_block_bias(t));
    px.push_back(xq.block_scale(t));
    span.push_back(xq.exponent_span(t));
  }
  std::vector<int8_t> tb;
  std::vector<double> tpx;
  d::amx_pack_tokens(q.data(), px.data(), n, xq.blocks(), tb, tpx);
  if (r1 < 0) r1 = ex.I;
  std::vector<float> got(size_t(n) * size_t(r1 - r0), -1.0f), want(got.size(), -2.0f);
  d::ProjArgs a;
  a.packed = ex.w1p.data();
  a.scale = ex.w1s.data();
  a.K = ex.H;
  a.nb = xq.blocks();
  a.nbp = xq.padded_blocks();
  a.r0 = r0;
  a.r1 = r1;
  a.amx_pass_groups = pass_groups;
  a.n = n;
  a.q = q.data();
  a.e = e.data();
  a.bias = bias.data();
  a.nbias = nbias.data();
  a.px = px.data();
  a.span = span.data();
  a.tb = tb.data();
  a.tpx = tpx.data();
  a.out_stride = r1 - r0;
  a.out = got.data();
  kernel(a);
  a.out = want.data();
  d::project_scalar(a);
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
      if (bad++ < 5) UNSCOPED_INFO("output " << i << ": got " << got[i] << " want " << want[i]);
    }
  INFO("shape " << ex.I << "x" << ex.H << ", rows " << r0 << ".." << r1 << ", " << n
                << " tokens, pass groups " << pass_groups);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("expert kernels: AMX kernel layouts and epilogue (tile ops emulated), and on AMX",
          "[expert]") {
  skip_without(ExpertIsa::avx512);
  using strata::cpu::detail::gemm_counts;
  const bool amx = strata::cpu::isa_supported(ExpertIsa::amx);
  for (int n : {8, 16, 21}) {
    // Normal data (all pairs in any order), K with a partial quad (nb = 37) and K3's width.
    for (int H : {1184, 3584}) {
      const auto ex = strata::test::random_expert(H, 64, uint32_t(H + n));
      const auto x = strata::test::random_activations(n, H, uint32_t(n), false);
      const auto before = gemm_counts();
      check_projection(ex, x, n, strata::cpu::detail::project_amx_emulated);
      CHECK(gemm_counts().fast > before.fast);
      if (amx) check_projection(ex, x, n, strata::cpu::detail::project_amx);
    }
    // Wide scale codes per row and every third token over 2^±60: both paths.
    const auto ex = strata::test::random_expert(1184, 96, 7, 106, 130);
    auto x = strata::test::random_activations(n, 1184, 5, false);
    const auto wide = strata::test::random_activations(n, 1184, 6, true);
    for (int t = 0; t < n; t += 3)
      std::copy(wide.begin() + t * 1184, wide.begin() + (t + 1) * 1184, x.begin() + t * 1184);
    const auto before = gemm_counts();
    check_projection(ex, x, n, strata::cpu::detail::project_amx_emulated);
    CHECK(gemm_counts().fast > before.fast);
    CHECK(gemm_counts().strict > before.strict);
    if (amx) check_projection(ex, x, n, strata::cpu::detail::project_amx);
    check_projection(ex, x, n, strata::cpu::detail::project_gemm_avx512);
  }
}

TEST_CASE(
    "expert kernels: AMX token passes over several row groups (tile ops emulated), and on AMX",
    "[expert]") {
  skip_without(ExpertIsa::avx512);
  using strata::cpu::detail::gemm_counts;
  namespace d = strata::cpu::detail;
  const bool amx = strata::cpu::isa_supported(ExpertIsa::amx);
  // 40 tokens at nb = 37 and 75 at K3's width (3 and 5 groups, the last partial) in passes of 1,
  // 2 or every group; rows 16 .. 88 of 96: one pass of 4 row
  // groups, then one of 0.5 (strict rows only).
  for (int n : {40, 75}) {
    const int H = n == 40 ? 1184 : 3584;
    const auto ex = strata::test::random_expert(H, 96, uint32_t(H + n));
    const auto x = strata::test::random_activations(n, H, uint32_t(n), false);
    for (int pg : {0, 1, 2}) {
      const auto before = gemm_counts();
      check_projection(ex, x, n, d::project_amx_emulated, pg, 0, -1);
      CHECK(gemm_counts().fast > before.fast);
      check_projection(ex, x, n, d::project_amx_emulated, pg, 16, 88);
      if (amx) {
        check_projection(ex, x, n, d::project_amx, pg, 0, -1);
        check_projection(ex, x, n, d::project_amx, pg, 16, 88);
      }
    }
  }
  // Wide scale codes and every third token over 2^±60: both paths inside passes.
  const int n = 40;
  const auto ex = strata::test::random_expert(1184, 128, 7, 106, 130);
  auto x = strata::test::random_activations(n, 1184, 5, false);
  const auto wide = strata::test::random_activations(n, 1184, 6, true);
  for (int t = 0; t < n; t += 3)
    std::copy(wide.begin() + t * 1184, wide.begin() + (t + 1) * 1184, x.begin() + t * 1184);
  for (int pg : {1, 2}) {
    const auto before = gemm_counts();
    check_projection(ex, x, n, d::project_amx_emulated, pg);
    CHECK(gemm_counts().fast > before.fast);
    CHECK(gemm_counts().strict > before.strict);
    if (amx) check_projection(ex, x, n, d::project_amx, pg);
  }
}

TEST_CASE("expert kernels: one workspace reused across layers of other shapes, same bits",
          "[expert]") {
  // Grows (more tokens, wider), shrinks (fewer experts and tokens: stale token sets, h and
  // packed tokens of the previous call must not leak in), and grows again, poisoned token
  // included; the AMX path with passes of 16 tokens where the CPU has AMX.
  strata::cpu::CpuExpertWorkspace ws;
  Layer a = make_layer(512, 256, 40, {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {}, {3, 3, 39}}, false, 31);
  std::vector<int> many(40);
  for (int i = 0; i < 40; ++i) many[size_t(i)] = 39 - i;
  Layer b = make_layer(544, 1056, 40, {{5}, many, many, {1, 2}}, false, 32);
  b.x[size_t(7) * 544 + 100] = std::numeric_limits<float>::infinity();
  Layer c = make_layer(160, 96, 3, {{2, 1}}, false, 33);
  const GluParams situ{true, 4.0, 25.0};
  for (ExpertIsa isa : {ExpertIsa::avx512, ExpertIsa::amx})
    if (supported_or_warn(isa))
      for (const Layer* L : {&a, &b, &c, &b, &a})
        check_layer(*L, situ, isa, &ws, isa == ExpertIsa::amx ? 16 : -1);
}
