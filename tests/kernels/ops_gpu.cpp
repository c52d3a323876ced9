// Op-check of the small CUDA ops (kernels/ops/ops.h) against the fp32 oracle (cpu/ref/ops.h) at
// K3 shapes (hidden 7168, latent 3584, KDA 96 heads × 128, MLA kv_lora 512, 896 experts top-16,
// 9 AttnRes sources) and odd small shapes, in fp32 and bf16 modes. Tolerances per op, with where
// the error comes from:
// - norms, AttnRes, GLUs: NMSE. Sources: fp32 reduction order (the oracle sums squares in fp64),
//   CUDA expf/tanhf vs libm (≤ 2 ulp); in bf16 mode those ulps occasionally flip a bf16 rounding
//   (one bf16 step, 2^-8 relative, on a small fraction of elements).
// - router ids, embedding gather, conversions: exact. Router weights: relative 1e-5 (sigmoid ulps
//   and the fp32 sum of 16 weights).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "cpu/ref/ops.h"
#include "gpu_test.h"
#include "kernels/moe/groups.h"
#include "kernels/ops/device_memory.h"
#include "kernels/ops/ops.h"
#include "kernels/runtime.h"
#include "kernels/sample/sample.h"
#include "storage/bf16.h"
#include "test_data.h"

namespace {

namespace ref = strata::cpu::ref;
namespace ops = strata::kernels::ops;
using strata::kernels::DeviceBuffer;

using strata::test::Rng;

// NMSE = Σ(got − want)² / Σ want², NaN/Inf positions must match exactly.
void check_nmse(const std::vector<float>& got, const std::vector<float>& want, double max_nmse) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  size_t nan_mismatch = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const bool fg = std::isfinite(got[i]), fw = std::isfinite(want[i]);
    if (fg != fw || (!fw && std::isnan(got[i]) != std::isnan(want[i]))) {
      nan_mismatch++;
      continue;
    }
    if (!fw) continue;
    const double d = double(got[i]) - double(want[i]);
    num += d * d;
    den += double(want[i]) * want[i];
  }
  CHECK(nan_mismatch == 0);
  const double nmse = den > 0 ? num / den : num;
  INFO("nmse " << nmse << " (max " << max_nmse << ")");
  CHECK(nmse <= max_nmse);
}

std::vector<float> run_gpu_unary(
    const std::vector<float>& x, size_t out_n,
    const std::function<strata::kernels::Status(const float*, float*)>& f) {
  DeviceBuffer dx = DeviceBuffer::from(x), dy(out_n * 4);
  strata::kernels::Status s = f(dx.as<float>(), dy.as<float>());
  INFO("status: " << s.message);
  REQUIRE(s.ok());
  return dy.to_vector<float>(out_n);
}

// fp32 results: only reduction order and ulps differ (relative ≲ 1e-6 per element).
constexpr double kNmseF32 = 1e-11;
// bf16 results: a flipped bf16 rounding costs (2^-8)² relative; allow it on ≤ 1% of elements.
constexpr double kNmseBf16 = 1e-6;

}  // namespace

TEST_CASE("ops gpu: KimiRMSNorm at hidden, latent and MLA widths", "[gpu]") {
  strata::test::skip_without_gpu();
  struct S {
    int rows, D;
    float eps;
  };
  for (S sh :
       {S{5, 7168, 1e-5f}, S{3, 3584, 1e-5f}, S{4, 512, 1e-6f}, S{7, 96, 1e-5f}, S{2, 1, 1e-5f}}) {
    for (bool bf : {false, true}) {
      INFO("rows " << sh.rows << " D " << sh.D << " bf16 " << bf);
      Rng r{uint64_t(sh.D) * 3 + bf};
      auto x = r.normals(size_t(sh.rows) * sh.D, 2.0f, bf);
      auto w = r.normals(size_t(sh.D), 1.0f, true);
      std::vector<float> want(x.size());
      ref::kimi_rms_norm(x.data(), w.data(), want.data(), sh.rows, sh.D, sh.eps,
                         bf ? ref::Precision::bf16 : ref::Precision::fp32);
      DeviceBuffer dw = DeviceBuffer::from(w);
      auto got = run_gpu_unary(x, x.size(), [&](const float* in, float* out) {
        return ops::kimi_rms_norm(in, dw.as<float>(), out, sh.rows, sh.D, sh.eps, bf, nullptr);
      });
      check_nmse(got, want, bf ? kNmseBf16 : kNmseF32);
    }
  }
}

