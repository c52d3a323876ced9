// Absorbed MLA decode (see mla.h), four kernels:
//   absorb_q  (grid: head × 128-column quarter × group of 4 sequences) — q_lat = bf16(W_UKᵀ
//   q_nope);
//             each thread keeps its 8×8 slice of W_UK_h in registers for its sequences; q_pe
//             copied beside it, so q_lat rows are the 576-wide bf16 queries of the cache rows.
//   attention over the splits of each sequence's cache, writing (m, l, unnormalised ctx) per
//             split, fp32 online softmax in the exp2 domain, P rounded to bf16 for P·Ĉ — one of:
//     attn_tma (the default; grid: head group × split × sequence, clusters of the two head
//             groups of a split) — see its section below: TMA cache tiles shared by the cluster,
//             S = Q·Kᵀ and P·V on wgmma, the 64-row head group one wgmma M tile.
//     attn_split (STRATA_MLA_DECODE=mma, and where attn_tma cannot run; grid: split × group of
//             48 heads × sequence) — one block streams its slice of the sequence's latent cache
//             through shared memory once (cp.async, 2 stages of 64 rows) for 48 heads. 12 warps:
//             warp (m, q) owns heads 16m .. 16m+15 and, for QKᵀ, the 144-wide k-slice q of
//             [ĉ | k_pe] (its q_lat fragments live in registers), for P·Ĉ the 128 value columns
//             128q .. 128q+127 (bf16 mma.sync m16n8k16, fp32 accumulate). The four k-slice
//             partial scores of a head group are summed through shared memory.
//     Either way the head groups of one split read the same cache rows close together; the
//     second read hits L2 (attn_split) or shares the loads (attn_tma), so the cache is read from
//     DRAM about once.
//   merge_ctx (grid: head × sequence × 128-column quarter) — merges the splits' softmax states into
//   ctx (fp32). out_uv    (grid: head × 32-row quarter of W_UV_h × group of 4 sequences) — o =
//   bf16(W_UV·ctx), weights in registers.
// Napkin (B = 1, S = 128K, 96 heads): 151 MB of cache, 27 GFLOP; the DRAM floor is 35 µs on an
// H200 (50 µs on an H100), 60 % of copy 59 µs (84 µs). attn_split: every 16-head group re-reads
// each cache tile from shared memory through ldmatrix (6 × (576 + 512) × 2 B per row = 1.7 GB at
// 128 B/clk/SM ≈ 51 µs on 132 SMs), measured 26-29 % of copy, shared-memory bound. attn_tma, per
// 64-row tile and 64-head block: 2.36 M + 2.10 M multiply-adds = 2176 clk at 2048 bf16 MAC/clk/SM
// (96 heads: two blocks of 48, 25 % of the tensor work padding), ≈ 39 µs of tensor floor at
// 128K; it is bound by the cache bytes and the latency of its 2-stage ring (docs/performance.md).
// (A third form, 64-head wgmma tiles by cp.async with the S halves exchanged between the
// warpgroups, was slower than both and is gone: docs/performance.md, "Tried and dropped".)
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/kda/cuda_util.cuh"
#include "kernels/mla/mla.h"
#include "kernels/mla/mma.cuh"
#include "kernels/mla/softmax_tile.cuh"
#include "kernels/mla/tma.cuh"
#include "kernels/mla/wgmma.cuh"
#include "kernels/ops/row_cluster.cuh"

namespace strata::kernels::mla {
namespace {

using namespace strata::kernels::detail;

// absorb_q and out_uv: a block per head, quarter and group of up to 4 sequences (each block holds
// its slice of W_UK or W_UV in registers for its sequences; B = 16 runs 4 groups side by side).
constexpr int kSeqsPerBlock = 4;
constexpr int kKv = kNope + kV;
constexpr int HC = 48;                  // heads per attention block
constexpr int MT = HC / 16;             // 16-head m-tiles per block
constexpr int QW = 4;                   // warps per m-tile
constexpr int kWarps = MT * QW;         // 12
constexpr int kThreads = kWarps * 32;   // 384
constexpr int BK = 64;                  // cache rows per tile
constexpr int KSLICE = kCacheDim / QW;  // 144: QKᵀ k-slice of one warp (9 k-steps)
constexpr int VSLICE = kLatent / QW;    // 128: P·Ĉ columns of one warp
static_assert(VSLICE == kV, "attn_split rescales its ctx slice with scale_o");
constexpr int KSTR = kCacheDim + 8;  // bf16 row stride (1168 B): ldmatrix rows hit distinct banks
// fp32 partial-score row stride; element (row, col) lives at row·SPSTR + (col ^ (row & 4)), so
// both the float2 fragment stores and the float4 row reads are free of bank conflicts.
constexpr int SPSTR = BK + 8;
constexpr int PSTR = BK + 8;  // bf16 P row stride (144 B)
constexpr int kStages = 2;
constexpr size_t kTileBytes = size_t(BK) * KSTR * 2;
constexpr size_t kPartBytes = size_t(kWarps) * 16 * SPSTR * 4;  // partial scores
constexpr size_t kPBytes = size_t(MT) * 16 * PSTR * 2;
constexpr size_t kStatBytes = size_t(MT) * QW * 16 * 4;  // row maxima (then row sums)
constexpr size_t kSplitSmem = kStages * kTileBytes + kPartBytes + kPBytes + kStatBytes;
static_assert(kSplitSmem <= 227 * 1024, "attn_split shared memory");
constexpr int kMaxSplits = 128;  // merge_ctx keeps one weight per split in shared memory

struct Lens {
  int32_t len[kMaxSeqs];
};

struct Plan {
  int splits = 1;
  int64_t chunk = 0;  // positions per split, a multiple of BK
};

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v < 1)
      v = 132;
    return v;
  }();
  return n;
}

// Split count that minimises (waves of one-block-per-SM) × (tiles per split + a fixed cost of about
// two tiles for the prologue, the q fragments and the partial-state write).
// heads_per_block: HC (attn_split) or tma_group(H) (attn_tma).
Plan plan_splits(int H, int B, int64_t max_len, int heads_per_block) {
  const int64_t tiles = (max_len + BK - 1) / BK;
  const int64_t per_split = int64_t(B) * ((H + heads_per_block - 1) / heads_per_block);
  const int64_t sms = sm_count();
  int64_t best_cost = INT64_MAX, best_chunk = tiles;
  for (int64_t s = 1; s <= std::min<int64_t>(kMaxSplits, tiles); s++) {
    const int64_t ct = (tiles + s - 1) / s;
    const int64_t actual = (tiles + ct - 1) / ct;
    const int64_t waves = (actual * per_split + sms - 1) / sms;
    const int64_t cost = waves * (ct + 2);
    if (cost < best_cost) best_cost = cost, best_chunk = ct;
  }
  Plan p;
  p.chunk = best_chunk * BK;
  p.splits = int((tiles + best_chunk - 1) / best_chunk);
  return p;
}

