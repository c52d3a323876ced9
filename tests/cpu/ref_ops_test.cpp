// Unit tests of the reference ops other than KDA and MLA: weight views, linear, norms, GLUs,
// AttnRes, router, expert FFNs. Small hand-checkable inputs plus random ones against
// double-precision evaluations with rigorous error bounds.
#include <tbb/task_arena.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/ref/ops.h"
#include "test_data.h"
#include "storage/bf16.h"
#include "storage/error.h"
#include "storage/mxfp4.h"

namespace ref = strata::cpu::ref;
using ref::Precision;

using strata::test::randn;
using strata::test::to_bf16;

namespace {

bool is_bf16(float x) {
  return strata::round_bf16(x) == x || std::isnan(x);
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Rigorous bound for an fp32 dot product of n terms in any summation order: |err| ≤ γ_n·Σ|x_i w_i|
// with γ_n = n·u / (1 − n·u), u = 2^-24 (Higham, Accuracy and Stability, §3.1). Products add u.
double dot_bound(int64_t n, double abs_sum) {
  const double u = std::ldexp(1.0, -24);
  return (double(n + 1) * u / (1.0 - double(n + 1) * u)) * abs_sum;
}

}  // namespace

TEST_CASE("ref WeightView widens bf16, f32 and MXFP4 rows exactly", "[ref]") {
  // MXFP4 row of 32 columns: byte 0 = 0x21 → col0 code 1 (0.5), col1 code 2 (1.0);
  // byte 1 = 0xF8 → col2 code 8 (−0), col3 code 15 (−6); scale 128 → ×2.
  std::vector<uint8_t> packed(32, 0), scale = {128, 0xFF};
  packed[0] = 0x21;
  packed[1] = 0xF8;
  packed[16 + 0] = 0x77;  // row 1: 6, 6 with a NaN scale
  auto W = ref::WeightView::mxfp4(packed.data(), scale.data(), 2, 32);
  std::vector<float> row(32);
  W.widen_row(0, row.data());
  CHECK(row[0] == 1.0f);
  CHECK(row[1] == 2.0f);
  CHECK(row[2] == 0.0f);
  CHECK(std::signbit(row[2]));
  CHECK(row[3] == -12.0f);
  for (int i = 4; i < 32; ++i) CHECK(row[size_t(i)] == 0.0f);
  W.widen_row(1, row.data());
  CHECK(std::isnan(row[0]));  // E8M0 0xFF poisons its block (STYLE §3)
  // row_slice of MXFP4 keeps the scale pointer in step.
  auto r1 = W.row_slice(1, 1);
  r1.widen_row(0, row.data());
  CHECK(std::isnan(row[1]));

  const std::vector<float> f = {1.5f, -2.25f, 3.0f, 0.1f};
  const auto b = to_bf16(f);
  auto Wb = ref::WeightView::bf16(b.data(), 2, 2);
  const auto wide = Wb.to_f32();
  for (size_t i = 0; i < 4; ++i) CHECK(wide[i] == strata::round_bf16(f[i]));
  auto Wf = ref::WeightView::f32(f.data(), 2, 2).row_slice(1, 1);
  Wf.widen_row(0, row.data());
  CHECK(row[0] == 3.0f);
  CHECK(row[1] == 0.1f);
}

TEST_CASE("ref linear matches a float64 evaluation within the fp32 summation bound", "[ref]") {
  for (auto [T, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                         {3, 13, 37},
                         {5, 17, 64},
                         {2, 9, 1000},
                         {2, 3, 7168}}) {  // last: K3 hidden
    const auto x = randn(static_cast<size_t>(T * K), 1);
    const auto wf = randn(static_cast<size_t>(N * K), 2, 0.1f);
    const auto wb = to_bf16(wf);
    for (int fmt = 0; fmt < 2; ++fmt) {
      const auto W =
          fmt == 0 ? ref::WeightView::f32(wf.data(), N, K) : ref::WeightView::bf16(wb.data(), N, K);
      const auto wide = W.to_f32();
      std::vector<float> y(static_cast<size_t>(T * N));
      ref::linear(x.data(), W, y.data(), T);
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t n = 0; n < N; ++n) {
          double s = 0, a = 0;
          for (int64_t k = 0; k < K; ++k) {
            s += double(x[size_t(t * K + k)]) * wide[size_t(n * K + k)];
            a += std::fabs(double(x[size_t(t * K + k)]) * wide[size_t(n * K + k)]);
          }
          INFO("T " << T << " N " << N << " K " << K << " fmt " << fmt);
          CHECK(std::fabs(double(y[size_t(t * N + n)]) - s) <= dot_bound(K, a));
        }
      }
    }
  }
}

