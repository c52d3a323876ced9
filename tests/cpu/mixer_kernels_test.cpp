// The fast token-mixer cores (cpu/mixer_kernels.h) against the reference ops at K3's shapes (KDA
// 96 heads × 128, MLA 96 heads, latent 512 + rope 64, nope 128, v 128) and small ones.
//
// Tolerances. fp32 paths (the KDA recurrence; MLA absorbed in fp32 mode): the same operations in
// another order, FMA instead of multiply-then-add. One step of either is a few dot products of
// length K = 128 (error ≤ γ_128·Σ|terms| ≈ 8e-6 relative), and the KDA state update
// S ← S(I − βkkᵀ) with ‖k‖ = 1, β ∈ (0, 1), decay ≤ 1 does not amplify an error already in S, so
// over T tokens errors add at most linearly: we allow 2·(T + 1)·γ_128 relative to the largest
// output. bf16 paths (the bf16 model's MLA): q_lat or the expanded k/v are GEMM outputs rounded to
// bf16, and an fp32 order difference moves an element across a rounding boundary now and then (a
// 2^-8 relative change of that element): the outputs must be bf16 values and agree with the
// reference within a relative L2 error of 2^-8 (every element one bf16 ulp apart would give
// about 2^-9).
#include <catch2/catch.hpp>

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/bf16_linear.h"
#include "cpu/mixer_kernels.h"
#include "cpu/ref/ops.h"
#include "skip.h"
#include "storage/bf16.h"
#include "test_data.h"

namespace cpu = strata::cpu;
namespace ref = strata::cpu::ref;
using ref::Precision;

namespace {

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}
double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double n = 0, d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    n += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    d += double(ref[i]) * ref[i];
  }
  return std::sqrt(n / d);
}
bool all_bf16(const std::vector<float>& v) {
  for (float x : v)
    if (strata::round_bf16(x) != x) return false;
  return true;
}
double gamma(int64_t n) {
  const double u = std::ldexp(1.0, -24);
  return double(n) * u / (1.0 - double(n) * u);
}

// KDA inputs as the backend prepares them: q, k L2-normalised, g log decay in [−5, 0), β in (0, 1).
struct KdaInputs {
  std::vector<float> q, k, v, g, beta, S;
  KdaInputs(int64_t T, int64_t H, int64_t K, uint32_t seed) {
    q = strata::test::randn(size_t(T * H * K), seed);
    k = strata::test::randn(size_t(T * H * K), seed + 1);
    v = strata::test::randn(size_t(T * H * K), seed + 2);
    g = strata::test::randn(size_t(T * H * K), seed + 3);
    beta = strata::test::randn(size_t(T * H), seed + 4);
    ref::l2_norm(q.data(), q.data(), T * H, K, 1e-6f, Precision::fp32);
    ref::l2_norm(k.data(), k.data(), T * H, K, 1e-6f, Precision::fp32);
    for (float& x : g) x = -5.0f * ref::sigmoid(x);
    ref::kda_beta(beta.data(), beta.data(), T * H);
    S = strata::test::randn(size_t(H * K * K), seed + 5, 0.3f);
  }
};

}  // namespace

TEST_CASE("fast KDA recurrence matches the reference", "[mixer_kernels]") {
  if (!cpu::mixer_kernels_avx512())
    STRATA_SKIP("no AVX-512 on this CPU (the fast call is the reference op itself)");
  struct Case {
    int64_t T, H, K;
  };
  for (const Case& c : {Case{1, 96, 128}, Case{4, 96, 128}, Case{33, 3, 128}, Case{7, 2, 64}}) {
    const int64_t T = c.T, H = c.H, K = c.K;
    KdaInputs in(T, H, K, uint32_t(T * 7 + H));
    const float scale = 1.0f / std::sqrt(float(K));
    std::vector<float> o_ref(size_t(T * H * K)), o_fast(o_ref.size());
    std::vector<float> S_ref = in.S, S_fast = in.S;
    ref::kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                       S_ref.data(), o_ref.data(), T, H, K, K, scale);
    cpu::kda_recurrent_fast(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                            S_fast.data(), o_fast.data(), T, H, K, K, scale);
    const double tol = 2.0 * double(T + 1) * gamma(K);
    INFO("T=" << T << " H=" << H << " K=" << K << ": output "
              << max_diff(o_fast, o_ref) / max_abs(o_ref) << ", state "
              << max_diff(S_fast, S_ref) / max_abs(S_ref) << " (bound " << tol << ")");
    CHECK(max_diff(o_fast, o_ref) <= tol * max_abs(o_ref));
    CHECK(max_diff(S_fast, S_ref) <= tol * max_abs(S_ref));
    // Zero initial state (nullptr) is the same as an explicit zero state.
    std::vector<float> o_null(o_ref.size()), zero(in.S.size(), 0.0f);
    cpu::kda_recurrent_fast(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                            nullptr, o_null.data(), T, H, K, K, scale);
    cpu::kda_recurrent_fast(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                            zero.data(), o_fast.data(), T, H, K, K, scale);
    CHECK(o_null == o_fast);
  }
}

