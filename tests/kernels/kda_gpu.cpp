// Op-check of the CUDA KDA kernels (kernels/kda/kda.h) against the fp32 reference ops
// (cpu/ref/ops.h): chunked prefill over several calls and sequences, then decode steps, compared
// with the naive recurrence token by token — outputs, the fp32 state and the conv state. K3 shapes
// (96 heads × 128), odd small shapes, both gate forms, and a long sequence in many passes.
//
// Tolerances: y is bf16 after a norm of a bf16 o; GPU and reference round at the same points, so
// the differences are fp32 summation order, exp approximations and the rare bf16 rounding flip
// they cause (each ≤ 2^-8 relative on one element): rel L2 ≤ 5e-3 and cosine ≥ 0.9999 bound them
// with margin. The fp32 state sees the same sources without output rounding: rel L2 ≤ 2e-3. The
// conv state is a copy of bf16 inputs: exact.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <numeric>

#include "attn_gpu_util.h"
#include "cpu/ref/ops.h"
#include "gpu_test.h"
#include "kernels/kda/kda.h"
#include "kernels/runtime.h"

namespace {

using namespace strata;
using namespace strata::test;
namespace kk = strata::kernels::kda;
namespace ref = strata::cpu::ref;

struct KdaCase {
  int H = 3;
  std::vector<std::vector<int>> calls;  // per prefill call: the token count of each sequence
  kk::GateForm form = kk::GateForm::bounded;
  int decode_steps = 0;
  bool random_initial_state = true;
  int64_t max_chunks = 0;  // > 0 forces several passes per call
  int decode_split = 0;    // CTAs per head in decode (0: decode_split_for(N))
  // >= 0: q, k, v interleaved in one [rows, 3·H·K + qkv_pad] buffer (the engine's fused
  // projection layout when 0; an odd pad makes the row stride odd, which chunk_prep_tc2's pair
  // loads cannot take, so prefill falls back to chunk_prep_tc). −1: three [rows, H·K] buffers.
  int qkv_pad = -1;
};

constexpr int D = 128;

// Per-sequence reference state: fp32 recurrent [H, V, K] and conv states [C, 3] per projection.
struct RefSeq {
  std::vector<float> S, cq, ck, cv;
};

// The reference for T tokens of one sequence; returns y [T, H·V] (bf16 values).
std::vector<float> ref_kda(const ref::KdaGate& gate, const std::vector<float>& wq,
                           const std::vector<float>& wk, const std::vector<float>& wv,
                           const std::vector<float>& onw, RefSeq& st, const float* q,
                           const float* k, const float* v, const float* z, const float* b,
                           const float* g_out, int64_t T, int H, bool decode_path) {
  const int64_t HK = int64_t(H) * D;
  std::vector<float> qc(T * HK), kc(T * HK), vc(T * HK), g(T * HK), beta(T * H), o(T * HK),
      y(T * HK);
  ref::short_conv_silu(q, wq.data(), st.cq.data(), qc.data(), T, HK, 4, ref::Precision::bf16);
  ref::short_conv_silu(k, wk.data(), st.ck.data(), kc.data(), T, HK, 4, ref::Precision::bf16);
  ref::short_conv_silu(v, wv.data(), st.cv.data(), vc.data(), T, HK, 4, ref::Precision::bf16);
  const auto l2p = decode_path ? ref::Precision::fp32 : ref::Precision::bf16;
  ref::l2_norm(qc.data(), qc.data(), T * H, D, 1e-6f, l2p);
  ref::l2_norm(kc.data(), kc.data(), T * H, D, 1e-6f, l2p);
  ref::kda_gate(gate, z, g.data(), T, H, D);
  ref::kda_beta(b, beta.data(), T * H);
  ref::kda_recurrent(qc.data(), kc.data(), vc.data(), g.data(), beta.data(), st.S.data(), o.data(),
                     T, H, D, D, 1.0f / std::sqrt(float(D)));
  ref::round_bf16_inplace(o.data(), int64_t(o.size()));
  ref::gated_rms_norm(o.data(), g_out, onw.data(), y.data(), T * H, D, 1e-5f, ref::Precision::bf16);
  return y;
}

void run_kda_case(const KdaCase& kc, uint32_t seed) {
  skip_without_gpu();
  std::mt19937 rng(seed);
  const int H = kc.H, N = int(kc.calls[0].size());
  const int64_t HK = int64_t(H) * D, CH = 3 * HK;
  // Parameters.
  auto wq = random_uniform(HK * 4, rng, -0.6f, 0.6f), wk = random_uniform(HK * 4, rng, -0.6f, 0.6f),
       wv = random_uniform(HK * 4, rng, -0.6f, 0.6f);
  const bool bounded = kc.form == kk::GateForm::bounded;
  auto A_log =
      bounded ? random_uniform(H, rng, -1.f, 1.f) : random_uniform(H, rng, 0.f, std::log(16.f));
  auto dt_bias =
      bounded ? random_uniform(HK, rng, -3.f, 0.5f) : random_uniform(HK, rng, -6.9f, -2.2f);
  auto onw = random_uniform(D, rng, 0.8f, 1.2f);
  ref::KdaGate gate;
  gate.form = bounded ? ref::KdaGateForm::bounded : ref::KdaGateForm::softplus;
  gate.A_log = A_log.data();
  gate.dt_bias = dt_bias.data();
  gate.lower_bound = -5.f;
  DevBuf<float> d_wq(wq), d_wk(wk), d_wv(wv), d_A(A_log), d_dt(dt_bias), d_onw(onw);
  kk::Params p;
  p.H = H;
  p.conv_q = d_wq.p;
  p.conv_k = d_wk.p;
  p.conv_v = d_wv.p;
  p.gate_form = kc.form;
  p.A_log = d_A.p;
  p.dt_bias = d_dt.p;
  p.o_norm_w = d_onw.p;

  // States: random (a continued sequence) or zero (a fresh one), same on both sides.
  std::vector<RefSeq> rs(N);
  std::vector<float> S0(size_t(N) * H * D * D, 0.f);
  std::vector<uint16_t> conv0(size_t(N) * CH * 3, 0);
  if (kc.random_initial_state) {
    auto s = random_bf16(S0.size(), rng, 0.1f);
    S0 = s.f32;
    conv0 = random_bf16(conv0.size(), rng, 1.f).bits;
  }
  for (int n = 0; n < N; n++) {
    rs[n].S.assign(S0.begin() + int64_t(n) * H * D * D, S0.begin() + int64_t(n + 1) * H * D * D);
    for (auto* part : {&rs[n].cq, &rs[n].ck, &rs[n].cv}) part->resize(HK * 3);
    for (int64_t c = 0; c < CH; c++)
      for (int j = 0; j < 3; j++) {
        const float x = bf16_to_f32(conv0[(n * CH + c) * 3 + j]);
        (c < HK ? rs[n].cq : c < 2 * HK ? rs[n].ck : rs[n].cv)[(c % HK) * 3 + j] = x;
      }
  }
  DevBuf<float> d_S(S0);
  DevBuf<uint16_t> d_conv(conv0);
  kk::State st{d_S.p, d_conv.p};

  // One batch of rows (prefill call or decode step): random inputs, GPU run, reference, compare.
  auto run_rows = [&](const std::vector<int>& lens, bool decode, const char* what) {
    std::vector<int32_t> cu(N + 1, 0);
    for (int n = 0; n < N; n++) cu[n + 1] = cu[n] + lens[n];
    const int64_t R = cu[N];
    if (R == 0) return;
    auto q = random_bf16(R * HK, rng, 1.f), k = random_bf16(R * HK, rng, 1.f),
         v = random_bf16(R * HK, rng, 1.f), z = random_bf16(R * HK, rng, 1.f),
         b = random_bf16(R * H, rng, 1.f), go = random_bf16(R * HK, rng, 1.f);
    const int64_t stride = kc.qkv_pad >= 0 ? 3 * HK + kc.qkv_pad : HK;
    std::vector<uint16_t> qkv;
    if (kc.qkv_pad >= 0) {
      qkv.assign(size_t(R * stride), 0x7fc0);  // NaN in the pad columns
      for (int64_t r = 0; r < R; r++)
        for (int part = 0; part < 3; part++)
          std::memcpy(&qkv[size_t(r * stride + part * HK)],
                      &(part == 0   ? q
                        : part == 1 ? k
                                    : v)
                           .bits[size_t(r * HK)],
                      HK * 2);
    }
    DevBuf<uint16_t> dq(kc.qkv_pad >= 0 ? qkv : q.bits), dk(k.bits), dv(v.bits), dz(z.bits),
        db(b.bits), dg(go.bits);
    DevBuf<uint16_t> dy(R * HK);
    dy.fill_bytes(0xff);  // NaN: every row must be written
    kk::Inputs in{dq.p, dk.p, dv.p, stride, dz.p, db.p, dg.p};
    if (kc.qkv_pad >= 0) in.k = dq.p + HK, in.v = dq.p + 2 * HK;
    if (decode) {
      auto s = kk::decode(p, in, N, st, dy.p, nullptr, nullptr, kc.decode_split);
      INFO(s.message);
      REQUIRE(s.ok());
    } else {
      const int64_t max_len = *std::max_element(lens.begin(), lens.end());
      const size_t wsb = kk::prefill_workspace_bytes(H, N, max_len, kc.max_chunks);
      DevBuf<uint8_t> ws(wsb);
      ws.fill_bytes(0xff);  // NaN: nothing unwritten may be read
      auto s = kk::prefill(p, in, cu.data(), N, st, dy.p, ws.p, wsb, nullptr);
      INFO(s.message);
      REQUIRE(s.ok());
    }
    CUDA_REQUIRE(cudaDeviceSynchronize());
    auto y = widen(dy.download());
    std::vector<float> yref(R * HK);
    for (int n = 0; n < N; n++) {
      const int64_t r0 = cu[n], T = lens[n];
      if (T == 0) continue;
      auto yr =
          ref_kda(gate, wq, wk, wv, onw, rs[n], &q.f32[r0 * HK], &k.f32[r0 * HK], &v.f32[r0 * HK],
                  &z.f32[r0 * HK], &b.f32[r0 * H], &go.f32[r0 * HK], T, H, decode);
      std::copy(yr.begin(), yr.end(), yref.begin() + r0 * HK);
    }
    const Diff d = compare(y, yref);
    INFO(what << ": y " << d.str());
    CHECK(d.nonfinite_mismatch == 0);
    CHECK(d.rel_l2 <= 5e-3);
    CHECK(d.cosine >= 0.9999);
  };

  for (size_t c = 0; c < kc.calls.size(); c++) run_rows(kc.calls[c], false, "prefill call");
  for (int s = 0; s < kc.decode_steps; s++) run_rows(std::vector<int>(N, 1), true, "decode step");

  // Final states.
  auto S = d_S.download();
  std::vector<float> Sref;
  for (int n = 0; n < N; n++) Sref.insert(Sref.end(), rs[n].S.begin(), rs[n].S.end());
  const Diff ds = compare(S, Sref);
  INFO("recurrent state " << ds.str());
  CHECK(ds.nonfinite_mismatch == 0);
  CHECK(ds.rel_l2 <= 2e-3);
  auto conv = d_conv.download();
  size_t conv_mismatch = 0;
  for (int n = 0; n < N; n++)
    for (int64_t c = 0; c < CH; c++)
      for (int j = 0; j < 3; j++) {
        const float x = (c < HK ? rs[n].cq : c < 2 * HK ? rs[n].ck : rs[n].cv)[(c % HK) * 3 + j];
        if (bf16_to_f32(conv[(n * CH + c) * 3 + j]) != x) conv_mismatch++;
      }
  CHECK(conv_mismatch == 0);
}

}  // namespace

