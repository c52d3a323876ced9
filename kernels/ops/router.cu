// Router (spec/model.md §7.1; Kimi-Linear's in-place bias quirk §7.2) — see kernels/ops/ops.h.
// One block per token: sigmoid scores and biased choice scores in shared memory, top-k by k
// block-wide arg-max passes (ties → the lower expert id, exactly the oracle's rule), then the
// selected weights renormalised in increasing expert-id order and the ids sorted ascending.
#include <cuda_runtime.h>

#include "kernels/ops/launch.cuh"
#include "kernels/ops/ops.h"

namespace strata::kernels::ops {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxTopk = 32;

// (value, id) ordering for selection: larger value first, then lower id.
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

__global__ void route_kernel(const float* logits, RouterParams rp, int32_t* ids, float* weights) {
  __shared__ float score[kMaxRouterExperts];
  __shared__ float choice[kMaxRouterExperts];
  __shared__ float wv[32];
  __shared__ int wi[32];
  __shared__ int sel[kMaxTopk];
  const int E = rp.E;
  const float* lr = logits + int64_t(blockIdx.x) * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-lr[e])));
    score[e] = s;
    choice[e] = rp.bias ? __fadd_rn(s, rp.bias[e]) : s;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int k = 0; k < rp.topk; k++) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (better(choice[e], e, bv, bi)) bv = choice[e], bi = e;
    for (int off = 16; off > 0; off >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) wv[warp] = bv, wi[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
      float v = wv[0];
      int i = wi[0];
      for (int w = 1; w < int(blockDim.x >> 5); w++)
        if (better(wv[w], wi[w], v, i)) v = wv[w], i = wi[w];
      if (i < 0 || i >= E) i = 0;  // all scores NaN: keep a valid id; weights come out NaN
      sel[k] = i;
      choice[i] = -INFINITY;  // removed from later passes
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int s[kMaxTopk];
    for (int k = 0; k < rp.topk; k++) {  // insertion sort by increasing id
      int v = sel[k], j = k;
      while (j > 0 && s[j - 1] > v) s[j] = s[j - 1], j--;
      s[j] = v;
    }
    float w[kMaxTopk];
    float sum = 0.0f;
    for (int k = 0; k < rp.topk; k++) {
      w[k] = rp.form == RouterForm::biased_in_place && rp.bias
                 ? __fadd_rn(score[s[k]], rp.bias[s[k]])
                 : score[s[k]];
      sum = __fadd_rn(sum, w[k]);
    }
    const float denom = __fadd_rn(sum, 1e-20f);
    int32_t* io = ids + int64_t(blockIdx.x) * rp.topk;
    float* wo = weights + int64_t(blockIdx.x) * rp.topk;
    for (int k = 0; k < rp.topk; k++) {
      float v = rp.renormalize ? __fdiv_rn(w[k], denom) : w[k];
      io[k] = s[k];
      wo[k] = __fmul_rn(v, rp.scaling);
    }
  }
}

}  // namespace

Status route(const float* logits, const RouterParams& rp, int32_t* ids, float* weights, int64_t T,
             void* stream) {
  if (rp.E < 1 || rp.E > kMaxRouterExperts || rp.topk < 1 || rp.topk > kMaxTopk || rp.topk > rp.E)
    return detail::invalid("route: need 1 <= topk <= 32, topk <= E <= 1024");
  if (T < 0 || T > 0x7fffffff) return detail::invalid("route: bad T");
  if (T == 0) return {};
  route_kernel<<<unsigned(T), kThreads, 0, detail::as_stream(stream)>>>(logits, rp, ids, weights);
  return detail::launch_status();
}

}  // namespace strata::kernels::ops