TEST_CASE("ref linear follows its documented summation order for every T (decode == prefill)",
          "[ref]") {
  // The order written in cpu/ref/linear.cpp: 8 interleaved partial sums over the leading multiple
  // of 8, combined 4+4, 2+2, 1+1, plus the in-order tail added last.
  auto documented = [](const float* a, const float* b, int64_t K) {
    float acc[8] = {};
    const int64_t K8 = K / 8 * 8;
    for (int64_t k = 0; k < K8; k += 8)
      for (int j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
    for (int w = 4; w >= 1; w /= 2)
      for (int j = 0; j < w; ++j) acc[j] += acc[j + w];
    float tail = 0.0f;
    for (int64_t k = K8; k < K; ++k) tail += a[k] * b[k];
    return acc[0] + tail;
  };
  for (int64_t K : {1, 7, 8, 37, 1000}) {
    const int64_t N = 11, Tmax = 5;
    const auto x = randn(size_t(Tmax * K), 30);
    const auto wb = to_bf16(randn(size_t(N * K), 31));
    const auto W = ref::WeightView::bf16(wb.data(), N, K);
    const auto wide = W.to_f32();
    for (int64_t T = 1; T <= Tmax; ++T) {
      std::vector<float> y(size_t(T * N));
      ref::linear(x.data(), W, y.data(), T);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n) {
          INFO("K " << K << " T " << T << " t " << t << " n " << n);
          CHECK(y[size_t(t * N + n)] == documented(x.data() + t * K, wide.data() + n * K, K));
        }
    }
  }
}

TEST_CASE("ref linear is bit-identical for any thread count and for MXFP4 vs its widened copy",
          "[ref]") {
  const int64_t T = 4, N = 70, K = 96;
  const auto x = randn(static_cast<size_t>(T * K), 3);
  std::vector<uint8_t> packed(static_cast<size_t>(N * K / 2)),
      scale(static_cast<size_t>(N * K / 32));
  std::mt19937 rng(4);
  for (auto& p : packed) p = uint8_t(rng());
  for (auto& s : scale) s = uint8_t(120 + rng() % 10);
  const auto W = ref::WeightView::mxfp4(packed.data(), scale.data(), N, K);
  std::vector<float> y1(static_cast<size_t>(T * N)), yn(static_cast<size_t>(T * N)),
      yw(static_cast<size_t>(T * N));
  tbb::task_arena one(1);
  one.execute([&] { ref::linear(x.data(), W, y1.data(), T); });
  ref::linear(x.data(), W, yn.data(), T);
  const auto wide = W.to_f32();
  ref::linear(x.data(), ref::WeightView::f32(wide.data(), N, K), yw.data(), T);
  CHECK(bits_equal(y1, yn));
  CHECK(bits_equal(y1, yw));
  // Widening agrees with the storage codec (the one definition of MXFP4 decode).
  std::vector<float> deq(static_cast<size_t>(N * K));
  strata::mxfp4::dequantize(packed.data(), scale.data(), N, K, deq.data());
  CHECK(bits_equal(deq, wide));
}

