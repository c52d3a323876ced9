// KimiRMSNorm, L2 norm and the gated per-head RMSNorm (spec/model.md §3) — see kernels/ops/ops.h.
// KimiRMSNorm of aligned rows of ≥ 256 floats (a multiple of 4) runs in the clustered row form
// (kernels/ops/row_cluster.cuh: a row over up to 8 SMs, held in registers, read once). Everything
// else — odd or short D, unaligned pointers, and L2 / gated norms, which the model runs on head
// vectors of 128 with T·96 rows, already many blocks — is one thread block per row, the block
// size following D (32 threads for head vectors of 128, 256 for hidden rows of 7168).
#include <cuda_runtime.h>

#include "kernels/ops/launch.cuh"
#include "kernels/ops/ops.h"
#include "kernels/ops/row_cluster.cuh"
#include "storage/bf16.h"

namespace strata::kernels::ops {
namespace {

using detail::block_sum;

int threads_for(int64_t D) {
  if (D <= 256) return 32;
  if (D <= 2048) return 128;
  return 256;
}

__device__ __forceinline__ float row_sum_sq(const float* x, int64_t D, float* scratch) {
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s = __fadd_rn(s, __fmul_rn(x[i], x[i]));
  return block_sum(s, scratch);
}

__device__ __forceinline__ float sigmoidf_ref(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

__global__ void kimi_rms_norm_kernel(const float* x, const float* w, float* out, uint16_t* ob,
                                     int64_t D, float eps, bool rb) {
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * D;
  float* yr = out + blockIdx.x * D;
  float ss = row_sum_sq(xr, D, scratch);
  float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(D)), eps)));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float y = __fmul_rn(xr[i], r);
    const float v = rb ? round_bf16(__fmul_rn(w[i], round_bf16(y))) : __fmul_rn(w[i], y);
    yr[i] = v;
    if (ob) ob[blockIdx.x * D + i] = strata::f32_to_bf16(v);
  }
}

// Clustered form: each thread's VEC float4s of x and w in registers; the sum of squares over the
// cluster; y = x·r, then w·y with the same rounding points as the one-block form.
template <int VEC>
__global__ void __launch_bounds__(detail::kRowThreads)
    kimi_rms_norm_cluster_kernel(const float* x, const float* w, float* out, uint16_t* ob,
                                 int64_t D, float eps, bool rb) {
  __shared__ float part[detail::kRowWarps][1];
  __shared__ float cta_ss[1], total[1];
  const unsigned rank = detail::cluster_ctarank(), C = detail::cluster_nctarank();
  const int64_t row = blockIdx.x / C;
  const int64_t d4 = D / 4;
  const float4* xr = reinterpret_cast<const float4*>(x + row * D);
  const float4* wr = reinterpret_cast<const float4*>(w);
  float4* yr = reinterpret_cast<float4*>(out + row * D);
  float4 xv[VEC], wv[VEC];
  int64_t j[VEC];
  bool in[VEC];
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int k = 0; k < VEC; k++) {
    in[k] = detail::row_slot(rank, C, d4, k, j[k]);
    xv[k] = in[k] ? xr[j[k]] : zero;
    wv[k] = in[k] ? wr[j[k]] : zero;
  }
  float ss[1] = {0.0f};
#pragma unroll
  for (int k = 0; k < VEC; k++) ss[0] = detail::sum_sq4(ss[0], xv[k]);
  detail::block_sums<1>(ss, 1, part, cta_ss);
  detail::cluster_totals(C, cta_ss, 1, total);
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(total[0], float(D)), eps)));
  detail::cluster_arrive();  // done reading other CTAs' shared memory
  auto one = [&](float xi, float wi) {
    const float y = __fmul_rn(xi, r);
    return rb ? round_bf16(__fmul_rn(wi, round_bf16(y))) : __fmul_rn(wi, y);
  };
#pragma unroll
  for (int k = 0; k < VEC; k++) {
    if (in[k]) {
      const float4 v = make_float4(one(xv[k].x, wv[k].x), one(xv[k].y, wv[k].y),
                                   one(xv[k].z, wv[k].z), one(xv[k].w, wv[k].w));
      yr[j[k]] = v;
      if (ob)  // 4 bf16 values as one 8-byte store
        reinterpret_cast<uint2*>(ob + row * D)[j[k]] = make_uint2(
            uint32_t(strata::f32_to_bf16(v.x)) | uint32_t(strata::f32_to_bf16(v.y)) << 16,
            uint32_t(strata::f32_to_bf16(v.z)) | uint32_t(strata::f32_to_bf16(v.w)) << 16);
    }
  }
  detail::cluster_wait();  // no CTA leaves while another may still read its cta_ss
}

