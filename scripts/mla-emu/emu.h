// Minimal host emulation (scripts/mla-emu/run.sh) of the CUDA features MLA decode's attn_wgmma
// uses: one std::thread per CUDA thread; __syncthreads, warp shuffles, named barriers (bar.sync /
// bar.arrive) and mbarriers (phase parity; cp.async arrivals) with their hardware semantics;
// cp.async as a synchronous copy (zero-fill included: a copy lands at issue, so a refill issued
// before a wgmma that still reads the stage has retired corrupts it, as it could on the GPU); the
// wgmmas recorded at issue and run at the wait_group that retires them, collectively over the
// warpgroup's 128 threads, reading shared memory through the descriptors' no-swizzle core-matrix
// addressing (start, leading = K-direction and stride = M/N-direction byte offsets), so a layout
// or descriptor mistake, an operand overwritten before the wait, or an accumulator touched before
// it shows as a wrong result. Not emulated: the proxy fences, and copies landing late.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(x) alignas(x)
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
inline float2 make_float2(float a, float b) {
  return {a, b};
}
inline float4 make_float4(float a, float b, float c, float d) {
  return {a, b, c, d};
}
inline float __uint_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
using std::max;
using std::min;
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
inline uint16_t bf16_rn(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_f(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}

// A hardware barrier that counts arrivals (bar.sync waits, bar.arrive does not) and releases the
// waiters when `count` threads have arrived; the same for named barriers and __syncthreads.
struct NamedBar {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t gen = 0;
  void arrive(int count, bool wait) {
    std::unique_lock<std::mutex> lk(mu);
    const uint64_t my = gen;
    if (++arrived == count) {
      arrived = 0;
      gen++;
      cv.notify_all();
      return;
    }
    if (wait) cv.wait(lk, [&] { return gen != my; });
  }
};
// mbarrier: `expected` arrivals complete a phase; try_wait.parity(p) succeeds once the phase of
// parity p has completed (the current phase's parity differs from p).
struct MBar {
  std::mutex mu;
  std::condition_variable cv;
  int expected = 0, pending = 0;
  uint64_t phase = 0;
  void init(int n) {
    std::lock_guard<std::mutex> lk(mu);
    expected = pending = n, phase = 0;
  }
  void arrive() {
    std::lock_guard<std::mutex> lk(mu);
    if (--pending == 0) {
      phase++;
      pending = expected;
      cv.notify_all();
    }
  }
  void wait(uint32_t parity) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return (phase & 1) != parity; });
  }
};