TEST_CASE("ref KimiRMSNorm: hand values, bf16 rounds before the weight", "[ref]") {
  // x = [3, 4]: mean(x²) = 12.5; eps 0 → y = [0.848528, 1.131371].
  const std::vector<float> x = {3.0f, 4.0f}, w = {2.0f, 0.5f};
  std::vector<float> o(2);
  ref::kimi_rms_norm(x.data(), w.data(), o.data(), 1, 2, 0.0f, Precision::fp32);
  CHECK(o[0] == Approx(2.0 * 3.0 / std::sqrt(12.5)).epsilon(1e-6));
  CHECK(o[1] == Approx(0.5 * 4.0 / std::sqrt(12.5)).epsilon(1e-6));

  // Random rows: the bf16 output equals bf16(w · bf16(x·r)); at least some elements differ from
  // rounding only after the weight multiply, so the test can tell the two orders apart.
  const int64_t R = 8, D = 256;
  const auto xr = randn(static_cast<size_t>(R * D), 5);
  auto wr = randn(static_cast<size_t>(D), 6, 0.3f);
  for (auto& v : wr) v = strata::round_bf16(1.0f + v);
  std::vector<float> ob(static_cast<size_t>(R * D)), of(static_cast<size_t>(R * D));
  ref::kimi_rms_norm(xr.data(), wr.data(), ob.data(), R, D, 1e-5f, Precision::bf16);
  ref::kimi_rms_norm(xr.data(), wr.data(), of.data(), R, D, 1e-5f, Precision::fp32);
  int differs = 0;
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += double(xr[size_t(r * D + d)]) * xr[size_t(r * D + d)];
    const float rs = 1.0f / std::sqrt(float(ss / D) + 1e-5f);
    for (int64_t d = 0; d < D; ++d) {
      const size_t i = size_t(r * D + d);
      const float y = xr[i] * rs;
      CHECK(ob[i] == strata::round_bf16(wr[size_t(d)] * strata::round_bf16(y)));
      CHECK(of[i] == wr[size_t(d)] * y);
      if (ob[i] != strata::round_bf16(wr[size_t(d)] * y)) ++differs;
    }
  }
  CHECK(differs > 0);
}

TEST_CASE("ref RMSNorm, L2 norm (eps on the sum), gated RMSNorm", "[ref]") {
  std::vector<float> o(4);
  const std::vector<float> x = {3.0f, 4.0f};
  ref::rms_norm(x.data(), o.data(), 1, 2, 0.0f);
  CHECK(o[0] == Approx(3.0 / std::sqrt(12.5)).epsilon(1e-6));
  // L2: eps is added to Σx², not to a mean: [1e-3, 0, 0, 0] → 1e-3/sqrt(1e-6 + 1e-6) = 0.7071.
  const std::vector<float> tiny = {1e-3f, 0.0f, 0.0f, 0.0f};
  ref::l2_norm(tiny.data(), o.data(), 1, 4, 1e-6f, Precision::fp32);
  CHECK(o[0] == Approx(1.0 / std::sqrt(2.0)).epsilon(1e-6));
  const std::vector<float> zero(4, 0.0f);
  ref::l2_norm(zero.data(), o.data(), 1, 4, 1e-6f, Precision::fp32);
  CHECK(o == zero);  // no NaN for an all-zero row
  ref::l2_norm(x.data(), o.data(), 1, 2, 1e-6f, Precision::fp32);
  CHECK(o[0] == Approx(3.0 / std::sqrt(25.0 + 1e-6)).epsilon(1e-7));
  CHECK(o[1] == Approx(4.0 / std::sqrt(25.0 + 1e-6)).epsilon(1e-7));
  ref::l2_norm(x.data(), o.data(), 1, 2, 1e-6f, Precision::bf16);
  CHECK(o[0] == strata::round_bf16(0.6f));

  // Gated: o = [3, 4], gate = [0, 100] (sigmoid 0.5, 1), w = [1, 2], eps 0.
  const std::vector<float> gate = {0.0f, 100.0f}, w = {1.0f, 2.0f};
  ref::gated_rms_norm(x.data(), gate.data(), w.data(), o.data(), 1, 2, 0.0f, Precision::fp32);
  CHECK(o[0] == Approx(0.5 * 3.0 / std::sqrt(12.5)).epsilon(1e-6));
  CHECK(o[1] == Approx(2.0 * 4.0 / std::sqrt(12.5)).epsilon(1e-6));
  std::vector<float> ob(2);
  ref::gated_rms_norm(x.data(), gate.data(), w.data(), ob.data(), 1, 2, 0.0f, Precision::bf16);
  CHECK(ob[0] == strata::round_bf16(o[0]));  // one rounding at the end
  CHECK(ob[1] == strata::round_bf16(o[1]));
}