struct Ws {
  uint16_t* qlat;  // [B, H, 576] bf16: [q_lat | q_pe]
  float* part;     // [B, splits, H, 512] unnormalised ctx per split
  float* ctx;      // [B, H, 512] merged, normalised ctx
  float* ml;       // [B, splits, H, 2] (running max, sum) per split
};

size_t ws_bytes(int H, int B, int splits) {
  return size_t(B) * H * kCacheDim * 2 +
         sizeof(float) * size_t(B) * H * (size_t(splits) * (kLatent + 2) + kLatent);
}

Ws carve(void* base, int H, int B, int splits) {
  Ws w;
  w.qlat = static_cast<uint16_t*>(base);
  w.part = reinterpret_cast<float*>(w.qlat + int64_t(B) * H * kCacheDim);
  w.ctx = w.part + int64_t(B) * splits * H * kLatent;
  w.ml = w.ctx + int64_t(B) * H * kLatent;
  return w;
}

// Block (h, quarter, z): thread (dg = tid / 16, c16 = tid % 16) owns columns quarter·128 + 8·c16 ..
// +7 over d = 8·dg .. +7 (its 8×8 slice of W_UK_h stays in registers for sequences 4z .. 4z + 3);
// the 16 d-groups are added in a fixed order.
__global__ void __launch_bounds__(256)
    absorb_q(int H, int B, const uint16_t* q, const uint16_t* kv_b, uint16_t* qlat) {
  const int h = blockIdx.x, quarter = blockIdx.y, tid = threadIdx.x, dg = tid / 16, c16 = tid % 16;
  __shared__ float qs[kNope];
  __shared__ __align__(16) float red[16][128];
  grid_launch_dependents();  // the attention kernel may launch and start loading cache tiles
  uint4 w[8];
  const uint16_t* wk = kv_b + (int64_t(h) * kKv + dg * 8) * kLatent + quarter * 128 + c16 * 8;
#pragma unroll
  for (int i = 0; i < 8; i++) w[i] = *reinterpret_cast<const uint4*>(wk + int64_t(i) * kLatent);
  const int b_end = min(B, int(blockIdx.z + 1) * kSeqsPerBlock);
  for (int b = int(blockIdx.z) * kSeqsPerBlock; b < b_end; b++) {
    const uint16_t* qb = q + (int64_t(b) * H + h) * kQDim;
    if (tid < kNope) qs[tid] = bf(qb[tid]);
    __syncthreads();
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 8; i++) {
      const float x = qs[dg * 8 + i];
      const uint32_t u[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
#pragma unroll
      for (int j = 0; j < 4; j++) {
        acc[2 * j] += x * __uint_as_float(u[j] << 16);
        acc[2 * j + 1] += x * __uint_as_float(u[j] & 0xffff0000u);
      }
    }
    *reinterpret_cast<float4*>(&red[dg][c16 * 8]) = make_float4(acc[0], acc[1], acc[2], acc[3]);
    *reinterpret_cast<float4*>(&red[dg][c16 * 8 + 4]) = make_float4(acc[4], acc[5], acc[6], acc[7]);
    __syncthreads();
    uint16_t* dst = qlat + (int64_t(b) * H + h) * kCacheDim;
    if (tid < 128) {
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 16; i++) s += red[i][tid];
      dst[quarter * 128 + tid] = to_bf(s);
    } else if (quarter == 0 && tid - 128 < kRope) {
      dst[kLatent + tid - 128] = qb[kNope + tid - 128];
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    attn_split(int H, const uint16_t* cache, int64_t cache_stride, const Lens lens,
               const int32_t* pos_dev, int max_len, int64_t chunk, int splits, float qscale,
               Ws ws) {
  const int split = blockIdx.x, hb = blockIdx.y * HC, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int mt = warp / QW, qw = warp % QW;
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* Ks = reinterpret_cast<uint16_t*>(smem);                   // [2][BK][KSTR]
  float* Sp = reinterpret_cast<float*>(smem + kStages * kTileBytes);  // [12][16][SPSTR]
  uint16_t* Ps =
      reinterpret_cast<uint16_t*>(smem + kStages * kTileBytes + kPartBytes);  // [MT][16][PSTR]
  float* St =
      reinterpret_cast<float*>(smem + kStages * kTileBytes + kPartBytes + kPBytes);  // [MT][QW][16]
  // Host lengths, or (decode_device) the new token's position + 1 from device memory, kept within
  // [1, max_len] so a bad position never reads outside the cache.
  const int len = pos_dev ? min(max(__ldg(pos_dev + b), 0) + 1, max_len) : lens.len[b];
  const int64_t sb = int64_t(split) * chunk, se = std::min<int64_t>(sb + chunk, len);
  const int ntiles = se > sb ? int((se - sb + BK - 1) / BK) : 0;
  const uint16_t* cb = cache + int64_t(b) * cache_stride;

  auto load_tile = [&](int stage, int64_t s0) {
    uint16_t* dst = Ks + stage * BK * KSTR;
    for (int idx = tid; idx < BK * (kCacheDim / 8); idx += kThreads) {
      const int j = idx / (kCacheDim / 8), c8 = (idx % (kCacheDim / 8)) * 8;
      const bool valid = s0 + j < se;
      cp_async16(dst + j * KSTR + c8, cb + (valid ? s0 + j : sb) * kCacheDim + c8, valid ? 16 : 0);
    }
    cp_async_commit();
  };
  if (ntiles > 0) load_tile(0, sb);
  grid_dependency_wait();  // a programmatic dependent of absorb_q: q_lat below is its output

  // q fragments of rows hb + 16mt + {g, g+8}, k-slice qw (9 k-steps).
  uint32_t qa[KSLICE / 16][4];
  {
    const int h_lo = hb + mt * 16 + g, h_hi = h_lo + 8;
    const uint16_t* q_lo = ws.qlat + (int64_t(b) * H + h_lo) * kCacheDim + qw * KSLICE + 2 * t;
    const uint16_t* q_hi = ws.qlat + (int64_t(b) * H + h_hi) * kCacheDim + qw * KSLICE + 2 * t;
#pragma unroll
    for (int kk = 0; kk < KSLICE / 16; kk++) {
      qa[kk][0] = h_lo < H ? ld32(q_lo + kk * 16) : 0u;
      qa[kk][1] = h_hi < H ? ld32(q_hi + kk * 16) : 0u;
      qa[kk][2] = h_lo < H ? ld32(q_lo + kk * 16 + 8) : 0u;
      qa[kk][3] = h_hi < H ? ld32(q_hi + kk * 16 + 8) : 0u;
    }
  }
  // Softmax role: head r of the m-tile, keys 16qw + 8hh .. +7 of each tile.
  const int r = lane & 15, hh = lane >> 4;
  float m_r = -INFINITY, l_r = 0.f;          // running max / this warp's share of the sum, head r
  float m_lo = -INFINITY, m_hi = -INFINITY;  // running max of heads g, g+8 (P·Ĉ layout)
  float acc[VSLICE / 8][4];
#pragma unroll
  for (int nt = 0; nt < VSLICE / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
  float* sp_mine = Sp + warp * 16 * SPSTR;
  float* st = St + mt * QW * 16;
  uint16_t* ps = Ps + mt * 16 * PSTR;
  const int bar = 1 + mt;

  for (int it = 0; it < ntiles; it++) {
    const int64_t s0 = sb + int64_t(it) * BK;
    cp_async_wait<0>();
    __syncthreads();
    if (it + 1 < ntiles) load_tile((it + 1) & 1, s0 + BK);
    const uint16_t* kt = Ks + (it & 1) * BK * KSTR;
    // Partial scores over this warp's k-slice, [16 heads, 64 keys] in two halves of 32 keys
    // (fewer live accumulators next to the 64 ctx and 36 q registers).
    const uint16_t* kbase =
        kt + ((lane & 7) + (lane >> 4) * 8) * KSTR + qw * KSLICE + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int nh = 0; nh < 2; nh++) {
      float c[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; nt++) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KSLICE / 16; kk++) {
#pragma unroll
        for (int nb = 0; nb < 2; nb++) {
          uint32_t kf[4];
          ldsm_x4(kf, kbase + (nh * 32 + nb * 16) * KSTR + kk * 16);
          mma16816(c[2 * nb], qa[kk], kf[0], kf[1]);
          mma16816(c[2 * nb + 1], qa[kk], kf[2], kf[3]);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; nt++) {
        const int col = (nh * 32 + nt * 8 + 2 * t) ^ (g & 4);  // rows g and g + 8 share g & 4
        *reinterpret_cast<float2*>(sp_mine + g * SPSTR + col) = make_float2(c[nt][0], c[nt][1]);
        *reinterpret_cast<float2*>(sp_mine + (g + 8) * SPSTR + col) =
            make_float2(c[nt][2], c[nt][3]);
      }
    }
    named_bar(bar, QW * 32);
    // Scores of head r, keys 16qw + 8hh .. +7: the sum of the four k-slices.
    float sc[8];
    {
      const int k0 = qw * 16 + hh * 8;
#pragma unroll
      for (int j = 0; j < 8; j++) sc[j] = 0.f;
#pragma unroll
      for (int p = 0; p < QW; p++) {
        const float* src = Sp + ((mt * QW + p) * 16 + r) * SPSTR;
        const float4 x0 = *reinterpret_cast<const float4*>(src + (k0 ^ (r & 4)));
        const float4 x1 = *reinterpret_cast<const float4*>(src + ((k0 + 4) ^ (r & 4)));
        sc[0] += x0.x, sc[1] += x0.y, sc[2] += x0.z, sc[3] += x0.w;
        sc[4] += x1.x, sc[5] += x1.y, sc[6] += x1.z, sc[7] += x1.w;
      }
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; j++) {
        sc[j] = s0 + k0 + j < se ? sc[j] * qscale : -INFINITY;
        mx = fmaxf(mx, sc[j]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      if (hh == 0) st[qw * 16 + r] = mx;
    }
    named_bar(bar, QW * 32);
    {  // new running maxima (identical in every warp of the m-tile), P = bf16(exp2(s − m))
      float mr = m_r, ml = m_lo, mh = m_hi;
#pragma unroll
      for (int p = 0; p < QW; p++) {
        mr = fmaxf(mr, st[p * 16 + r]);
        ml = fmaxf(ml, st[p * 16 + g]);
        mh = fmaxf(mh, st[p * 16 + g + 8]);
      }
      // finite: the tile's first row is valid
      const float alpha_r = exp2f(m_r - mr);
      uint32_t pk[4];
      float psum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const uint16_t p0 = to_bf(exp2f(sc[2 * j] - mr)), p1 = to_bf(exp2f(sc[2 * j + 1] - mr));
        psum += bf(p0) + bf(p1);
        pk[j] = uint32_t(p0) | (uint32_t(p1) << 16);
      }
      psum += __shfl_xor_sync(0xffffffffu, psum, 16);
      l_r = l_r * alpha_r + psum;
      m_r = mr;
      *reinterpret_cast<uint4*>(ps + r * PSTR + qw * 16 + hh * 8) =
          make_uint4(pk[0], pk[1], pk[2], pk[3]);
      const float a_lo = exp2f(m_lo - ml), a_hi = exp2f(m_hi - mh);
      m_lo = ml;
      m_hi = mh;
      scale_o(acc, a_lo, a_hi);
    }
    named_bar(bar, QW * 32);
    {  // ctx[16 heads, 128·qw ..] += P · Ĉ
      const uint16_t* pa = ps + ((lane & 7) + ((lane >> 3) & 1) * 8) * PSTR + (lane >> 4) * 8;
      const uint16_t* vb =
          kt + ((lane & 7) + ((lane >> 3) & 1) * 8) * KSTR + qw * VSLICE + (lane >> 4) * 8;
#pragma unroll
      for (int kk = 0; kk < BK / 16; kk++) {
        uint32_t a[4];
        ldsm_x4(a, pa + kk * 16);
#pragma unroll
        for (int nb = 0; nb < VSLICE / 16; nb++) {
          uint32_t vf[4];
          ldsm_x4_trans(vf, vb + kk * 16 * KSTR + nb * 16);
          mma16816(acc[2 * nb], a, vf[0], vf[1]);
          mma16816(acc[2 * nb + 1], a, vf[2], vf[3]);
        }
      }
    }
  }
  // Partial state of this split (an empty split leaves m = −inf, l = 0, ctx = 0).
  __syncthreads();
  if (hh == 0) st[qw * 16 + r] = l_r;
  __syncthreads();
  const int64_t row0 = (int64_t(b) * splits + split) * H + hb + mt * 16;
  if (qw == 0 && hh == 0 && hb + mt * 16 + r < H) {
    float l = 0.f;
#pragma unroll
    for (int p = 0; p < QW; p++) l += st[p * 16 + r];
    ws.ml[(row0 + r) * 2] = m_r;
    ws.ml[(row0 + r) * 2 + 1] = l;
  }
  const bool lo_ok = hb + mt * 16 + g < H, hi_ok = hb + mt * 16 + g + 8 < H;
#pragma unroll
  for (int nt = 0; nt < VSLICE / 8; nt++) {
    const int col = qw * VSLICE + nt * 8 + 2 * t;
    if (lo_ok)
      *reinterpret_cast<float2*>(ws.part + (row0 + g) * kLatent + col) =
          make_float2(acc[nt][0], acc[nt][1]);
    if (hi_ok)
      *reinterpret_cast<float2*>(ws.part + (row0 + g + 8) * kLatent + col) =
          make_float2(acc[nt][2], acc[nt][3]);
  }
}

constexpr int kRowChunks = kCacheDim / 8;  // 72 16-byte chunks per cache row
constexpr int kKSteps = kCacheDim / 16;    // 36 k-steps of S = Q·Kᵀ

// Value columns col0 .. col0 + 255 of a split's unnormalised O (two m64n128 accumulators) for rows
// r_lo and r_hi of the head group.
__device__ __forceinline__ void store_o_half(const Ws& ws, int64_t row0, int r_lo, int r_hi,
                                             bool lo_ok, bool hi_ok, int col0, int t,
                                             const float (&oa)[16][4], const float (&ob)[16][4]) {
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
      const float* o = h ? ob[nt] : oa[nt];
      const int col = col0 + h * 128 + nt * 8 + 2 * t;
      if (lo_ok)
        *reinterpret_cast<float2*>(ws.part + (row0 + r_lo) * kLatent + col) =
            make_float2(o[0], o[1]);
      if (hi_ok)
        *reinterpret_cast<float2*>(ws.part + (row0 + r_hi) * kLatent + col) =
            make_float2(o[2], o[3]);
    }
}

// ---- attn_tma: TMA cache tiles, S on wgmma from shared memory, one warpgroup's softmax ----
// Grid: head group × split × sequence; a head group is G ≤ 64 heads (96 heads: two of 48), one
// wgmma M tile whose rows past G are zero. Two head groups of a split form a cluster when their
// count is even: each CTA loads half of every cache tile's rows and multicasts them to both, as
// the prefill kernels do. 256 threads: warpgroup 0 computes S = Q·Kᵀ for the 64-key tile (36
// m64n64k16 with q_lat and the tile both read from shared memory, in the 128-byte swizzle the TMA
// writes), runs the online softmax (softmax_tile.cuh), keeps O's value columns 0 .. 255 and issues
// P·V for them (P from registers, V read MN-major from the tile's first four boxes), then issues
// the next tile's S; warpgroup 1 keeps columns 256 .. 511 and issues their P·V with the P fragments
// and rescale factors that warpgroup 0 hands over through shared memory (thread i of one to thread
// i of the other: the two hold the same rows in the same layout). Warpgroup 1's first thread issues
// each tile's nine boxes by TMA into a 2-stage ring once every consumer warp of the cluster is done
// with the stage (a ninth, producer warp would cap every thread at 168 registers: one SM
// sub-partition would hold three warps). Rows of a tile at or past the split's end (real cache
// rows, possibly NaN) are zeroed in shared memory before use: their P is 0, and 0·NaN would still
// poison P·V. Shared memory: q_lat (9 boxes of 64 rows × 128 B), two 72 KB stages, the hand-over (P
// 8 KB, factors 1 KB), the mbarriers.
constexpr int kTThreads = 256;
constexpr int kTBoxes = kCacheDim / 64;  // boxes of 64 bf16 columns per cache row
constexpr uint32_t kTQBox = 64 * 128;    // a box of q_lat: 64 rows × 128 B
constexpr int kTStages = 2;              // tiles of kKeyTile cache rows in the ring
constexpr int kWuvAhead = 4;             // W_UV's L2 prefetch: this many tiles before the last
constexpr uint32_t kTRing = kTStages * uint32_t(kTBoxes) * kKeyTile * 128;  // 147456 B
constexpr uint32_t kTOffX = uint32_t(kTBoxes) * kTQBox + kTRing;  // after q_lat and the ring
constexpr uint32_t kTOffBar = kTOffX + 128 * (64 + 8);
constexpr size_t kTSmem = 1024 + kTOffBar + 128;
static_assert(kTSmem <= 227 * 1024, "attn_tma shared memory");

__global__ void __launch_bounds__(kTThreads, 1)
    attn_tma(const __grid_constant__ CUtensorMap tm, int H, int G, const Lens lens,
             const int32_t* pos_dev, int max_len, int64_t chunk, int splits, float qscale, Ws ws,
             int pf, const uint16_t* kv_b) {
  const unsigned rank = cluster_ctarank(), cl = cluster_nctarank();
  const int hb = blockIdx.x * G, split = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, t = lane % 4;
  const int len = pos_dev ? min(max(__ldg(pos_dev + b), 0) + 1, max_len) : lens.len[b];
  const int64_t sb = int64_t(split) * chunk, se = std::min<int64_t>(sb + chunk, len);
  constexpr uint32_t kBox = kKeyTile * 128, kTile = uint32_t(kTBoxes) * kBox;
  const int n = se > sb ? int((se - sb + kKeyTile - 1) / kKeyTile) : 0;
  extern __shared__ uint8_t tsmem[];
  const uint32_t raw = smem_addr(tsmem), base = (raw + 1023u) & ~1023u;
  uint8_t* const gbase = tsmem + (base - raw);
  const uint32_t q_s = base, stage0 = base + uint32_t(kTBoxes) * kTQBox;
  const uint32_t full = base + kTOffBar, empty = full + 8 * kTStages, pfull = empty + 8 * kTStages,
                 pempty = pfull + 8;
  auto stage = [&](int j) { return stage0 + uint32_t(j % kTStages) * kTile; };
  auto phase = [&](int j) { return unsigned(j / kTStages) & 1u; };
  if (tid == 0) {
    for (int i = 0; i < kTStages; i++) {
      mbar_init(full + 8 * i, 1);
      mbar_init(empty + 8 * i, 8 * cl);
    }
    mbar_init(pfull, 4);
    mbar_init(pempty, 4);
    fence_mbarrier_init();
  }
  __syncthreads();
  if (cl > 1) {  // the peer's barriers initialised before any multicast or remote arrival
    cluster_arrive_relaxed();
    cluster_wait();
  }
  // Warp lane 0 of every consumer warp: this warp is done with tile j's stage, in every CTA.
  auto release = [&](int j) {
    release_slot_in_cluster(empty + 8 * (j % kTStages), rank, cl, lane);
  };
  auto wait_full = [&](int j) { mbar_wait<false>(full + 8 * (j % kTStages), phase(j)); };
  uint4* const xp = reinterpret_cast<uint4*>(gbase + kTOffX);                   // [4][128] P words
  float2* const xa = reinterpret_cast<float2*>(gbase + kTOffX + 4 * 128 * 16);  // [128] factors
  const int64_t row0 = (int64_t(b) * splits + split) * H + hb;

  // Tile j into its stage (thread 128, warpgroup 1's first thread, is the producer: tiles 0 and
  // 1 up front, tile j + 2 once every consumer warp of the cluster is done with tile j).
  auto issue = [&](int j) {
    const int rows = kKeyTile / int(cl);
    const uint32_t bar = full + 8 * (j % kTStages);
    mbar_arrive_expect_tx(bar, kTile);
    const int y = int(sb) + j * kKeyTile + int(rank) * rows;
    const uint32_t dst = stage(j) + rank * uint32_t(rows) * 128;
    for (int x = 0; x < kTBoxes; x++) {
      if (cl > 1)
        tma_load_mc(dst + x * kBox, &tm, x * 64, y, b, bar, uint16_t((1u << cl) - 1));
      else
        tma_load(dst + x * kBox, &tm, x * 64, y, b, bar);
    }
  };
  // This CTA's part of tile j into L2 only (pf tiles ahead of the ring).
  auto prefetch = [&](int j) {
    const int rows = kKeyTile / int(cl);
    const int y = int(sb) + j * kKeyTile + int(rank) * rows;
    for (int x = 0; x < kTBoxes; x++) tma_prefetch_l2(&tm, x * 64, y, b);
  };
  auto issue_ahead = [&](int j) {
    issue(j);
    if (pf > 0 && j + pf < n) prefetch(j + pf);
  };
  // W_UV (out_uv's weights, a contiguous 128 KB per head) into L2, CTA c taking heads c, c +
  // #CTAs, …: issued a few tiles before this CTA's last, while the loads leave DRAM time idle,
  // instead of from DRAM at out_uv's start beside merge_ctx.
  auto prefetch_wuv = [&] {
    if (!kv_b) return;  // not 16-byte aligned (launch_decode passes null then)
    const unsigned nctas = gridDim.x * gridDim.y * gridDim.z;
    for (unsigned h = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
         h < unsigned(H); h += nctas) {
      const uint16_t* w = kv_b + (int64_t(h) * kKv + kNope) * kLatent;
      for (int part = 0; part < kV * kLatent * 2 / 32768; part++)
        bulk_prefetch_l2(w + part * 16384, 32768u);
    }
  };
  // Tiles 0 and 1 before q_lat is ready; the L2 prefetches of the next tiles only after q_lat's
  // copy, which they would otherwise queue ahead of.
  if (tid == 128)
    for (int j = 0; j < min(kTStages, n); j++) issue(j);
  // Launched as a programmatic dependent of absorb_q: the cache's first tiles are on their way
  // before q_lat (absorb_q's output) is ready.
  grid_dependency_wait();
  // q_lat rows hb .. hb + G − 1 (zero past G or H), chunk c of row r at box c / 8, swizzled.
  for (int i = tid; i < 64 * kRowChunks; i += kTThreads) {
    const int r = i / kRowChunks, c = i % kRowChunks;
    const bool ok = r < G && hb + r < H;
    const uint32_t dst =
        q_s + uint32_t(c / 8) * kTQBox + uint32_t(r) * 128 + uint32_t(((c % 8) ^ (r % 8)) * 16);
    cp_async16_at(dst, ws.qlat + (int64_t(b) * H + (ok ? hb + r : 0)) * kCacheDim + c * 8,
                  ok ? 16u : 0u);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  if (tid == 128) {
    for (int j = kTStages; j < min(kTStages + pf, n); j++) prefetch(j);
    if (n <= kWuvAhead) prefetch_wuv();
  }
  // merge_ctx may launch now (it waits for this grid's end): measured on the H100 (B = 1, 128K
  // positions) 111.7 / 112.2 µs against 113.0 / 113.0 with the trigger after the last tile.
  grid_launch_dependents();
  if (warp < 4) {
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
    float oa[16][4], ob[16][4], sc[kKeyTile / 8][4];
    uint32_t pa[kKeyTile / 16][4];
#pragma unroll
    for (int nt = 0; nt < 16; nt++)
      for (int e = 0; e < 4; e++) oa[nt][e] = ob[nt][e] = 0.f;
    const int64_t far = INT64_MAX / 4;  // no causal mask: only the split's end masks keys
    // Tile j's bytes landed; its rows at and past se zeroed (only a split's last tile has any).
    auto prep = [&](int j) {
      wait_full(j);
      const int64_t s0 = sb + int64_t(j) * kKeyTile;
      if (se - s0 < kKeyTile) {
        const int r0 = int(se - s0);
        uint8_t* st = gbase + (stage(j) - base);
        for (int i = tid; i < (kKeyTile - r0) * kRowChunks; i += 128) {
          const int r = r0 + i / kRowChunks, c = i % kRowChunks;
          *reinterpret_cast<uint4*>(st + (c / 8) * kBox + r * 128 + (c % 8) * 16) =
              make_uint4(0u, 0u, 0u, 0u);
        }
        fence_proxy_async();
        named_bar(3, 128);
      }
    };
    auto issue_s = [&](int j) {
      const uint32_t st = stage(j);
      zero_for_wgmma(sc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ks++) {
        const uint32_t col = uint32_t(ks % 4) * 32;
        wgmma_m64n64k16_ss(sc, wgmma_desc_sw128(q_s + uint32_t(ks / 4) * kTQBox + col),
                           wgmma_desc_sw128(st + uint32_t(ks / 4) * kBox + col));
      }
      wgmma_commit();
    };
    auto pv = [&](int j) {
      const uint32_t v = stage(j);
#pragma unroll
      for (int kk = 0; kk < kKeyTile / 16; kk++) {
        wgmma_m64n128k16_tb(oa, pa[kk], wgmma_desc_sw128_mn(v + kk * 2048, kBox, 1024));
        wgmma_m64n128k16_tb(ob, pa[kk], wgmma_desc_sw128_mn(v + 2 * kBox + kk * 2048, kBox, 1024));
      }
      wgmma_commit();
    };
    // Softmax of tile j (S complete, P·V of j − 1 complete), O rescaled, P and the factors handed
    // to warpgroup 1 once it has taken the previous ones.
    auto soft = [&](int j) {
      reg_fence(sc);
      reg_fence(oa);
      reg_fence(ob);
      float a_lo, a_hi;
      softmax_tile(sc, pa, m_lo, m_hi, l_lo, l_hi, a_lo, a_hi, sb + int64_t(j) * kKeyTile, far, far,
                   far, se, t, qscale);
      scale_o(oa, a_lo, a_hi);
      scale_o(ob, a_lo, a_hi);
      if (j > 0) mbar_wait<false>(pempty, unsigned(j - 1) & 1u);
#pragma unroll
      for (int kk = 0; kk < kKeyTile / 16; kk++)
        xp[kk * 128 + tid] = make_uint4(pa[kk][0], pa[kk][1], pa[kk][2], pa[kk][3]);
      xa[tid] = make_float2(a_lo, a_hi);
      __syncwarp();
      if (lane == 0) mbar_arrive_local(pfull);
    };
    if (n > 0) {
      prep(0);
      issue_s(0);
      wgmma_wait<0>();
    }
    // Nothing is in flight at a loop edge (ptxas would serialise every wgmma otherwise).
    // P·V of tile j is issued before the wait for tile j + 1 and the stage released as soon as it
    // is done, ahead of S(j + 1): the load of tile j + 2 into that stage starts one S earlier.
    for (int j = 0; j + 1 < n; j++) {
      soft(j);
      wgmma_fence();
      pv(j);
      prep(j + 1);
      issue_s(j + 1);
      wgmma_wait<1>();
      release(j);
      wgmma_wait<0>();
    }
    if (n > 0) {
      soft(n - 1);
      wgmma_fence();
      pv(n - 1);
      wgmma_wait<0>();
      reg_fence(oa);
      reg_fence(ob);
    }
    // The state of this split (an empty one: m = −inf, l = 0, O = 0), value columns 0 .. 255.
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
      l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o2);
      l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o2);
    }
    const int r_lo = warp * 16 + lane / 4, r_hi = r_lo + 8;
    const bool lo_ok = r_lo < G && hb + r_lo < H, hi_ok = r_hi < G && hb + r_hi < H;
    if (t == 0) {
      if (lo_ok) *reinterpret_cast<float2*>(ws.ml + (row0 + r_lo) * 2) = make_float2(m_lo, l_lo);
      if (hi_ok) *reinterpret_cast<float2*>(ws.ml + (row0 + r_hi) * 2) = make_float2(m_hi, l_hi);
    }
    store_o_half(ws, row0, r_lo, r_hi, lo_ok, hi_ok, 0, t, oa, ob);
  } else {
    const int u = tid - 128, w = warp - 4;
    float oa[16][4], ob[16][4];
    uint32_t pa[kKeyTile / 16][4];
#pragma unroll
    for (int nt = 0; nt < 16; nt++)
      for (int e = 0; e < 4; e++) oa[nt][e] = ob[nt][e] = 0.f;
    for (int j = 0; j < n; j++) {
      mbar_wait<false>(pfull, unsigned(j) & 1u);
#pragma unroll
      for (int kk = 0; kk < kKeyTile / 16; kk++) {
        const uint4 x = xp[kk * 128 + u];
        pa[kk][0] = x.x, pa[kk][1] = x.y, pa[kk][2] = x.z, pa[kk][3] = x.w;
      }
      const float2 a = xa[u];
      __syncwarp();
      if (lane == 0) mbar_arrive_local(pempty);
      reg_fence(oa);
      reg_fence(ob);
      scale_o(oa, a.x, a.y);
      scale_o(ob, a.x, a.y);
      wait_full(j);  // seen complete by warpgroup 0 already; orders the TMA's bytes for this one
      wgmma_fence();
      const uint32_t v = stage(j) + 4 * kBox;
#pragma unroll
      for (int kk = 0; kk < kKeyTile / 16; kk++) {
        wgmma_m64n128k16_tb(oa, pa[kk], wgmma_desc_sw128_mn(v + kk * 2048, kBox, 1024));
        wgmma_m64n128k16_tb(ob, pa[kk], wgmma_desc_sw128_mn(v + 2 * kBox + kk * 2048, kBox, 1024));
      }
      wgmma_commit();
      if (tid == 160 && j == n - 1 - kWuvAhead) prefetch_wuv();
      wgmma_wait<0>();
      if (j + 1 < n) release(j);
      if (tid == 128 && j + kTStages < n) {
        mbar_wait<true>(empty + 8 * (j % kTStages), phase(j));
        issue_ahead(j + kTStages);
      }
    }
    reg_fence(oa);
    reg_fence(ob);
    const int r_lo = w * 16 + lane / 4, r_hi = r_lo + 8;
    const bool lo_ok = r_lo < G && hb + r_lo < H, hi_ok = r_hi < G && hb + r_hi < H;
    store_o_half(ws, row0, r_lo, r_hi, lo_ok, hi_ok, 256, t, oa, ob);
  }
  // Every copy into this CTA has landed (warpgroup 0 waited on every tile); the cluster barrier
  // orders the peer's last arrivals on this CTA's barriers before either CTA exits.
  if (cl > 1) {
    cluster_arrive();
    cluster_wait();
  }
}