TEST_CASE("fast chunked KDA matches the reference chunked form and the recurrence",
          "[mixer_kernels]") {
  if (!cpu::mixer_kernels_avx512())
    STRATA_SKIP("no AVX-512 on this CPU (the fast call is the reference op itself)");
  struct Case {
    int64_t T, H, K;
  };
  // Odd lengths around the chunk (64) and the 16-row blocks, K3's 96 heads, a 64-wide head.
  for (const Case& c : {Case{1, 2, 128}, Case{16, 2, 128}, Case{17, 2, 128}, Case{63, 2, 128},
                        Case{64, 96, 128}, Case{65, 2, 128}, Case{200, 3, 128}, Case{70, 2, 64}}) {
    const int64_t T = c.T, H = c.H, K = c.K;
    KdaInputs in(T, H, K, uint32_t(T * 3 + H));
    const float scale = 1.0f / std::sqrt(float(K));
    std::vector<float> o_ref(size_t(T * H * K)), o_rec(o_ref.size()), o_fast(o_ref.size());
    std::vector<float> S_ref = in.S, S_rec = in.S, S_fast = in.S;
    ref::kda_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                     S_ref.data(), o_ref.data(), T, H, K, K, scale);
    ref::kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                       S_rec.data(), o_rec.data(), T, H, K, K, scale);
    const unsigned csr = _mm_getcsr();
    cpu::kda_chunked_fast(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(),
                          S_fast.data(), o_fast.data(), T, H, K, K, scale);
    // The kernel flushes subnormals on its threads (these gates, up to e^−5 per step, underflow
    // within a chunk) and gives the calling thread, which runs heads too, its own mode back.
    CHECK(_mm_getcsr() == csr);
    // A chunk chains dot products of length K and sums over ≤ 64 rows (forward substitution,
    // W, U, O, the state update): ≈ (K + 64)·u per step, not growing over chunks (the state map
    // is contracting); the vector exp adds ≤ 2 ulp per factor.
    const double tol = 4.0 * gamma(K + 64);
    INFO("T=" << T << " H=" << H << " K=" << K << ": vs chunked ref: output "
              << max_diff(o_fast, o_ref) / max_abs(o_ref) << ", state "
              << max_diff(S_fast, S_ref) / max_abs(S_ref) << "; vs recurrence: output "
              << max_diff(o_fast, o_rec) / max_abs(o_rec) << " (bound " << tol << ")");
    CHECK(max_diff(o_fast, o_ref) <= tol * max_abs(o_ref));
    CHECK(max_diff(S_fast, S_ref) <= tol * max_abs(S_ref));
    CHECK(max_diff(o_fast, o_rec) <= tol * max_abs(o_rec));
  }
}

