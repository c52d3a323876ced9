// CPU check of chunk_prep_tc2 (see run.sh): emulated kernel against a double-precision reference.
#include <cstdio>
#include <random>
#include "tc2_kernel.h"
using namespace strata::kernels::kda;
static uint16_t tobf(float f) {
  return bf16_rn(f);
}
static float frombf(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}
int main(int argc, char** argv) {
  const int H = 2, HK = H * D, N = 2;
  const int lens[N] = {75, 40};
  const int64_t stride = argc > 1 ? atoi(argv[1]) : 3 * HK;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> U(-1, 1);
  std::normal_distribution<float> Nd(0, 1);
  const int R = lens[0] + lens[1];
  std::vector<uint16_t> qkv(size_t(R) * stride + 3 * HK), z(size_t(R) * HK), b(size_t(R) * H),
      conv(size_t(N) * 3 * HK * 3);
  for (auto& x : qkv) x = tobf(Nd(rng));
  for (auto& x : z) x = tobf(Nd(rng));
  for (auto& x : b) x = tobf(Nd(rng));
  for (auto& x : conv) x = tobf(Nd(rng));
  std::vector<float> wq(HK * 4), wk(HK * 4), wv(HK * 4), A_log(H), dt(HK);
  for (auto* w : {&wq, &wk, &wv})
    for (auto& x : *w) x = 0.6f * U(rng);
  for (auto& x : A_log) x = U(rng);
  for (auto& x : dt) x = -1.25f + 1.75f * U(rng);
  std::vector<uint16_t> gout(size_t(R) * HK);
  for (auto& x : gout) x = tobf(Nd(rng));
  std::vector<float> onw(D), S0(size_t(N) * H * D * D);
  for (auto& x : onw) x = 1.0f + 0.2f * U(rng);
  for (auto& x : S0) x = 0.1f * Nd(rng);
  Params p;
  p.H = H, p.conv_q = wq.data(), p.conv_k = wk.data(), p.conv_v = wv.data(), p.A_log = A_log.data();
  p.dt_bias = dt.data();
  Inputs in;
  in.q = qkv.data(), in.k = qkv.data() + HK, in.v = qkv.data() + 2 * HK, in.qkv_stride = stride;
  in.z = z.data(), in.b = b.data();
  SeqTable tbl{};
  tbl.cu[0] = 0, tbl.cu[1] = lens[0], tbl.cu[2] = lens[0] + lens[1];
  const int nc = 3;
  std::vector<float> ws(size_t(N) * nc * H * kChunkFloats, NAN);
  float* wsp = ws.data();
  launch(dim3{unsigned(nc), unsigned(H), unsigned(N)}, kThreads, kPrepTc2Smem,
         [&] { chunk_prep_tc2(p, in, tbl, conv.data(), 0, nc, wsp); });
  // The scan, both variants, from the same state: the state must match bit for bit (tf32_op's add
  // is cvt.rna's rounding), y up to rare bf16 flips from the fast σ.
  std::vector<float> S1 = S0, S2 = S0;
  std::vector<uint16_t> y1(size_t(R) * HK, 0xffff), y2(size_t(R) * HK, 0xffff);
  launch(dim3{unsigned(H), unsigned(N), 1}, kThreads, kScanTcSmem, [&] {
    chunk_scan_tc<false>(H, tbl, 0, nc, wsp, S1.data(), gout.data(), onw.data(), 1e-5f, y1.data());
  });
  launch(dim3{unsigned(H), unsigned(N), 1}, kThreads, kScanTcSmem, [&] {
    chunk_scan_tc<true>(H, tbl, 0, nc, wsp, S2.data(), gout.data(), onw.data(), 1e-5f, y2.data());
  });
  size_t state_diff = 0, y_diff = 0;
  for (size_t i = 0; i < S1.size(); i++) state_diff += memcmp(&S1[i], &S2[i], 4) != 0;
  for (size_t i = 0; i < y1.size(); i++) y_diff += y1[i] != y2[i];
  printf("scan<true> vs scan<false>: %zu of %zu state values differ, %zu of %zu y values\n",
         state_diff, S1.size(), y_diff, y1.size());
  // Reference in double: the prep's definitions per chunk, and the recurrence token by token
  // (S ← diag(e^g) S; S += β k (v − Sᵀk)ᵀ; o = Sᵀq; y = bf16(RMSNorm(bf16(o))·w·σ(gate))).
  std::vector<double> Sref(S0.begin(), S0.end());  // [n][h][v][k]
  std::vector<float> yref(size_t(R) * HK, 0.f);
  double worst[6] = {0, 0, 0, 0, 0, 0};
  const char* names[6] = {"W", "U", "Qg", "Kt", "A", "gC"};
  for (int n = 0; n < N; n++)
    for (int h = 0; h < H; h++)
      for (int j = 0; j * C < lens[n]; j++) {
        const int start = tbl.cu[n], L = lens[n], p0 = j * C, rows = std::min(C, L - p0);
        std::vector<double> q(C * D, 0), k(C * D, 0), v(C * D, 0), G(C * D, 0), beta(C, 0);
        const std::vector<float>* ws3[3] = {&wq, &wk, &wv};
        for (int r = 0; r < rows; r++) {
          const int pos = p0 + r;
          for (int d = 0; d < D; d++) {
            const int ch = h * D + d;
            for (int part = 0; part < 3; part++) {
              double a = 0;
              for (int t = 0; t < 4; t++) {
                const int sp = pos - 3 + t;
                const float x =
                    sp >= 0 ? frombf(qkv[size_t(start + sp) * stride + part * HK + ch])
                            : frombf(conv[(size_t(n) * 3 * HK + part * HK + ch) * 3 + sp + 3]);
                a += double((*ws3[part])[ch * 4 + t]) * x;
              }
              const double s = a / (1 + std::exp(-a));
              (part == 0 ? q : part == 1 ? k : v)[r * D + d] = frombf(tobf(float(s)));
            }
            const double xg = frombf(z[size_t(start + pos) * HK + ch]) + dt[ch];
            const double g = -5.0 / (1 + std::exp(-std::exp(A_log[h]) * xg));
            G[r * D + d] = g;
          }
          beta[r] = 1 / (1 + std::exp(-double(frombf(b[size_t(start + pos) * H + h]))));
        }
        for (int d = 0; d < D; d++)
          for (int r = 1; r < C; r++) G[r * D + d] += G[(r - 1) * D + d];
        for (int r = 0; r < C; r++)
          for (int which = 0; which < 2; which++) {
            double* x = (which ? k : q).data() + r * D;
            double ss = 0;
            for (int d = 0; d < D; d++) ss += x[d] * x[d];
            const double rs = 1 / std::sqrt(ss + 1e-6);
            for (int d = 0; d < D; d++)
              x[d] = frombf(tobf(float(x[d] * rs))) * (which ? 1.0 : 1 / std::sqrt(128.0));
          }
        std::vector<double> Wr(C * D), Ur(C * D), Qr(C * D), Kr(C * D), Ar(C * C, 0), Lr(C * C, 0),
            gr(D);
        for (int r = 0; r < C; r++)
          for (int d = 0; d < D; d++) {
            Qr[r * D + d] = q[r * D + d] * std::exp(G[r * D + d]);
            Kr[r * D + d] = k[r * D + d] * std::exp(G[(C - 1) * D + d] - G[r * D + d]);
          }
        for (int d = 0; d < D; d++) gr[d] = std::exp(G[(C - 1) * D + d]);
        for (int r = 0; r < C; r++)
          for (int i = 0; i <= r; i++) {
            double a = 0, l = 0;
            for (int d = 0; d < D; d++) {
              const double e = std::exp(G[r * D + d] - G[i * D + d]);
              a += q[r * D + d] * k[i * D + d] * e;
              l += k[r * D + d] * k[i * D + d] * e;
            }
            Ar[r * C + i] = a;
            if (i < r) Lr[r * C + i] = beta[r] * l;
          }
        for (int d = 0; d < D; d++)
          for (int r = 0; r < C; r++) {
            double w = beta[r] * k[r * D + d] * std::exp(G[r * D + d]), u = beta[r] * v[r * D + d];
            for (int i = 0; i < r; i++)
              w -= Lr[r * C + i] * Wr[i * D + d], u -= Lr[r * C + i] * Ur[i * D + d];
            Wr[r * D + d] = w, Ur[r * D + d] = u;
          }
        double* Sh = Sref.data() + (size_t(n) * H + h) * D * D;
        for (int r = 0; r < rows; r++) {
          const int pos = p0 + r;
          std::vector<double> kv(D, 0), o(D, 0);
          for (int vv = 0; vv < D; vv++)
            for (int kk = 0; kk < D; kk++) {
              const double gk = G[r * D + kk] - (r > 0 ? G[(r - 1) * D + kk] : 0.0);
              Sh[vv * D + kk] *= std::exp(gk);
              kv[vv] += Sh[vv * D + kk] * k[r * D + kk];
            }
          for (int vv = 0; vv < D; vv++) {
            const double dv = beta[r] * (v[r * D + vv] - kv[vv]);
            for (int kk = 0; kk < D; kk++) Sh[vv * D + kk] += k[r * D + kk] * dv;
            for (int kk = 0; kk < D; kk++) o[vv] += Sh[vv * D + kk] * q[r * D + kk];
          }
          double ss = 0;
          for (int vv = 0; vv < D; vv++) o[vv] = frombf(tobf(float(o[vv]))), ss += o[vv] * o[vv];
          const double rstd = 1 / std::sqrt(ss / D + 1e-5);
          for (int vv = 0; vv < D; vv++) {
            const double ga = frombf(gout[size_t(start + pos) * HK + h * D + vv]);
            yref[size_t(start + pos) * HK + h * D + vv] =
                frombf(tobf(float(o[vv] * rstd * onw[vv] / (1 + std::exp(-ga)))));
          }
        }
        const float* blk = wsp + ((int64_t(n) * nc + j) * H + h) * kChunkFloats;
        const std::vector<double>* refs[6] = {&Wr, &Ur, &Qr, &Kr, &Ar, &gr};
        const int64_t off[6] = {0, C * D, 2 * C * D, 3 * C * D, 4 * C * D, 4 * C * D + C * C};
        for (int a = 0; a < 6; a++) {
          double num = 0, den = 0, mx = 0, mref = 0;
          bool nonfinite = false;
          for (size_t i = 0; i < refs[a]->size(); i++) {
            const double got = blk[off[a] + i], want = (*refs[a])[i];
            if (!std::isfinite(got)) nonfinite = true;
            num += (got - want) * (got - want), den += want * want;
            mx = std::max(mx, std::abs(got - want)), mref = std::max(mref, std::abs(want));
          }
          const double rel = std::sqrt(num / std::max(den, 1e-300));
          worst[a] = std::max(worst[a], nonfinite ? 1e9 : rel);
          if (rel > 2e-3 || nonfinite)
            printf("n=%d h=%d chunk=%d rows=%d %s rel_l2=%.3e max_abs=%.3e ref_max=%.3e%s\n", n, h,
                   j, rows, names[a], rel, mx, mref, nonfinite ? " NONFINITE" : "");
        }
      }
  for (int a = 0; a < 6; a++) printf("worst rel_l2 %s %.3e\n", names[a], worst[a]);
  // End to end (tc2 prep + the fast scan) against the recurrence; the test's tolerances are
  // y rel L2 ≤ 5e-3 and state ≤ 2e-3 (tf32 operands in the scan).
  double num = 0, den = 0;
  for (size_t i = 0; i < yref.size(); i++) {
    const double d = frombf(y2[i]) - yref[i];
    num += d * d, den += double(yref[i]) * yref[i];
  }
  printf("end to end: y rel_l2 %.3e", std::sqrt(num / den));
  num = den = 0;
  for (size_t i = 0; i < Sref.size(); i++) {
    const double d = S2[i] - Sref[i];
    num += d * d, den += Sref[i] * Sref[i];
  }
  printf(", state rel_l2 %.3e\n", std::sqrt(num / den));
}