TEST_CASE("ref SiTU and SiLU GLUs: hand values, bound, one bf16 rounding", "[ref]") {
  // g = 1, u = 2: SiTU = 4·tanh(1/4)·σ(1) · 25·tanh(2/25); SiLU = σ(1)·1·2.
  const float g = 1.0f, u = 2.0f;
  float o = 0;
  ref::situ_glu(&g, &u, &o, 1, 4.0f, 25.0f, Precision::fp32);
  const double sg = 1.0 / (1.0 + std::exp(-1.0));
  CHECK(o == Approx(4.0 * std::tanh(0.25) * sg * 25.0 * std::tanh(0.08)).epsilon(1e-6));
  ref::situ_glu(&g, &u, &o, 1, 4.0f, 0.0f, Precision::fp32);  // no β2: the up factor is u
  CHECK(o == Approx(4.0 * std::tanh(0.25) * sg * 2.0).epsilon(1e-6));
  ref::silu_glu(&g, &u, &o, 1, Precision::fp32);
  CHECK(o == Approx(sg * 2.0).epsilon(1e-6));

  // Bound |out| ≤ β1·β2 = 100 (report §2.3.2), reached for large positive g and |u|.
  const int64_t n = 4096;
  const auto G = randn(static_cast<size_t>(n), 7, 300.0f),
             U = randn(static_cast<size_t>(n), 8, 300.0f);
  std::vector<float> out(static_cast<size_t>(n)), outb(static_cast<size_t>(n));
  ref::situ_glu(G.data(), U.data(), out.data(), n, 4.0f, 25.0f, Precision::fp32);
  ref::situ_glu(G.data(), U.data(), outb.data(), n, 4.0f, 25.0f, Precision::bf16);
  float mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    CHECK(std::fabs(out[size_t(i)]) <= 100.0f);
    CHECK(outb[size_t(i)] == strata::round_bf16(out[size_t(i)]));
    mx = std::max(mx, std::fabs(out[size_t(i)]));
  }
  CHECK(mx > 99.0f);
  const float big = 1e4f;
  ref::situ_glu(&big, &big, &o, 1, 4.0f, 25.0f, Precision::fp32);
  CHECK(o == Approx(100.0f));
  const float neg = -1e4f;
  ref::situ_glu(&neg, &big, &o, 1, 4.0f, 25.0f, Precision::fp32);
  CHECK(std::fabs(o) < 1e-30f);  // σ of a large negative g → 0
  ref::silu_glu(G.data(), U.data(), outb.data(), n, Precision::bf16);
  for (int64_t i = 0; i < n; ++i) CHECK(is_bf16(outb[size_t(i)]));

  // MLA output gate: bf16 rounds the sigmoid, then the product.
  std::vector<float> ov = {1.3f, -2.7f}, gv = {0.3f, -1.1f}, ob = ov;
  ref::sigmoid_gate_inplace(ov.data(), gv.data(), 2, Precision::fp32);
  ref::sigmoid_gate_inplace(ob.data(), gv.data(), 2, Precision::bf16);
  CHECK(ov[0] == Approx(1.3 / (1.0 + std::exp(-0.3))).epsilon(1e-6));
  CHECK(ob[1] == strata::round_bf16(-2.7f * strata::round_bf16(ref::sigmoid(-1.1f))));
}