TEST_CASE("kda gpu: odd small shapes, bounded gate, 3 sequences over 2 calls, then decode",
          "[gpu][kda]") {
  KdaCase c;
  c.H = 3;
  c.calls = {{1, 37, 70}, {0, 33, 5}};
  c.decode_steps = 3;
  run_kda_case(c, 11);
}

TEST_CASE("kda gpu: softplus gate (Kimi-Linear), one sequence over 4 calls, fresh state",
          "[gpu][kda]") {
  KdaCase c;
  c.H = 2;
  c.form = kk::GateForm::softplus;
  c.calls = {{64}, {31}, {1}, {100}};
  c.decode_steps = 2;
  c.random_initial_state = false;
  run_kda_case(c, 12);
}

TEST_CASE("kda gpu: K3 shape (96 heads x 128), 2 sequences, prefill then decode", "[gpu][kda]") {
  KdaCase c;
  c.H = 96;
  c.calls = {{300, 129}};
  c.decode_steps = 2;
  run_kda_case(c, 13);
}

TEST_CASE("kda gpu: long sequence (256K tokens) in many passes equals the recurrence",
          "[gpu][kda]") {
  KdaCase c;
  c.H = 1;
  c.calls = {{262147}};
  c.max_chunks = 1000;  // 8193 chunks → 9 passes carrying the state
  c.decode_steps = 1;
  run_kda_case(c, 14);
}

