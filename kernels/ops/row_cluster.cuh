// The clustered row form of the reducing row ops (KimiRMSNorm, AttnRes mix; kernels/ops/ops.h):
// one row spread over a thread-block cluster of up to 8 CTAs on as many SMs (sm_90), each thread
// holding its float4s of the row in registers, the row sums combined across the cluster through
// distributed shared memory. Why: a decode step has 1..16 rows of 7168 floats, and one CTA per
// row left 131 of 132 SMs idle while one SM walked the row in ~28 dependent load rounds (≈ 20 µs
// per KimiRMSNorm, ≈ 38 µs per AttnRes mix on the H200, docs/performance.md "End to end").
//
// The split (CTAs and float4s per thread) depends on D only, never on the row count, so a row's
// result is the same bits in a decode step of 1 row and in a prefill of 4096. The summation order
// is fixed: per thread over its float4s in index order (x, y, z, w), a shuffle tree per warp, the
// 8 warps in order, the cluster's CTAs in rank order. Not here: the one-CTA-per-row form (odd D,
// unaligned pointers, short rows), which stays in each op's .cu file.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/ops/launch.cuh"

namespace strata::kernels::detail {

inline constexpr int kRowThreads = 256;
inline constexpr int kRowWarps = kRowThreads / 32;
inline constexpr int kMaxRowCluster = 8;  // portable cluster size limit

struct RowSplit {
  int cluster = 0;  // CTAs per row; 0 = use the one-CTA-per-row form
  int vec = 0;      // float4s per thread
};

// The smallest float4-per-thread count (1, 2, .. max_vec) that fits the row in ≤ 8 CTAs, and the
// smallest power-of-two cluster that holds it (7168 and 3584 split evenly into 8 and 4 chunks of
// 224 float4s; power-of-two clusters are the common shape, so no odd sizes are asked of the
// scheduler). Rows shorter than min_d, not a multiple of 4 floats or too long get {0, 0}.
inline RowSplit row_split(int64_t D, int max_vec, int64_t min_d) {
  if (D < min_d || D % 4 != 0) return {};
  const int64_t d4 = D / 4;
  for (int vec = 1; vec <= max_vec; vec *= 2) {
    const int64_t per_cta = int64_t(kRowThreads) * vec;
    for (int c = 1; c <= kMaxRowCluster; c *= 2)
      if (d4 <= per_cta * c) return {c, vec};
  }
  return {};
}

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// The k-th float4 slot of this thread in its row: CTA rank r of C covers the float4s
// [r·chunk, (r+1)·chunk), chunk = ⌈d4 / C⌉ ≤ vec·256, consecutive threads consecutive float4s
// (coalesced). Returns false (j unset) for a slot past the chunk or the row.
__device__ __forceinline__ bool row_slot(unsigned rank, unsigned C, int64_t d4, int k, int64_t& j) {
  const int64_t chunk = (d4 + C - 1) / C;
  const int64_t in_chunk = int64_t(k) * kRowThreads + threadIdx.x;
  j = int64_t(rank) * chunk + in_chunk;
  return in_chunk < chunk && j < d4;
}

__device__ __forceinline__ float sum_sq4(float s, float4 v) {
  s = __fadd_rn(s, __fmul_rn(v.x, v.x));
  s = __fadd_rn(s, __fmul_rn(v.y, v.y));
  s = __fadd_rn(s, __fmul_rn(v.z, v.z));
  return __fadd_rn(s, __fmul_rn(v.w, v.w));
}

// Sums of N per-thread values over the block, in fixed order (warp shuffle tree, then warps in
// order); thread i < n gets total i in cta_out[i] after the call's final __syncthreads. part:
// [kRowWarps][N] shared floats, free on entry (the caller separates reuses by a barrier).
template <int N>
__device__ __forceinline__ void block_sums(const float (&v)[N], int n, float (*part)[N],
                                           float* cta_out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < N; i++) {
    if (i < n) {
      const float s = warp_sum(v[i]);
      if (lane == 0) part[warp][i] = s;
    }
  }
  __syncthreads();
  if (int(threadIdx.x) < n) {
    float s = 0.0f;
    for (int w = 0; w < kRowWarps; w++) s = __fadd_rn(s, part[w][threadIdx.x]);
    cta_out[threadIdx.x] = s;
  }
}

// Cluster primitives in PTX (sm_90; used by kernels/ops, kernels/kda/kda_decode.cu and the MLA TMA
// kernels instead of the toolkit's cooperative groups).
__device__ __forceinline__ unsigned cluster_ctarank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_nctarank() {
  unsigned n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
// Arrival without release semantics: for a barrier that orders nothing but what a fence before it
// published (fence.mbarrier_init), so the arrival does not wait for the CTA's copies in flight.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The float at the address of p in the shared memory of CTA `rank` of the cluster.
__device__ __forceinline__ float ld_cluster(const float* p, unsigned rank) {
  const uint32_t local = uint32_t(__cvta_generic_to_shared(p));
  uint32_t remote;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// After block_sums wrote cta_part[0..n) in every CTA of the cluster: the cluster-wide totals, in
// rank order, into total[0..n) of this CTA (shared), visible to all its threads on return. Makes
// one full cluster barrier (also a block barrier); the caller keeps every CTA alive until all have
// read (cluster_arrive after its last remote read, cluster_wait before exiting).
__device__ __forceinline__ void cluster_totals(unsigned C, float* cta_part, int n, float* total) {
  cluster_arrive();  // every CTA's cta_part written
  cluster_wait();
  if (int(threadIdx.x) < n) {
    float s = 0.0f;
    for (unsigned r = 0; r < C; r++) s = __fadd_rn(s, ld_cluster(cta_part + threadIdx.x, r));
    total[threadIdx.x] = s;
  }
  __syncthreads();
}

}  // namespace strata::kernels::detail
