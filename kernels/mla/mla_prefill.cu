// MLA latent-cache write and prefill attention (see mla.h). Prefill expands the latent cache to
// per-head [k_nope | v] with one cuBLASLt GEMM, then a flash-style kernel walks the causal key
// tiles with an fp32 online softmax (exp2 domain: q is pre-scaled by scale·log2 e). fp32 CUDA-core
// arithmetic for now (no tensor cores; docs/performance.md has the numbers and the gap).
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "kernels/kda/cuda_util.cuh"
#include "kernels/mla/mla.h"

namespace strata::kernels::mla {
namespace {

using namespace strata::kernels::detail;

constexpr int kKv = kNope + kV;  // 256 expanded values per head and position
constexpr int BQ = 32, BK = 32, kThreads = 256;
constexpr int QP = kQDim + 4;  // 196: rows of 4 consecutive query rows fall in distinct banks
constexpr int KP = kQDim + 1;  // 193
constexpr int VP = kV;
constexpr int PP = BK + 1;
constexpr size_t kAttnSmem = sizeof(float) * (BQ * QP + BK * KP + BK * VP + BQ * PP);
constexpr size_t kGemmScratch = size_t(32) << 20;

__global__ void latent_rows(const uint16_t* ckv, const float* w, float eps, uint16_t* cache,
                            int64_t pos0, int64_t T) {
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= T) return;
  const int lane = threadIdx.x % 32;
  const uint16_t* x = ckv + t * kCacheDim;
  uint16_t* o = cache + (pos0 + t) * kCacheDim;
  float c[kLatent / 32], ss = 0.f;
#pragma unroll
  for (int i = 0; i < kLatent / 32; i++) {
    c[i] = bf(x[lane + 32 * i]);
    ss += c[i] * c[i];
  }
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / float(kLatent) + eps);
#pragma unroll
  for (int i = 0; i < kLatent / 32; i++) {
    const int j = lane + 32 * i;
    o[j] = to_bf(w[j] * round_bf(c[i] * r));
  }
  for (int j = lane; j < kRope; j += 32) o[kLatent + j] = x[kLatent + j];
}

__global__ void __launch_bounds__(kThreads)
    attn_prefill(int H, const uint16_t* q, const uint16_t* kv, const uint16_t* cache, int64_t S,
                 int64_t T, uint16_t* out, float qscale) {
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest (latest) query tiles first
  const int h = blockIdx.y, tid = threadIdx.x;
  extern __shared__ __align__(16) float sm[];
  float* Qs = sm;
  float* Ks = Qs + BQ * QP;
  float* Vs = Ks + BK * KP;
  float* Ps = Vs + BK * VP;
  const int64_t t0 = int64_t(qt) * BQ, base = S - T;
  for (int idx = tid; idx < BQ * kQDim; idx += kThreads) {
    const int r = idx / kQDim, c = idx % kQDim;
    const int64_t t = t0 + r;
    Qs[r * QP + c] = t < T ? bf(q[(t * H + h) * kQDim + c]) * qscale : 0.f;
  }
  const int r = tid / 8, sl = tid % 8;
  const int64_t my_pos = base + t0 + r;
  const int64_t last_pos = std::min<int64_t>(base + t0 + BQ - 1, S - 1);
  float m = -INFINITY, l = 0.f, acc[kV / 8];
#pragma unroll
  for (int j = 0; j < kV / 8; j++) acc[j] = 0.f;
  for (int64_t s0 = 0; s0 <= last_pos; s0 += BK) {
    __syncthreads();
    for (int idx = tid; idx < BK * kQDim; idx += kThreads) {
      const int j = idx / kQDim, c = idx % kQDim;
      const int64_t s = s0 + j;
      float val = 0.f;
      if (s < S)
        val = c < kNope ? bf(kv[(s * H + h) * kKv + c])
                        : bf(cache[s * kCacheDim + kLatent + c - kNope]);
      Ks[j * KP + c] = val;
    }
    for (int idx = tid; idx < BK * kV; idx += kThreads) {
      const int j = idx / kV, v = idx % kV;
      const int64_t s = s0 + j;
      Vs[j * VP + v] = s < S ? bf(kv[(s * H + h) * kKv + kNope + v]) : 0.f;
    }
    __syncthreads();
    float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int c = 0; c < kQDim; c++) {
      const float qv = Qs[r * QP + c];
#pragma unroll
      for (int jj = 0; jj < 4; jj++) sc[jj] += qv * Ks[(sl + 8 * jj) * KP + c];
    }
    float mx = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < 4; jj++) {
      const int64_t s = s0 + sl + 8 * jj;
      if (s > my_pos || s >= S) sc[jj] = -INFINITY;
      mx = fmaxf(mx, sc[jj]);
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_new = fmaxf(m, mx);
    const float alpha = exp2f(m - m_new);
    float psum = 0.f;
#pragma unroll
    for (int jj = 0; jj < 4; jj++) {
      const float p = exp2f(sc[jj] - m_new);
      psum += p;
      Ps[r * PP + sl + 8 * jj] = p;
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
    l = l * alpha + psum;
    m = m_new;
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kV / 8; j++) acc[j] *= alpha;
    for (int j = 0; j < BK; j++) {
      const float p = Ps[r * PP + j];
#pragma unroll
      for (int jv = 0; jv < kV / 8; jv++) acc[jv] += p * Vs[j * VP + sl + 8 * jv];
    }
  }
  const int64_t t = t0 + r;
  if (t < T) {
    const float inv = 1.0f / l;
#pragma unroll
    for (int jv = 0; jv < kV / 8; jv++) out[(t * H + h) * kV + sl + 8 * jv] = to_bf(acc[jv] * inv);
  }
}

