// `strata bench kernels`: measures the H200 peaks (D2D copy bandwidth, cuBLASLt bf16 GEMM), then
// runs every registered kernel case (tools/bench_kernels.h) — here the KDA and MLA lines of CUDA
// kernels I and the row ops (KimiRMSNorm, AttnRes mix). Warm caches (the same buffers every
// repeat), CUDA-event timing, median of repeats.
//
// Napkin (STYLE.md §17), K3 shapes on an H200 (≈ 4.3 TB/s, ≈ 800 TFLOP/s bf16):
//   KDA decode: state 96×128×128 fp32 = 6 MiB read + written per sequence → ≥ 2.9 µs at B=1.
//   KDA prefill: T·96·(10·64·128 + 6·128²) FLOPs = 17.3 GFLOP per 1K tokens (the formula).
//   MLA decode: 1152 B of latent cache per position; 128K positions = 151 MB → ≥ 35 µs per
//     sequence; plus kv_b (25 MB) once per call. 96 heads × (576 + 512) MACs per position make it
//     compute-heavy: 27 GFLOP per 128K-position sequence.
//   MLA prefill T=16K: 2·96·(T²/2)·320 = 8.2 TFLOP of attention (+ 0.4 TFLOP kv expansion).
//   MLA prefill, a 4096-token chunk against 1M cached positions: 2·96·4096·1M·320 = 264 TFLOP of
//     attention + 26 TFLOP of tile-by-tile expansion → ≥ 0.37 s at the GEMM peak.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "storage/bf16.h"
#include "storage/error.h"
#include "tools/bench.h"
#include "tools/bench_kernels.h"

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/gpu_timer.h"
#include "kernels/kda/kda.h"
#include "kernels/mla/mla.h"
#include "kernels/ops/ops.h"
#include "kernels/peaks.h"
#include "kernels/runtime.h"
#endif

