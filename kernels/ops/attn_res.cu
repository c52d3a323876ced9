// AttnRes mix (spec/model.md §6.2) — see kernels/ops/ops.h. One block per token: per source an RMS
// reduction and a logit reduction (keys are formed exactly as the oracle forms them, x·r·w_norm·
// w_proj per element), an fp32 softmax over the ≤ 16 sources, then the mix of the raw values in
// source order.
#include <cuda_runtime.h>

#include "kernels/ops/launch.cuh"
#include "kernels/ops/ops.h"
#include "storage/bf16.h"

namespace strata::kernels::ops {
namespace {

using detail::block_sum;

__global__ void attn_res_mix_kernel(AttnResSources S, const float* norm_w, const float* proj_w,
                                    float* out, int64_t D, float eps, bool rb) {
  __shared__ float scratch[32];
  __shared__ float p[kMaxAttnResSources];
  const int64_t row = int64_t(blockIdx.x) * D;
  for (int i = 0; i < S.n; i++) {
    const float* x = S.src[i] + row;
    float ss = 0.0f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(x[d], x[d]));
    ss = block_sum(ss, scratch);
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(D)), eps)));
    float dot = 0.0f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
      dot = __fadd_rn(dot, __fmul_rn(__fmul_rn(__fmul_rn(x[d], r), norm_w[d]), proj_w[d]));
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) p[i] = dot;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int i = 0; i < S.n; i++) m = fmaxf(m, p[i]);
    float z = 0.0f;
    for (int i = 0; i < S.n; i++) {
      p[i] = expf(__fsub_rn(p[i], m));
      z = __fadd_rn(z, p[i]);
    }
    for (int i = 0; i < S.n; i++) p[i] = __fdiv_rn(p[i], z);
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < S.n; i++) acc = __fadd_rn(acc, __fmul_rn(p[i], S.src[i][row + d]));
    out[row + d] = rb ? round_bf16(acc) : acc;
  }
}

}  // namespace

Status attn_res_mix(const AttnResSources& sources, const float* norm_w, const float* proj_w,
                    float* out, int64_t T, int64_t D, float eps, bool round_bf16, void* stream) {
  if (sources.n < 1 || sources.n > kMaxAttnResSources)
    return detail::invalid("attn_res_mix: source count outside 1..16");
  if (T < 0 || D <= 0 || T > 0x7fffffff) return detail::invalid("attn_res_mix: bad T or D");
  if (T == 0) return {};
  attn_res_mix_kernel<<<unsigned(T), 256, 0, detail::as_stream(stream)>>>(sources, norm_w, proj_w,
                                                                          out, D, eps, round_bf16);
  return detail::launch_status();
}

}  // namespace strata::kernels::ops