TEST_CASE("fast MLA attention (absorbed and expanded) matches the reference", "[mixer_kernels]") {
  if (!cpu::mixer_kernels_avx512())
    STRATA_SKIP("no AVX-512 on this CPU (the fast call is the reference op itself)");
  struct Case {
    int64_t H, nope, rope, v, C, S, T;
  };
  cpu::Bf16Linear lin;
  for (const Case& c : {Case{96, 128, 64, 128, 512, 40, 1}, Case{96, 128, 64, 128, 512, 24, 24},
                        Case{3, 32, 16, 48, 96, 9, 4}, Case{2, 64, 32, 64, 128, 5, 1},
                        Case{3, 32, 16, 48, 96, 100, 70}, Case{4, 32, 16, 48, 96, 700, 2}}) {
    ref::MlaDims d;
    d.H = c.H;
    d.nope = c.nope;
    d.rope = c.rope;
    d.v = c.v;
    d.kv_lora = c.C;
    // bf16-valued queries, cache rows and kv_b, as in the bf16 model.
    auto bf = [](std::vector<float> x) {
      for (float& f : x) f = strata::round_bf16(f);
      return x;
    };
    const std::vector<float> q = bf(strata::test::randn(size_t(c.T * c.H * d.q_dim()), 11));
    const std::vector<float> cache = bf(strata::test::randn(size_t(c.S * d.cache_dim()), 12));
    const std::vector<uint16_t> kvb = strata::test::to_bf16(
        strata::test::randn(size_t(c.H * (c.nope + c.v) * c.C), 13, 1.0f / std::sqrt(float(c.C))));
    const auto W = ref::WeightView::bf16(kvb.data(), c.H * (c.nope + c.v), c.C);
    INFO("H=" << c.H << " C=" << c.C << " S=" << c.S << " T=" << c.T);
    std::vector<float> o_ref(size_t(c.T * c.H * c.v)), o_fast(o_ref.size());
    // Absorbed, fp32: fp32 reorderings only. Each output is a chain of length-C/nope/S sums.
    ref::mla_attention_absorbed(q.data(), cache.data(), c.S, W, d, o_ref.data(), c.T,
                                Precision::fp32);
    cpu::mla_attention_absorbed_fast(q.data(), cache.data(), c.S, W, d, o_fast.data(), c.T,
                                     Precision::fp32);
    const double tol32 = 4.0 * gamma(c.C + c.nope + c.S);
    INFO("absorbed fp32: " << max_diff(o_fast, o_ref) / max_abs(o_ref) << " (bound " << tol32
                           << ")");
    CHECK(max_diff(o_fast, o_ref) <= tol32 * max_abs(o_ref));
    // Absorbed and expanded, bf16: rounding boundaries crossed now and then.
    ref::mla_attention_absorbed(q.data(), cache.data(), c.S, W, d, o_ref.data(), c.T,
                                Precision::bf16);
    cpu::mla_attention_absorbed_fast(q.data(), cache.data(), c.S, W, d, o_fast.data(), c.T,
                                     Precision::bf16);
    INFO("absorbed bf16: rel L2 " << rel_l2(o_fast, o_ref));
    CHECK(all_bf16(o_fast));
    CHECK(rel_l2(o_fast, o_ref) <= std::ldexp(1.0, -8));
    ref::mla_attention_expanded(q.data(), cache.data(), c.S, W, d, o_ref.data(), c.T,
                                Precision::bf16);
    cpu::mla_attention_expanded_fast(q.data(), cache.data(), c.S, W, d, o_fast.data(), c.T,
                                     Precision::bf16, lin);
    INFO("expanded bf16: rel L2 " << rel_l2(o_fast, o_ref));
    CHECK(all_bf16(o_fast));
    CHECK(rel_l2(o_fast, o_ref) <= std::ldexp(1.0, -8));
  }
}

