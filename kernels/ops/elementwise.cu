// Elementwise ops — SiTU/SiLU GLUs (spec/model.md §8), embedding gather (§9), bf16 <-> fp32 —
// see kernels/ops/ops.h. Grid-stride loops; fp32 math with explicit round-to-nearest intrinsics
// (no FMA contraction) and CUDA's tanhf/expf (≤ 2 ulp from libm; the op-check tolerance says so).
#include <cuda_runtime.h>

#include "kernels/ops/launch.cuh"
#include "kernels/ops/ops.h"
#include "storage/bf16.h"

namespace strata::kernels::ops {
namespace {

__device__ __forceinline__ float glu_one(GluParams a, float g, float u) {
  float sg = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
  if (a.kind == GluKind::silu) return __fmul_rn(__fmul_rn(g, sg), u);
  float gate = __fmul_rn(__fmul_rn(a.beta1, tanhf(__fdiv_rn(g, a.beta1))), sg);
  float up = a.beta2 > 0.0f ? __fmul_rn(a.beta2, tanhf(__fdiv_rn(u, a.beta2))) : u;
  return __fmul_rn(gate, up);
}

__global__ void glu_kernel(GluParams a, const float* g, const float* u, float* out, int64_t n,
                           bool rb) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float y = glu_one(a, g[i], u[i]);
    out[i] = rb ? round_bf16(y) : y;
  }
}

__global__ void glu_fused_kernel(GluParams a, const float* gu, float* out, int64_t T, int64_t I,
                                 bool rb) {
  const int64_t n = T * I;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / I, c = i - t * I;
    float y = glu_one(a, gu[t * 2 * I + c], gu[t * 2 * I + I + c]);
    out[i] = rb ? round_bf16(y) : y;
  }
}

__global__ void glu_fused_bf16_kernel(GluParams a, const float* gu, uint16_t* out, int64_t T,
                                      int64_t I) {
  const int64_t n = T * I;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / I, c = i - t * I;
    const float y = glu_one(a, round_bf16(gu[t * 2 * I + c]), round_bf16(gu[t * 2 * I + I + c]));
    out[i] = ::strata::f32_to_bf16(round_bf16(y));
  }
}

__global__ void gather_kernel(const uint16_t* table, int64_t vocab, int64_t D, const int32_t* ids,
                              float* out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
    out[t * D + d] =
        ok ? ::strata::bf16_to_f32(table[int64_t(id) * D + d]) : __int_as_float(0x7fc00000);
}

__global__ void f32_to_bf16_kernel(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = ::strata::f32_to_bf16(in[i]);
}

__global__ void gather_rows_bf16_kernel(const float* in, const int32_t* rows, int64_t n,
                                        int64_t cols, uint16_t* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    out[i] = ::strata::f32_to_bf16(in[int64_t(rows[r]) * cols + c]);
  }
}

__global__ void bf16_to_f32_kernel(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = ::strata::bf16_to_f32(in[i]);
}

unsigned grid_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  return unsigned(b < 4096 ? (b < 1 ? 1 : b) : 4096);
}

}  // namespace

Status glu(const GluParams& act, const float* g, const float* u, float* out, int64_t n,
           bool round_bf16, void* stream) {
  if (n < 0) return detail::invalid("glu: n < 0");
  if (n == 0) return {};
  glu_kernel<<<grid_for(n), 256, 0, detail::as_stream(stream)>>>(act, g, u, out, n, round_bf16);
  return detail::launch_status();
}

Status glu_fused(const GluParams& act, const float* gate_up, float* out, int64_t T, int64_t I,
                 bool round_bf16, void* stream) {
  if (T < 0 || I <= 0) return detail::invalid("glu_fused: bad T or I");
  if (T == 0) return {};
  glu_fused_kernel<<<grid_for(T * I), 256, 0, detail::as_stream(stream)>>>(act, gate_up, out, T, I,
                                                                           round_bf16);
  return detail::launch_status();
}

Status glu_fused_bf16(const GluParams& act, const float* gate_up, uint16_t* out, int64_t T,
                      int64_t I, void* stream) {
  if (T < 0 || I <= 0) return detail::invalid("glu_fused_bf16: bad T or I");
  if (T == 0) return {};
  glu_fused_bf16_kernel<<<grid_for(T * I), 256, 0, detail::as_stream(stream)>>>(act, gate_up, out,
                                                                                T, I);
  return detail::launch_status();
}

Status embedding_gather(const uint16_t* table, int64_t vocab, int64_t D, const int32_t* ids,
                        int64_t T, float* out, void* stream) {
  if (T < 0 || D <= 0 || vocab <= 0 || T > 0x7fffffff)
    return detail::invalid("embedding_gather: bad T, D or vocab");
  if (T == 0) return {};
  gather_kernel<<<unsigned(T), 256, 0, detail::as_stream(stream)>>>(table, vocab, D, ids, out);
  return detail::launch_status();
}

Status f32_to_bf16(const float* in, uint16_t* out, int64_t n, void* stream) {
  if (n < 0) return detail::invalid("f32_to_bf16: n < 0");
  if (n == 0) return {};
  f32_to_bf16_kernel<<<grid_for(n), 256, 0, detail::as_stream(stream)>>>(in, out, n);
  return detail::launch_status();
}

Status gather_rows_bf16(const float* in, const int32_t* rows, int64_t n, int64_t cols,
                        uint16_t* out, void* stream) {
  if (n < 0 || cols <= 0) return detail::invalid("gather_rows_bf16: bad n or cols");
  if (n == 0) return {};
  gather_rows_bf16_kernel<<<grid_for(n * cols), 256, 0, detail::as_stream(stream)>>>(in, rows, n,
                                                                                     cols, out);
  return detail::launch_status();
}

Status bf16_to_f32(const uint16_t* in, float* out, int64_t n, void* stream) {
  if (n < 0) return detail::invalid("bf16_to_f32: n < 0");
  if (n == 0) return {};
  bf16_to_f32_kernel<<<grid_for(n), 256, 0, detail::as_stream(stream)>>>(in, out, n);
  return detail::launch_status();
}

}  // namespace strata::kernels::ops