// Block (h, b, quarter), 128 threads: thread (grp = tid / 32, c = tid % 32) sums splits ≡ grp mod 4
// for columns quarter·128 + 4c .. +3; the four groups are added in a fixed order.
__global__ void __launch_bounds__(128) merge_ctx(int H, int splits, Ws ws) {
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  __shared__ float wsplit[kMaxSplits];
  __shared__ float inv_l;
  __shared__ __align__(16) float4 red[4][32];
  // A programmatic dependent of the attention kernel; out_uv may launch at once (it loads W_UV
  // while this block merges).
  grid_launch_dependents();
  grid_dependency_wait();
  if (warp == 0) {
    float M = -INFINITY;
    for (int i = lane; i < splits; i += 32)
      M = fmaxf(M, ws.ml[((int64_t(b) * splits + i) * H + h) * 2]);
    M = warp_max(M);
    float L = 0.f;
    for (int i = lane; i < splits; i += 32) {
      const float* ml = ws.ml + ((int64_t(b) * splits + i) * H + h) * 2;
      const float w = ml[1] > 0.f ? exp2f(ml[0] - M) : 0.f;
      wsplit[i] = w;
      L += w * ml[1];
    }
    L = warp_sum(L);
    if (lane == 0) inv_l = 1.0f / L;
  }
  __syncthreads();
  const int c4 = blockIdx.z * 32 + lane;
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int i = warp; i < splits; i += 4) {
    const float w = wsplit[i];
    if (w != 0.f) {
      const float4 x = reinterpret_cast<const float4*>(
          ws.part + ((int64_t(b) * splits + i) * H + h) * kLatent)[c4];
      a.x += w * x.x, a.y += w * x.y, a.z += w * x.z, a.w += w * x.w;
    }
  }
  red[warp][lane] = a;
  __syncthreads();
  if (warp == 0) {
    const float il = inv_l;
    float4 s = red[0][lane];
#pragma unroll
    for (int k = 1; k < 4; k++) {
      const float4 x = red[k][lane];
      s.x += x.x, s.y += x.y, s.z += x.z, s.w += x.w;
    }
    reinterpret_cast<float4*>(ws.ctx + (int64_t(b) * H + h) * kLatent)[c4] =
        make_float4(s.x * il, s.y * il, s.z * il, s.w * il);
  }
}

