// Unit tests of the reference MLA: absorbed == expanded (prefill and decode), causality, decode ==
// the last row of prefill, a one-position hand check, latent-cache rows, bf16 mode.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/ref/ops.h"
#include "storage/bf16.h"
#include "storage/error.h"
#include "test_data.h"

namespace ref = strata::cpu::ref;
using ref::Precision;

using strata::test::max_abs_diff;
using strata::test::randn;
using strata::test::to_bf16;

namespace {

float max_abs(const std::vector<float>& a) {
  float m = 0;
  for (float x : a) m = std::max(m, std::fabs(x));
  return m;
}

struct MlaCase {
  ref::MlaDims d;
  int64_t S;
  std::vector<float> q, cache;
  std::vector<uint16_t> kv_b;
  ref::WeightView kvb() const {
    return ref::WeightView::bf16(kv_b.data(), d.H * (d.nope + d.v), d.kv_lora);
  }
};

MlaCase make_case(ref::MlaDims d, int64_t S, uint32_t seed) {
  MlaCase c{d, S, {}, {}, {}};
  c.q = randn(static_cast<size_t>(S * d.H * d.q_dim()), seed, 0.5f);
  // Cache rows from raw kv_a outputs through the latent norm (eps 1e-6 as released).
  const auto ckv = randn(static_cast<size_t>(S * d.cache_dim()), seed + 1);
  auto w = randn(static_cast<size_t>(d.kv_lora), seed + 2, 0.1f);
  for (auto& x : w) x += 1.0f;
  c.cache.resize(ckv.size());
  ref::mla_latent_rows(ckv.data(), w.data(), c.cache.data(), S, d, 1e-6f, Precision::fp32);
  c.kv_b = to_bf16(randn(static_cast<size_t>(d.H * (d.nope + d.v) * d.kv_lora), seed + 3,
                         1.0f / std::sqrt(float(d.kv_lora))));
  return c;
}

}  // namespace

TEST_CASE("ref MLA latent rows: latent normalised, rope part copied", "[ref][mla]") {
  ref::MlaDims d{1, 4, 2, 4, 4};
  const std::vector<float> ckv = {1, 2, 3, 4, 7, -8}, w = {1, 1, 2, 2};
  std::vector<float> rows(6);
  ref::mla_latent_rows(ckv.data(), w.data(), rows.data(), 1, d, 0.0f, Precision::fp32);
  const double r = 1.0 / std::sqrt(7.5);  // mean of 1,4,9,16
  CHECK(rows[0] == Approx(1 * r).epsilon(1e-6));
  CHECK(rows[3] == Approx(2 * 4 * r).epsilon(1e-6));
  CHECK(rows[4] == 7.0f);
  CHECK(rows[5] == -8.0f);
  CHECK(d.scale() == Approx(1.0 / std::sqrt(6.0)));
}

