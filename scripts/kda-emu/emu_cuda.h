// Minimal host emulation (scripts/kda-emu/run.sh) of the CUDA features chunk_prep_tc2 uses: one
// std::thread per CUDA thread, std::barrier for __syncthreads and per-warp barriers for shuffles
// and mma.sync.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
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
struct uint2 {
  unsigned x, y;
};
inline float2 make_float2(float a, float b) {
  return {a, b};
}
inline float4 make_float4(float a, float b, float c, float d) {
  return {a, b, c, d};
}
inline uint2 make_uint2(unsigned a, unsigned b) {
  return {a, b};
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
inline float __expf(float x) {
  return std::exp(x);
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
using std::min;
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
struct Ctx {
  dim3 tid, bid;
  std::barrier<>* block;
  std::barrier<>* warp;
  float* xchg;  // per warp: 32 lanes × 16 floats
};
inline thread_local Ctx ctx;
inline thread_local float* emu_sm;
#define threadIdx (ctx.tid)
#define blockIdx (ctx.bid)
inline void __syncthreads() {
  ctx.block->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned, float v, int off) {
  const int lane = ctx.tid.x % 32;
  ctx.xchg[lane * 16] = v;
  ctx.warp->arrive_and_wait();
  const float r = ctx.xchg[(lane ^ off) * 16];
  ctx.warp->arrive_and_wait();
  return r;
}
struct __nv_bfloat162 {
  uint16_t x, y;
};
inline uint16_t bf16_rn(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {bf16_rn(a), bf16_rn(b)};
}
// mma.sync m16n8k8 tf32 (operands truncated to their top 19 bits), fp32 accumulation.
inline float tf32_trunc(uint32_t u) {
  return __uint_as_float(u & 0xffffe000u);
}
inline void mma_emu(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                    uint32_t b1) {
  const int lane = ctx.tid.x % 32;
  float* me = ctx.xchg + lane * 16;
  me[0] = tf32_trunc(a0), me[1] = tf32_trunc(a1), me[2] = tf32_trunc(a2), me[3] = tf32_trunc(a3);
  me[4] = tf32_trunc(b0), me[5] = tf32_trunc(b1);
  ctx.warp->arrive_and_wait();
  float A[16][8], B[8][8];
  for (int l = 0; l < 32; l++) {
    const float* f = ctx.xchg + l * 16;
    const int g = l / 4, t = l % 4;
    A[g][t] = f[0], A[g + 8][t] = f[1], A[g][t + 4] = f[2], A[g + 8][t + 4] = f[3];
    B[t][g] = f[4], B[t + 4][g] = f[5];
  }
  ctx.warp->arrive_and_wait();
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; e++) {
    const int r = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    double acc = 0;
    for (int k = 0; k < 8; k++) acc += double(A[r][k]) * B[k][col];
    c[e] += float(acc);
  }
}
template <class F>
void launch(dim3 grid, int threads, size_t smem, F kernel) {
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        std::vector<float> sm(smem / 4 + 16);
        std::vector<float> xchg(threads / 32 * 32 * 16);
        std::barrier<> block(threads);
        std::vector<std::unique_ptr<std::barrier<>>> warps;
        for (int w = 0; w < threads / 32; w++)
          warps.push_back(std::make_unique<std::barrier<>>(32));
        std::vector<std::thread> th;
        for (int i = 0; i < threads; i++)
          th.emplace_back([&, i] {
            ctx.tid = {unsigned(i), 0, 0};
            ctx.bid = {x, y, z};
            ctx.block = &block;
            ctx.warp = warps[i / 32].get();
            ctx.xchg = xchg.data() + (i / 32) * 32 * 16;
            emu_sm = sm.data();
            kernel();
          });
        for (auto& t : th) t.join();
      }
}
