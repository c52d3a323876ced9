// MLA latent-cache write and prefill attention (see mla.h). Prefill expands the latent cache to
// per-head [k_nope | v] with one cuBLASLt GEMM, then a flash-style kernel walks the causal key
// tiles on tensor cores (bf16 mma.sync, fp32 accumulate) with an fp32 online softmax (exp2 domain:
// scores are scaled by scale·log2 e); P is rounded to bf16 for the P·V product.
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "kernels/kda/cuda_util.cuh"
#include "kernels/mla/mla.h"
#include "kernels/mla/mma.cuh"

namespace strata::kernels::mla {
namespace {

using namespace strata::kernels::detail;

constexpr int kKv = kNope + kV;  // 256 expanded values per head and position
constexpr int BQ = 64, BK = 64, kThreads = 128;
constexpr int QKS =
    kQDim + 8;               // bf16 row stride of Q and K tiles (fragment rows in distinct banks)
constexpr int VST = kV + 8;  // bf16 row stride of the V tile
constexpr size_t kAttnSmem = 2 * (size_t(BQ + BK) * QKS + size_t(BK) * VST);
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

__device__ __forceinline__ uint32_t pack_bf(float lo, float hi) {
  return uint32_t(to_bf(lo)) | (uint32_t(to_bf(hi)) << 16);
}

// Flash-style causal attention on tensor cores (FA2 structure): block = 64 queries of one head,
// 4 warps × 16 query rows; per tile of 64 keys, S = Q Kᵀ by bf16 mma.sync (fp32 accumulate),
// fp32 online softmax in registers (exp2 domain), P rounded to bf16 and fed from registers as the
// A operand of O += P V.
__global__ void __launch_bounds__(kThreads)
    attn_prefill(int H, const uint16_t* q, const uint16_t* kv, const uint16_t* cache, int64_t S,
                 int64_t T, uint16_t* out, float qscale) {
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest (latest) query tiles first
  const int h = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  extern __shared__ __align__(16) float sm[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(sm);  // [BQ][QKS]
  uint16_t* Ks = Qs + BQ * QKS;                    // [BK][QKS]
  uint16_t* Vs = Ks + BK * QKS;                    // [BK][VST]
  const int64_t t0 = int64_t(qt) * BQ, base = S - T;
  for (int idx = tid; idx < BQ * (kQDim / 8); idx += kThreads) {
    const int r = idx / (kQDim / 8), c8 = (idx % (kQDim / 8)) * 8;
    const int64_t tt = t0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (tt < T) v = *reinterpret_cast<const uint4*>(q + (tt * H + h) * kQDim + c8);
    *reinterpret_cast<uint4*>(Qs + r * QKS + c8) = v;
  }
  __syncthreads();
  uint32_t qa[kQDim / 16][4];
#pragma unroll
  for (int ks = 0; ks < kQDim / 16; ks++) {
    const uint16_t* r0 = Qs + (warp * 16 + g) * QKS + ks * 16 + 2 * t;
    qa[ks][0] = ld32(r0);
    qa[ks][1] = ld32(r0 + 8 * QKS);
    qa[ks][2] = ld32(r0 + 8);
    qa[ks][3] = ld32(r0 + 8 * QKS + 8);
  }
  const int64_t pos_lo = base + t0 + warp * 16 + g, pos_hi = pos_lo + 8;
  const int64_t last_pos = std::min<int64_t>(base + t0 + BQ - 1, S - 1);
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  float o[kV / 8][4];
#pragma unroll
  for (int nt = 0; nt < kV / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
  for (int64_t s0 = 0; s0 <= last_pos; s0 += BK) {
    __syncthreads();
    for (int idx = tid; idx < BK * 40; idx += kThreads) {  // per key row: 16 + 8 + 16 uint4
      const int j = idx / 40, part = idx % 40;
      const int64_t sp = s0 + j;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (part < 16) {
        if (sp < S) v = *reinterpret_cast<const uint4*>(kv + (sp * H + h) * kKv + part * 8);
        *reinterpret_cast<uint4*>(Ks + j * QKS + part * 8) = v;
      } else if (part < 24) {
        if (sp < S)
          v = *reinterpret_cast<const uint4*>(cache + sp * kCacheDim + kLatent + (part - 16) * 8);
        *reinterpret_cast<uint4*>(Ks + j * QKS + kNope + (part - 16) * 8) = v;
      } else {
        if (sp < S)
          v = *reinterpret_cast<const uint4*>(kv + (sp * H + h) * kKv + kNope + (part - 24) * 8);
        *reinterpret_cast<uint4*>(Vs + j * VST + (part - 24) * 8) = v;
      }
    }
    __syncthreads();
    float sc[BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
      const uint16_t* kr = Ks + (nt * 8 + g) * QKS + 2 * t;
#pragma unroll
      for (int ks = 0; ks < kQDim / 16; ks++)
        mma16816(sc[nt], qa[ks], ld32(kr + ks * 16), ld32(kr + ks * 16 + 8));
    }
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int64_t sp = s0 + nt * 8 + 2 * t + e;
        const bool ok_lo = sp <= pos_lo && sp < S, ok_hi = sp <= pos_hi && sp < S;
        sc[nt][e] = ok_lo ? sc[nt][e] * qscale : -INFINITY;
        sc[nt][2 + e] = ok_hi ? sc[nt][2 + e] * qscale : -INFINITY;
        mx_lo = fmaxf(mx_lo, sc[nt][e]);
        mx_hi = fmaxf(mx_hi, sc[nt][2 + e]);
      }
    }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o2));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o2));
    }
    // Key 0 is valid for every row and comes first, so m_new is finite from the first tile on.
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    const float a_lo = exp2f(m_lo - mn_lo), a_hi = exp2f(m_hi - mn_hi);
    m_lo = mn_lo, m_hi = mn_hi;
    uint32_t pa[BK / 16][4];
    float ps_lo = 0.f, ps_hi = 0.f;
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) {
      const float p0 = round_bf(exp2f(sc[nt][0] - mn_lo)), p1 = round_bf(exp2f(sc[nt][1] - mn_lo));
      const float p2 = round_bf(exp2f(sc[nt][2] - mn_hi)), p3 = round_bf(exp2f(sc[nt][3] - mn_hi));
      ps_lo += p0 + p1;
      ps_hi += p2 + p3;
      pa[nt / 2][(nt % 2) * 2 + 0] = pack_bf(p0, p1);
      pa[nt / 2][(nt % 2) * 2 + 1] = pack_bf(p2, p3);
    }
    l_lo = l_lo * a_lo + ps_lo;  // per-thread partial row sums, reduced over the quad at the end
    l_hi = l_hi * a_hi + ps_hi;