TEST_CASE("ref MLA absorbed equals expanded (prefill, decode), causal, decode = prefill row",
          "[ref][mla]") {
  // Odd small dims, then K3's per-head dims (nope 128, rope 64, v 128, kv_lora 512) with 2 heads.
  for (auto [d, S] :
       {std::pair<ref::MlaDims, int64_t>{{3, 16, 8, 12, 32}, 11}, {{2, 128, 64, 128, 512}, 9}}) {
    const auto c = make_case(d, S, 40);
    const int64_t n_out = S * d.H * d.v;
    std::vector<float> oe(static_cast<size_t>(n_out)), oa(static_cast<size_t>(n_out));
    ref::mla_attention_expanded(c.q.data(), c.cache.data(), S, c.kvb(), d, oe.data(), S,
                                Precision::fp32);
    ref::mla_attention_absorbed(c.q.data(), c.cache.data(), S, c.kvb(), d, oa.data(), S,
                                Precision::fp32);
    // Same algebra, different association: scores differ by fp32 rounding of nope- and
    // kv_lora-length dots (values O(1), relative ~1e-6), the softmax maps that to ~1e-6 relative
    // weight changes, and the value mix reassociates over kv_lora. 1e-5 of max|o| covers it with
    // margin; a wrong head slice or scale gives O(1) differences.
    INFO("H " << d.H << " kv_lora " << d.kv_lora);
    CHECK(max_abs_diff(oa, oe) <= 1e-5f * std::max(1.0f, max_abs(oe)));

    // Decode: the last query alone (T = 1 at position S−1) gives the last prefill row exactly,
    // in both forms.
    const int64_t row = (S - 1) * d.H * d.v;
    const float* q_last = c.q.data() + (S - 1) * d.H * d.q_dim();
    std::vector<float> de(static_cast<size_t>(d.H * d.v)), da(static_cast<size_t>(d.H * d.v));
    ref::mla_attention_expanded(q_last, c.cache.data(), S, c.kvb(), d, de.data(), 1,
                                Precision::fp32);
    ref::mla_attention_absorbed(q_last, c.cache.data(), S, c.kvb(), d, da.data(), 1,
                                Precision::fp32);
    CHECK(std::memcmp(de.data(), oe.data() + row, de.size() * 4) == 0);
    CHECK(std::memcmp(da.data(), oa.data() + row, da.size() * 4) == 0);

    // Causality: poisoning the last cache row changes only the last query's output.
    auto poisoned = c.cache;
    for (int64_t j = 0; j < d.cache_dim(); ++j) poisoned[size_t((S - 1) * d.cache_dim() + j)] = NAN;
    std::vector<float> pe(static_cast<size_t>(n_out)), pa(static_cast<size_t>(n_out));
    ref::mla_attention_expanded(c.q.data(), poisoned.data(), S, c.kvb(), d, pe.data(), S,
                                Precision::fp32);
    ref::mla_attention_absorbed(c.q.data(), poisoned.data(), S, c.kvb(), d, pa.data(), S,
                                Precision::fp32);
    CHECK(std::memcmp(pe.data(), oe.data(), size_t(row) * 4) == 0);
    CHECK(std::memcmp(pa.data(), oa.data(), size_t(row) * 4) == 0);
    CHECK(std::isnan(pe[size_t(row)]));
    CHECK(std::isnan(pa[size_t(row)]));

    // bf16 mode: bf16 outputs within bf16 noise of fp32 (kv / q_lat and the output rounded).
    std::vector<float> be(static_cast<size_t>(n_out)), ba(static_cast<size_t>(n_out));
    ref::mla_attention_expanded(c.q.data(), c.cache.data(), S, c.kvb(), d, be.data(), S,
                                Precision::bf16);
    ref::mla_attention_absorbed(c.q.data(), c.cache.data(), S, c.kvb(), d, ba.data(), S,
                                Precision::bf16);
    for (size_t i = 0; i < be.size(); ++i) {
      CHECK(strata::round_bf16(be[i]) == be[i]);
      CHECK(strata::round_bf16(ba[i]) == ba[i]);
    }
    CHECK(max_abs_diff(be, oe) <= 2e-2f * max_abs(oe));
    CHECK(max_abs_diff(ba, oe) <= 2e-2f * max_abs(oe));
  }
}

TEST_CASE("ref MLA one cached position: the output is that position's value", "[ref][mla]") {
  // S = 1: softmax over one score is 1, so out_h = W_UV_h · ĉ_0 whatever q is.
  ref::MlaDims d{2, 4, 2, 3, 8};
  const auto c = make_case(d, 1, 50);
  std::vector<float> oe(static_cast<size_t>(d.H * d.v)), oa(static_cast<size_t>(d.H * d.v));
  ref::mla_attention_expanded(c.q.data(), c.cache.data(), 1, c.kvb(), d, oe.data(), 1,
                              Precision::fp32);
  ref::mla_attention_absorbed(c.q.data(), c.cache.data(), 1, c.kvb(), d, oa.data(), 1,
                              Precision::fp32);
  const auto W = c.kvb().to_f32();
  for (int64_t h = 0; h < d.H; ++h) {
    for (int64_t e = 0; e < d.v; ++e) {
      double s = 0;
      for (int64_t j = 0; j < d.kv_lora; ++j) {
        s += double(W[size_t((h * (d.nope + d.v) + d.nope + e) * d.kv_lora + j)]) *
             c.cache[size_t(j)];
      }
      CHECK(oe[size_t(h * d.v + e)] == Approx(s).margin(1e-6));
      CHECK(oa[size_t(h * d.v + e)] == Approx(s).margin(1e-6));
    }
  }
  // A kv_b of the wrong shape is reported with the expected shape.
  const auto bad = ref::WeightView::bf16(c.kv_b.data(), d.H * (d.nope + d.v) - 1, d.kv_lora);
  CHECK_THROWS_AS(ref::mla_attention_absorbed(c.q.data(), c.cache.data(), 1, bad, d, oa.data(), 1,
                                              Precision::fp32),
                  strata::Error);
}
