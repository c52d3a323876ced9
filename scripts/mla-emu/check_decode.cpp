// CPU check of MLA decode's attn_wgmma (see run.sh): the emulated kernel's split states, merged
// on the host, against a double-precision softmax attention over the same bf16 q_lat and cache.
#include <cstdio>
#include <random>
#include "wg_kernel.h"
using namespace strata::kernels::mla;

struct Case {
  int H, B;
  std::vector<int32_t> lens;
  int64_t chunk;  // positions per split (a multiple of 64)
};

static int run(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  const int H = c.H, B = c.B;
  const int64_t Lmax = *std::max_element(c.lens.begin(), c.lens.end());
  const int64_t stride = Lmax * kCacheDim;
  const int splits = int((Lmax + c.chunk - 1) / c.chunk);
  std::vector<uint16_t> qlat(size_t(B) * H * kCacheDim), cache(size_t(B) * stride);
  for (auto& x : qlat) x = bf16_rn(N(rng));
  for (int b = 0; b < B; b++)
    for (int64_t i = 0; i < stride; i++)
      cache[b * stride + i] = i < int64_t(c.lens[b]) * kCacheDim ? bf16_rn(N(rng)) : 0x7fc0;
  std::vector<float> part(size_t(B) * splits * H * kLatent, NAN),
      ml(size_t(B) * splits * H * 2, NAN);
  Ws ws{qlat.data(), part.data(), nullptr, ml.data()};
  Lens lens{};
  for (int b = 0; b < B; b++) lens.len[b] = c.lens[b];
  const int hpb = wg_heads(H);
  const float qscale = float(1.0 / std::sqrt(192.0) * 1.4426950408889634);
  launch(dim3{unsigned((H + hpb - 1) / hpb), unsigned(splits), unsigned(B)}, kWThreads, kWSmem,
         [&] {
           attn_wgmma(H, hpb, cache.data(), stride, lens, nullptr, int(Lmax), c.chunk, splits,
                      qscale, ws);
         });
  double err2 = 0, ref2 = 0;
  int bad = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      // merge as merge_ctx does
      float M = -INFINITY;
      for (int s = 0; s < splits; s++) M = std::max(M, ml[((size_t(b) * splits + s) * H + h) * 2]);
      std::vector<double> ctx(kLatent, 0.0);
      double L = 0;
      for (int s = 0; s < splits; s++) {
        const float* m = &ml[((size_t(b) * splits + s) * H + h) * 2];
        if (!(m[1] > 0.f)) continue;
        const double w = std::exp2(double(m[0]) - M);
        L += w * m[1];
        for (int d = 0; d < kLatent; d++)
          ctx[d] += w * part[((size_t(b) * splits + s) * H + h) * kLatent + d];
      }
      // reference
      const int len = c.lens[b];
      std::vector<double> sc(len);
      double mx = -INFINITY;
      for (int j = 0; j < len; j++) {
        double acc = 0;
        for (int d = 0; d < kCacheDim; d++)
          acc += double(bf16_f(qlat[(size_t(b) * H + h) * kCacheDim + d])) *
                 bf16_f(cache[b * stride + int64_t(j) * kCacheDim + d]);
        sc[j] = acc * qscale;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0;
      std::vector<double> ref(kLatent, 0.0);
      for (int j = 0; j < len; j++) {
        const double p = std::exp2(sc[j] - mx);
        sum += p;
        for (int d = 0; d < kLatent; d++)
          ref[d] += p * bf16_f(cache[b * stride + int64_t(j) * kCacheDim + d]);
      }
      for (int d = 0; d < kLatent; d++) {
        const double r = ref[d] / sum, g = ctx[d] / L;
        if (!std::isfinite(g)) bad++;
        err2 += (g - r) * (g - r);
        ref2 += r * r;
      }
    }
  const double rel = std::sqrt(err2 / ref2);
  std::printf("H=%d B=%d lens", H, B);
  for (int L : c.lens) std::printf(" %d", L);
  std::printf(" chunk %lld splits %d: rel L2 %.3e, non-finite %d -> %s\n", (long long)c.chunk,
              splits, rel, bad, rel < 2e-3 && bad == 0 ? "ok" : "FAIL");
  return rel < 2e-3 && bad == 0 ? 0 : 1;
}

int main() {
  int fails = 0;
  // 96 heads (2 blocks of 48): 5-tile splits with a partial last tile, a short sequence whose
  // later splits are empty, a single-row sequence; odd split lengths (1, 2, 3 tiles).
  fails += run({96, 3, {1000, 130, 1}, 320}, 1);
  fails += run({96, 1, {449}, 192}, 2);
  fails += run({64, 1, {64}, 64}, 3);
  fails += run({100, 1, {300}, 128}, 4);
  fails += run({3, 2, {700, 65}, 448}, 5);
  std::printf(fails ? "FAILED\n" : "all ok\n");
  return fails ? 1 : 0;
}
