// `strata bench kernels` (case "moe", registered in tools/bench_kernels.cpp), CUDA kernels II
// lines: the MXFP4 expert GEMV (one token, 16 experts of 3584→3072→3584) in weight GB/s against the
// measured copy bandwidth, the grouped MXFP4 experts at 64–4096 tokens per layer in TFLOP/s against
// each line's roofline min(bf16 GEMM peak, FLOPs / (bytes of the touched experts / copy rate)) from
// the peaks measured in the same run (every path: GEMM in its wgmma and mma.sync forms, IMMA, GEMV;
// the whole routed step, merge into the tokens' outputs included), and the cuBLASLt shapes of
// the K3 dense trunk (decode T=1 in weight GB/s, prefill T=4096 in TFLOP/s).
//
// Napkin (STYLE.md §17): 16 experts × 17.55 MB = 280.8 MB per token per MoE layer; at the H200's
// ≈ 4.3 TB/s that is ≥ 65 µs, the floor of the GEMV line. Weights are cold: the expert pool holds
// all 896 experts of a K3 layer (15.7 GB ≫ 50 MB L2) and each repeat uses the next 16; the dense
// shapes rotate through a 3 GiB weight pool.
#ifdef STRATA_HAVE_CUDA
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "kernels/gpu_timer.h"
#include "kernels/moe/experts.h"
#include "kernels/ops/device_memory.h"
#include "offload/cost_model.h"
#include "offload/hardware.h"
#include "storage/error.h"
#include "tools/bench.h"

