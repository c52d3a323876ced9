// Absorbed MLA decode (see mla.h), three kernels:
//   absorb_q  (grid: head × 128-column tile) — q_lat = bf16(W_UKᵀ q_nope) for the whole batch, so
//             each W_UK_h column is read once per call; q_pe copied beside it.
//   attn_split (grid: split × head group of 16 × sequence) — one block streams its slice of the
//             sequence's latent cache once for 16 heads: scores over [ĉ | k_pe] (576), fp32
//             online softmax (exp2 domain), unnormalised ctx = Σ p ĉ; writes (m, l, ctx).
//   merge_out (grid: head × sequence) — merges the splits' softmax states, then o = W_UV·ctx.
// fp32 CUDA-core arithmetic (no tensor cores yet; docs/performance.md has the numbers).
#include <algorithm>
#include <cmath>

#include "kernels/kda/cuda_util.cuh"
#include "kernels/mla/mla.h"

namespace strata::kernels::mla {
namespace {

using namespace strata::kernels::detail;

constexpr int kKv = kNope + kV;
constexpr int HG = 16;  // heads per attention block
constexpr int BK = 32;  // cache rows per tile
constexpr int kThreads = 256;
constexpr int CP = kCacheDim + 1;  // 577
constexpr int PP = BK + 1;
constexpr size_t kSplitSmem = sizeof(float) * (HG * CP + BK * CP + HG * PP + HG);
constexpr int kMinSplitLen = 256;
constexpr int kMaxSplits = 64;  // merge_out keeps one weight per split in shared memory

struct Lens {
  int32_t len[kMaxSeqs];
};

struct Plan {
  int splits = 1;
  int64_t chunk = 0;  // positions per split, a multiple of BK
};

Plan plan_splits(int H, int B, int64_t max_len) {
  Plan p;
  const int groups = (H + HG - 1) / HG;
  const int64_t want = (2 * 132 + int64_t(B) * groups - 1) / (int64_t(B) * groups);
  const int64_t cap = std::max<int64_t>(1, (max_len + kMinSplitLen - 1) / kMinSplitLen);
  int64_t splits = std::max<int64_t>(1, std::min({want, cap, int64_t(kMaxSplits)}));
  int64_t chunk = (max_len + splits - 1) / splits;
  chunk = std::max<int64_t>(BK, (chunk + BK - 1) / BK * BK);
  p.splits = int((max_len + chunk - 1) / chunk);
  if (p.splits < 1) p.splits = 1;
  p.chunk = chunk;
  return p;
}

struct Ws {
  float* qf;   // [B, H, 576]
  float* ctx;  // [B, splits, H, 512]
  float* ml;   // [B, splits, H, 2]
};

Ws carve(void* base, int H, int B, int splits) {
  Ws w;
  w.qf = static_cast<float*>(base);
  w.ctx = w.qf + int64_t(B) * H * kCacheDim;
  w.ml = w.ctx + int64_t(B) * splits * H * kLatent;
  return w;
}

constexpr int kAbsorbB = 32;  // sequences per pass of absorb_q

__global__ void __launch_bounds__(128)
    absorb_q(int H, int B, const uint16_t* q, const uint16_t* kv_b, float* qf) {
  const int h = blockIdx.x, c = blockIdx.y * 128 + threadIdx.x;
  __shared__ float qs[kAbsorbB][kNope];
  const uint16_t* wk = kv_b + int64_t(h) * kKv * kLatent + c;  // W_UK_h column c, stride 512
  for (int b0 = 0; b0 < B; b0 += kAbsorbB) {
    const int nb = min(kAbsorbB, B - b0);
    __syncthreads();
    for (int idx = threadIdx.x; idx < nb * kNope; idx += 128) {
      const int b = idx / kNope, d = idx % kNope;
      qs[b][d] = bf(q[(int64_t(b0 + b) * H + h) * kQDim + d]);
    }
    __syncthreads();
    float acc[kAbsorbB];
#pragma unroll
    for (int b = 0; b < kAbsorbB; b++) acc[b] = 0.f;
    for (int d = 0; d < kNope; d++) {
      const float w = bf(wk[int64_t(d) * kLatent]);
#pragma unroll
      for (int b = 0; b < kAbsorbB; b++) acc[b] += qs[b][d] * w;
    }
    for (int b = 0; b < nb; b++) {
      float* dst = qf + (int64_t(b0 + b) * H + h) * kCacheDim;
      dst[c] = round_bf(acc[b]);
      if (blockIdx.y == 0 && threadIdx.x < kRope)
        dst[kLatent + threadIdx.x] = bf(q[(int64_t(b0 + b) * H + h) * kQDim + kNope + threadIdx.x]);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    attn_split(int H, const uint16_t* cache, int64_t cache_stride, const Lens lens, int64_t chunk,
               int splits, float qscale, Ws ws) {
  const int split = blockIdx.x, hg = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % 32;
  extern __shared__ __align__(16) float sm[];
  float* Qs = sm;            // [HG][CP]
  float* Ks = Qs + HG * CP;  // [BK][CP]
  float* Ps = Ks + BK * CP;  // [HG][PP]
  float* As = Ps + HG * PP;  // [HG] rescale factors
  const int h0 = hg * HG;
  const int len = lens.len[b];
  const int64_t sb = int64_t(split) * chunk, se = std::min<int64_t>(sb + chunk, len);
  for (int idx = tid; idx < HG * kCacheDim; idx += kThreads) {
    const int hh = idx / kCacheDim, c = idx % kCacheDim;
    Qs[hh * CP + c] =
        h0 + hh < H ? ws.qf[(int64_t(b) * H + h0 + hh) * kCacheDim + c] * qscale : 0.f;
  }
  const uint16_t* cb = cache + int64_t(b) * cache_stride;
  // Score role: head sh = tid/16, rows j = sl, sl + 16. PV role: heads 2·ph, 2·ph+1, columns
  // lane + 32·i.
  const int sh = tid / 16, sl = tid % 16, ph = tid / 32;
  float m = -INFINITY, l = 0.f;
  float acc0[kLatent / 32], acc1[kLatent / 32];
#pragma unroll
  for (int i = 0; i < kLatent / 32; i++) acc0[i] = acc1[i] = 0.f;
  for (int64_t s0 = sb; s0 < se; s0 += BK) {
    __syncthreads();
    for (int idx = tid; idx < BK * (kCacheDim / 2); idx += kThreads) {
      const int j = idx / (kCacheDim / 2), c2 = (idx % (kCacheDim / 2)) * 2;
      const int64_t s = s0 + j;
      float x0 = 0.f, x1 = 0.f;
      if (s < se) {
        const uint32_t pair = *reinterpret_cast<const uint32_t*>(cb + s * kCacheDim + c2);
        x0 = bf(uint16_t(pair & 0xffffu));
        x1 = bf(uint16_t(pair >> 16));
      }
      Ks[j * CP + c2] = x0;
      Ks[j * CP + c2 + 1] = x1;
    }
    __syncthreads();
    float sc0 = 0.f, sc1 = 0.f;
#pragma unroll 8
    for (int c = 0; c < kCacheDim; c++) {
      const float qv = Qs[sh * CP + c];
      sc0 += qv * Ks[sl * CP + c];
      sc1 += qv * Ks[(sl + 16) * CP + c];
    }
    if (s0 + sl >= se) sc0 = -INFINITY;
    if (s0 + sl + 16 >= se) sc1 = -INFINITY;
    float mx = fmaxf(sc0, sc1);
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float m_new = fmaxf(m, mx);  // finite: row s0 < se is always valid
    const float alpha = exp2f(m - m_new);
    const float p0 = exp2f(sc0 - m_new), p1 = exp2f(sc1 - m_new);
    float ps = p0 + p1;
#pragma unroll
    for (int o = 1; o < 16; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
    l = l * alpha + ps;
    m = m_new;
    Ps[sh * PP + sl] = p0;
    Ps[sh * PP + sl + 16] = p1;
    if (sl == 0) As[sh] = alpha;
    __syncthreads();
    const float a0 = As[2 * ph], a1 = As[2 * ph + 1];
#pragma unroll
    for (int i = 0; i < kLatent / 32; i++) {
      acc0[i] *= a0;
      acc1[i] *= a1;
    }
    for (int j = 0; j < BK; j++) {
      const float q0 = Ps[(2 * ph) * PP + j], q1 = Ps[(2 * ph + 1) * PP + j];
#pragma unroll
      for (int i = 0; i < kLatent / 32; i++) {
        const float x = Ks[j * CP + lane + 32 * i];
        acc0[i] += q0 * x;
        acc1[i] += q1 * x;
      }
    }
  }
  // Partial state of this split (an empty split leaves m = −inf, l = 0, ctx = 0).
  const int64_t row0 = (int64_t(b) * splits + split) * H;
  if (sl == 0 && h0 + sh < H) {
    ws.ml[(row0 + h0 + sh) * 2] = m;
    ws.ml[(row0 + h0 + sh) * 2 + 1] = l;
  }
#pragma unroll
  for (int i = 0; i < kLatent / 32; i++) {
    if (h0 + 2 * ph < H) ws.ctx[(row0 + h0 + 2 * ph) * kLatent + lane + 32 * i] = acc0[i];
    if (h0 + 2 * ph + 1 < H) ws.ctx[(row0 + h0 + 2 * ph + 1) * kLatent + lane + 32 * i] = acc1[i];
  }
}

__global__ void __launch_bounds__(128)
    merge_out(int H, int splits, const uint16_t* kv_b, Ws ws, uint16_t* out) {
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  __shared__ float ctx[kLatent];
  __shared__ float wsplit[64];
  __shared__ float inv_l;
  if (warp == 0) {
    float M = -INFINITY;
    for (int i = lane; i < splits; i += 32)
      M = fmaxf(M, ws.ml[((int64_t(b) * splits + i) * H + h) * 2]);
    M = warp_max(M);
    float L = 0.f;
    for (int i = lane; i < splits; i += 32) {
      const float* ml = ws.ml + ((int64_t(b) * splits + i) * H + h) * 2;
      const float w = ml[1] > 0.f ? exp2f(ml[0] - M) : 0.f;
      if (i < 64) wsplit[i] = w;
      L += w * ml[1];
    }
    L = warp_sum(L);
    if (lane == 0) inv_l = 1.0f / L;
  }
  __syncthreads();
  for (int c = tid; c < kLatent; c += 128) {
    float a = 0.f;
    for (int i = 0; i < splits; i++) {
      const float w = wsplit[i];
      if (w != 0.f) a += w * ws.ctx[((int64_t(b) * splits + i) * H + h) * kLatent + c];
    }
    ctx[c] = a * inv_l;
  }
  __syncthreads();
  const uint16_t* wuv = kv_b + (int64_t(h) * kKv + kNope) * kLatent;  // [128, 512]
  for (int v = warp; v < kV; v += 4) {
    float a = 0.f;
#pragma unroll
    for (int i = 0; i < kLatent / 32; i++)
      a += bf(wuv[int64_t(v) * kLatent + lane + 32 * i]) * ctx[lane + 32 * i];
    a = warp_sum(a);
    if (lane == 0) out[(int64_t(b) * H + h) * kV + v] = to_bf(a);
  }
}

}  // namespace

size_t decode_workspace_bytes(int H, int B, int64_t max_len) {
  const Plan p = plan_splits(H, B, std::max<int64_t>(max_len, 1));
  return sizeof(float) * (size_t(B) * H * kCacheDim + size_t(B) * p.splits * H * (kLatent + 2));
}

Status decode(int H, const uint16_t* q, const uint16_t* cache, int64_t cache_stride,
              const int32_t* lens_host, int B, const uint16_t* kv_b, uint16_t* out, void* workspace,
              size_t workspace_bytes, void* stream) {
  if (!q || !cache || !lens_host || !kv_b || !out || !workspace)
    return invalid("mla decode: null pointer");
  if (H < 1 || H > 65535) return invalid("mla decode: H must be 1 .. 65535");
  if (B < 1 || B > kMaxSeqs) return invalid("mla decode: B must be 1 .. 256");
  if (cache_stride % 2 != 0 || (B > 1 && cache_stride < kCacheDim))
    return invalid("mla decode: cache_stride must be even and >= 576 elements");
  Lens lens{};
  int64_t max_len = 0;
  for (int b = 0; b < B; b++) {
    if (lens_host[b] < 1) return invalid("mla decode: every sequence needs >= 1 cached position");
    lens.len[b] = lens_host[b];
    max_len = std::max<int64_t>(max_len, lens_host[b]);
  }
  const Plan plan = plan_splits(H, B, max_len);
  if (plan.splits > kMaxSplits)
    return invalid("mla decode: more than 64 splits (internal plan error)");
  if (workspace_bytes < decode_workspace_bytes(H, B, max_len))
    return invalid("mla decode: workspace smaller than decode_workspace_bytes(H, B, max_len)");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Ws ws = carve(workspace, H, B, plan.splits);
  static const bool attrs = [] {
    cudaFuncSetAttribute(attn_split, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSplitSmem));
    return true;
  }();
  (void)attrs;
  absorb_q<<<dim3(H, kLatent / 128), 128, 0, s>>>(H, B, q, kv_b, ws.qf);
  const float qscale = float(1.0 / std::sqrt(double(kQDim)) * 1.4426950408889634);
  attn_split<<<dim3(plan.splits, (H + HG - 1) / HG, B), kThreads, kSplitSmem, s>>>(
      H, cache, cache_stride, lens, plan.chunk, plan.splits, qscale, ws);
  merge_out<<<dim3(H, B), 128, 0, s>>>(H, plan.splits, kv_b, ws, out);
  return launch_status();
}

}  // namespace strata::kernels::mla