TEST_CASE("ops gpu: L2 norm and gated per-head RMSNorm at KDA shapes", "[gpu]") {
  strata::test::skip_without_gpu();
  for (int rows : {3 * 96, 5}) {
    for (int D : {128, 40}) {
      for (bool bf : {false, true}) {
        INFO("rows " << rows << " D " << D << " bf16 " << bf);
        Rng r{uint64_t(rows * 1000 + D) + bf};
        auto x = r.normals(size_t(rows) * D, 1.5f, bf);
        auto gate = r.normals(size_t(rows) * D, 2.0f, bf);
        auto w = r.normals(size_t(D));
        const auto prec = bf ? ref::Precision::bf16 : ref::Precision::fp32;
        std::vector<float> want(x.size());
        ref::l2_norm(x.data(), want.data(), rows, D, 1e-6f, prec);
        auto got = run_gpu_unary(x, x.size(), [&](const float* in, float* out) {
          return ops::l2_norm(in, out, rows, D, 1e-6f, bf, nullptr);
        });
        check_nmse(got, want, bf ? kNmseBf16 : kNmseF32);

        ref::gated_rms_norm(x.data(), gate.data(), w.data(), want.data(), rows, D, 1e-5f, prec);
        DeviceBuffer dg = DeviceBuffer::from(gate), dw = DeviceBuffer::from(w);
        got = run_gpu_unary(x, x.size(), [&](const float* in, float* out) {
          return ops::gated_rms_norm(in, dg.as<float>(), dw.as<float>(), out, rows, D, 1e-5f, bf,
                                     nullptr);
        });
        check_nmse(got, want, bf ? kNmseBf16 : kNmseF32);
      }
    }
  }
}

TEST_CASE("ops gpu: AttnRes mix over block snapshots", "[gpu]") {
  strata::test::skip_without_gpu();
  struct S {
    int n, T, D;
  };
  for (S sh : {S{9, 3, 7168}, S{2, 4, 7168}, S{1, 2, 96}, S{16, 3, 33}}) {
    for (bool bf : {false, true}) {
      INFO("sources " << sh.n << " T " << sh.T << " D " << sh.D << " bf16 " << bf);
      Rng r{uint64_t(sh.n * 100 + sh.D) + bf};
      std::vector<std::vector<float>> src;
      // Sources of different scales, as banked block sums grow with depth.
      for (int i = 0; i < sh.n; i++) src.push_back(r.normals(size_t(sh.T) * sh.D, 1.0f + i, bf));
      auto nw = r.normals(size_t(sh.D), 1.0f, true);
      auto pw = r.normals(size_t(sh.D), 0.05f, true);
      std::vector<const float*> sp;
      for (auto& s : src) sp.push_back(s.data());
      std::vector<float> want(size_t(sh.T) * sh.D);
      ref::attn_res_mix(sp.data(), sh.n, nw.data(), pw.data(), want.data(), sh.T, sh.D, 1e-5f,
                        bf ? ref::Precision::bf16 : ref::Precision::fp32);
      std::vector<DeviceBuffer> dsrc;
      ops::AttnResSources S;
      S.n = sh.n;
      for (int i = 0; i < sh.n; i++) {
        dsrc.push_back(DeviceBuffer::from(src[size_t(i)]));
        S.src[i] = dsrc.back().as<float>();
      }
      DeviceBuffer dnw = DeviceBuffer::from(nw), dpw = DeviceBuffer::from(pw),
                   dout(want.size() * 4);
      REQUIRE(ops::attn_res_mix(S, dnw.as<float>(), dpw.as<float>(), dout.as<float>(), sh.T, sh.D,
                                1e-5f, bf, nullptr)
                  .ok());
      check_nmse(dout.to_vector<float>(want.size()), want, bf ? kNmseBf16 : kNmseF32);
    }
  }
  ops::AttnResSources none;
  CHECK_FALSE(ops::attn_res_mix(none, nullptr, nullptr, nullptr, 1, 8, 1e-5f, false, nullptr).ok());
}

