// The vectorised row ops (cpu/row_ops.h) against the reference ops in bf16 mode, at K3's widths
// (hidden 7168, KDA 96 heads × 128, dense intermediate 33792 cut to 4 rows, latent 3584) and odd
// small shapes (tails of 1–15 elements).
//
// Tolerance: both sides round to bf16 at the same points, from fp32 values that differ by a few
// ulp (vector exp/sigmoid/tanh within 3 ulp of std::, FMA, fp64 sums of squares in another
// order). Such a difference changes the rounded result only when the value lies within a few fp32
// ulp of a bf16 rounding boundary — then the two results are neighbouring bf16 values. So: every
// output is a bf16 value, every output is within one bf16 ulp of the reference (2^-7 relative to
// the larger magnitude), and at most 1% of the outputs differ at all (measured: at most 3 of
// 135168). Pure roundings (the residual add, round_bf16) must match bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/ref/ops.h"
#include "cpu/row_ops.h"
#include "skip.h"
#include "storage/bf16.h"
#include "test_data.h"

namespace cpu = strata::cpu;
namespace ref = strata::cpu::ref;
using ref::Precision;

namespace {

struct Agreement {
  size_t differ = 0, beyond_ulp = 0, not_bf16 = 0, n = 0;
};
Agreement agree(const std::vector<float>& fast, const std::vector<float>& r) {
  Agreement a;
  a.n = fast.size();
  for (size_t i = 0; i < fast.size(); ++i) {
    if (strata::round_bf16(fast[i]) != fast[i]) ++a.not_bf16;
    if (fast[i] == r[i]) continue;
    ++a.differ;
    const double m = std::max(std::fabs(double(fast[i])), std::fabs(double(r[i])));
    if (!(std::fabs(double(fast[i]) - double(r[i])) <= std::ldexp(m, -7))) ++a.beyond_ulp;
  }
  return a;
}
void check(const Agreement& a, const char* what) {
  INFO(what << ": " << a.differ << " of " << a.n << " differ, " << a.beyond_ulp
            << " by more than one bf16 ulp, " << a.not_bf16 << " not bf16");
  CHECK(a.not_bf16 == 0);
  CHECK(a.beyond_ulp == 0);
  CHECK(double(a.differ) <= 0.01 * double(a.n));
}
std::vector<float> bf(std::vector<float> x) {
  for (float& f : x) f = strata::round_bf16(f);
  return x;
}

}  // namespace

TEST_CASE("row ops: elementwise GLUs, gate, residual add, rounding", "[row_ops]") {
  if (!cpu::row_ops_avx512())
    STRATA_SKIP("no AVX-512 on this CPU (the fast calls are the reference ops)");
  for (int64_t n : {1, 15, 17, 100, 7168 * 3, 33792 * 4}) {
    INFO("n=" << n);
    const auto g = bf(strata::test::randn(size_t(n), uint32_t(n), 3.0f));
    const auto u = bf(strata::test::randn(size_t(n), uint32_t(n + 1), 3.0f));
    for (ref::Glu act : {ref::Glu{ref::GluKind::situ, 4.0f, 25.0f},
                         ref::Glu{ref::GluKind::situ, 4.0f, 0.0f}, ref::Glu{ref::GluKind::silu}}) {
      std::vector<float> r(static_cast<size_t>(n)), f(static_cast<size_t>(n));
      ref::glu(act, g.data(), u.data(), r.data(), n, Precision::bf16);
      cpu::glu_fast(act, g.data(), u.data(), f.data(), n);
      check(agree(f, r), act.kind == ref::GluKind::situ ? "SiTU-GLU" : "SwiGLU");
    }
    std::vector<float> o = bf(strata::test::randn(size_t(n), uint32_t(n + 2))), o2 = o;
    ref::sigmoid_gate_inplace(o.data(), g.data(), n, Precision::bf16);
    cpu::sigmoid_gate_fast(o2.data(), g.data(), n);
    check(agree(o2, o), "sigmoid gate");
    // Residual add and rounding: exact operations, the same bits.
    std::vector<float> a = g, a2 = g;
    for (int64_t i = 0; i < n; ++i) a[size_t(i)] = strata::round_bf16(a[size_t(i)] + u[size_t(i)]);
    cpu::add_round_fast(a2.data(), u.data(), n);
    CHECK(std::memcmp(a.data(), a2.data(), size_t(n) * 4) == 0);
    std::vector<float> x = strata::test::randn(size_t(n), uint32_t(n + 3)), x2 = x;
    if (n > 3) {
      x[0] = x2[0] = std::numeric_limits<float>::quiet_NaN();
      x[1] = x2[1] = std::numeric_limits<float>::infinity();
      x[2] = x2[2] = 1.0f + std::ldexp(1.0f, -8);  // a tie: to even
    }
    ref::round_bf16_inplace(x.data(), n);
    cpu::round_bf16_fast(x2.data(), n);
    CHECK(std::memcmp(x.data(), x2.data(), size_t(n) * 4) == 0);
  }
}