// Several K3-shape sequences whose lengths end mid-chunk, over two calls in passes of 7 chunks:
// the per-sequence chunk ranges, inert rows past each end and the state carried between passes.
// (Run with STRATA_KDA_PREFILL=fp32 and STRATA_KDA_PREP=tc as well: every prefill path against
// the reference.)
TEST_CASE("kda gpu: K3 shape, 4 ragged sequences, 2 calls in passes of 7 chunks", "[gpu][kda]") {
  KdaCase c;
  c.H = 96;
  c.calls = {{1000, 77, 515, 33}, {45, 0, 300, 64}};
  c.max_chunks = 7;
  c.decode_steps = 1;
  run_kda_case(c, 40);
}

// q, k, v interleaved in one buffer as the engine's fused projection writes them (row stride
// 3·H·K, unlike z's H·K), then with an odd row stride (the prefill's unaligned fallback).
TEST_CASE("kda gpu: K3 shape, q/k/v interleaved in one buffer, even and odd row stride",
          "[gpu][kda]") {
  for (int pad : {0, 1}) {
    INFO("qkv_pad " << pad);
    KdaCase c;
    c.H = 96;
    c.calls = {{200, 45}, {70, 0}};
    c.max_chunks = 3;
    c.decode_steps = 1;
    c.qkv_pad = pad;
    run_kda_case(c, 41 + pad);
  }
}