// Block (h, quarter, z), 256 threads: warp w owns rows quarter·32 + 4w .. +3 of W_UV_h; lane holds
// columns 8·lane .. +7 and 256 + 8·lane .. +7 of each (in registers, reused for sequences 4z ..
// 4z + 3).
__global__ void __launch_bounds__(256)
    out_uv(int H, int B, const uint16_t* kv_b, const float* ctx, uint16_t* out) {
  const int h = blockIdx.x, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int v0 = blockIdx.y * 32 + warp * 4;
  const uint16_t* wuv = kv_b + (int64_t(h) * kKv + kNope + v0) * kLatent + lane * 8;
  uint4 w[4][2];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    w[i][0] = *reinterpret_cast<const uint4*>(wuv + int64_t(i) * kLatent);
    w[i][1] = *reinterpret_cast<const uint4*>(wuv + int64_t(i) * kLatent + 256);
  }
  grid_dependency_wait();  // a programmatic dependent of merge_ctx: ctx below is its output
  const int b_end = min(B, int(blockIdx.z + 1) * kSeqsPerBlock);
  for (int b = int(blockIdx.z) * kSeqsPerBlock; b < b_end; b++) {
    const float* c = ctx + (int64_t(b) * H + h) * kLatent + lane * 8;
    float x[16];
#pragma unroll
    for (int k = 0; k < 2; k++) {
      const float4 c0 = *reinterpret_cast<const float4*>(c + 256 * k);
      const float4 c1 = *reinterpret_cast<const float4*>(c + 256 * k + 4);
      x[8 * k + 0] = c0.x, x[8 * k + 1] = c0.y, x[8 * k + 2] = c0.z, x[8 * k + 3] = c0.w;
      x[8 * k + 4] = c1.x, x[8 * k + 5] = c1.y, x[8 * k + 6] = c1.z, x[8 * k + 7] = c1.w;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
      float a = 0.f;
#pragma unroll
      for (int k = 0; k < 2; k++) {
        const uint32_t u[4] = {w[i][k].x, w[i][k].y, w[i][k].z, w[i][k].w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
          a += __uint_as_float(u[j] << 16) * x[8 * k + 2 * j];
          a += __uint_as_float(u[j] & 0xffff0000u) * x[8 * k + 2 * j + 1];
        }
      }
      a = warp_sum(a);
      if (lane == 0) out[(int64_t(b) * H + h) * kV + v0 + i] = to_bf(a);
    }
  }
}

}  // namespace