__global__ void l2_norm_kernel(const float* x, float* out, int64_t D, float eps, bool rb) {
  __shared__ float scratch[32];
  const float* xr = x + blockIdx.x * D;
  float* yr = out + blockIdx.x * D;
  float ss = row_sum_sq(xr, D, scratch);
  float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ss, eps)));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float y = __fmul_rn(xr[i], r);
    yr[i] = rb ? round_bf16(y) : y;
  }
}

__global__ void gated_rms_norm_kernel(const float* o, const float* gate, const float* w, float* out,
                                      int64_t D, float eps, bool rb) {
  __shared__ float scratch[32];
  const float* orow = o + blockIdx.x * D;
  const float* grow = gate + blockIdx.x * D;
  float* yr = out + blockIdx.x * D;
  float ss = row_sum_sq(orow, D, scratch);
  float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, float(D)), eps)));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float y = __fmul_rn(__fmul_rn(__fmul_rn(orow[i], r), w[i]), sigmoidf_ref(grow[i]));
    yr[i] = rb ? round_bf16(y) : y;
  }
}

Status check_rows(int64_t rows, int64_t D) {
  if (rows < 0 || D <= 0 || rows > 0x7fffffff) return detail::invalid("norm: bad rows or D");
  return {};
}

}  // namespace

Status kimi_rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t D, float eps,
                     bool round_bf16, void* stream, uint16_t* out_bf16) {
  if (Status s = check_rows(rows, D); !s.ok()) return s;
  if (rows == 0) return {};
  const detail::RowSplit sp = detail::row_split(D, 4, 256);
  if (sp.cluster == 0 || !detail::aligned16(x) || !detail::aligned16(w) ||
      !detail::aligned16(out) || (reinterpret_cast<uintptr_t>(out_bf16) & 7) != 0 ||
      rows > 0x7fffffff / sp.cluster)
    return kimi_rms_norm_row_blocks(x, w, out, rows, D, eps, round_bf16, stream, out_bf16);
  auto* k = sp.vec == 1   ? kimi_rms_norm_cluster_kernel<1>
            : sp.vec == 2 ? kimi_rms_norm_cluster_kernel<2>
                          : kimi_rms_norm_cluster_kernel<4>;
  return detail::launch_clustered(k, dim3(unsigned(rows * sp.cluster)), dim3(detail::kRowThreads),
                                  unsigned(sp.cluster), stream, x, w, out, out_bf16, D, eps,
                                  round_bf16);
}

Status kimi_rms_norm_row_blocks(const float* x, const float* w, float* out, int64_t rows, int64_t D,
                                float eps, bool round_bf16, void* stream, uint16_t* out_bf16) {
  if (Status s = check_rows(rows, D); !s.ok()) return s;
  if (rows == 0) return {};
  kimi_rms_norm_kernel<<<unsigned(rows), threads_for(D), 0, detail::as_stream(stream)>>>(
      x, w, out, out_bf16, D, eps, round_bf16);
  return detail::launch_status();
}

Status l2_norm(const float* x, float* out, int64_t rows, int64_t D, float eps, bool round_bf16,
               void* stream) {
  if (Status s = check_rows(rows, D); !s.ok()) return s;
  if (rows == 0) return {};
  l2_norm_kernel<<<unsigned(rows), threads_for(D), 0, detail::as_stream(stream)>>>(x, out, D, eps,
                                                                                   round_bf16);
  return detail::launch_status();
}

Status gated_rms_norm(const float* o, const float* gate, const float* w, float* out, int64_t rows,
                      int64_t D, float eps, bool round_bf16, void* stream) {
  if (Status s = check_rows(rows, D); !s.ok()) return s;
  if (rows == 0) return {};
  gated_rms_norm_kernel<<<unsigned(rows), threads_for(D), 0, detail::as_stream(stream)>>>(
      o, gate, w, out, D, eps, round_bf16);
  return detail::launch_status();
}

}  // namespace strata::kernels::ops