// Decode alone (no prefill call: one empty call fixes the sequence count) from a random state,
// with every split of the state rows over CTAs: the same recurrence whichever CTA owns a row, the
// q/k conv state written once after every CTA of the head has read it.
TEST_CASE("kda gpu: decode with 1, 2, 4 and 8 CTAs per head, K3 shape, 3 sequences", "[gpu][kda]") {
  for (int split : {1, 2, 4, 8}) {
    INFO("split " << split);
    KdaCase c;
    c.H = 96;
    c.calls = {{0, 0, 0}};
    c.decode_steps = 3;
    c.decode_split = split;
    run_kda_case(c, 15 + split);
  }
}

TEST_CASE("kda gpu: decode with every split, odd small shape, softplus gate, fresh state",
          "[gpu][kda]") {
  for (int split : {1, 2, 4, 8}) {
    INFO("split " << split);
    KdaCase c;
    c.H = 5;
    c.form = kk::GateForm::softplus;
    c.calls = {{0, 0}};
    c.decode_steps = 4;
    c.random_initial_state = false;
    c.decode_split = split;
    run_kda_case(c, 25 + split);
  }
}

TEST_CASE("kda gpu: unsupported head size is refused with a reason", "[gpu][kda]") {
  kk::Params p;
  p.H = 2;
  p.K = 64;
  kk::Inputs in;
  kk::State st;
  auto s = kk::decode(p, in, 1, st, nullptr, nullptr, nullptr);
  REQUIRE_FALSE(s.ok());
  REQUIRE(std::string(s.message).find("128") != std::string::npos);
}