namespace strata::tools {

namespace {

using kernels::DeviceBuffer;
namespace moe = kernels::moe;

constexpr int kH = 3584, kI = 3072, kExperts = 896, kTopk = 16;

BenchStats to_stats(const kernels::GpuTimes& t) {
  if (t.code != 0) throw Error("bench kernels: CUDA error " + std::to_string(t.code));
  BenchStats s;
  s.median_s = t.median_s, s.min_s = t.min_s, s.max_s = t.max_s, s.repeats = t.repeats;
  return s;
}

void ok(const kernels::Status& s, const char* what) {
  if (!s.ok()) throw Error(std::string("bench kernels: ") + what + ": " + s.message);
}

// The 896 experts of one K3 MoE layer, released layout, random codes and scales near 2^-7: codes
// 117..120 per block (a 4-code window per row, like `strata synth`'s s0 + 0..1 and inside the GEMM
// path's 3-code weight window; the other paths' speed does not depend on the codes).
// refill_scales(117, 121) puts nearly every row outside that window (the GEMM path's strict rows).
struct ExpertPool {
  DeviceBuffer packed, scale;
  std::vector<Mxfp4ExpertView> views;
  static constexpr size_t kProjPacked = size_t(kI) * kH / 2, kProjScale = size_t(kI) * kH / 32;
  ExpertPool() : packed(kProjPacked * 3 * kExperts), scale(kProjScale * 3 * kExperts) {
    kernels::fill_random_bytes(packed.get(), packed.bytes(), 1);
    refill_scales(117, 120);
    for (int e = 0; e < kExperts; e++) {
      const uint8_t* p = packed.as<uint8_t>() + kProjPacked * 3 * size_t(e);
      const uint8_t* s = scale.as<uint8_t>() + kProjScale * 3 * size_t(e);
      Mxfp4ExpertView v;
      v.w1_packed = p, v.w3_packed = p + kProjPacked, v.w2_packed = p + 2 * kProjPacked;
      v.w1_scale = s, v.w3_scale = s + kProjScale, v.w2_scale = s + 2 * kProjScale;
      v.hidden = kH, v.inter = kI;
      views.push_back(v);
    }
  }
  void refill_scales(uint8_t lo, uint8_t hi) {
    kernels::fill_random_bytes(scale.get(), scale.bytes(), 2, lo, hi);
  }
  static double expert_bytes() { return 3.0 * double(kProjPacked + kProjScale); }
};

// One routed batch: T tokens, each to kTopk distinct experts; groups by increasing expert id.
struct Routed {
  DeviceBuffer views, offsets, pair_token, x, y, ws;
  DeviceBuffer merge_offsets, merge_pair, merge_weight, out;  // the merge (numerics.md §5)
  moe::ExpertBatch b;
  int distinct = 0;
  size_t ws_bytes = 0;
  // first_expert ≥ 0: token t goes to the 16 experts first_expert + (t mod groups)·16 + 0..15, so
  // T = M·groups tokens give 16·groups experts exactly M tokens each.
  Routed(const ExpertPool& pool, int T, std::mt19937_64& rng, int first_expert = -1,
         int groups = 1) {
    std::vector<std::vector<int>> tokens_of(kExperts);
    std::vector<int> ids(kExperts);
    std::iota(ids.begin(), ids.end(), 0);
    for (int t = 0; t < T; t++) {
      if (first_expert >= 0) {  // the decode line: a fixed, disjoint set of 16 experts
        const int g = t % groups;
        for (int k = 0; k < kTopk; k++)
          tokens_of[size_t(first_expert + g * kTopk + k)].push_back(t);
        continue;
      }
      for (int k = 0; k < kTopk; k++) {  // partial Fisher-Yates: 16 distinct experts
        std::uniform_int_distribution<int> d(k, kExperts - 1);
        std::swap(ids[size_t(k)], ids[size_t(d(rng))]);
        tokens_of[size_t(ids[size_t(k)])].push_back(t);
      }
    }
    std::vector<Mxfp4ExpertView> v;
    std::vector<int32_t> off = {0}, pt;
    for (int e = 0; e < kExperts; e++) {
      if (tokens_of[size_t(e)].empty()) continue;
      v.push_back(pool.views[size_t(e)]);
      for (int t : tokens_of[size_t(e)]) pt.push_back(t);
      off.push_back(int32_t(pt.size()));
    }
    distinct = int(v.size());
    // Each token's pairs in increasing expert id (the groups' order), with made-up weights.
    std::vector<std::vector<int32_t>> pairs_of(static_cast<size_t>(T));
    for (size_t q = 0; q < pt.size(); q++) pairs_of[size_t(pt[q])].push_back(int32_t(q));
    std::vector<int32_t> moff = {0}, mpair;
    std::vector<float> mw;
    std::uniform_real_distribution<float> ud(0.0f, 0.3f);
    for (const auto& ps : pairs_of) {
      for (int32_t q : ps) mpair.push_back(q), mw.push_back(ud(rng));
      moff.push_back(int32_t(mpair.size()));
    }
    merge_offsets = DeviceBuffer::from(moff), merge_pair = DeviceBuffer::from(mpair);
    merge_weight = DeviceBuffer::from(mw), out = DeviceBuffer(size_t(T) * kH * 4);
    std::vector<float> xs(size_t(T) * kH);
    std::normal_distribution<float> nd;
    for (float& f : xs) f = nd(rng);
    views = DeviceBuffer::from(v), offsets = DeviceBuffer::from(off);
    pair_token = DeviceBuffer::from(pt), x = DeviceBuffer::from(xs);
    y = DeviceBuffer(pt.size() * kH * 4);
    ws_bytes = moe::experts_workspace_bytes(T, int(pt.size()), kH, kI);
    ws = DeviceBuffer(ws_bytes);
    b.experts = views.as<Mxfp4ExpertView>(), b.group_offsets = offsets.as<int32_t>();
    b.pair_token = pair_token.as<int32_t>(), b.x = x.as<float>(), b.y = y.as<float>();
    b.G = distinct, b.P = int(pt.size()), b.T = T, b.H = kH, b.I = kI;
  }
  void run(moe::ExpertPath path) {
    ok(moe::grouped_experts(b, ws.get(), ws_bytes, path, nullptr), "grouped_experts");
  }
  // The whole routed step: the experts, then the weighted merge into the tokens' outputs.
  void run_and_merge(moe::ExpertPath path) {
    run(path);
    ok(moe::merge_weighted(y.as<float>(), merge_offsets.as<int32_t>(), merge_pair.as<int32_t>(),
                           merge_weight.as<float>(), out.as<float>(), b.T, kH, nullptr),
       "merge_weighted");
  }
};

struct DenseShape {
  const char* name;
  int64_t N, K;
};

// The path's name in the bench lines.
const char* path_name(moe::ExpertPath p) {
  return p == moe::ExpertPath::wgmma_wide ? "wgmma-wide"
         : p == moe::ExpertPath::wgmma    ? "wgmma"
         : p == moe::ExpertPath::gemm     ? "gemm"
         : p == moe::ExpertPath::imma     ? "imma"
                                          : "gemv";
}

// A line over disjoint routed sets of `experts` experts each on one path, one set per repeat in
// turn (weights cold), against the copy peak: `repeats` timed calls after 3 warm-ups.
BenchLine rotating_line(std::vector<Routed>& sets, moe::ExpertPath path, int experts, int repeats,
                        double copy_gbps, std::string name, std::string shape, std::string note) {
  size_t k = 0;
  BenchLine l;
  l.name = std::move(name);
  l.shape = std::move(shape);
  l.time =
      to_stats(kernels::gpu_time([&] { sets[k++ % sets.size()].run(path); }, nullptr, repeats, 3));
  l.bytes = experts * ExpertPool::expert_bytes();
  l.peak_name = "D2D copy (measured)";
  l.peak = copy_gbps;
  l.note = std::move(note);
  return l;
}

}  // namespace

// Batched decode: 128 experts with M tokens each (8 sequences over the 8-layer slice's 64 experts
// give ≈ 2 per expert; K3's 896 experts at B = 64 ≈ 1.1); each repeat takes the next 128 of the
// 896 (cold). The GEMV path's strips and the GEMM path's tiles at the same M: where they cross
// sets kGemmMinMeanPairsPerGroup (kernels/moe/experts.h).
void bench_kernels_moe_batch(BenchReport& r, double copy_gbps) {
  std::mt19937_64 rng(4321);
  ExpertPool pool;
  for (int M : {1, 2, 3, 4, 8}) {
    std::vector<Routed> bs;
    for (int s = 0; s < kExperts / 128; s++) bs.emplace_back(pool, 8 * M, rng, s * 128, 8);
    kernels::device_sync("bench setup");
    for (moe::ExpertPath path :
         {moe::ExpertPath::gemv, moe::ExpertPath::gemm, moe::ExpertPath::wgmma}) {
      const char* name = path_name(path);
      r.add(rotating_line(
          bs, path, 128, 14, copy_gbps, "moe/mxfp4-batch M=" + std::to_string(M) + " " + name,
          "128 experts x " + std::to_string(M) + " tokens, 3584->3072->3584",
          std::string(name) + " path, weight bytes, cold (rotating 128 of 896 experts)"));
    }
  }
}

void bench_kernels_moe(BenchReport& r, double copy_gbps, double gemm_tflops,
                       const std::vector<int>& tokens, const std::vector<std::string>& paths) {
  // --paths: the grouped lines' paths by name (empty: all).
  const auto wanted = [&](moe::ExpertPath p) {
    return paths.empty() || std::find(paths.begin(), paths.end(), path_name(p)) != paths.end();
  };
  std::mt19937_64 rng(1234);
  {
    ExpertPool pool;
    // 1. Decode GEMV: one token, 16 experts; each repeat takes the next 16 of the 896 (cold).
    std::vector<Routed> sets;
    for (int s = 0; s < kExperts / kTopk; s++) sets.emplace_back(pool, 1, rng, s * kTopk);
    kernels::device_sync("bench setup");
    r.add(rotating_line(sets, moe::ExpertPath::gemv, kTopk, 20, copy_gbps, "moe/mxfp4-gemv T=1",
                        "16 experts 3584->3072->3584",
                        "weight bytes, cold (rotating 16 of 896 experts)"));

    // 2. Grouped experts at prefill scale, every path, each line against its own roofline.
    const auto grouped_line = [&](Routed& batch, int T, moe::ExpertPath path, const char* suffix,
                                  int repeats) {
      BenchLine g;
      g.name =
          std::string("moe/mxfp4-grouped T=") + std::to_string(T) + " " + path_name(path) + suffix;
      g.shape =
          std::to_string(batch.distinct) + " experts, " + std::to_string(batch.b.P) + " pairs";
      g.time = to_stats(kernels::gpu_time([&] { batch.run_and_merge(path); }, nullptr, repeats, 1));
      g.flops = 6.0 * double(batch.b.P) * kH * kI;
      g.bytes = batch.distinct * ExpertPool::expert_bytes();
      // The line's roofline: compute at the bf16 peak, or every touched expert read once at the
      // copy rate, whichever is slower.
      const double byte_bound = g.flops / (g.bytes / (copy_gbps * 1e9)) / 1e12;
      g.peak = std::min(gemm_tflops, byte_bound);
      g.peak_name = byte_bound < gemm_tflops ? "roofline: expert bytes / copy (measured)"
                                             : "roofline: bf16 GEMM (measured)";
      g.peak_is_bandwidth = false;
      char note[160];
      std::snprintf(note, sizeof note,
                    "%.1f%% of bf16 GEMM peak; whole step (quantize, experts, GLU, merge); int8 "
                    "MACs as 2 FLOPs",
                    100.0 * g.tflops() / gemm_tflops);
      g.note = note;
      if (path == moe::ExpertPath::gemm || path == moe::ExpertPath::wgmma ||
          path == moe::ExpertPath::wgmma_wide) {
        // How much of the line's work the integer method carried (rows outside the window take
        // the strict path): the input rows of the last call.
        moe::GemmWindowCounts wc;
        ok(moe::gemm_window_counts(batch.ws.get(), batch.b.T, batch.b.P, kH, kI, &wc),
           "gemm_window_counts");
        std::snprintf(note, sizeof note, "; x rows in window %lld/%d, h rows %lld/%d", wc.x_ok,
                      batch.b.T, wc.h_ok, batch.b.P);
        g.note += note;
      }
      r.add(g);
    };
    const std::vector<int> Ts = tokens.empty() ? std::vector<int>{64, 256, 1024, 4096} : tokens;
    for (int T : Ts) {
      Routed batch(pool, T, rng);
      for (auto path : {moe::ExpertPath::wgmma_wide, moe::ExpertPath::wgmma, moe::ExpertPath::gemm,
                        moe::ExpertPath::imma, moe::ExpertPath::gemv})
        if (wanted(path)) grouped_line(batch, T, path, "", 5);
    }
    // The GEMM path when nearly every weight row is outside its window (strict fallback per row).
    pool.refill_scales(117, 121);
    if (std::find(Ts.begin(), Ts.end(), 1024) != Ts.end()) {
      Routed batch(pool, 1024, rng);
      for (auto path : {moe::ExpertPath::wgmma_wide, moe::ExpertPath::wgmma, moe::ExpertPath::gemm})
        if (wanted(path)) grouped_line(batch, 1024, path, " (codes 117..121: strict rows)", 3);
    }
    pool.refill_scales(117, 120);
  }

  // 3. cuBLASLt shapes of the dense trunk (y = x·Wᵀ, bf16 in, bf16 out).
  const DenseShape shapes[] = {{"kda q/k/v/g_proj", 12288, 7168}, {"kda f_a_proj", 128, 7168},
                               {"kda f_b_proj", 12288, 128},      {"kda b_proj", 96, 7168},
                               {"attn o_proj", 7168, 12288},      {"mla q_a_proj", 1536, 7168},
                               {"mla q_b_proj", 18432, 1536},     {"mla kv_a_proj", 576, 7168},
                               {"mla kv_b_proj", 24576, 512},     {"router gate", 896, 7168},
                               {"latent down", 3584, 7168},       {"latent up", 7168, 3584},
                               {"shared gate|up", 12288, 7168},   {"shared down", 7168, 6144},
                               {"dense0 gate|up", 67584, 7168},   {"dense0 down", 7168, 33792},
                               {"lm_head", 163840, 7168}};
  const size_t pool_bytes = size_t(3) << 30;
  DeviceBuffer wpool(pool_bytes), xbuf(size_t(4096) * 33792 * 2), ybuf(size_t(4096) * 163840 * 2);
  kernels::fill_random_bytes(wpool.get(), pool_bytes, 3, 0, 0x3f);  // small positive bf16 values
  kernels::fill_random_bytes(xbuf.get(), xbuf.bytes(), 4, 0, 0x3f);
  kernels::gemm::Gemm gemm;
  for (int64_t T : {int64_t(1), int64_t(4096)}) {
    for (const DenseShape& s : shapes) {
      const size_t wbytes = size_t(s.N * s.K * 2);
      if (wbytes > pool_bytes) continue;
      const size_t slots = std::max<size_t>(1, pool_bytes / ((wbytes + 255) & ~size_t(255)));
      size_t k = 0;
      BenchLine l;
      l.name = std::string("gemm/") + s.name + " T=" + std::to_string(T);
      l.shape = std::to_string(s.N) + "x" + std::to_string(s.K);
      l.time = to_stats(kernels::gpu_time(
          [&] {
            const size_t off = (k++ % slots) * ((wbytes + 255) & ~size_t(255));
            ok(gemm.linear(xbuf.as<uint16_t>(),
                           reinterpret_cast<const uint16_t*>(wpool.as<uint8_t>() + off), ybuf.get(),
                           kernels::gemm::OutType::bf16, T, s.N, s.K, nullptr),
               "gemm");
          },
          nullptr, 10, 2));
      l.bytes = double(wbytes);
      l.flops = 2.0 * double(T) * double(s.N) * double(s.K);
      if (T == 1) {
        l.peak_name = "D2D copy (measured)", l.peak = copy_gbps;
        l.note = "weight bytes, cold";
      } else {
        l.peak_name = "bf16 GEMM (measured)", l.peak = gemm_tflops;
        l.peak_is_bandwidth = false;
      }
      r.add(l);
    }
  }
}

// `strata bench hw`: our GPU kernels' rates as weight GB/s at M tokens — grouped_experts over 128
// K3 experts with exactly M tokens each (the automatic path, as the engine launches it: GEMV at 1,
// the GEMM path's strip form at 2 and 4, its 32-token tile at 8 and 16, the wgmma form at 64 and
// 256 — the curve bends between them, so each gets a point), and the
// trunk's cuBLASLt GEMM (kda q/k/v/g_proj, 12288 × 7168, weights rotating through 3 GiB) at M
// tokens, 8 calls back to back per timing as a captured decode step issues its GEMMs (timed one
// call at a time, each call's launch and ramp-up counted, the curve gave 2219 GB/s at M = 1 on
// the H100 machine and the cost model predicted the all-GPU decode lines 17-18 % slow, planner
// validation round 3). Fills hw.kernels.gpu_expert and gpu_trunk.
void bench_hw_gpu_kernels(BenchReport& r, offload::HardwareProfile& hw, bool quick,
                          const ModelConfig* model, const std::string& model_name) {
  const double copy = hw.gpu.hbm_copy_gbps.value_or(0), peak = hw.gpu.bf16_gemm_tflops.value_or(0);
  std::mt19937_64 rng(99);
  {
    ExpertPool pool;
    constexpr int kGroups = 8;  // 128 experts = 2.2 GB per call, ≫ L2
    offload::RateCurve c;
    for (int M : quick ? std::vector<int>{1, 16, 256} : std::vector<int>{1, 2, 4, 8, 16, 64, 256}) {
      Routed batch(pool, M * kGroups, rng, 0, kGroups);
      kernels::device_sync("bench setup");
      BenchLine g;
      g.name = "hw/gpu expert M=" + std::to_string(M);
      g.shape = std::to_string(batch.distinct) + " experts x " + std::to_string(M) + " tokens";
      g.time = to_stats(kernels::gpu_time([&] { batch.run(moe::ExpertPath::automatic); }, nullptr,
                                          quick ? 5 : 10, 2));
      g.bytes = batch.distinct * ExpertPool::expert_bytes();
      g.flops = 6.0 * double(batch.b.P) * kH * kI;
      g.peak_is_bandwidth = M < 16;
      g.peak_name = g.peak_is_bandwidth ? "HBM copy (measured)" : "bf16 GEMM (measured)";
      g.peak = g.peak_is_bandwidth ? copy : peak;
      g.note = "grouped_experts, automatic path";
      r.add(g);
      c.points.push_back({M, g.gbps()});
    }
    c.source = "measured: kernels::moe::grouped_experts, 128 K3 experts x M tokens, automatic path";
    hw.kernels.gpu_expert = c;
  }
  const int64_t N = 12288, K = 7168;
  const size_t wbytes = size_t(N * K * 2), stride = (wbytes + 255) & ~size_t(255);
  const size_t pool_bytes = size_t(3) << 30, slots = pool_bytes / stride;
  DeviceBuffer wpool(pool_bytes), xbuf(size_t(4096) * K * 2), ybuf(size_t(4096) * N * 2);
  kernels::fill_random_bytes(wpool.get(), pool_bytes, 3, 0, 0x3f);
  kernels::fill_random_bytes(xbuf.get(), xbuf.bytes(), 4, 0, 0x3f);
  kernels::gemm::Gemm gemm;
  offload::RateCurve t;
  constexpr int kBackToBack = 8;
  for (int64_t M : quick ? std::vector<int64_t>{1, 4096} : std::vector<int64_t>{1, 16, 256, 4096}) {
    size_t k = 0;
    BenchLine l;
    l.name = "hw/gpu trunk GEMM M=" + std::to_string(M);
    l.shape = "12288x7168 (kda q/k/v/g_proj), " + std::to_string(kBackToBack) + " back to back";
    l.time = to_stats(kernels::gpu_time(
        [&] {
          for (int i = 0; i < kBackToBack; i++)
            ok(gemm.linear(
                   xbuf.as<uint16_t>(),
                   reinterpret_cast<const uint16_t*>(wpool.as<uint8_t>() + (k++ % slots) * stride),
                   ybuf.get(), kernels::gemm::OutType::bf16, M, N, K, nullptr),
               "gemm");
        },
        nullptr, quick ? 5 : 10, 2));
    l.time.median_s /= kBackToBack, l.time.min_s /= kBackToBack, l.time.max_s /= kBackToBack;
    l.bytes = double(wbytes);
    l.flops = 2.0 * double(M) * double(N) * double(K);
    l.peak_is_bandwidth = M < 256;
    l.peak_name = l.peak_is_bandwidth ? "HBM copy (measured)" : "bf16 GEMM (measured)";
    l.peak = l.peak_is_bandwidth ? copy : peak;
    l.note = "weights cold (rotating through 3 GiB)";
    r.add(l);
    t.points.push_back({int(M), l.gbps()});
  }
  t.source = "measured: kernels::gemm::Gemm::linear bf16, 12288x7168, 8 back to back, weight GB/s";
  hw.kernels.gpu_trunk = t;
  if (!model) return;
  // `bench hw -m DIR`: the GPU engine's GEMMs of a decode step at the model's own shapes
  // (offload::gpu_step_gemms, lm_head at M rows as in decode), back to back as a captured step
  // issues them, weights carved in turn from a pool that wraps around when the model's trunk is
  // larger (the pool stays ≫ L2, so every weight is read cold as in the engine).
  const std::vector<offload::GpuGemm> gemms = offload::gpu_step_gemms(*model);
  size_t total = 0, largest = 0;
  int64_t max_in = 1, max_out = 1;
  for (const auto& g : gemms) {
    const size_t b = (size_t(g.out * g.in) * 2 + 255) & ~size_t(255);
    total += b, largest = std::max(largest, b);
    max_in = std::max(max_in, g.in), max_out = std::max(max_out, g.out);
  }
  const size_t mpool = std::max(largest, std::min(total, pool_bytes));
  wpool = DeviceBuffer(mpool);
  kernels::fill_random_bytes(wpool.get(), mpool, 5, 0, 0x3f);
  const std::vector<int64_t> Ms =
      quick ? std::vector<int64_t>{1, 8} : std::vector<int64_t>{1, 2, 4, 8, 16, 64};
  DeviceBuffer mx(size_t(Ms.back()) * size_t(max_in) * 2),
      my(size_t(Ms.back()) * size_t(max_out) * 2);
  kernels::fill_random_bytes(mx.get(), mx.bytes(), 6, 0, 0x3f);
  double weight_bytes = 0;
  for (const auto& g : gemms) weight_bytes += 2.0 * double(g.out) * double(g.in);
  offload::RateCurve mc;
  for (int64_t M : Ms) {
    BenchLine l;
    l.name = "hw/gpu model GEMMs M=" + std::to_string(M);
    l.shape = std::to_string(gemms.size()) + " GEMMs of a decode step, " +
              std::to_string(int64_t(weight_bytes / 1e6)) + " MB";
    l.time = to_stats(kernels::gpu_time(
        [&] {
          size_t off = 0;
          for (const auto& g : gemms) {
            const size_t b = (size_t(g.out * g.in) * 2 + 255) & ~size_t(255);
            if (off + b > mpool) off = 0;
            ok(gemm.linear(mx.as<uint16_t>(),
                           reinterpret_cast<const uint16_t*>(wpool.as<uint8_t>() + off), my.get(),
                           kernels::gemm::OutType::bf16, M, g.out, g.in, nullptr),
               "gemm");
            off += b;
          }
        },
        nullptr, quick ? 3 : 5, 1));
    l.bytes = weight_bytes;
    l.flops = 2.0 * double(M) * weight_bytes / 2;
    l.peak_is_bandwidth = true;
    l.peak_name = "HBM copy (measured)";
    l.peak = copy;
    l.note = "the model's own shapes (bench hw -m)";
    r.add(l);
    mc.points.push_back({int(M), l.gbps()});
  }
  mc.source = "measured: the GPU engine's " + std::to_string(gemms.size()) +
              " GEMMs of a decode step at this model's shapes (kernels::gemm::Gemm::linear bf16, "
              "back to back), weight GB/s";
  offload::ModelShapeRates& ms = hw.model_shapes;
  if (ms.signature.empty()) ms.signature = offload::model_shape_signature(*model);
  if (ms.model.empty()) ms.model = model_name;
  ms.gpu_trunk = mc;
}

}  // namespace strata::tools
#endif  // STRATA_HAVE_CUDA
