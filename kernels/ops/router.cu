// Router (spec/model.md §7.1; Kimi-Linear's in-place bias quirk §7.2) — see kernels/ops/ops.h.
// One warp per token: sigmoid scores and biased choice scores in shared memory, top-k by k warp
// arg-max picks (ties → the lower expert id, exactly the oracle's rule), then the selected weights
// renormalised in increasing expert-id order and the ids sorted ascending.
#include <cuda_runtime.h>

#include "kernels/ops/launch.cuh"
#include "kernels/ops/ops.h"

namespace strata::kernels::ops {
namespace {

constexpr int kWarps = 4;  // tokens per block
constexpr int kMaxTopk = 32;

// (value, id) ordering for selection: larger value first, then lower id.
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// One warp per token, kWarps tokens per block. Each lane keeps the best (value, id) of its
// experts e ≡ lane (mod 32); a pick reduces the 32 candidates by a butterfly and only the lane
// owning the pick rescans its experts (the pick's choice became −∞, nothing else changed). The
// block-wide form before (two barriers and a serial step per pick) took 14 us per decode token on
// the H200 (ncu, 8-layer slice, top-16 of 64).
__global__ void __launch_bounds__(kWarps * 32)
    route_kernel(const float* logits, RouterParams rp, int32_t* ids, float* weights, int64_t T) {
  __shared__ float score_all[kWarps][kMaxRouterExperts];
  __shared__ float choice_all[kWarps][kMaxRouterExperts];
  __shared__ int sel_all[kWarps][kMaxTopk];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = int64_t(blockIdx.x) * kWarps + warp;
  if (t >= T) return;
  float* score = score_all[warp];
  float* choice = choice_all[warp];
  int* sel = sel_all[warp];
  const int E = rp.E;
  const float* lr = logits + t * E;
  for (int e = lane; e < E; e += 32) {
    float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-lr[e])));
    score[e] = s;
    choice[e] = rp.bias ? __fadd_rn(s, rp.bias[e]) : s;
  }
  __syncwarp();
  float lv = -INFINITY;  // this lane's best (value, id)
  int li = 0x7fffffff;
  auto rescan = [&] {
    lv = -INFINITY, li = 0x7fffffff;
    for (int e = lane; e < E; e += 32)
      if (better(choice[e], e, lv, li)) lv = choice[e], li = e;
  };
  rescan();
  for (int k = 0; k < rp.topk; k++) {
    float bv = lv;
    int bi = li;
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    const int i = bi < 0 || bi >= E ? 0 : bi;  // all NaN: keep a valid id; weights come out NaN
    if (lane == 0) sel[k] = i;
    if (lane == (i & 31)) {
      choice[i] = -INFINITY;  // removed from later picks
      rescan();
    }
    __syncwarp();
  }
  // The picks in increasing id (the oracle sorts its pick list, duplicates included: a row of
  // NaN or −∞ choices can pick an id twice): each expert's pick count, then one warp scan of the
  // counts per 32 experts places its id count times. Weights in parallel, one lane per pick; the
  // normaliser summed in that order by every lane (the oracle's order of additions).
  int* count = reinterpret_cast<int*>(choice);
  for (int e = lane; e < E; e += 32) count[e] = 0;
  __syncwarp();
  for (int k = lane; k < rp.topk; k += 32) atomicAdd(&count[sel[k]], 1);
  __syncwarp();
  int base = 0;
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int c = e0 + lane < E ? count[e0 + lane] : 0;
    int incl = c;
    for (int off = 1; off < 32; off <<= 1) {
      const int o = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += o;
    }
    __syncwarp();
    for (int j = incl - c; j < incl; j++) sel[base + j] = e0 + lane;
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  __syncwarp();
  float w = 0.0f;
  int id = 0;
  if (lane < rp.topk) {
    id = sel[lane];
    w = rp.form == RouterForm::biased_in_place && rp.bias ? __fadd_rn(score[id], rp.bias[id])
                                                          : score[id];
    choice[lane] = w;  // the counts are used up: the row holds the weights now
  }
  __syncwarp();
  float sum = 0.0f;
  for (int k = 0; k < rp.topk; k++) sum = __fadd_rn(sum, choice[k]);
  const float denom = __fadd_rn(sum, 1e-20f);
  if (lane < rp.topk) {
    const float v = rp.renormalize ? __fdiv_rn(w, denom) : w;
    ids[t * rp.topk + lane] = id;
    weights[t * rp.topk + lane] = __fmul_rn(v, rp.scaling);
  }
}

}  // namespace

Status route(const float* logits, const RouterParams& rp, int32_t* ids, float* weights, int64_t T,
             void* stream) {
  if (rp.E < 1 || rp.E > kMaxRouterExperts || rp.topk < 1 || rp.topk > kMaxTopk || rp.topk > rp.E)
    return detail::invalid("route: need 1 <= topk <= 32, topk <= E <= 1024");
  if (T < 0 || T > 0x7fffffff) return detail::invalid("route: bad T");
  if (T == 0) return {};
  route_kernel<<<unsigned((T + kWarps - 1) / kWarps), kWarps * 32, 0, detail::as_stream(stream)>>>(
      logits, rp, ids, weights, T);
  return detail::launch_status();
}

}  // namespace strata::kernels::ops
