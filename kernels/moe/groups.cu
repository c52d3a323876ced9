// kernels/moe/groups.h: one block sorts the (expert, token) keys of a step's pairs with CUB's block
// radix sort (4 keys per thread, blocked), marks the first pair of each expert, numbers the groups
// with a block scan, and writes the lists. The block is sized to the pairs (32, 256 or 1024
// threads): a decode step's 16 pairs sorted by 1024 threads took 23 us on the H200 (ncu, the
// 8-layer slice), most of it the sort of 4096 padding keys.
#include <cuda_runtime.h>
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/moe/groups.h"
#include "kernels/ops/launch.cuh"

namespace strata::kernels::moe {
namespace {

constexpr int kItems = 4;
static_assert(1024 * kItems == kMaxGroupPairs);

template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    groups_kernel(const int32_t* ids, int n, int K, const int32_t* slot_of,
                  const Mxfp4ExpertView* views_by_slot, int g_cap, Mxfp4ExpertView* views,
                  int32_t* group_offsets, int32_t* pair_token, int32_t* pair_of) {
  using Sort = cub::BlockRadixSort<uint32_t, kThreads, kItems, int32_t>;
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ union {
    typename Sort::TempStorage sort;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ uint32_t skey[kThreads * kItems];
  __shared__ int n_groups;
  uint32_t key[kItems];
  int32_t val[kItems];
  for (int j = 0; j < kItems; ++j) {
    const int i = threadIdx.x * kItems + j;
    // Expert in the high half, token in the low half (tokens < 2^16 since n ≤ 4096).
    key[j] = i < n ? (uint32_t(ids[i]) << 16) | uint32_t(i / K) : 0xFFFFFFFFu;
    val[j] = i;
  }
  Sort(tmp.sort).Sort(key, val);  // blocked: thread t holds sorted items kItems·t …
  for (int j = 0; j < kItems; ++j) skey[threadIdx.x * kItems + j] = key[j];
  __syncthreads();
  int heads = 0;
  bool head[kItems];
  for (int j = 0; j < kItems; ++j) {
    const int p = threadIdx.x * kItems + j;
    head[j] = p < n && (p == 0 || (skey[p] >> 16) != (skey[p - 1] >> 16));
    heads += head[j];
  }
  int g0 = 0, total = 0;
  Scan(tmp.scan).ExclusiveSum(heads, g0, total);
  for (int j = 0; j < kItems; ++j) {
    const int p = threadIdx.x * kItems + j;
    if (p >= n) break;
    pair_token[p] = int32_t(key[j] & 0xFFFFu);
    pair_of[val[j]] = p;
    if (head[j]) {
      group_offsets[g0] = p;
      views[g0] = views_by_slot[slot_of[key[j] >> 16]];
      ++g0;
    }
  }
  if (threadIdx.x == 0) n_groups = total;
  __syncthreads();
  for (int g = n_groups + int(threadIdx.x); g <= g_cap; g += kThreads) {
    group_offsets[g] = n;
    if (g < g_cap) views[g] = views_by_slot[slot_of[skey[0] >> 16]];
  }
}

}  // namespace

Status build_groups(const int32_t* ids, int n, int K, const int32_t* slot_of,
                    const Mxfp4ExpertView* views_by_slot, int g_cap, Mxfp4ExpertView* views,
                    int32_t* group_offsets, int32_t* pair_token, int32_t* pair_of, void* stream) {
  if (n < 1 || n > kMaxGroupPairs || K < 1 || n % K != 0 || g_cap < 1)
    return kernels::detail::invalid(
        "build_groups: n must be in [1, 4096], a multiple of K, g_cap >= 1");
  const int threads = n <= 32 * kItems ? 32 : n <= 256 * kItems ? 256 : 1024;
  auto* k = threads == 32    ? groups_kernel<32>
            : threads == 256 ? groups_kernel<256>
                             : groups_kernel<1024>;
  k<<<1, threads, 0, kernels::detail::as_stream(stream)>>>(
      ids, n, K, slot_of, views_by_slot, g_cap, views, group_offsets, pair_token, pair_of);
  return kernels::detail::launch_status();
}

}  // namespace strata::kernels::moe