// The clustered row form (kernels/ops/row_cluster.cuh) at decode row counts and the widths that
// pick each split (7168: 8 CTAs, 3584: 4, 512 and 260: 1 with idle threads, 12288: 2 float4s per
// thread): against the oracle; a row alone gives the bits it gets among 16 rows (the split depends
// on D only); in place equals out of place; the one-CTA-per-row form (the fallback for unaligned
// pointers, also callable directly) against the oracle, and an unaligned call takes it.
TEST_CASE("ops gpu: clustered KimiRMSNorm and AttnRes rows at decode row counts", "[gpu]") {
  strata::test::skip_without_gpu();
  const int T = 16, one = 5;  // the row also run alone
  for (int D : {7168, 3584, 512, 260, 12288}) {
    for (bool bf : {false, true}) {
      INFO("KimiRMSNorm rows " << T << " D " << D << " bf16 " << bf);
      Rng r{uint64_t(D) * 5 + bf};
      auto x = r.normals(size_t(T) * D, 2.0f, bf);
      auto w = r.normals(size_t(D), 1.0f, true);
      std::vector<float> want(x.size());
      ref::kimi_rms_norm(x.data(), w.data(), want.data(), T, D, 1e-5f,
                         bf ? ref::Precision::bf16 : ref::Precision::fp32);
      DeviceBuffer dx = DeviceBuffer::from(x), dw = DeviceBuffer::from(w), dy(x.size() * 4),
                   dy1(size_t(D) * 4), dyb(x.size() * 4);
      REQUIRE(ops::kimi_rms_norm(dx.as<float>(), dw.as<float>(), dy.as<float>(), T, D, 1e-5f, bf,
                                 nullptr)
                  .ok());
      auto got = dy.to_vector<float>(x.size());
      check_nmse(got, want, bf ? kNmseBf16 : kNmseF32);
      REQUIRE(ops::kimi_rms_norm(dx.as<float>() + size_t(one) * D, dw.as<float>(), dy1.as<float>(),
                                 1, D, 1e-5f, bf, nullptr)
                  .ok());
      CHECK(std::memcmp(dy1.to_vector<float>(size_t(D)).data(), got.data() + size_t(one) * D,
                        size_t(D) * 4) == 0);
      REQUIRE(ops::kimi_rms_norm_row_blocks(dx.as<float>(), dw.as<float>(), dyb.as<float>(), T, D,
                                            1e-5f, bf, nullptr)
                  .ok());
      auto blocks = dyb.to_vector<float>(x.size());
      check_nmse(blocks, want, bf ? kNmseBf16 : kNmseF32);
      // Unaligned rows (x shifted by one float) fall back to the one-CTA form: its bits exactly.
      std::vector<float> xs(1, 0.0f);
      xs.insert(xs.end(), x.begin(), x.end());
      DeviceBuffer dxs = DeviceBuffer::from(xs), dys(xs.size() * 4);
      REQUIRE(ops::kimi_rms_norm(dxs.as<float>() + 1, dw.as<float>(), dys.as<float>() + 1, T, D,
                                 1e-5f, bf, nullptr)
                  .ok());
      auto shifted = dys.to_vector<float>(x.size() + 1);
      CHECK(std::memcmp(shifted.data() + 1, blocks.data(), x.size() * 4) == 0);
      // The bf16 output beside the fp32 one (the engine's GEMM input): the fp32 output's bits
      // (RNE), in the clustered and the one-CTA form, and in place as the engine runs the MLA
      // q_a and latent norms (the engine normalises them in place).
      auto bits = [](const std::vector<float>& v) {
        std::vector<uint16_t> b(v.size());
        for (size_t i = 0; i < v.size(); ++i) b[i] = strata::f32_to_bf16(v[i]);
        return b;
      };
      DeviceBuffer dob(x.size() * 2), dobb(x.size() * 2), dy2(x.size() * 4);
      REQUIRE(ops::kimi_rms_norm(dx.as<float>(), dw.as<float>(), dy2.as<float>(), T, D, 1e-5f, bf,
                                 nullptr, dob.as<uint16_t>())
                  .ok());
      CHECK(std::memcmp(dy2.to_vector<float>(x.size()).data(), got.data(), x.size() * 4) == 0);
      CHECK(dob.to_vector<uint16_t>(x.size()) == bits(got));
      REQUIRE(ops::kimi_rms_norm_row_blocks(dx.as<float>(), dw.as<float>(), dy2.as<float>(), T, D,
                                            1e-5f, bf, nullptr, dobb.as<uint16_t>())
                  .ok());
      CHECK(dobb.to_vector<uint16_t>(x.size()) == bits(blocks));
      REQUIRE(ops::kimi_rms_norm(dx.as<float>(), dw.as<float>(), dx.as<float>(), T, D, 1e-5f, bf,
                                 nullptr, dob.as<uint16_t>())
                  .ok());
      CHECK(std::memcmp(dx.to_vector<float>(x.size()).data(), got.data(), x.size() * 4) == 0);
      CHECK(dob.to_vector<uint16_t>(x.size()) == bits(got));
    }
  }
  struct S {
    int n, T, D;
  };
  for (S sh : {S{10, 16, 7168}, S{9, 16, 3584}, S{16, 2, 12288}, S{3, 7, 260}}) {
    for (bool bf : {false, true}) {
      INFO("AttnRes sources " << sh.n << " T " << sh.T << " D " << sh.D << " bf16 " << bf);
      Rng r{uint64_t(sh.n * 1000 + sh.D) + bf};
      std::vector<std::vector<float>> src;
      for (int i = 0; i < sh.n; i++) src.push_back(r.normals(size_t(sh.T) * sh.D, 1.0f + i, bf));
      auto nw = r.normals(size_t(sh.D), 1.0f, true);
      auto pw = r.normals(size_t(sh.D), 0.05f, true);
      std::vector<const float*> sp;
      for (auto& v : src) sp.push_back(v.data());
      const size_t n = size_t(sh.T) * sh.D;
      std::vector<float> want(n);
      ref::attn_res_mix(sp.data(), sh.n, nw.data(), pw.data(), want.data(), sh.T, sh.D, 1e-5f,
                        bf ? ref::Precision::bf16 : ref::Precision::fp32);
      std::vector<DeviceBuffer> dsrc;
      ops::AttnResSources all, row;
      all.n = row.n = sh.n;
      for (int i = 0; i < sh.n; i++) {
        dsrc.push_back(DeviceBuffer::from(src[size_t(i)]));
        all.src[i] = dsrc.back().as<float>();
        row.src[i] = all.src[i] + size_t(sh.T / 2) * sh.D;
      }
      DeviceBuffer dnw = DeviceBuffer::from(nw), dpw = DeviceBuffer::from(pw), dout(n * 4),
                   d1(size_t(sh.D) * 4), dblk(n * 4);
      REQUIRE(ops::attn_res_mix(all, dnw.as<float>(), dpw.as<float>(), dout.as<float>(), sh.T, sh.D,
                                1e-5f, bf, nullptr)
                  .ok());
      auto got = dout.to_vector<float>(n);
      check_nmse(got, want, bf ? kNmseBf16 : kNmseF32);
      REQUIRE(ops::attn_res_mix(row, dnw.as<float>(), dpw.as<float>(), d1.as<float>(), 1, sh.D,
                                1e-5f, bf, nullptr)
                  .ok());
      CHECK(std::memcmp(d1.to_vector<float>(size_t(sh.D)).data(),
                        got.data() + size_t(sh.T / 2) * sh.D, size_t(sh.D) * 4) == 0);
      REQUIRE(ops::attn_res_mix_row_blocks(all, dnw.as<float>(), dpw.as<float>(), dblk.as<float>(),
                                           sh.T, sh.D, 1e-5f, bf, nullptr)
                  .ok());
      check_nmse(dblk.to_vector<float>(n), want, bf ? kNmseBf16 : kNmseF32);
    }
  }
}