TEST_CASE("ref AttnRes mix: hand values, identity, softmax invariances", "[ref]") {
  // Two sources, D = 2, eps 0: s1 = [1, 1] → key [1, 1]; s2 = [2, −2] → key [1, −1];
  // folded query [1·0.5, 1·0.25] → logits 0.75, 0.25 → p1 = σ(0.5).
  const std::vector<float> s1 = {1.0f, 1.0f}, s2 = {2.0f, -2.0f}, nw = {1.0f, 1.0f},
                           pw = {0.5f, 0.25f};
  const float* src[2] = {s1.data(), s2.data()};
  std::vector<float> o(2);
  ref::attn_res_mix(src, 2, nw.data(), pw.data(), o.data(), 1, 2, 0.0f, Precision::fp32);
  const double p1 = 1.0 / (1.0 + std::exp(-0.5));
  CHECK(o[0] == Approx(p1 * 1 + (1 - p1) * 2).epsilon(1e-6));
  CHECK(o[1] == Approx(p1 * 1 - (1 - p1) * 2).epsilon(1e-6));

  const int64_t T = 3, D = 64;
  const auto a = randn(static_cast<size_t>(T * D), 9), b = randn(static_cast<size_t>(T * D), 10),
             c = randn(static_cast<size_t>(T * D), 11);
  const auto w1 = randn(static_cast<size_t>(D), 12), w2 = randn(static_cast<size_t>(D), 13, 0.1f);
  std::vector<float> out(static_cast<size_t>(T * D));
  // One source: p = 1 exactly, the output is that source.
  const float* one[1] = {a.data()};
  ref::attn_res_mix(one, 1, w1.data(), w2.data(), out.data(), T, D, 1e-5f, Precision::fp32);
  CHECK(bits_equal(out, a));
  // Two copies of one source: p = ½ each, ½a + ½a = a exactly.
  const float* two[2] = {a.data(), a.data()};
  ref::attn_res_mix(two, 2, w1.data(), w2.data(), out.data(), T, D, 1e-5f, Precision::fp32);
  CHECK(bits_equal(out, a));
  // Scaling every source by 2 leaves the keys (RMS-normalised, eps 0) and so the weights
  // unchanged: the output doubles exactly.
  std::vector<float> a2 = a, b2 = b, c2 = c, out2(static_cast<size_t>(T * D));
  for (size_t i = 0; i < a.size(); ++i) a2[i] *= 2, b2[i] *= 2, c2[i] *= 2;
  const float* s3[3] = {a.data(), b.data(), c.data()};
  const float* s3x2[3] = {a2.data(), b2.data(), c2.data()};
  ref::attn_res_mix(s3, 3, w1.data(), w2.data(), out.data(), T, D, 0.0f, Precision::fp32);
  ref::attn_res_mix(s3x2, 3, w1.data(), w2.data(), out2.data(), T, D, 0.0f, Precision::fp32);
  for (size_t i = 0; i < out.size(); ++i) CHECK(out2[i] == 2.0f * out[i]);
  // Zero pseudo-query (the init): uniform mixing = the mean of the sources.
  const std::vector<float> zq(static_cast<size_t>(D), 0.0f);
  ref::attn_res_mix(s3, 3, w1.data(), zq.data(), out.data(), T, D, 1e-5f, Precision::fp32);
  for (size_t i = 0; i < out.size(); ++i) {
    CHECK(out[i] == Approx((double(a[i]) + b[i] + c[i]) / 3.0).margin(1e-6));
  }
  // In place: the output may be one of the sources (all logits of a token are formed first).
  ref::attn_res_mix(s3, 3, w1.data(), w2.data(), out.data(), T, D, 1e-5f, Precision::fp32);
  std::vector<float> c_inplace = c;
  const float* s3ip[3] = {a.data(), b.data(), c_inplace.data()};
  ref::attn_res_mix(s3ip, 3, w1.data(), w2.data(), c_inplace.data(), T, D, 1e-5f, Precision::fp32);
  CHECK(bits_equal(c_inplace, out));
  // bf16 mode: one rounding of the fp32 result.
  ref::attn_res_mix(s3, 3, w1.data(), w2.data(), out.data(), T, D, 1e-5f, Precision::fp32);
  ref::attn_res_mix(s3, 3, w1.data(), w2.data(), out2.data(), T, D, 1e-5f, Precision::bf16);
  for (size_t i = 0; i < out.size(); ++i) CHECK(out2[i] == strata::round_bf16(out[i]));
}