struct Block {
  std::vector<uint8_t> smem;
  NamedBar bars[16];
  std::map<uint32_t, std::unique_ptr<MBar>> mbars;
  std::mutex mbar_mu;
  std::vector<float> xchg;  // per warp: 32 lanes × 16 floats
  std::vector<std::unique_ptr<std::barrier<>>> warps, wgs;
  // wgmma gathering: per warpgroup, each thread's accumulator and A-fragment pointers
  struct Op {
    int n = 0;
    bool has_a = false, b_mn = false;
    uint64_t desc_a = 0, desc_b = 0;
    std::vector<uint32_t> a;  // 128 threads × 4 registers
    float* d[128];
  };
  struct Wg {
    float* d[128];
    const uint32_t* a[128];
    std::vector<Op> open;                 // issued since the last commit
    std::vector<std::vector<Op>> groups;  // committed, not yet retired
  } wg[4];
  int threads = 0;
  MBar& mbar(uint32_t addr) {
    std::lock_guard<std::mutex> lk(mbar_mu);
    auto& p = mbars[addr];
    if (!p) p = std::make_unique<MBar>();
    return *p;
  }
};
struct Ctx {
  dim3 tid, bid;
  Block* blk;
};
inline thread_local Ctx ctx;
#define threadIdx (ctx.tid)
#define blockIdx (ctx.bid)
inline uint8_t* emu_smem() {
  return ctx.blk->smem.data();
}
inline uint32_t smem_addr(const void* p) {
  return uint32_t(static_cast<const uint8_t*>(p) - ctx.blk->smem.data());
}
inline void __syncthreads() {
  ctx.blk->bars[0].arrive(ctx.blk->threads, true);
}
inline void named_bar(int id, int threads) {
  ctx.blk->bars[id].arrive(threads, true);
}
inline void named_bar_arrive(int id, int threads) {
  ctx.blk->bars[id].arrive(threads, false);
}
inline void warp_sync() {
  ctx.blk->warps[ctx.tid.x / 32]->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int off) {
  float* x = ctx.blk->xchg.data() + (ctx.tid.x / 32) * 32 * 16;
  const int lane = ctx.tid.x % 32;
  x[lane * 16] = v;
  warp_sync();
  const float r = x[(lane ^ off) * 16];
  warp_sync();
  return r;
}
inline void mbar_init(uint32_t bar, uint32_t count) {
  ctx.blk->mbar(bar).init(int(count));
}
inline void fence_mbar_init() {}
inline void cp_async_arrive(uint32_t bar) {
  ctx.blk->mbar(bar).arrive();
}
inline void mbar_wait(uint32_t bar, uint32_t parity) {
  ctx.blk->mbar(bar).wait(parity);
}
inline void cp_async16_at(uint32_t dst, const void* src, uint32_t src_bytes) {
  uint8_t* d = ctx.blk->smem.data() + dst;
  if (src_bytes == 16)
    memcpy(d, src, 16);
  else
    memset(d, 0, 16);
}
inline void reg_fence(float&) {}
inline void fence_proxy_async() {}
inline float fast_exp2(float x) {
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
}
inline uint32_t pack_bf2(float lo, float hi) {
  return uint32_t(bf16_rn(lo)) | (uint32_t(bf16_rn(hi)) << 16);
}
inline uint64_t wgmma_desc(uint32_t addr, uint32_t lead_bytes, uint32_t stride_bytes) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lead_bytes >> 4) << 16) |
         (uint64_t(stride_bytes >> 4) << 32);
}