TEST_CASE("ops gpu: SiTU and SiLU GLUs, separate and fused gate|up", "[gpu]") {
  strata::test::skip_without_gpu();
  const int T = 3;
  for (int I : {3072, 6144, 33792, 7}) {
    for (int kind = 0; kind < 3; kind++) {  // SiTU β2=25, SiTU without β2, SiLU
      for (bool bf : {false, true}) {
        INFO("I " << I << " kind " << kind << " bf16 " << bf);
        Rng r{uint64_t(I) * 7 + kind * 2 + bf};
        const size_t n = size_t(T) * I;
        auto g = r.normals(n, 4.0f, bf), u = r.normals(n, 30.0f, bf);
        ref::Glu ra;
        ops::GluParams ga;
        ra.kind = kind == 2 ? ref::GluKind::silu : ref::GluKind::situ;
        ga.kind = kind == 2 ? ops::GluKind::silu : ops::GluKind::situ;
        ra.beta2 = ga.beta2 = kind == 1 ? 0.0f : 25.0f;
        std::vector<float> want(n);
        ref::glu(ra, g.data(), u.data(), want.data(), int64_t(n),
                 bf ? ref::Precision::bf16 : ref::Precision::fp32);
        DeviceBuffer du = DeviceBuffer::from(u);
        auto got = run_gpu_unary(g, n, [&](const float* in, float* out) {
          return ops::glu(ga, in, du.as<float>(), out, int64_t(n), bf, nullptr);
        });
        check_nmse(got, want, bf ? kNmseBf16 : kNmseF32);
        std::vector<float> gu(2 * n);
        for (int t = 0; t < T; t++)
          for (int c = 0; c < I; c++) {
            gu[size_t(t) * 2 * I + c] = g[size_t(t) * I + c];
            gu[size_t(t) * 2 * I + I + c] = u[size_t(t) * I + c];
          }
        auto fused = run_gpu_unary(gu, n, [&](const float* in, float* out) {
          return ops::glu_fused(ga, in, out, T, I, bf, nullptr);
        });
        CHECK(std::memcmp(fused.data(), got.data(), n * 4) == 0);  // same op, same bits
        if (bf) {  // one pass: gate|up rounded on read, h as bf16 — the three passes' bits
          std::vector<float> gur(gu.size());
          for (size_t i = 0; i < gu.size(); i++) gur[i] = strata::round_bf16(gu[i] * 1.0001f);
          std::vector<float> gun(gu.size());
          for (size_t i = 0; i < gu.size(); i++) gun[i] = gu[i] * 1.0001f;  // off the bf16 grid
          auto three = run_gpu_unary(gur, n, [&](const float* in, float* out) {
            return ops::glu_fused(ga, in, out, T, I, true, nullptr);
          });
          DeviceBuffer din = DeviceBuffer::from(gun), dhb(n * 2);
          REQUIRE(ops::glu_fused_bf16(ga, din.as<float>(), dhb.as<uint16_t>(), T, I, nullptr).ok());
          const std::vector<uint16_t> hb = dhb.to_vector<uint16_t>(n);
          size_t bad = 0;
          for (size_t i = 0; i < n; i++) bad += hb[i] != strata::f32_to_bf16(three[i]);
          CHECK(bad == 0);
        }
      }
    }
  }
}