TEST_CASE("ref router: top-k ties, bias for selection, both weight forms, renormalisation",
          "[ref]") {
  ref::RouterParams rp;
  rp.E = 8;
  rp.topk = 3;
  std::vector<int32_t> ids(3), ranked(3);
  std::vector<float> w(3);
  // All logits equal: ties go to the lower ids.
  const std::vector<float> flat(8, 0.25f);
  ref::route(flat.data(), rp, ids.data(), w.data(), ranked.data(), 1);
  CHECK(ids == std::vector<int32_t>{0, 1, 2});
  for (float x : w) CHECK(x == Approx(1.0 / 3.0).epsilon(1e-6));

  // Scores s_e = σ(logit_e); bias moves expert 6 into the selection; K3 weights use unbiased s.
  const std::vector<float> lg = {0.1f, 2.0f, -1.0f, 1.5f, 0.0f, 0.3f, -0.5f, 1.0f};
  std::vector<float> bias(8, 0.0f);
  bias[6] = 0.9f;  // σ(−0.5) + 0.9 = 1.277 > σ(2) = 0.881
  rp.bias = bias.data();
  rp.scaling = 2.5f;
  ref::route(lg.data(), rp, ids.data(), w.data(), ranked.data(), 1);
  CHECK(ranked == std::vector<int32_t>{6, 1, 3});
  CHECK(ids == std::vector<int32_t>{1, 3, 6});
  auto sg = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  const double s1 = sg(2.0), s3 = sg(1.5), s6 = sg(-0.5);
  CHECK(w[0] == Approx(2.5 * s1 / (s1 + s3 + s6)).epsilon(1e-6));
  CHECK(w[2] == Approx(2.5 * s6 / (s1 + s3 + s6)).epsilon(1e-6));
  CHECK(w[0] + w[1] + w[2] == Approx(2.5).epsilon(1e-6));

  // Kimi-Linear quirk: the weights include the bias.
  rp.form = ref::RouterForm::biased_in_place;
  ref::route(lg.data(), rp, ids.data(), w.data(), ranked.data(), 1);
  CHECK(ids == std::vector<int32_t>{1, 3, 6});
  const double b6 = s6 + 0.9;
  CHECK(w[2] == Approx(2.5 * b6 / (s1 + s3 + b6)).epsilon(1e-6));

  // No renormalisation: the raw scores times the scale.
  rp.form = ref::RouterForm::unbiased;
  rp.renormalize = false;
  ref::route(lg.data(), rp, ids.data(), w.data(), nullptr, 1);
  CHECK(w[1] == Approx(2.5 * s3).epsilon(1e-6));

  // Many tokens at once equal token-by-token routing.
  rp.renormalize = true;
  rp.E = 64;
  rp.topk = 6;
  std::vector<float> bias64 = randn(64, 14, 0.05f);
  rp.bias = bias64.data();
  const int64_t T = 33;
  const auto L = randn(static_cast<size_t>(T * 64), 15);
  std::vector<int32_t> all(static_cast<size_t>(T * 6)), one(6);
  std::vector<float> wall(static_cast<size_t>(T * 6)), wone(6);
  ref::route(L.data(), rp, all.data(), wall.data(), nullptr, T);
  for (int64_t t = 0; t < T; ++t) {
    ref::route(L.data() + t * 64, rp, one.data(), wone.data(), nullptr, 1);
    for (int j = 0; j < 6; ++j) {
      CHECK(all[size_t(t * 6 + j)] == one[size_t(j)]);
      CHECK(wall[size_t(t * 6 + j)] == wone[size_t(j)]);
      if (j > 0) CHECK(all[size_t(t * 6 + j - 1)] < all[size_t(t * 6 + j)]);
    }
  }

  // Replay: the weights of route()'s own selection are reproduced bit for bit, for both forms; a
  // forced different selection gets the same formula; a bad id is an error naming it.
  for (auto form : {ref::RouterForm::unbiased, ref::RouterForm::biased_in_place}) {
    rp.form = form;
    ref::route(L.data(), rp, all.data(), wall.data(), nullptr, T);
    std::vector<float> wrep(wall.size());
    ref::route_weights(L.data(), rp, all.data(), wrep.data(), T);
    CHECK(wrep == wall);
  }
  rp.form = ref::RouterForm::unbiased;
  const std::vector<int32_t> forced = {5, 9, 0, 63, 17, 2};
  ref::route_weights(L.data(), rp, forced.data(), wone.data(), 1);
  double sum = 0;
  for (int32_t e : forced) sum += sg(L[size_t(e)]);
  for (int j = 0; j < 6; ++j)
    CHECK(wone[size_t(j)] == Approx(rp.scaling * sg(L[size_t(forced[size_t(j)])]) / sum));
  const std::vector<int32_t> bad = {5, 9, 0, 64, 17, 2};
  CHECK_THROWS_AS(ref::route_weights(L.data(), rp, bad.data(), wone.data(), 1), strata::Error);
}