namespace strata::tools {

std::vector<KernelBenchCase>& kernel_bench_cases() {
  static std::vector<KernelBenchCase> c;
  return c;
}

#ifdef STRATA_HAVE_CUDA
// CUDA kernels II (tools/bench_kernels_moe.cpp) reports through this function.
void bench_kernels_moe(BenchReport& r, double copy_gbps, double gemm_tflops,
                       const std::vector<int>& tokens);
void bench_kernels_moe_batch(BenchReport& r, double copy_gbps);
#endif

namespace {

#ifdef STRATA_HAVE_CUDA

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(std::string("bench kernels: ") + what + ": " + cudaGetErrorString(e));
}

void ok(const kernels::Status& s, const char* what) {
  if (!s.ok()) throw Error(std::string("bench kernels: ") + what + ": " + s.message);
}

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { cuda_ok(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc"); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// n bf16 values: 1M seeded normal values, tiled over the buffer by device copies.
void fill_bf16(void* d, size_t n, uint32_t seed, float stddev) {
  const size_t P = std::min<size_t>(n, size_t(1) << 20);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, stddev);
  std::vector<uint16_t> h(P);
  for (auto& x : h) x = f32_to_bf16(nd(rng));
  auto* b = static_cast<uint16_t*>(d);
  cuda_ok(cudaMemcpy(b, h.data(), P * 2, cudaMemcpyHostToDevice), "upload");
  for (size_t done = P; done < n;) {
    const size_t c = std::min(done, n - done);
    cuda_ok(cudaMemcpy(b + done, b, c * 2, cudaMemcpyDeviceToDevice), "tile");
    done += c;
  }
}

std::unique_ptr<Dev> upload_f32(const std::vector<float>& v) {
  auto d = std::make_unique<Dev>(v.size() * 4);
  cuda_ok(cudaMemcpy(d->p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload");
  return d;
}

std::vector<float> uniform(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

BenchStats stats(const kernels::GpuTimes& t) {
  if (t.code != 0)
    throw Error(std::string("bench kernels: CUDA error: ") +
                cudaGetErrorString(cudaError_t(t.code)));
  BenchStats s;
  s.median_s = t.median_s, s.min_s = t.min_s, s.max_s = t.max_s, s.repeats = t.repeats;
  return s;
}

std::string fmt(const char* f, double a, double b = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

// ---- KDA ----------------------------------------------------------------------------------------

struct KdaSetup {
  static constexpr int H = 96, D = 128;
  std::unique_ptr<Dev> wq, wk, wv, A, dt, onw;
  kernels::kda::Params p;
  KdaSetup() {
    const size_t HK = size_t(H) * D;
    wq = upload_f32(uniform(HK * 4, 1, -0.6f, 0.6f));
    wk = upload_f32(uniform(HK * 4, 2, -0.6f, 0.6f));
    wv = upload_f32(uniform(HK * 4, 3, -0.6f, 0.6f));
    A = upload_f32(uniform(H, 4, -1.f, 1.f));
    dt = upload_f32(uniform(HK, 5, -3.f, 0.5f));
    onw = upload_f32(uniform(D, 6, 0.8f, 1.2f));
    p.H = H;
    p.conv_q = wq->as<float>(), p.conv_k = wk->as<float>(), p.conv_v = wv->as<float>();
    p.A_log = A->as<float>(), p.dt_bias = dt->as<float>(), p.o_norm_w = onw->as<float>();
  }
};

// Inputs for `rows` rows, q/k/v interleaved in one [rows, 3·H·K] projection output.
struct KdaRows {
  std::unique_ptr<Dev> qkv, z, b, g, y;
  kernels::kda::Inputs in;
  KdaRows(int64_t rows, int H) {
    const size_t HK = size_t(H) * 128;
    qkv = std::make_unique<Dev>(rows * 3 * HK * 2);
    z = std::make_unique<Dev>(rows * HK * 2);
    b = std::make_unique<Dev>(rows * H * 2);
    g = std::make_unique<Dev>(rows * HK * 2);
    y = std::make_unique<Dev>(rows * HK * 2);
    fill_bf16(qkv->p, rows * 3 * HK, 11, 1.f);
    fill_bf16(z->p, rows * HK, 12, 1.f);
    fill_bf16(b->p, rows * H, 13, 1.f);
    fill_bf16(g->p, rows * HK, 14, 1.f);
    const auto* base = qkv->as<uint16_t>();
    in = {base,
          base + HK,
          base + 2 * HK,
          int64_t(3 * HK),
          z->as<uint16_t>(),
          b->as<uint16_t>(),
          g->as<uint16_t>()};
  }
};

void bench_kda(const KernelBenchContext& ctx, BenchReport& r) {
  namespace kda = kernels::kda;
  KdaSetup s;
  const int H = KdaSetup::H;
  const size_t state_bytes = size_t(H) * 128 * 128 * 4, conv_bytes = size_t(3) * H * 128 * 3 * 2;
  // Prefill: single calls of T tokens, and long documents as chunked prefill of 16K-token calls
  // carrying the state (the input rows are reused; the state keeps evolving).
  struct P {
    int64_t total, call;
  };
  std::vector<P> cases =
      ctx.quick ? std::vector<P>{{4096, 4096}}
                : std::vector<P>{{16384, 16384}, {65536, 65536}, {262144, 16384}, {1048576, 16384}};
  for (const P& c : cases) {
    KdaRows rows(c.call, H);
    Dev S(state_bytes), conv(conv_bytes);
    cuda_ok(cudaMemset(S.p, 0, state_bytes), "memset");
    cuda_ok(cudaMemset(conv.p, 0, conv_bytes), "memset");
    const int64_t nch = (c.call + kda::kChunk - 1) / kda::kChunk;
    const size_t wsb = kda::prefill_workspace_bytes(H, 1, c.call, std::min<int64_t>(nch, 1024));
    Dev ws(wsb);
    const int32_t cu[2] = {0, int32_t(c.call)};
    const int calls = int(c.total / c.call);
    auto run = [&] {
      for (int i = 0; i < calls; i++)
        ok(kda::prefill(s.p, rows.in, cu, 1, {S.as<float>(), conv.as<uint16_t>()},
                        rows.y->as<uint16_t>(), ws.p, wsb, nullptr),
           "kda prefill");
    };
    BenchLine l;
    l.name = "kda/prefill T=" + std::to_string(c.total);
    l.shape = "H=96 d=128 fp32 state" +
              (calls > 1 ? ", " + std::to_string(calls) + " calls of " + std::to_string(c.call)
                         : std::string());
    l.time = stats(kernels::gpu_time(run, nullptr, c.total > 65536 ? 3 : ctx.repeats, 1));
    l.flops = kda::effective_flops(c.total, H);
    l.bytes = double(c.total) * H * 128 * 2 * 6;  // q,k,v,z,gate in + y out (bf16)
    l.peak_name = "bf16 GEMM (measured)";
    l.peak = ctx.gemm_tflops;
    l.peak_is_bandwidth = false;
    l.note = fmt("%.2f M tokens/s (target 6.3)", double(c.total) / l.time.median_s / 1e6);
    r.add(l);
  }
  // Decode: one step for B sequences; the state (read + written once) dominates the bytes.
  // The plain line is one isolated launch per event pair (launch latency included) with the
  // split decode() picks; "split=s" lines force s CTAs per head; "x20" lines time 20 steps back to
  // back per event pair (as a decode loop issues them) and report the time per step.
  for (int B : ctx.quick ? std::vector<int>{1} : std::vector<int>{1, 16, 64}) {
    KdaRows rows(B, H);
    Dev S(state_bytes * B), conv(conv_bytes * B);
    cuda_ok(cudaMemset(S.p, 0, state_bytes * B), "memset");
    cuda_ok(cudaMemset(conv.p, 0, conv_bytes * B), "memset");
    const int chosen = kda::decode_split_for(B);
    // One line: `t` timed `steps` decode steps per run; the bytes are the state and conv state
    // read and written once per step.
    const auto add_line = [&](std::string name, std::string note, kernels::GpuTimes t, int steps) {
      BenchLine l;
      l.name = std::move(name);
      l.note = std::move(note);
      l.shape = "H=96 d=128, state 6 MiB/seq";
      l.time = stats(t);
      l.time.median_s /= steps, l.time.min_s /= steps, l.time.max_s /= steps;
      l.bytes = 2.0 * double(state_bytes) * B + 2.0 * double(conv_bytes) * B;
      l.flops = double(B) * H * 128 * 128 * 7;
      l.peak_name = "D2D copy (measured)";
      l.peak = ctx.copy_gbps;
      r.add(l);
    };
    for (int split : ctx.quick ? std::vector<int>{0} : std::vector<int>{0, 1, 2, 4, 8, -20}) {
      if (split == chosen) continue;
      const int steps = split < 0 ? -split : 1;
      auto run = [&] {
        for (int i = 0; i < steps; i++)
          ok(kda::decode(s.p, rows.in, B, {S.as<float>(), conv.as<uint16_t>()},
                         rows.y->as<uint16_t>(), nullptr, nullptr, split < 0 ? 0 : split),
             "kda decode");
      };
      std::string name = "kda/decode B=" + std::to_string(B);
      std::string note = "split " + std::to_string(split > 0 ? split : chosen);
      if (split > 0) name += " split=" + std::to_string(split);
      if (steps > 1) name += " x20", note += ", time per step";
      if (split <= 0 && B == 1) note += ", target >= 2500 GB/s";
      if (split <= 0 && B == 64) note += ", target >= 3400 GB/s";
      add_line(std::move(name), std::move(note), kernels::gpu_time(run, nullptr, 50, 5), steps);
    }
    // "graph x20": the 20 steps captured once into a CUDA graph and replayed (as the engine's
    // captured decode step runs them): no launch gaps between the steps, each kernel's ramp-up
    // and tail included. Issue 20's KDA decode target (>= 2500 GB/s at B = 1) is stated for this.
    if (!ctx.quick) {
      namespace rt = kernels::rt;
      void* stream = rt::stream_create();
      void* graph = nullptr;
      ok(stream ? rt::begin_capture(stream) : kernels::Status{-1, "stream_create failed"},
         "capture");
      for (int i = 0; i < 20; i++)
        ok(kda::decode(s.p, rows.in, B, {S.as<float>(), conv.as<uint16_t>()},
                       rows.y->as<uint16_t>(), nullptr, stream),
           "kda decode (captured)");
      ok(rt::end_capture(stream, &graph), "end capture");
      add_line(
          "kda/decode B=" + std::to_string(B) + " graph x20",
          "split " + std::to_string(chosen) + ", 20 steps in one CUDA graph, time per step" +
              (B == 1 ? ", target >= 2500 GB/s" : ""),
          kernels::gpu_time([&] { ok(rt::graph_launch(graph, stream), "graph"); }, stream, 50, 5),
          20);
      rt::graph_destroy(graph);
      rt::stream_destroy(stream);
    }
  }
}

// ---- MLA ----------------------------------------------------------------------------------------

// Two cases, "mla/decode" and "mla/prefill", so that --filter selects either (--filter mla both).
void bench_mla_decode(const KernelBenchContext& ctx, BenchReport& r) {
  namespace mla = kernels::mla;
  namespace rt = kernels::rt;
  const int H = 96;
  const size_t kvb_elems = size_t(H) * 256 * mla::kLatent;
  Dev kvb(kvb_elems * 2);
  fill_bf16(kvb.p, kvb_elems, 21, 1.f / 22.6f);
  // Decode over long caches.
  struct Dc {
    int B;
    int64_t S;
  };
  std::vector<Dc> dcs = ctx.quick ? std::vector<Dc>{{1, 32768}}
                                  : std::vector<Dc>{{1, 131072}, {16, 131072}, {1, 1048576}};
  for (const Dc& c : dcs) {
    const size_t cache_elems = size_t(c.B) * c.S * mla::kCacheDim;
    Dev cache(cache_elems * 2), q(size_t(c.B) * H * mla::kQDim * 2), out(size_t(c.B) * H * 128 * 2);
    fill_bf16(cache.p, cache_elems, 22, 1.f);
    fill_bf16(q.p, size_t(c.B) * H * mla::kQDim, 23, 1.f);
    std::vector<int32_t> lens(c.B, int32_t(c.S));
    const size_t wsb = mla::decode_workspace_bytes(H, c.B, c.S);
    Dev ws(wsb);
    // A created stream, as the engine's: the decode chain's programmatic dependent launches
    // apply only there.
    void* stream = rt::stream_create();
    ok(stream ? kernels::Status{} : kernels::Status{-1, "stream_create failed"}, "mla decode");
    cuda_ok(cudaDeviceSynchronize(), "fills");  // the created stream does not wait for them
    auto run = [&] {
      ok(mla::decode(H, q.as<uint16_t>(), cache.as<uint16_t>(), c.S * mla::kCacheDim, lens.data(),
                     c.B, kvb.as<uint16_t>(), out.as<uint16_t>(), ws.p, wsb, stream),
         "mla decode");
    };
    BenchLine l;
    l.name = "mla/decode B=" + std::to_string(c.B) + " S=" + std::to_string(c.S);
    l.shape = std::string("H=96 latent 512+64, absorbed, ") +
              mla::decode_kernel_name(mla::default_decode_kernel()) + " kernel";
    l.time = stats(kernels::gpu_time(run, stream, ctx.repeats, 1));
    rt::stream_destroy(stream);
    l.bytes = double(cache_elems) * 2 + double(kvb_elems) * 2;
    l.flops = 2.0 * c.B * double(c.S) * H * (mla::kCacheDim + mla::kLatent);
    l.peak_name = "D2D copy (measured)";
    l.peak = ctx.copy_gbps;
    l.note = fmt("%.1f TFLOP/s; target >= 70%% of copy", l.tflops());
    r.add(l);
  }
}

void bench_mla_prefill(const KernelBenchContext& ctx, BenchReport& r) {
  namespace mla = kernels::mla;
  const int H = 96;
  const size_t kvb_elems = size_t(H) * 256 * mla::kLatent;
  Dev kvb(kvb_elems * 2);
  fill_bf16(kvb.p, kvb_elems, 21, 1.f / 22.6f);
  // Prefill of a fresh prompt of T tokens (S = T).
  for (int64_t T : ctx.quick ? std::vector<int64_t>{2048} : std::vector<int64_t>{4096, 16384}) {
    const int64_t S = T;
    Dev cache(size_t(S) * mla::kCacheDim * 2), q(size_t(T) * H * mla::kQDim * 2),
        out(size_t(T) * H * 128 * 2);
    fill_bf16(cache.p, size_t(S) * mla::kCacheDim, 24, 1.f);
    fill_bf16(q.p, size_t(T) * H * mla::kQDim, 25, 1.f);
    const size_t wsb = mla::prefill_workspace_bytes(H, S);
    Dev ws(wsb);
    // The attention kernels (the same bits): the process default (the unsuffixed line, as the
    // long-cache lines below run it), then the others.
    const mla::PrefillKernel def = mla::default_prefill_kernel();
    std::vector<mla::PrefillKernel> kinds{def};
    for (const mla::PrefillKernel k : mla::kPrefillKernels)
      if (k != def) kinds.push_back(k);
    for (const mla::PrefillKernel k : kinds) {
      auto run = [&] {
        ok(mla::prefill(H, q.as<uint16_t>(), cache.as<uint16_t>(), S, kvb.as<uint16_t>(),
                        out.as<uint16_t>(), T, ws.p, wsb, nullptr, k),
           "mla prefill");
      };
      BenchLine l;
      l.name = "mla/prefill T=" + std::to_string(T) +
               (k == def ? "" : std::string(" ") + mla::prefill_kernel_name(k));
      l.shape =
          std::string("H=96 q/k 192 v 128, causal, ") + mla::prefill_kernel_name(k) + " kernel";
      l.time = stats(kernels::gpu_time(run, nullptr, 3, 1));
      const double expand = 2.0 * double(S) * mla::kLatent * H * 256;
      l.flops = mla::prefill_attention_flops(H, T, S) + expand;
      l.peak_name = "bf16 GEMM (measured)";
      l.peak = ctx.gemm_tflops;
      l.peak_is_bandwidth = false;
      l.note = "incl. kv expansion GEMM; target >= 50% of GEMM";
      r.add(l);
    }
  }
  // A chunk of T new tokens against a long cache (S positions, the chunk's own rows last), in the
  // bounded workspace: the cache expanded tile by tile (mla::kPrefillTile positions).
  struct Lc {
    int64_t T, S;
  };
  for (const Lc& c : ctx.quick ? std::vector<Lc>{{1024, 32768}}
                               : std::vector<Lc>{{4096, 131072}, {4096, 1048576}}) {
    Dev cache(size_t(c.S) * mla::kCacheDim * 2), q(size_t(c.T) * H * mla::kQDim * 2),
        out(size_t(c.T) * H * 128 * 2);
    fill_bf16(cache.p, size_t(c.S) * mla::kCacheDim, 26, 1.f);
    fill_bf16(q.p, size_t(c.T) * H * mla::kQDim, 27, 1.f);
    const double expand = 2.0 * double(c.S) * mla::kLatent * H * 256;
    const size_t one_pass = mla::prefill_workspace_bytes(H, c.S);
    // The bounded workspace; at 128K also the one-pass form (6.5 GB) for what tiling costs.
    std::vector<size_t> sizes{mla::prefill_workspace_bytes_bounded(H, c.T)};
    if (c.S <= 131072) sizes.push_back(one_pass);
    for (const size_t wsb : sizes) {
      const int64_t tile = mla::prefill_tile_positions(H, c.S, c.T, wsb);
      Dev ws(wsb);
      auto run = [&] {
        ok(mla::prefill(H, q.as<uint16_t>(), cache.as<uint16_t>(), c.S, kvb.as<uint16_t>(),
                        out.as<uint16_t>(), c.T, ws.p, wsb, nullptr),
           "mla prefill (long cache)");
      };
      BenchLine l;
      l.name = "mla/prefill T=" + std::to_string(c.T) + " S=" + std::to_string(c.S) +
               (tile < c.S ? "" : " one pass");
      l.shape = "H=96, " + (tile < c.S ? "cache tiles of " + std::to_string(tile) : "one tile") +
                ", workspace " + fmt("%.2f GB", double(wsb) / 1e9) + ", " +
                mla::prefill_kernel_name(mla::default_prefill_kernel()) + " kernel";
      l.time = stats(kernels::gpu_time(run, nullptr, 3, 1));
      l.flops = mla::prefill_attention_flops(H, c.T, c.S) + expand;
      l.peak_name = "bf16 GEMM (measured)";
      l.peak = ctx.gemm_tflops;
      l.peak_is_bandwidth = false;
      l.note = fmt("incl. kv expansion GEMM (%.1f%% of FLOPs); one pass needs %.1f GB",
                   100.0 * expand / l.flops, double(one_pass) / 1e9);
      r.add(l);
    }
  }
}

// ---- Row ops (kernels/ops) ---------------------------------------------------------------------
// KimiRMSNorm and the AttnRes mix at decode row counts (T = 1, 16) and a prefill chunk (4096), in
// the form kimi_rms_norm / attn_res_mix pick (clustered rows, kernels/ops/row_cluster.cuh) and in
// the one-CTA-per-row form ("row-blocks": the kernels as they were before the clustered form, kept
// for unaligned and odd shapes), so one run gives before and after on one machine. 20 calls back
// to back per event pair (as a decode graph issues them), time per call. Bytes: every input row
// read once, the output written once, the weight vectors once.

// n fp32 values uniform in [-1, 1): 1M seeded values, tiled over the buffer by device copies.
void fill_f32(float* d, size_t n, uint32_t seed) {
  const auto h = uniform(std::min<size_t>(n, size_t(1) << 20), seed, -1.f, 1.f);
  cuda_ok(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice), "upload");
  for (size_t done = h.size(); done < n;) {
    const size_t c = std::min(done, n - done);
    cuda_ok(cudaMemcpy(d + done, d, c * 4, cudaMemcpyDeviceToDevice), "tile");
    done += c;
  }
}

void bench_ops(const KernelBenchContext& ctx, BenchReport& r) {
  namespace ops = kernels::ops;
  constexpr int kCalls = 20;
  auto line = [&](const std::string& name, const std::string& shape, double bytes,
                  const std::function<void()>& call, bool blocks) {
    BenchLine l;
    l.name = name + (blocks ? " row-blocks" : "");
    l.shape = shape;
    auto run = [&] {
      for (int i = 0; i < kCalls; i++) call();
    };
    l.time = stats(kernels::gpu_time(run, nullptr, ctx.repeats, 2));
    l.time.median_s /= kCalls, l.time.min_s /= kCalls, l.time.max_s /= kCalls;
    l.bytes = bytes;
    l.peak_name = "D2D copy (measured)";
    l.peak = ctx.copy_gbps;
    l.note = fmt("%.2f us per call (x20 back to back)", l.time.median_s * 1e6);
    l.note += blocks ? ", one CTA per row (before)" : ", clustered rows";
    r.add(l);
  };
  struct N {
    int64_t T, D;
  };
  const std::vector<N> norms =
      ctx.quick ? std::vector<N>{{1, 7168}} : std::vector<N>{{1, 7168}, {16, 7168}, {4096, 7168},
                                                             {1, 3584}, {16, 3584}, {4096, 3584}};
  for (const N& c : norms) {
    Dev x(size_t(c.T * c.D) * 4), w(size_t(c.D) * 4), y(size_t(c.T * c.D) * 4);
    fill_f32(x.as<float>(), size_t(c.T * c.D), 31);
    fill_f32(w.as<float>(), size_t(c.D), 32);
    for (bool blocks : {false, true}) {
      auto call = [&] {
        ok((blocks ? ops::kimi_rms_norm_row_blocks : ops::kimi_rms_norm)(
               x.as<float>(), w.as<float>(), y.as<float>(), c.T, c.D, 1e-5f, true, nullptr,
               nullptr),
           "kimi_rms_norm");
      };
      line("ops/kimi_rms_norm T=" + std::to_string(c.T) + " D=" + std::to_string(c.D),
           "fp32 rows, bf16 rounding points", double(2 * c.T * c.D + c.D) * 4, call, blocks);
    }
  }
  struct A {
    int S;
    int64_t T, D;
  };
  const std::vector<A> mixes =
      ctx.quick ? std::vector<A>{{10, 1, 7168}}
                : std::vector<A>{{10, 1, 7168},    {9, 1, 7168},  {10, 16, 7168},
                                 {10, 4096, 7168}, {10, 1, 3584}, {10, 16, 3584}};
  for (const A& c : mixes) {
    const size_t rows = size_t(c.T * c.D);
    Dev src(rows * c.S * 4), nw(size_t(c.D) * 4), pw(size_t(c.D) * 4), out(rows * 4);
    fill_f32(src.as<float>(), rows * c.S, 33);
    fill_f32(nw.as<float>(), size_t(c.D), 34);
    fill_f32(pw.as<float>(), size_t(c.D), 35);
    ops::AttnResSources S;
    S.n = c.S;
    for (int i = 0; i < c.S; i++) S.src[i] = src.as<float>() + rows * i;
    for (bool blocks : {false, true}) {
      auto call = [&] {
        ok((blocks ? ops::attn_res_mix_row_blocks : ops::attn_res_mix)(
               S, nw.as<float>(), pw.as<float>(), out.as<float>(), c.T, c.D, 1e-5f, true, nullptr),
           "attn_res_mix");
      };
      line("ops/attn_res_mix T=" + std::to_string(c.T) + " D=" + std::to_string(c.D) +
               " S=" + std::to_string(c.S),
           "fp32 sources, softmax over S", double(rows * (c.S + 1) + 2 * c.D) * 4, call, blocks);
    }
  }
}

STRATA_KERNEL_BENCH("kda", bench_kda);
STRATA_KERNEL_BENCH("mla/decode", bench_mla_decode);
STRATA_KERNEL_BENCH("mla/prefill", bench_mla_prefill);
STRATA_KERNEL_BENCH("ops", bench_ops);
STRATA_KERNEL_BENCH("moe", [](const KernelBenchContext& ctx, BenchReport& r) {
  bench_kernels_moe(r, ctx.copy_gbps, ctx.gemm_tflops, ctx.moe_tokens);
});
STRATA_KERNEL_BENCH("moe-batch", [](const KernelBenchContext& ctx, BenchReport& r) {
  bench_kernels_moe_batch(r, ctx.copy_gbps);
});

#endif  // STRATA_HAVE_CUDA

std::function<int()> setup_bench_kernels(CLI::App& app) {
  auto json = std::make_shared<std::string>();
  auto filter = std::make_shared<std::string>();
  auto repeats = std::make_shared<int>(10);
  auto quick = std::make_shared<bool>(false);
  auto tokens = std::make_shared<std::vector<int>>();
  app.add_option("--json", *json, "also write the lines as JSON to this file");
  app.add_option("--filter", *filter,
                 "run only the cases whose name contains this (kda, mla, moe, ops)");
  app.add_option("--repeats", *repeats, "timed repeats per line (default 10)")
      ->check(CLI::Range(1, 1000));
  app.add_flag("--quick", *quick, "small shapes (a smoke run)");
  app.add_option("--tokens", *tokens,
                 "the grouped MoE lines only at these tokens per layer (default 64 256 1024 4096; "
                 "the strict-rows line runs when 1024 is among them)")
      ->check(CLI::Range(1, 65536));
  return [=]() -> int {
    check_json_output(*json);
#ifndef STRATA_HAVE_CUDA
    throw Error(
        "bench kernels: this strata was built without CUDA (configure with STRATA_CUDA=ON)");
#else
    if (kernels::cuda_device_count() == 0) throw Error("bench kernels: no CUDA device found");
    BenchReport report("strata bench kernels");
    report.note("device: " + kernels::cuda_device_description(0));
    KernelBenchContext ctx;
    ctx.repeats = *repeats;
    ctx.quick = *quick;
    ctx.moe_tokens = *tokens;
    const auto copy = kernels::measure_copy_bandwidth();
    ok(copy.status, "copy peak");
    const auto gemm = kernels::measure_bf16_gemm();
    ok(gemm.status, "GEMM peak");
    ctx.copy_gbps = copy.value;
    ctx.gemm_tflops = gemm.value;
    BenchLine lc;
    lc.name = "peak/copy";
    lc.shape = copy.what;
    lc.time.median_s = lc.time.min_s = lc.time.max_s = copy.median_s;
    lc.time.repeats = 10;
    lc.bytes = copy.median_s * copy.value * 1e9;
    lc.peak_name = "itself";
    lc.peak = copy.value;
    report.add(lc);
    BenchLine lg;
    lg.name = "peak/bf16-gemm";
    lg.shape = gemm.what;
    lg.time.median_s = lg.time.min_s = lg.time.max_s = gemm.median_s;
    lg.time.repeats = 10;
    lg.flops = gemm.median_s * gemm.value * 1e12;
    lg.peak_name = "itself";
    lg.peak = gemm.value;
    lg.peak_is_bandwidth = false;
    report.add(lg);
    for (const auto& c : kernel_bench_cases()) {
      if (!filter->empty() && c.name.find(*filter) == std::string::npos) continue;
      c.run(ctx, report);
    }
    if (!json->empty()) report.write_json(*json);
    return 0;
#endif
  };
}

}  // namespace

STRATA_BENCH("kernels", "CUDA kernels: time, bytes, FLOPs and % of the measured H200 peaks",
             setup_bench_kernels);

}  // namespace strata::tools
