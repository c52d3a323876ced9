// Absorbed MLA decode (see mla.h), three kernels:
//   absorb_q  (grid: head × 128-column tile) — q_lat = bf16(W_UKᵀ q_nope) for the whole batch, so
//             each W_UK_h column is read once per call; q_pe copied beside it.
//   attn_split (grid: split × head group of 16 × sequence) — one block streams its slice of the
//             sequence's latent cache once for 16 heads: scores over [ĉ | k_pe] (576) and
//             ctx = Σ p ĉ on tensor cores (bf16 mma.sync, fp32 accumulate; p rounded to bf16),
//             fp32 online softmax (exp2 domain); writes (m, l, unnormalised ctx).
//   merge_out (grid: head × sequence) — merges the splits' softmax states, then o = W_UV·ctx.
#include <algorithm>
#include <cmath>

#include "kernels/kda/cuda_util.cuh"
#include "kernels/mla/mla.h"
#include "kernels/mla/mma.cuh"

namespace strata::kernels::mla {
namespace {

using namespace strata::kernels::detail;

constexpr int kKv = kNope + kV;
constexpr int HG = 16;  // heads per attention block (the M of one m16n8k16 tile)
constexpr int BK = 64;  // cache rows per tile
constexpr int kThreads = 128;
constexpr int KSTR = kCacheDim + 8;  // bf16 row stride: 8 rows of a fragment hit distinct banks
constexpr int SSTR = BK + 4;
constexpr int PSTR = BK + 8;
constexpr size_t kSplitSmem =
    2 * size_t(HG + BK) * KSTR + 4 * size_t(HG) * SSTR + 2 * size_t(HG) * PSTR + 4 * HG;
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

// One block = 16 heads × one split of one sequence; 4 warps. Per tile of 64 cache rows: scores
// S[16 heads, 64] = Q[16, 576] · Kᵀ on tensor cores (warp w: rows 16w .. 16w+15), fp32 online
// softmax in shared memory, P rounded to bf16, ctx[16, 512] += P · Ĉ (warp w: columns
// 128w .. 128w+127, accumulators in registers).
__global__ void __launch_bounds__(kThreads)
    attn_split(int H, const uint16_t* cache, int64_t cache_stride, const Lens lens, int64_t chunk,
               int splits, float qscale, Ws ws) {
  const int split = blockIdx.x, hg = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  extern __shared__ __align__(16) float sm[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(sm);              // [HG][KSTR] bf16
  uint16_t* Ks = Qs + HG * KSTR;                               // [BK][KSTR] bf16
  float* Ss = reinterpret_cast<float*>(Ks + BK * KSTR);        // [HG][SSTR]
  uint16_t* Ps = reinterpret_cast<uint16_t*>(Ss + HG * SSTR);  // [HG][PSTR] bf16
  float* As = reinterpret_cast<float*>(Ps + HG * PSTR);        // [HG]
  const int h0 = hg * HG;
  const int len = lens.len[b];
  const int64_t sb = int64_t(split) * chunk, se = std::min<int64_t>(sb + chunk, len);
  for (int idx = tid; idx < HG * kCacheDim; idx += kThreads) {
    const int hh = idx / kCacheDim, c = idx % kCacheDim;
    Qs[hh * KSTR + c] =
        h0 + hh < H ? to_bf(ws.qf[(int64_t(b) * H + h0 + hh) * kCacheDim + c]) : uint16_t(0);
  }
  const uint16_t* cb = cache + int64_t(b) * cache_stride;
  const int sh = tid / 8, sl = tid % 8;  // softmax role: head sh, rows sl + 8j
  float m = -INFINITY, l = 0.f;
  float acc[16][4];
#pragma unroll
  for (int nt = 0; nt < 16; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
  for (int64_t s0 = sb; s0 < se; s0 += BK) {
    __syncthreads();
    for (int idx = tid; idx < BK * (kCacheDim / 8); idx += kThreads) {
      const int j = idx / (kCacheDim / 8), c8 = (idx % (kCacheDim / 8)) * 8;
      const int64_t s = s0 + j;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (s < se) v = *reinterpret_cast<const uint4*>(cb + s * kCacheDim + c8);
      *reinterpret_cast<uint4*>(Ks + j * KSTR + c8) = v;
    }
    __syncthreads();
    {  // scores of rows 16·warp .. +15
      float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll 4
      for (int k0 = 0; k0 < kCacheDim; k0 += 16) {
        uint32_t a[4];
        a[0] = ld32(Qs + g * KSTR + k0 + 2 * t);
        a[1] = ld32(Qs + (g + 8) * KSTR + k0 + 2 * t);
        a[2] = ld32(Qs + g * KSTR + k0 + 8 + 2 * t);
        a[3] = ld32(Qs + (g + 8) * KSTR + k0 + 8 + 2 * t);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
          const uint16_t* kr = Ks + (warp * 16 + nt * 8 + g) * KSTR + k0 + 2 * t;
          mma16816(c[nt], a, ld32(kr), ld32(kr + 8));
        }
      }
#pragma unroll
      for (int nt = 0; nt < 2; nt++) {
        const int j = warp * 16 + nt * 8 + 2 * t;
        const bool v0 = s0 + j < se, v1 = s0 + j + 1 < se;
        Ss[g * SSTR + j] = v0 ? c[nt][0] * qscale : -INFINITY;
        Ss[g * SSTR + j + 1] = v1 ? c[nt][1] * qscale : -INFINITY;
        Ss[(g + 8) * SSTR + j] = v0 ? c[nt][2] * qscale : -INFINITY;
        Ss[(g + 8) * SSTR + j + 1] = v1 ? c[nt][3] * qscale : -INFINITY;
      }
    }
    __syncthreads();
    {  // online softmax of head sh over this tile
      float sc[BK / 8], mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < BK / 8; j++) {
        sc[j] = Ss[sh * SSTR + sl + 8 * j];
        mx = fmaxf(mx, sc[j]);
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m, mx);  // finite: row s0 < se is always valid
      const float alpha = exp2f(m - m_new);
      float ps = 0.f;
#pragma unroll
      for (int j = 0; j < BK / 8; j++) {
        const uint16_t pb = to_bf(exp2f(sc[j] - m_new));
        Ps[sh * PSTR + sl + 8 * j] = pb;
        ps += bf(pb);
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
      l = l * alpha + ps;
      m = m_new;
      if (sl == 0) As[sh] = alpha;
    }
    __syncthreads();
    {  // ctx[:, 128·warp ..] = alpha · ctx + P · Ĉ
      const float a_lo = As[g], a_hi = As[g + 8];
#pragma unroll
      for (int nt = 0; nt < 16; nt++) {
        acc[nt][0] *= a_lo;
        acc[nt][1] *= a_lo;
        acc[nt][2] *= a_hi;
        acc[nt][3] *= a_hi;
      }
#pragma unroll
      for (int k0 = 0; k0 < BK; k0 += 16) {
        uint32_t a[4];
        a[0] = ld32(Ps + g * PSTR + k0 + 2 * t);
        a[1] = ld32(Ps + (g + 8) * PSTR + k0 + 2 * t);
        a[2] = ld32(Ps + g * PSTR + k0 + 8 + 2 * t);
        a[3] = ld32(Ps + (g + 8) * PSTR + k0 + 8 + 2 * t);
        const uint16_t* r0 = Ks + (k0 + 2 * t) * KSTR + warp * 128 + g;
#pragma unroll
        for (int nt = 0; nt < 16; nt++) {
          const uint16_t* r = r0 + nt * 8;
          const uint32_t b0 = uint32_t(r[0]) | (uint32_t(r[KSTR]) << 16);
          const uint32_t b1 = uint32_t(r[8 * KSTR]) | (uint32_t(r[9 * KSTR]) << 16);
          mma16816(acc[nt], a, b0, b1);
        }
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
  for (int nt = 0; nt < 16; nt++) {
    const int col = warp * 128 + nt * 8 + 2 * t;
    if (h0 + g < H) {
      float* d = ws.ctx + (row0 + h0 + g) * kLatent + col;
      d[0] = acc[nt][0];
      d[1] = acc[nt][1];
    }
    if (h0 + g + 8 < H) {
      float* d = ws.ctx + (row0 + h0 + g + 8) * kLatent + col;
      d[0] = acc[nt][2];
      d[1] = acc[nt][3];
    }
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
  if (cache_stride % 8 != 0 || (B > 1 && cache_stride < kCacheDim))
    return invalid("mla decode: cache_stride must be a multiple of 8 and >= 576 elements");
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