TEST_CASE("ref expert FFNs: dense vs float64, MXFP4 exact mode vs widened weights, bf16", "[ref]") {
  const int64_t T = 3, D = 64, I = 96;
  const auto x = randn(static_cast<size_t>(T * D), 16);
  const auto gf = randn(static_cast<size_t>(I * D), 17, 0.125f),
             uf = randn(static_cast<size_t>(I * D), 18, 0.125f),
             df = randn(static_cast<size_t>(D * I), 19, 0.1f);
  const auto gb = to_bf16(gf), ub = to_bf16(uf), db = to_bf16(df);
  const ref::GluMlp m{ref::WeightView::bf16(gb.data(), I, D),
                      ref::WeightView::bf16(ub.data(), I, D),
                      ref::WeightView::bf16(db.data(), D, I)};
  for (auto act : {ref::Glu{ref::GluKind::situ, 4.0f, 25.0f}, ref::Glu{ref::GluKind::silu}}) {
    std::vector<float> y(static_cast<size_t>(T * D));
    ref::expert_ffn_dense(x.data(), m, act, y.data(), T, Precision::fp32);
    const auto G = m.gate.to_f32(), U = m.up.to_f32(), Dn = m.down.to_f32();
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> h(static_cast<size_t>(I));
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < D; ++d) {
          g += double(x[size_t(t * D + d)]) * G[size_t(i * D + d)];
          u += double(x[size_t(t * D + d)]) * U[size_t(i * D + d)];
        }
        const double sg = 1.0 / (1.0 + std::exp(-g));
        h[size_t(i)] = act.kind == ref::GluKind::situ
                           ? 4.0 * std::tanh(g / 4.0) * sg * 25.0 * std::tanh(u / 25.0)
                           : g * sg * u;
      }
      for (int64_t d = 0; d < D; ++d) {
        double s = 0, a = 0;
        for (int64_t i = 0; i < I; ++i) {
          s += h[size_t(i)] * Dn[size_t(d * I + i)];
          a += std::fabs(h[size_t(i)] * Dn[size_t(d * I + i)]);
        }
        // fp32 error of gate/up (64-term dots) and the GLU (a few ulp, relative) propagated
        // through the 96-term down projection: bounded by 4·dot_bound(96) on Σ|h·w|.
        CHECK(std::fabs(y[size_t(t * D + d)] - s) <= 4.0 * dot_bound(I + D, a) + 1e-7);
      }
    }
    // bf16 mode: the output is bf16 and close to fp32 (three bf16 roundings, ~2^-8 relative).
    std::vector<float> yb(static_cast<size_t>(T * D));
    ref::expert_ffn_dense(x.data(), m, act, yb.data(), T, Precision::bf16);
    double num = 0, den = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      CHECK(is_bf16(yb[i]));
      num += (yb[i] - y[i]) * double(yb[i] - y[i]);
      den += double(y[i]) * y[i];
    }
    CHECK(std::sqrt(num / den) < 1e-2);
  }

  // MXFP4 exact mode: quantize random weights with the storage codec, run through the MXFP4
  // views and through f32 copies of the dequantized matrices — bit-identical (exact widening).
  std::vector<uint8_t> p1(static_cast<size_t>(I * D / 2)), s1(static_cast<size_t>(I * D / 32)),
      p3 = p1, s3 = s1, p2(static_cast<size_t>(D * I / 2)), s2(static_cast<size_t>(D * I / 32));
  strata::mxfp4::quantize(gf.data(), I, D, p1.data(), s1.data());
  strata::mxfp4::quantize(uf.data(), I, D, p3.data(), s3.data());
  strata::mxfp4::quantize(df.data(), D, I, p2.data(), s2.data());
  const ref::Mxfp4Expert e{ref::WeightView::mxfp4(p1.data(), s1.data(), I, D),
                           ref::WeightView::mxfp4(p3.data(), s3.data(), I, D),
                           ref::WeightView::mxfp4(p2.data(), s2.data(), D, I)};
  const auto G = e.w1.to_f32(), U = e.w3.to_f32(), Dn = e.w2.to_f32();
  const ref::GluMlp wide{ref::WeightView::f32(G.data(), I, D), ref::WeightView::f32(U.data(), I, D),
                         ref::WeightView::f32(Dn.data(), D, I)};
  const ref::Glu situ{ref::GluKind::situ, 4.0f, 25.0f};
  for (auto p : {Precision::fp32, Precision::bf16}) {
    std::vector<float> ye(static_cast<size_t>(T * D)), yw(static_cast<size_t>(T * D));
    ref::expert_ffn_mxfp4(x.data(), e, situ, ye.data(), T, p);
    ref::glu_mlp(x.data(), wide, situ, yw.data(), T, p);
    CHECK(bits_equal(ye, yw));
  }
  // Inconsistent shapes are an error naming them.
  const ref::GluMlp bad{m.gate, m.up, ref::WeightView::bf16(db.data(), I, D)};
  std::vector<float> y(static_cast<size_t>(T * D));
  CHECK_THROWS_AS(ref::glu_mlp(x.data(), bad, situ, y.data(), T, Precision::fp32), strata::Error);

  // Merge step: acc + w·y in fp32.
  std::vector<float> acc = {1.0f, 2.0f};
  const std::vector<float> yy = {4.0f, -8.0f};
  ref::accumulate_weighted(acc.data(), yy.data(), 0.25f, 2);
  CHECK(acc == std::vector<float>{2.0f, 0.0f});
}