TEST_CASE("kda gpu: decode refuses a split other than 0, 1, 2, 4 or 8", "[gpu][kda]") {
  skip_without_gpu();
  // Valid-looking (never dereferenced) pointers: the split is checked before any launch.
  DevBuf<float> f(4 * 128 * 4);
  DevBuf<uint16_t> u(4 * 128 * 9);
  kk::Params p;
  p.H = 1;
  p.conv_q = p.conv_k = p.conv_v = p.A_log = p.dt_bias = p.o_norm_w = f.p;
  kk::Inputs in{u.p, u.p, u.p, 128, u.p, u.p, u.p};
  kk::State st{f.p, u.p};
  auto s = kk::decode(p, in, 1, st, u.p, nullptr, nullptr, 3);
  REQUIRE_FALSE(s.ok());
  REQUIRE(std::string(s.message).find("split") != std::string::npos);
}

// Programmatic dependent launches: decode steps launched back to back on a stream, each reading
// the state the one before wrote, give the same bits as steps with a host synchronization between
// them (a step that read the state before the previous step's writes were visible would differ).
TEST_CASE("kda gpu: back-to-back decode steps equal synchronized ones bit for bit", "[gpu][kda]") {
  skip_without_gpu();
  namespace rt = strata::kernels::rt;
  std::mt19937 rng(41);
  const int H = 96;
  const int64_t HK = int64_t(H) * D;
  auto wq = random_uniform(HK * 4, rng, -0.6f, 0.6f), wk = random_uniform(HK * 4, rng, -0.6f, 0.6f),
       wv = random_uniform(HK * 4, rng, -0.6f, 0.6f);
  auto A_log = random_uniform(H, rng, -1.f, 1.f), dt_bias = random_uniform(HK, rng, -3.f, 0.5f);
  auto onw = random_uniform(D, rng, 0.8f, 1.2f);
  DevBuf<float> d_wq(wq), d_wk(wk), d_wv(wv), d_A(A_log), d_dt(dt_bias), d_onw(onw);
  kk::Params p;
  p.H = H;
  p.conv_q = d_wq.p;
  p.conv_k = d_wk.p;
  p.conv_v = d_wv.p;
  p.A_log = d_A.p;
  p.dt_bias = d_dt.p;
  p.o_norm_w = d_onw.p;
  void* stream = rt::stream_create();
  REQUIRE(stream);
  for (int B : {1, 3}) {
    for (int split : {1, 2, 4, 8}) {
      INFO("B " << B << ", split " << split);
      const auto S0 = random_bf16(size_t(B) * H * D * D, rng, 0.1f).f32;
      const auto conv0 = random_bf16(size_t(B) * 3 * HK * 3, rng, 1.f).bits;
      auto q = random_bf16(B * HK, rng, 1.f), k = random_bf16(B * HK, rng, 1.f),
           v = random_bf16(B * HK, rng, 1.f), z = random_bf16(B * HK, rng, 1.f),
           b = random_bf16(B * H, rng, 1.f), go = random_bf16(B * HK, rng, 1.f);
      DevBuf<uint16_t> dq(q.bits), dk(k.bits), dv(v.bits), dz(z.bits), db(b.bits), dg(go.bits);
      kk::Inputs in{dq.p, dk.p, dv.p, HK, dz.p, db.p, dg.p};
      std::vector<float> S[2];
      std::vector<uint16_t> conv[2], y[2];
      for (int synced : {0, 1}) {
        DevBuf<float> d_S(S0);
        DevBuf<uint16_t> d_conv(conv0), d_y(B * HK);
        for (int step = 0; step < 12; step++) {
          auto st = kk::decode(p, in, B, {d_S.p, d_conv.p}, d_y.p, nullptr, stream, split);
          INFO(st.message);
          REQUIRE(st.ok());
          if (synced) REQUIRE(rt::stream_sync(stream).ok());
        }
        REQUIRE(rt::stream_sync(stream).ok());
        S[synced] = d_S.download();
        conv[synced] = d_conv.download();
        y[synced] = d_y.download();
      }
      CHECK(std::memcmp(S[0].data(), S[1].data(), S[0].size() * sizeof(float)) == 0);
      CHECK(conv[0] == conv[1]);
      CHECK(y[0] == y[1]);
    }
  }
  rt::stream_destroy(stream);
}