TEST_CASE("ops gpu: router top-k selection (K3 and Kimi-Linear forms)", "[gpu]") {
  strata::test::skip_without_gpu();
  struct S {
    int E, k, T;
    ref::RouterForm form;
    float scaling;
    bool bias;
  };
  for (S sh : {S{896, 16, 9, ref::RouterForm::unbiased, 1.0f, true},
               S{256, 8, 5, ref::RouterForm::biased_in_place, 2.446f, true},
               S{37, 5, 3, ref::RouterForm::unbiased, 1.0f, false},
               S{4, 4, 2, ref::RouterForm::unbiased, 1.0f, true}}) {
    INFO("E " << sh.E << " topk " << sh.k);
    Rng r{uint64_t(sh.E)};
    auto logits = r.normals(size_t(sh.T) * sh.E, 2.0f);
    std::vector<float> bias(size_t(sh.E));
    for (float& b : bias) b = 0.01f * r.normal();
    // Ties: two experts with identical logits and bias; the lower id must win.
    logits[10 % sh.E] = logits[3 % sh.E] = 9.0f;
    bias[10 % sh.E] = bias[3 % sh.E];
    ref::RouterParams rp;
    rp.E = sh.E, rp.topk = sh.k, rp.form = sh.form, rp.scaling = sh.scaling;
    rp.bias = sh.bias ? bias.data() : nullptr;
    std::vector<int32_t> want_ids(size_t(sh.T) * sh.k);
    std::vector<float> want_w(want_ids.size());
    ref::route(logits.data(), rp, want_ids.data(), want_w.data(), nullptr, sh.T);

    DeviceBuffer dl = DeviceBuffer::from(logits), db = DeviceBuffer::from(bias),
                 di(want_ids.size() * 4), dw(want_ids.size() * 4);
    ops::RouterParams gp;
    gp.E = sh.E, gp.topk = sh.k, gp.scaling = sh.scaling;
    gp.form = sh.form == ref::RouterForm::unbiased ? ops::RouterForm::unbiased
                                                   : ops::RouterForm::biased_in_place;
    gp.bias = sh.bias ? db.as<float>() : nullptr;
    REQUIRE(ops::route(dl.as<float>(), gp, di.as<int32_t>(), dw.as<float>(), sh.T, nullptr).ok());
    auto ids = di.to_vector<int32_t>(want_ids.size());
    auto w = dw.to_vector<float>(want_ids.size());
    CHECK(ids == want_ids);
    double max_rel = 0;
    for (size_t i = 0; i < w.size(); i++)
      max_rel = std::max(max_rel, std::fabs(double(w[i]) - want_w[i]) / std::fabs(want_w[i]));
    CHECK(max_rel <= 1e-5);
  }
  ops::RouterParams bad;
  bad.E = 2000, bad.topk = 16;
  CHECK_FALSE(ops::route(nullptr, bad, nullptr, nullptr, 1, nullptr).ok());
}