namespace emu {
// Element (i, k) of a no-swizzle operand: i along M/N, k along K; mn_major: 8 consecutive i are
// contiguous (a core matrix row is 8 elements of i), else 8 consecutive k.
inline float desc_elem(uint64_t desc, int i, int k, bool mn_major) {
  const uint32_t start = uint32_t(desc & 0x3FFF) << 4, lbo = uint32_t((desc >> 16) & 0x3FFF) << 4,
                 sbo = uint32_t((desc >> 32) & 0x3FFF) << 4;
  const uint32_t off = mn_major ? (k / 8) * lbo + (i / 8) * sbo + (k % 8) * 16 + (i % 8) * 2
                                : (k / 8) * lbo + (i / 8) * sbo + (i % 8) * 16 + (k % 8) * 2;
  uint16_t b;
  memcpy(&b, ctx.blk->smem.data() + start + off, 2);
  return bf16_f(b);
}
// Runs one recorded wgmma: D[64 × n] += A[64 × 16] · B[16 × n] into the 128 threads' accumulators.
// The m16n8 C/D layout over the warpgroup: thread (warp ww, lane g·4 + t), element d[nt][e] is
// row 16·ww + g (+8 for e ≥ 2), column 8·nt + 2t + (e & 1). The A fragment a[0..3]: rows g / g+8,
// k 2t.. (a0, a1) and 8 + 2t.. (a2, a3), two bf16 each, the lower k in the low half.
inline void execute(const Block::Op& op) {
  std::vector<float> A(64 * 16), Bm(size_t(op.n) * 16);
  for (int i = 0; i < 64; i++)
    for (int k = 0; k < 16; k++) {
      if (op.has_a) {
        const int ww = i / 16, g = i % 8, hi = (i % 16) / 8, t = (k % 8) / 2;
        const uint32_t v = op.a[(ww * 32 + g * 4 + t) * 4 + hi + 2 * (k / 8)];
        A[i * 16 + k] = bf16_f(uint16_t((k & 1) ? v >> 16 : v & 0xffff));
      } else {
        A[i * 16 + k] = desc_elem(op.desc_a, i, k, false);
      }
    }
  for (int n = 0; n < op.n; n++)
    for (int k = 0; k < 16; k++) Bm[n * 16 + k] = desc_elem(op.desc_b, n, k, op.b_mn);
  for (int th = 0; th < 128; th++) {
    const int ww = th / 32, g = (th % 32) / 4, t = th % 4;
    for (int nt = 0; nt < op.n / 8; nt++)
      for (int e = 0; e < 4; e++) {
        const int r = ww * 16 + g + (e >= 2 ? 8 : 0), c = nt * 8 + 2 * t + (e & 1);
        double acc = 0;
        for (int k = 0; k < 16; k++) acc += double(A[r * 16 + k]) * Bm[c * 16 + k];
        op.d[th][nt * 4 + e] += float(acc);
      }
  }
}
// Issue: recorded (A registers copied now, shared memory read when it runs); the warpgroup's
// wgmmas run at the wait_group that retires them, in order, so an operand overwritten or an
// accumulator touched before that wait changes the result, as on the GPU.
inline void record(int n, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b,
                   bool b_mn) {
  Block& B = *ctx.blk;
  const int wgi = ctx.tid.x / 128, wt = ctx.tid.x % 128;
  B.wg[wgi].d[wt] = d;
  B.wg[wgi].a[wt] = a;
  B.wgs[wgi]->arrive_and_wait();
  if (wt == 0) {
    Block::Op op;
    op.n = n, op.has_a = a != nullptr, op.desc_a = desc_a, op.desc_b = desc_b, op.b_mn = b_mn;
    for (int th = 0; th < 128; th++) {
      op.d[th] = B.wg[wgi].d[th];
      if (a)
        for (int r = 0; r < 4; r++) op.a.push_back(B.wg[wgi].a[th][r]);
    }
    B.wg[wgi].open.push_back(std::move(op));
  }
  B.wgs[wgi]->arrive_and_wait();
}
}  // namespace emu
inline void wgmma_fence() {}
inline void wgmma_commit() {
  Block& B = *ctx.blk;
  const int wgi = ctx.tid.x / 128;
  B.wgs[wgi]->arrive_and_wait();
  if (ctx.tid.x % 128 == 0) {
    B.wg[wgi].groups.push_back(std::move(B.wg[wgi].open));
    B.wg[wgi].open.clear();
  }
  B.wgs[wgi]->arrive_and_wait();
}
template <int N>
inline void wgmma_wait() {
  Block& B = *ctx.blk;
  const int wgi = ctx.tid.x / 128;
  B.wgs[wgi]->arrive_and_wait();
  if (ctx.tid.x % 128 == 0) {
    auto& gs = B.wg[wgi].groups;
    while (int(gs.size()) > N) {
      for (const auto& op : gs.front()) emu::execute(op);
      gs.erase(gs.begin());
    }
  }
  B.wgs[wgi]->arrive_and_wait();
}
inline void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b) {
  emu::record(64, &d[0][0], nullptr, desc_a, desc_b, false);
}
inline void wgmma_m64n128k16_tb(float (&d)[16][4], const uint32_t* a, uint64_t desc_b) {
  emu::record(128, &d[0][0], a, 0, desc_b, true);
}
inline void wgmma_m64n128k16_ss_tb(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b) {
  emu::record(128, &d[0][0], nullptr, desc_a, desc_b, true);
}

template <class F>
void launch(dim3 grid, int threads, size_t smem, F kernel) {
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        Block blk;
        blk.threads = threads;
        blk.smem.assign(smem, 0xFF);  // NaN bf16 pairs: an unwritten read poisons the result
        blk.xchg.assign(size_t(threads / 32) * 32 * 16, 0.f);
        for (int w = 0; w < threads / 32; w++)
          blk.warps.push_back(std::make_unique<std::barrier<>>(32));
        for (int w = 0; w < (threads + 127) / 128; w++)
          blk.wgs.push_back(std::make_unique<std::barrier<>>(128));
        std::vector<std::thread> th;
        for (int i = 0; i < threads; i++)
          th.emplace_back([&, i] {
            ctx.tid = {unsigned(i), 0, 0};
            ctx.bid = {x, y, z};
            ctx.blk = &blk;
            kernel();
          });
        for (auto& t : th) t.join();
      }
}