TEST_CASE("fast MLA decode of several sequences in one call: each query's bits as alone",
          "[mixer_kernels]") {
  // 19 sequences (two groups of the batched kernel) of lengths 1 … 1000 at k3-mini's and an odd
  // shape: every output equal, bit for bit, to the single-sequence call; without AVX-512 both are
  // the reference op.
  struct Shape {
    int64_t H, nope, rope, v, C;
  };
  const std::vector<int64_t> lens = {1, 2,   5,  127, 128, 129, 300, 1000, 3,  64,
                                     7, 256, 17, 1,   90,  511, 2,   33,   700};
  for (const Shape& sh : {Shape{8, 128, 64, 128, 512}, Shape{3, 32, 16, 48, 96}}) {
    ref::MlaDims d;
    d.H = sh.H, d.nope = sh.nope, d.rope = sh.rope, d.v = sh.v, d.kv_lora = sh.C;
    const std::vector<uint16_t> kvb = strata::test::to_bf16(strata::test::randn(
        size_t(sh.H * (sh.nope + sh.v) * sh.C), 21, 1.0f / std::sqrt(float(sh.C))));
    const auto W = ref::WeightView::bf16(kvb.data(), sh.H * (sh.nope + sh.v), sh.C);
    std::vector<std::vector<float>> q, cache;
    for (size_t j = 0; j < lens.size(); ++j) {
      q.push_back(strata::test::randn(size_t(sh.H * d.q_dim()), 100 + uint32_t(j)));
      cache.push_back(strata::test::randn(size_t(lens[j] * d.cache_dim()), 200 + uint32_t(j)));
    }
    for (Precision p : {Precision::fp32, Precision::bf16}) {
      INFO("H=" << sh.H << " C=" << sh.C << (p == Precision::bf16 ? " bf16" : " fp32"));
      std::vector<std::vector<float>> alone(lens.size()), batch(lens.size());
      std::vector<cpu::MlaDecodeQuery> qs;
      for (size_t j = 0; j < lens.size(); ++j) {
        alone[j].assign(size_t(sh.H * sh.v), 0.0f);
        batch[j].assign(size_t(sh.H * sh.v), -1.0f);
        cpu::mla_attention_absorbed_fast(q[j].data(), cache[j].data(), lens[j], W, d,
                                         alone[j].data(), 1, p);
        qs.push_back({q[j].data(), cache[j].data(), lens[j], batch[j].data()});
      }
      cpu::mla_attention_absorbed_batch_fast(qs.data(), int64_t(qs.size()), W, d, p);
      for (size_t j = 0; j < lens.size(); ++j) {
        INFO("sequence " << j << ", length " << lens[j]);
        CHECK(std::memcmp(batch[j].data(), alone[j].data(), alone[j].size() * sizeof(float)) == 0);
      }
      // And the single call agrees with the reference (its own test bounds it more closely).
      std::vector<float> r(size_t(sh.H * sh.v));
      ref::mla_attention_absorbed(q[7].data(), cache[7].data(), lens[7], W, d, r.data(), 1, p);
      CHECK(rel_l2(batch[7], r) <= 1e-2);
    }
  }
}

TEST_CASE("fast KDA recurrence of several sequences in one call: each one's bits as alone",
          "[mixer_kernels]") {
  // Five sequences of 1–3 tokens with their own states (one without: zero, discarded), K = 128
  // and 64: outputs and states equal, bit for bit, to one call per sequence.
  for (int64_t K : {int64_t(128), int64_t(64)}) {
    const int64_t H = 3;
    const std::vector<int64_t> Ts = {1, 1, 3, 1, 2};
    std::vector<KdaInputs> in;
    for (size_t i = 0; i < Ts.size(); ++i) in.emplace_back(Ts[i], H, K, uint32_t(40 + 10 * i));
    std::vector<std::vector<float>> S_alone, S_batch, o_alone, o_batch;
    std::vector<cpu::KdaSeq> seqs;
    for (size_t i = 0; i < Ts.size(); ++i) {
      S_alone.push_back(in[i].S), S_batch.push_back(in[i].S);
      o_alone.emplace_back(size_t(Ts[i] * H * K), 0.0f);
      o_batch.emplace_back(size_t(Ts[i] * H * K), -1.0f);
    }
    for (size_t i = 0; i < Ts.size(); ++i) {
      const bool stateless = i == 3;
      const KdaInputs& x = in[i];
      cpu::kda_recurrent_fast(x.q.data(), x.k.data(), x.v.data(), x.g.data(), x.beta.data(),
                              stateless ? nullptr : S_alone[i].data(), o_alone[i].data(), Ts[i], H,
                              K, K, 0.088f);
      seqs.push_back({x.q.data(), x.k.data(), x.v.data(), x.g.data(), x.beta.data(),
                      stateless ? nullptr : S_batch[i].data(), o_batch[i].data(), Ts[i]});
    }
    cpu::kda_recurrent_seqs_fast(seqs.data(), int64_t(seqs.size()), H, K, K, 0.088f);
    for (size_t i = 0; i < Ts.size(); ++i) {
      INFO("K=" << K << ", sequence " << i << ", T=" << Ts[i]);
      CHECK(o_batch[i] == o_alone[i]);
      CHECK(S_batch[i] == S_alone[i]);
    }
    CHECK(S_batch[3] == in[3].S);  // no state: nothing written
  }
}