TEST_CASE("ops gpu: embedding gather and bf16 conversions are exact", "[gpu]") {
  strata::test::skip_without_gpu();
  const int vocab = 1000, D = 7168, T = 6;
  Rng r{5};
  std::vector<uint16_t> table(size_t(vocab) * D);
  for (auto& b : table) b = strata::f32_to_bf16(r.normal());
  const std::vector<int32_t> ids = {0, 999, 17, 17, -1, 1000};  // last two out of range → NaN
  DeviceBuffer dt = DeviceBuffer::from(table), di = DeviceBuffer::from(ids),
               dout(size_t(T) * D * 4);
  REQUIRE(ops::embedding_gather(dt.as<uint16_t>(), vocab, D, di.as<int32_t>(), T, dout.as<float>(),
                                nullptr)
              .ok());
  auto got = dout.to_vector<float>(size_t(T) * D);
  size_t bad = 0;
  for (int t = 0; t < T; t++)
    for (int d = 0; d < D; d++) {
      const float g = got[size_t(t) * D + d];
      if (ids[size_t(t)] < 0 || ids[size_t(t)] >= vocab)
        bad += !std::isnan(g);
      else
        bad += g != strata::bf16_to_f32(table[size_t(ids[size_t(t)]) * D + d]);
    }
  CHECK(bad == 0);

  std::vector<float> x = r.normals(4099, 100.0f);
  x[1] = NAN, x[2] = INFINITY, x[3] = -0.0f, x[4] = 1.0f + 1.0f / 256;  // a tie: rounds to even
  DeviceBuffer dx = DeviceBuffer::from(x), db(x.size() * 2), dback(x.size() * 4);
  REQUIRE(ops::f32_to_bf16(dx.as<float>(), db.as<uint16_t>(), int64_t(x.size()), nullptr).ok());
  REQUIRE(ops::bf16_to_f32(db.as<uint16_t>(), dback.as<float>(), int64_t(x.size()), nullptr).ok());
  auto b = db.to_vector<uint16_t>(x.size());
  size_t diff = 0;
  for (size_t i = 0; i < x.size(); i++) diff += b[i] != strata::f32_to_bf16(x[i]);
  CHECK(diff == 0);
  auto back = dback.to_vector<float>(x.size());
  diff = 0;
  for (size_t i = 0; i < x.size(); i++)
    diff += !(std::isnan(x[i]) ? std::isnan(back[i]) : back[i] == strata::round_bf16(x[i]));
  CHECK(diff == 0);
}

// ------------------------------------------------------------------------------------------------
// Sampling: the GPU draw is checked against the semantics (kernels/sample/sample.h) computed on the
// host in fp64 with the same uniform: the picked token must sit where the uniform falls in the
// cumulative distribution of the kept candidates, within 1e-9 of the total mass (both sides sum
// in double, in other orders; the fp32 sums of the first version needed 1e-4 and shifted edges
// by whole candidates over 163,840 tiny tail probabilities).

namespace {

bool consistent_draw(const float* logits, int V, const strata::kernels::sample::SamplingParams& p,
                     double u, int32_t got) {
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int i = 0; i < V; i++) order[size_t(i)] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (p.temperature <= 0.0f) return got == order[0];
  const int n = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  std::vector<double> pr(static_cast<size_t>(n));
  double z = 0;
  for (int i = 0; i < n; i++)
    z += pr[size_t(i)] =
        std::exp((double(logits[order[size_t(i)]]) - logits[order[0]]) / p.temperature);
  const double tol = 1e-9 * z;
  int m = n;
  if (p.top_p < 1.0f) {
    double c = 0;
    for (int i = 0; i < n; i++) {
      c += pr[size_t(i)];
      if (c >= p.top_p * z) {
        m = i + 1;
        break;
      }
    }
  }
  double zk = 0;
  for (int i = 0; i < m; i++) zk += pr[size_t(i)];
  int k = -1;
  double before = 0;
  for (int i = 0; i < n; i++) {
    if (order[size_t(i)] == got) {
      k = i;
      break;
    }
    before += pr[size_t(i)];
  }
  if (k < 0) return false;                                          // outside the top-k
  if (p.top_p < 1.0f && before >= p.top_p * z + tol) return false;  // outside the nucleus
  const double target = double(u) * zk;
  return before <= target + tol && before + pr[size_t(k)] >= target - tol;
}

}  // namespace