#pragma unroll
    for (int nt = 0; nt < kV / 8; nt++) {
      o[nt][0] *= a_lo;
      o[nt][1] *= a_lo;
      o[nt][2] *= a_hi;
      o[nt][3] *= a_hi;
    }
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      const uint16_t* vr = Vs + (kk * 16 + 2 * t) * VST + g;
#pragma unroll
      for (int nt = 0; nt < kV / 8; nt++) {
        const uint16_t* r = vr + nt * 8;
        const uint32_t b0 = uint32_t(r[0]) | (uint32_t(r[VST]) << 16);
        const uint32_t b1 = uint32_t(r[8 * VST]) | (uint32_t(r[9 * VST]) << 16);
        mma16816(o[nt], pa[kk], b0, b1);
      }
    }
  }
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o2);
  }
  const int64_t t_lo = t0 + warp * 16 + g, t_hi = t_lo + 8;
  const float i_lo = 1.0f / l_lo, i_hi = 1.0f / l_hi;
#pragma unroll
  for (int nt = 0; nt < kV / 8; nt++) {
    const int col = nt * 8 + 2 * t;
    if (t_lo < T)
      *reinterpret_cast<uint32_t*>(out + (t_lo * H + h) * kV + col) =
          pack_bf(o[nt][0] * i_lo, o[nt][1] * i_lo);
    if (t_hi < T)
      *reinterpret_cast<uint32_t*>(out + (t_hi * H + h) * kV + col) =
          pack_bf(o[nt][2] * i_hi, o[nt][3] * i_hi);
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