DecodeKernel default_decode_kernel() {
  static const DecodeKernel k = [] {
    const char* e = std::getenv("STRATA_MLA_DECODE");
    if (e && std::strcmp(e, "mma") == 0) return DecodeKernel::mma;
    return DecodeKernel::tma;
  }();
  return k;
}

const char* decode_kernel_name(DecodeKernel k) {
  return k == DecodeKernel::mma ? "mma" : "tma";
}

// attn_tma's heads per block: the fewest blocks of at most 64 heads, as even as they go (96: 2 ×
// 48).
static int tma_group(int H) {
  const int groups = (H + 63) / 64;
  return (H + groups - 1) / groups;
}

size_t decode_workspace_bytes(int H, int B, int64_t max_len) {
  // Either kernel's plan fits (the two block widths can give different split counts).
  max_len = std::max<int64_t>(max_len, 1);
  const int splits = std::max(plan_splits(H, B, max_len, HC).splits,
                              plan_splits(H, B, max_len, tma_group(H)).splits);
  return ws_bytes(H, B, splits);
}

namespace {

// The launches of decode() and decode_device(): lengths from `lens` (host) or pos_dev (device),
// the plan and grids for max_len positions.
Status launch_decode(int H, const uint16_t* q, const uint16_t* cache, int64_t cache_stride,
                     const Lens& lens, const int32_t* pos_dev, int B, int64_t max_len,
                     const uint16_t* kv_b, uint16_t* out, void* workspace, size_t workspace_bytes,
                     void* stream, DecodeKernel kernel) {
  // attn_tma reads whole 64-row tiles of each sequence up to max_len through one tensor map: it
  // needs cuTensorMapEncodeTiled, a 16-byte aligned cache and (B > 1) sequences of at least
  // max_len rows; otherwise the mma kernel runs (the same math).
  const EncodeTiled encode = kernel == DecodeKernel::tma ? encode_tiled() : nullptr;
  if (kernel == DecodeKernel::tma && (!encode || reinterpret_cast<uintptr_t>(cache) % 16 != 0 ||
                                      (B > 1 && cache_stride / kCacheDim < max_len)))
    kernel = DecodeKernel::mma;
  const int heads = kernel == DecodeKernel::tma ? tma_group(H) : HC;  // per attention block
  const Plan plan = plan_splits(H, B, max_len, heads);
  if (plan.splits > kMaxSplits)
    return invalid("mla decode: more than 128 splits (internal plan error)");
  if (workspace_bytes < ws_bytes(H, B, plan.splits))
    return invalid("mla decode: workspace smaller than decode_workspace_bytes(H, B, max_len)");
  const Ws ws = carve(workspace, H, B, plan.splits);
  const unsigned groups = unsigned((H + heads - 1) / heads);
  // attn_tma: pairs of head groups share each tile's loads (multicast); every CTA prefetches its
  // part of the tile two ahead of its ring into L2. Measured on an H100 (docs/performance.md): each
  // CTA loading its own tiles, prefetch distances 0 and 4, and 32-key tiles in a ring of four were
  // slower.
  constexpr int kPrefetch = 2;
  const unsigned cl = groups % 2 == 0 ? 2 : 1;
  CUtensorMap tm{};
  if (kernel == DecodeKernel::tma) {
    if (Status a = rt::allow_dynamic_smem(attn_tma, int(kTSmem)); !a.ok()) return a;
    // The caches as [B][max_len][576]; boxes of 64 columns × 64/cl rows of one sequence.
    const cuuint64_t dim[3] = {cuuint64_t(kCacheDim), cuuint64_t(max_len), cuuint64_t(B)};
    const cuuint64_t stride[2] = {cuuint64_t(kCacheDim) * 2,
                                  cuuint64_t(B > 1 ? cache_stride : max_len * kCacheDim) * 2};
    const cuuint32_t box[3] = {64, cuuint32_t(kKeyTile / int(cl)), 1};
    if (Status st = encode_map(encode, &tm, 3, cache, dim, stride, box,
                               "mla decode: cuTensorMapEncodeTiled failed");
        !st.ok())
      return st;
  } else if (Status a = rt::allow_dynamic_smem(attn_split, int(kSplitSmem)); !a.ok()) {
    return a;
  }
  const unsigned seq_blocks = unsigned((B + kSeqsPerBlock - 1) / kSeqsPerBlock);
  if (Status st = launch_pdl(absorb_q, dim3(H, kLatent / 128, seq_blocks), dim3(256), stream, false,
                             H, B, q, kv_b, ws.qlat);
      !st.ok())
    return st;
  const float qscale = float(1.0 / std::sqrt(double(kQDim)) * 1.4426950408889634);
  // The three kernels after absorb_q are programmatic dependents of the one before them on a
  // created stream (the legacy stream serializes anyway): each launches while the one before runs
  // and waits in grid_dependency_wait before it reads that one's output. attn_tma loads its first
  // cache tiles before it waits; out_uv loads W_UV. H100, bench kernels --filter mla/decode, two
  // rounds interleaved: B = 1 at 128K 116.9 / 118.5 µs plain, 111.7 / 112.2 with these launches;
  // B = 16 and 1M positions within ±1 %.
  const bool dep = stream != nullptr;
  // attn_tma: the head groups of a split innermost, a cluster sharing each tile's loads.
  if (kernel == DecodeKernel::tma) {
    if (Status st = launch_ex(attn_tma, dim3(groups, plan.splits, B), dim3(kTThreads), kTSmem, cl,
                              dep, stream, tm, H, heads, lens, pos_dev, int(max_len), plan.chunk,
                              plan.splits, qscale, ws, kPrefetch,
                              reinterpret_cast<uintptr_t>(kv_b) % 16 == 0 ? kv_b : nullptr);
        !st.ok())
      return st;
  } else if (Status st = launch_ex(attn_split, dim3(plan.splits, groups, B), dim3(kThreads),
                                   kSplitSmem, 1, dep, stream, H, cache, cache_stride, lens,
                                   pos_dev, int(max_len), plan.chunk, plan.splits, qscale, ws);
             !st.ok()) {
    return st;
  }
  if (Status st = launch_pdl(merge_ctx, dim3(H, B, kLatent / 128), dim3(128), stream, dep, H,
                             plan.splits, ws);
      !st.ok())
    return st;
  if (Status st = launch_pdl(out_uv, dim3(H, kV / 32, seq_blocks), dim3(256), stream, dep, H, B,
                             kv_b, static_cast<const float*>(ws.ctx), out);
      !st.ok())
    return st;
  return launch_status();
}

Status check_decode_args(int H, const uint16_t* q, const uint16_t* cache, int64_t cache_stride,
                         const void* lens, int B, const uint16_t* kv_b, uint16_t* out,
                         void* workspace) {
  if (!q || !cache || !lens || !kv_b || !out || !workspace)
    return invalid("mla decode: null pointer");
  if (H < 1 || H > 65535) return invalid("mla decode: H must be 1 .. 65535");
  if (B < 1 || B > kMaxSeqs) return invalid("mla decode: B must be 1 .. 256");
  if (cache_stride % 8 != 0 || (B > 1 && cache_stride < kCacheDim))
    return invalid("mla decode: cache_stride must be a multiple of 8 and >= 576 elements");
  return Status{};
}

}  // namespace