TEST_CASE("sample gpu: greedy, temperature, top-k, top-p match a host sampler", "[gpu]") {
  strata::test::skip_without_gpu();
  namespace smp = strata::kernels::sample;
  struct S {
    int B, V;
    smp::SamplingParams p;
  };
  const S cases[] = {{4, 163840, {0.0f, 0, 1.0f}},   {16, 163840, {1.0f, 0, 0.95f}},
                     {16, 163840, {0.7f, 40, 1.0f}}, {16, 1000, {1.3f, 50, 0.9f}},
                     {8, 7, {1.0f, 0, 1.0f}},        {8, 3000, {0.5f, 1, 1.0f}}};
  for (const S& c : cases) {
    INFO("B " << c.B << " V " << c.V << " T " << c.p.temperature << " top_k " << c.p.top_k
              << " top_p " << c.p.top_p);
    Rng r{uint64_t(c.V) + uint64_t(c.p.top_k)};
    auto logits = r.normals(size_t(c.B) * c.V, 3.0f);
    logits[7 % c.V] = logits[2 % c.V] = 50.0f;  // a tie at the top of row 0: lower id wins greedy
    std::vector<double> u(size_t(c.B));
    for (double& x : u) x = r.uniform();
    DeviceBuffer dl = DeviceBuffer::from(logits), du = DeviceBuffer::from(u), dids(size_t(c.B) * 4),
                 ws(smp::sample_workspace_bytes(c.B, c.V));
    strata::kernels::Status s = smp::sample(dl.as<float>(), c.B, c.V, c.p, du.as<double>(),
                                            dids.as<int32_t>(), ws.get(), ws.bytes(), nullptr);
    INFO("status " << s.message);
    REQUIRE(s.ok());
    auto ids = dids.to_vector<int32_t>(size_t(c.B));
    int bad = 0;
    for (int b = 0; b < c.B; b++) {
      if (!consistent_draw(logits.data() + size_t(b) * c.V, c.V, c.p, u[size_t(b)],
                           ids[size_t(b)])) {
        bad++;
        UNSCOPED_INFO("row " << b << ": gpu picked " << ids[size_t(b)]);
      }
    }
    CHECK(bad == 0);
  }
}

// Routing → expert groups on the device (kernels/moe/groups.h) against the host's grouping: pairs
// sorted by (expert, token), one group per distinct expert in increasing id, empty groups up to
// g_cap, and the merge list mapping (t, k) to its pair row. K3's 896 experts top-16 at 1, 8 and
// 256 tokens (the largest decode step), and a small E where every expert repeats.
TEST_CASE("moe gpu: routing to expert groups on the device matches the host grouping", "[gpu]") {
  strata::test::skip_without_gpu();
  using strata::Mxfp4ExpertView;
  for (const auto& [E, K, T] : std::vector<std::array<int, 3>>{{896, 16, 1},
                                                               {896, 16, 8},
                                                               {896, 16, 9},
                                                               {896, 16, 64},
                                                               {896, 16, 256},
                                                               {64, 16, 8},
                                                               {5, 4, 3}}) {
    INFO("E " << E << " K " << K << " T " << T);
    Rng rng(uint64_t(E * 1000 + T));
    const int n = T * K;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int t = 0; t < T; ++t) {  // K distinct experts per token, increasing
      std::vector<int32_t> all(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) all[size_t(e)] = e;
      for (int k = 0; k < K; ++k)
        std::swap(all[size_t(k)], all[size_t(k + int(rng.next() % uint64_t(E - k)))]);
      std::sort(all.begin(), all.begin() + K);
      std::copy(all.begin(), all.begin() + K, ids.begin() + t * K);
    }
    // Slot table: expert e in slot (E − 1 − e); a view per slot tagged by its slot in `hidden`.
    std::vector<int32_t> slot_of(static_cast<size_t>(E));
    std::vector<Mxfp4ExpertView> by_slot(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) {
      slot_of[size_t(e)] = E - 1 - e;
      by_slot[size_t(E - 1 - e)].hidden = E - 1 - e;
    }
    const int g_cap = std::min(n, E);
    DeviceBuffer d_ids = DeviceBuffer::from(ids), d_slot = DeviceBuffer::from(slot_of),
                 d_by = DeviceBuffer::from(by_slot);
    DeviceBuffer d_views(size_t(g_cap) * sizeof(Mxfp4ExpertView)), d_goff(size_t(g_cap + 1) * 4),
        d_ptok(size_t(n) * 4), d_pair(size_t(n) * 4);
    REQUIRE(strata::kernels::moe::build_groups(d_ids.as<int32_t>(), n, K, d_slot.as<int32_t>(),
                                               d_by.as<Mxfp4ExpertView>(), g_cap,
                                               d_views.as<Mxfp4ExpertView>(), d_goff.as<int32_t>(),
                                               d_ptok.as<int32_t>(), d_pair.as<int32_t>(), nullptr)
                .ok());
    strata::kernels::device_sync("build_groups");
    const auto views = d_views.to_vector<Mxfp4ExpertView>(size_t(g_cap));
    const auto goff = d_goff.to_vector<int32_t>(size_t(g_cap + 1));
    const auto ptok = d_ptok.to_vector<int32_t>(size_t(n));
    const auto pair = d_pair.to_vector<int32_t>(size_t(n));
    // Host: (expert, token, index) sorted.
    std::vector<std::array<int, 3>> keys;
    for (int i = 0; i < n; ++i) keys.push_back({ids[size_t(i)], i / K, i});
    std::sort(keys.begin(), keys.begin() + n);
    int g = 0;
    for (int p = 0; p < n; ++p) {
      if (p == 0 || keys[size_t(p)][0] != keys[size_t(p - 1)][0]) {
        REQUIRE(g < g_cap);
        CHECK(goff[size_t(g)] == p);
        CHECK(views[size_t(g)].hidden == slot_of[size_t(keys[size_t(p)][0])]);
        ++g;
      }
      CHECK(ptok[size_t(p)] == keys[size_t(p)][1]);
      CHECK(pair[size_t(keys[size_t(p)][2])] == p);
    }
    for (int h = g; h <= g_cap; ++h) CHECK(goff[size_t(h)] == n);  // empty groups at the end
  }
}