TEST_CASE("row ops: norms, the KDA conv and gate, the AttnRes mix", "[row_ops]") {
  if (!cpu::row_ops_avx512())
    STRATA_SKIP("no AVX-512 on this CPU (the fast calls are the reference ops)");
  for (int64_t D : {16, 48, 7168, 3584}) {
    const int64_t rows = D > 1000 ? 5 : 33;
    INFO("D=" << D);
    const auto x = bf(strata::test::randn(size_t(rows * D), uint32_t(D), 2.0f));
    const auto w = bf(strata::test::randn(size_t(D), uint32_t(D + 1), 0.5f));
    std::vector<float> r(x.size()), f(x.size());
    ref::kimi_rms_norm(x.data(), w.data(), r.data(), rows, D, 1e-5f, Precision::bf16);
    cpu::kimi_rms_norm_fast(x.data(), w.data(), f.data(), rows, D, 1e-5f);
    check(agree(f, r), "KimiRMSNorm");
    // AttnRes over 1 … 9 sources (K3: up to 8 banked blocks and the partial sum), out = P.
    for (int64_t n : {1, 3, 9}) {
      std::vector<std::vector<float>> src;
      std::vector<const float*> ptr;
      for (int64_t i = 0; i < n; ++i)
        src.push_back(bf(strata::test::randn(size_t(rows * D), uint32_t(D * 10 + i))));
      for (auto& s : src) ptr.push_back(s.data());
      const auto nw = strata::test::randn(size_t(D), 5), pw = strata::test::randn(size_t(D), 6);
      ref::attn_res_mix(ptr.data(), n, nw.data(), pw.data(), r.data(), rows, D, 1e-5f,
                        Precision::bf16);
      std::vector<float> p_last = src.back();  // in place on the partial sum, as the engine does
      ptr.back() = p_last.data();
      cpu::attn_res_mix_fast(ptr.data(), n, nw.data(), pw.data(), p_last.data(), rows, D, 1e-5f);
      check(agree(p_last, r), "AttnRes mix");
    }
  }
  // KDA at K3's shape: 96 heads × 128, T = 5 (and T = 1): L2 norms, gate, conv, gated norm.
  const int64_t T = 5, H = 96, K = 128, P = H * K, W = 4;
  const auto z = bf(strata::test::randn(size_t(T * P), 21));
  const auto A_log = strata::test::randn(size_t(H), 22, 0.5f);
  const auto dt = strata::test::randn(size_t(P), 23, 0.5f);
  ref::KdaGate gate{ref::KdaGateForm::bounded, A_log.data(), dt.data(), -5.0f};
  std::vector<float> r(static_cast<size_t>(T * P)), f(static_cast<size_t>(T * P));
  ref::kda_gate(gate, z.data(), r.data(), T, H, K);
  cpu::kda_gate_fast(gate, z.data(), f.data(), T, H, K);
  double worst = 0;  // fp32 output (not rounded): a few ulp
  for (size_t i = 0; i < r.size(); ++i)
    worst = std::max(worst, std::fabs(double(f[i]) - r[i]) / std::fabs(double(r[i])));
  INFO("KDA gate worst relative difference " << worst);
  CHECK(worst <= 1e-6);
  for (bool round : {false, true}) {
    ref::l2_norm(z.data(), r.data(), T * H, K, 1e-6f, round ? Precision::bf16 : Precision::fp32);
    cpu::l2_norm_fast(z.data(), f.data(), T * H, K, 1e-6f, round);
    if (round) {
      check(agree(f, r), "L2 norm (bf16)");
    } else {
      double wl = 0;
      for (size_t i = 0; i < r.size(); ++i) wl = std::max(wl, std::fabs(double(f[i]) - r[i]));
      CHECK(wl <= 1e-6);
    }
  }
  const auto o = bf(strata::test::randn(size_t(T * P), 24));
  const auto onw = strata::test::randn(size_t(K), 25);
  ref::gated_rms_norm(o.data(), z.data(), onw.data(), r.data(), T * H, K, 1e-5f, Precision::bf16);
  cpu::gated_rms_norm_fast(o.data(), z.data(), onw.data(), f.data(), T * H, K, 1e-5f);
  check(agree(f, r), "gated RMSNorm");
  const auto cw = strata::test::randn(size_t(P * W), 26, 0.5f);
  for (int64_t t : {int64_t(1), T}) {
    std::vector<float> sr = strata::test::randn(size_t(P * (W - 1)), 27), sf = sr;
    ref::short_conv_silu(z.data(), cw.data(), sr.data(), r.data(), t, P, W, Precision::bf16);
    cpu::short_conv_silu_fast(z.data(), cw.data(), sf.data(), f.data(), t, P, W);
    std::vector<float> rr(r.begin(), r.begin() + t * P), ff(f.begin(), f.begin() + t * P);
    check(agree(ff, rr), "short conv + SiLU");
    CHECK(sr == sf);  // the state is the last inputs, copied
  }
  // Several sequences in one call (rows 0, 1–3, 4 of z; the second without a state): each one's
  // outputs and state are the bits of its own call.
  {
    const std::vector<int64_t> at = {0, 1, 4}, len = {1, 3, 1};
    std::vector<std::vector<float>> st_alone, st_batch, y_alone, y_batch;
    std::vector<cpu::ConvSeq> seqs;
    for (size_t i = 0; i < at.size(); ++i) {
      st_alone.push_back(strata::test::randn(size_t(P * (W - 1)), 30 + uint32_t(i)));
      st_batch.push_back(st_alone.back());
      y_alone.emplace_back(size_t(len[i] * P), 0.0f);
      y_batch.emplace_back(size_t(len[i] * P), -1.0f);
    }
    for (size_t i = 0; i < at.size(); ++i) {
      float* sa = i == 1 ? nullptr : st_alone[i].data();
      cpu::short_conv_silu_fast(z.data() + at[i] * P, cw.data(), sa, y_alone[i].data(), len[i], P,
                                W);
      seqs.push_back(
          {z.data() + at[i] * P, i == 1 ? nullptr : st_batch[i].data(), y_batch[i].data(), len[i]});
    }
    cpu::short_conv_silu_seqs_fast(seqs.data(), int64_t(seqs.size()), cw.data(), P, W);
    for (size_t i = 0; i < at.size(); ++i) {
      INFO("sequence " << i);
      CHECK(y_batch[i] == y_alone[i]);
      CHECK(st_batch[i] == st_alone[i]);
    }
  }
}

TEST_CASE("row ops: the routed merge equals one thread's loop bit for bit", "[row_ops]") {
  const int64_t T = 37, K = 4, D = 512;
  std::vector<float> y(size_t(T * K * D)), w(size_t(T * K));
  uint32_t s = 12345;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return float(int(s >> 9) - (1 << 22)) * 1e-6f;
  };
  for (float& v : y) v = next();
  for (float& v : w) v = next();
  std::vector<float> want(size_t(T * D), 0.0f), got(size_t(T * D), 7.0f);  // got: not zeroed
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j)
      ref::accumulate_weighted(want.data() + t * D, y.data() + (t * K + j) * D,
                               w[size_t(t * K + j)], D);
  cpu::round_bf16_fast(want.data(), T * D);
  cpu::merge_routed_fast(y.data(), w.data(), got.data(), T, K, D);
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
}