struct Lt {
  cublasLtHandle_t handle = nullptr;
  cublasStatus_t status = CUBLAS_STATUS_NOT_INITIALIZED;
};

Lt& lt() {
  static Lt l;
  static std::once_flag once;
  std::call_once(once, [] { l.status = cublasLtCreate(&l.handle); });
  return l;
}

Status cublas_error(cublasStatus_t e, const char* what) {
  Status s;
  s.code = 1000 + int(e);
  s.message = what;
  return s;
}

// kv[S, H·256] = cache[:, :512] · kv_bᵀ, bf16 out with fp32 accumulation. In cuBLAS's
// column-major terms: D[H·256, S] = op_T(kv_b as [512, H·256]) · cache as [512, S] (ld 576).
Status expand_kv(int H, const uint16_t* cache, int64_t S, const uint16_t* kv_b, uint16_t* kv,
                 void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  Lt& l = lt();
  if (l.status != CUBLAS_STATUS_SUCCESS)
    return cublas_error(l.status, "mla: cublasLtCreate failed");
  const int64_t N = int64_t(H) * kKv;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t c = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t tr = CUBLAS_OP_T;
  if (c == CUBLAS_STATUS_SUCCESS)
    c = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr);
  if (c == CUBLAS_STATUS_SUCCESS)
    c = cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, kLatent, N, kLatent);
  if (c == CUBLAS_STATUS_SUCCESS)
    c = cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, kLatent, S, kCacheDim);
  if (c == CUBLAS_STATUS_SUCCESS) c = cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, N, S, N);
  if (c == CUBLAS_STATUS_SUCCESS) c = cublasLtMatmulPreferenceCreate(&pref);
  if (c == CUBLAS_STATUS_SUCCESS)
    c = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &scratch_bytes, sizeof scratch_bytes);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  if (c == CUBLAS_STATUS_SUCCESS)
    c = cublasLtMatmulAlgoGetHeuristic(l.handle, op, la, lb, ld, ld, pref, 1, &heur, &found);
  if (c == CUBLAS_STATUS_SUCCESS && found == 0) c = CUBLAS_STATUS_NOT_SUPPORTED;
  const float alpha = 1.0f, beta = 0.0f;
  if (c == CUBLAS_STATUS_SUCCESS)
    c = cublasLtMatmul(l.handle, op, &alpha, kv_b, la, cache, lb, &beta, kv, ld, kv, ld, &heur.algo,
                       scratch, scratch_bytes, stream);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (op) cublasLtMatmulDescDestroy(op);
  if (c != CUBLAS_STATUS_SUCCESS) return cublas_error(c, "mla: cuBLASLt kv expansion failed");
  return Status{};
}

}  // namespace

Status write_latent(const uint16_t* ckv, const float* norm_w, float eps, uint16_t* cache,
                    int64_t pos0, int64_t T, void* stream) {
  if (!ckv || !norm_w || !cache) return invalid("mla write_latent: null pointer");
  if (T <= 0) return Status{};
  latent_rows<<<unsigned((T + 7) / 8), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      ckv, norm_w, eps, cache, pos0, T);
  return launch_status();
}

size_t prefill_workspace_bytes(int H, int64_t S) {
  const size_t kv = size_t(S) * size_t(H) * kKv * sizeof(uint16_t);
  return ((kv + 255) & ~size_t(255)) + kGemmScratch;
}

Status prefill(int H, const uint16_t* q, const uint16_t* cache, int64_t S, const uint16_t* kv_b,
               uint16_t* out, int64_t T, void* workspace, size_t workspace_bytes, void* stream) {
  if (!q || !cache || !kv_b || !out || !workspace) return invalid("mla prefill: null pointer");
  if (H < 1 || T < 1 || T > S) return invalid("mla prefill: need H >= 1 and 1 <= T <= S");
  if (workspace_bytes < prefill_workspace_bytes(H, S))
    return invalid("mla prefill: workspace smaller than prefill_workspace_bytes(H, S)");
  if ((T + BQ - 1) / BQ > int64_t(1) << 30 || H > 65535) return invalid("mla prefill: too large");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint16_t* kv = static_cast<uint16_t*>(workspace);
  const size_t kv_bytes = (size_t(S) * size_t(H) * kKv * sizeof(uint16_t) + 255) & ~size_t(255);
  if (Status st = expand_kv(H, cache, S, kv_b, kv, static_cast<char*>(workspace) + kv_bytes,
                            kGemmScratch, s);
      !st.ok())
    return st;
  static const bool attrs = [] {
    cudaFuncSetAttribute(attn_prefill, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kAttnSmem));
    return true;
  }();
  (void)attrs;
  const float qscale = float(1.0 / std::sqrt(double(kQDim)) * 1.4426950408889634);
  attn_prefill<<<dim3(unsigned((T + BQ - 1) / BQ), H), kThreads, kAttnSmem, s>>>(H, q, kv, cache, S,
                                                                                 T, out, qscale);
  return launch_status();
}

}  // namespace strata::kernels::mla