// The engine's non-finite scan: the record ends at the first site in call order and, in it, the
// first element, with the class; clean scans leave it untouched.
TEST_CASE("ops gpu: the non-finite scan keeps the first site and element", "[gpu]") {
  strata::test::skip_without_gpu();
  const int64_t n = 7168 * 9;
  std::vector<float> clean(size_t(n), 1.0f), a = clean, b = clean;
  a[size_t(n - 3)] = -INFINITY;
  a[size_t(40001)] = INFINITY;
  b[size_t(5)] = NAN;
  DeviceBuffer dc = DeviceBuffer::from(clean), da = DeviceBuffer::from(a),
               db = DeviceBuffer::from(b);
  std::vector<uint64_t> init = {ops::kFiniteClean};
  DeviceBuffer rec = DeviceBuffer::from(init);
  REQUIRE(ops::finite_scan(dc.as<float>(), n, 0, rec.as<uint64_t>(), nullptr).ok());
  strata::kernels::device_sync("finite_scan");
  CHECK(rec.to_vector<uint64_t>(1)[0] == ops::kFiniteClean);
  REQUIRE(ops::finite_scan(da.as<float>(), n, 3, rec.as<uint64_t>(), nullptr).ok());
  REQUIRE(ops::finite_scan(db.as<float>(), n, 4, rec.as<uint64_t>(), nullptr).ok());
  strata::kernels::device_sync("finite_scan");
  CHECK(rec.to_vector<uint64_t>(1)[0] == ops::finite_key(3, 40001, 1));
  REQUIRE(ops::finite_scan(db.as<float>(), n, 2, rec.as<uint64_t>(), nullptr).ok());
  strata::kernels::device_sync("finite_scan");
  CHECK(rec.to_vector<uint64_t>(1)[0] == ops::finite_key(2, 5, 0));
  // The scan fused into the residual add: add_inplace's sums (bf16-rounded or not), the same
  // record as finite_scan of the addend.
  for (bool rb : {false, true}) {
    INFO("round " << rb);
    Rng r{77 + uint64_t(rb)};
    const auto x = r.normals(size_t(n), 2.0f, true);
    auto y = r.normals(size_t(n), 1.0f, true);
    DeviceBuffer acc1 = DeviceBuffer::from(x), acc2 = DeviceBuffer::from(x),
                 dy = DeviceBuffer::from(y);
    std::vector<uint64_t> clean_rec = {ops::kFiniteClean};
    DeviceBuffer r1 = DeviceBuffer::from(clean_rec);
    REQUIRE(ops::add_inplace(acc1.as<float>(), dy.as<float>(), n, rb, nullptr).ok());
    REQUIRE(ops::add_inplace_scan(acc2.as<float>(), dy.as<float>(), n, rb, 6, r1.as<uint64_t>(),
                                  nullptr)
                .ok());
    strata::kernels::device_sync("add_inplace_scan");
    CHECK(acc1.to_vector<float>(size_t(n)) == acc2.to_vector<float>(size_t(n)));
    CHECK(r1.to_vector<uint64_t>(1)[0] == ops::kFiniteClean);  // a clean addend
    y[size_t(n - 2)] = NAN;
    y[size_t(7000)] = -INFINITY;
    y[size_t(9001)] = INFINITY;
    DeviceBuffer dy2 = DeviceBuffer::from(y), r2 = DeviceBuffer::from(clean_rec);
    REQUIRE(ops::add_inplace_scan(acc2.as<float>(), dy2.as<float>(), n, rb, 6, r2.as<uint64_t>(),
                                  nullptr)
                .ok());
    strata::kernels::device_sync("add_inplace_scan");
    CHECK(r2.to_vector<uint64_t>(1)[0] == ops::finite_key(6, 7000, 2));
  }
}
