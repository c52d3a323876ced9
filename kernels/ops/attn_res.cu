// AttnRes mix (spec/model.md §6.2) — see kernels/ops/ops.h. Per token: per source an RMS
// reduction and a logit reduction (keys are formed exactly as the oracle forms them, x·r·w_norm·
// w_proj per element), an fp32 softmax over the ≤ 16 sources, then the mix of the raw values in
// source order. Aligned rows of 256..16384 floats (a multiple of 4) run in the clustered row form
// (kernels/ops/row_cluster.cuh): every source's slice of the row in registers, read once, the n
// sums of squares and then the n logits combined over the cluster in one exchange each. Other
// shapes: one block per token, sources one after the other.
#include <cuda_runtime.h>

#include "kernels/ops/launch.cuh"
#include "kernels/ops/ops.h"
#include "kernels/ops/row_cluster.cuh"
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

template <int VEC>
__global__ void __launch_bounds__(detail::kRowThreads)
    attn_res_mix_cluster_kernel(AttnResSources S, const float* norm_w, const float* proj_w,
                                float* out, int64_t D, float eps, bool rb) {
  constexpr int N = kMaxAttnResSources;
  __shared__ float part[detail::kRowWarps][N];
  __shared__ float cta_ss[N], cta_dot[N], total_ss[N], total_dot[N];
  const unsigned rank = detail::cluster_ctarank(), C = detail::cluster_nctarank();
  const int n = S.n;
  const int64_t row = blockIdx.x / C;
  const int64_t d4 = D / 4;
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // All loads first (every source's slice, both weight vectors), so they are in flight together.
  float4 xv[N][VEC], nw[VEC], pw[VEC];
  int64_t j[VEC];
  bool in[VEC];
#pragma unroll
  for (int k = 0; k < VEC; k++) {
    in[k] = detail::row_slot(rank, C, d4, k, j[k]);
    nw[k] = in[k] ? reinterpret_cast<const float4*>(norm_w)[j[k]] : zero;
    pw[k] = in[k] ? reinterpret_cast<const float4*>(proj_w)[j[k]] : zero;
#pragma unroll
    for (int i = 0; i < N; i++)
      xv[i][k] = in[k] && i < n ? reinterpret_cast<const float4*>(S.src[i] + row * D)[j[k]] : zero;
  }
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; i++) {
    acc[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[i] = detail::sum_sq4(acc[i], xv[i][k]);
  }
  detail::block_sums<N>(acc, n, part, cta_ss);
  detail::cluster_totals(C, cta_ss, n, total_ss);
  // Logits: Σ_d x·r·w_norm·w_proj, rounded per product as the oracle does.
#pragma unroll
  for (int i = 0; i < N; i++) {
    const float r =
        __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total_ss[i < n ? i : 0], float(D)), eps)));
    auto key = [&](float x, float a, float b) {
      return __fmul_rn(__fmul_rn(__fmul_rn(x, r), a), b);
    };
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      dot = __fadd_rn(dot, key(xv[i][k].x, nw[k].x, pw[k].x));
      dot = __fadd_rn(dot, key(xv[i][k].y, nw[k].y, pw[k].y));
      dot = __fadd_rn(dot, key(xv[i][k].z, nw[k].z, pw[k].z));
      dot = __fadd_rn(dot, key(xv[i][k].w, nw[k].w, pw[k].w));
    }
    acc[i] = dot;
  }
  // part is free again: cluster_totals' cluster barrier came after its last read.
  detail::block_sums<N>(acc, n, part, cta_dot);
  detail::cluster_totals(C, cta_dot, n, total_dot);
  detail::cluster_arrive();  // done reading other CTAs' shared memory
  // Softmax over the sources in fp32, every thread alike (the one-block form's order).
  float p[N];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < N; i++)
    if (i < n) m = fmaxf(m, total_dot[i]);
  float z = 0.0f;
#pragma unroll
  for (int i = 0; i < N; i++) {
    p[i] = i < n ? expf(__fsub_rn(total_dot[i], m)) : 0.0f;
    if (i < n) z = __fadd_rn(z, p[i]);
  }
#pragma unroll
  for (int i = 0; i < N; i++) p[i] = __fdiv_rn(p[i], z);
  auto mix = [&](float4(*x)[VEC], int k, int c) {
    float a = 0.0f;
#pragma unroll
    for (int i = 0; i < N; i++) {
      if (i < n) {
        const float4 v = x[i][k];
        const float e = c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
        a = __fadd_rn(a, __fmul_rn(p[i], e));
      }
    }
    return rb ? round_bf16(a) : a;
  };
#pragma unroll
  for (int k = 0; k < VEC; k++) {
    if (in[k])
      reinterpret_cast<float4*>(out + row * D)[j[k]] =
          make_float4(mix(xv, k, 0), mix(xv, k, 1), mix(xv, k, 2), mix(xv, k, 3));
  }
  detail::cluster_wait();  // no CTA leaves while another may still read its sums
}

}  // namespace

Status attn_res_mix(const AttnResSources& sources, const float* norm_w, const float* proj_w,
                    float* out, int64_t T, int64_t D, float eps, bool round_bf16, void* stream) {
  if (sources.n < 1 || sources.n > kMaxAttnResSources)
    return detail::invalid("attn_res_mix: source count outside 1..16");
  if (T < 0 || D <= 0 || T > 0x7fffffff) return detail::invalid("attn_res_mix: bad T or D");
  if (T == 0) return {};
  const detail::RowSplit sp = detail::row_split(D, 2, 256);
  bool aligned = detail::aligned16(norm_w) && detail::aligned16(proj_w) && detail::aligned16(out);
  for (int i = 0; i < sources.n; i++) aligned = aligned && detail::aligned16(sources.src[i]);
  if (sp.cluster == 0 || !aligned || T > 0x7fffffff / sp.cluster)
    return attn_res_mix_row_blocks(sources, norm_w, proj_w, out, T, D, eps, round_bf16, stream);
  auto* k = sp.vec == 1 ? attn_res_mix_cluster_kernel<1> : attn_res_mix_cluster_kernel<2>;
  return detail::launch_clustered(k, dim3(unsigned(T * sp.cluster)), dim3(detail::kRowThreads),
                                  unsigned(sp.cluster), stream, sources, norm_w, proj_w, out, D,
                                  eps, round_bf16);
}

Status attn_res_mix_row_blocks(const AttnResSources& sources, const float* norm_w,
                               const float* proj_w, float* out, int64_t T, int64_t D, float eps,
                               bool round_bf16, void* stream) {
  if (sources.n < 1 || sources.n > kMaxAttnResSources)
    return detail::invalid("attn_res_mix: source count outside 1..16");
  if (T < 0 || D <= 0 || T > 0x7fffffff) return detail::invalid("attn_res_mix: bad T or D");
  if (T == 0) return {};
  attn_res_mix_kernel<<<unsigned(T), 256, 0, detail::as_stream(stream)>>>(sources, norm_w, proj_w,
                                                                          out, D, eps, round_bf16);
  return detail::launch_status();
}

}  // namespace strata::kernels::ops