Status decode(int H, const uint16_t* q, const uint16_t* cache, int64_t cache_stride,
              const int32_t* lens_host, int B, const uint16_t* kv_b, uint16_t* out, void* workspace,
              size_t workspace_bytes, void* stream, DecodeKernel kernel) {
  if (Status st = check_decode_args(H, q, cache, cache_stride, lens_host, B, kv_b, out, workspace);
      !st.ok())
    return st;
  Lens lens{};
  int64_t max_len = 0;
  for (int b = 0; b < B; b++) {
    if (lens_host[b] < 1) return invalid("mla decode: every sequence needs >= 1 cached position");
    lens.len[b] = lens_host[b];
    max_len = std::max<int64_t>(max_len, lens_host[b]);
  }
  return launch_decode(H, q, cache, cache_stride, lens, nullptr, B, max_len, kv_b, out, workspace,
                       workspace_bytes, stream, kernel);
}

Status decode_device(int H, const uint16_t* q, const uint16_t* cache, int64_t cache_stride,
                     const int32_t* pos_dev, int B, int64_t max_len, const uint16_t* kv_b,
                     uint16_t* out, void* workspace, size_t workspace_bytes, void* stream,
                     DecodeKernel kernel) {
  if (Status st = check_decode_args(H, q, cache, cache_stride, pos_dev, B, kv_b, out, workspace);
      !st.ok())
    return st;
  if (max_len < 1 || max_len > INT32_MAX)
    return invalid("mla decode: max_len must be 1 .. 2^31 - 1 positions");
  return launch_decode(H, q, cache, cache_stride, Lens{}, pos_dev, B, max_len, kv_b, out, workspace,
                       workspace_bytes, stream, kernel);
}

}  // namespace strata::kernels::mla
