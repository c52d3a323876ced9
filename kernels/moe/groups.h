// Routing → expert groups on the device (issue 18 item 2): the lists grouped_experts and
// merge_weighted read, built from the router's ids without a trip to the host, so a decode step
// whose routed experts all sit in the GPU expert cache runs from CUDA graphs end to end.
//
// Input: ids [n] = [T, K] (each token's K experts in increasing id, as kernels::ops::route writes
// them), slot_of [E] (the expert's GPU cache slot), views_by_slot [slots]. Output, for pairs
// sorted by (expert, token) — the order the host path builds:
//   views [g_cap], group_offsets [g_cap + 1]: groups of the distinct experts in increasing id,
//     then empty groups up to g_cap (offsets = n, views = the first group's, never read for a
//     token); g_cap ≥ the number of distinct experts (e.g. min(n, E));
//   pair_token [n]: the token (row of x) of each pair;
//   pair_of [n]: the pair row of (t, k), i.e. merge_weighted's `pair` list with token_offsets
//     t·K (a token's pairs in increasing expert id).
// Every expert named by ids must be resident (slot_of ≥ 0); the caller checks that on the host
// (all experts of the layer in the cache). n ≤ kMaxGroupPairs; one block, CUB block radix sort.
// Not here: the expert math (experts.h), the host path for partial placements (engine/).
#pragma once
#include <cstdint>

#include "kernels/runtime.h"
#include "storage/expert_contract.h"

namespace strata::kernels::moe {

inline constexpr int kMaxGroupPairs = 4096;  // T·K of one decode step (e.g. 256 rows × top-16)

Status build_groups(const int32_t* ids, int n, int K, const int32_t* slot_of,
                    const Mxfp4ExpertView* views_by_slot, int g_cap, Mxfp4ExpertView* views,
                    int32_t* group_offsets, int32_t* pair_token, int32_t* pair_of, void* stream);

}  // namespace strata::kernels::moe
