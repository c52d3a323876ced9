// Absorbed MLA decode (see mla.h), four kernels:
//   absorb_q  (grid: head × 128-column quarter) — q_lat = bf16(W_UKᵀ q_nope) for the whole batch;
//             each thread keeps its 8×8 slice of W_UK_h in registers for all sequences; q_pe
//             copied beside it, so q_lat rows are the 576-wide bf16 queries of the cache rows.
//   attention over the splits of each sequence's cache, writing (m, l, unnormalised ctx) per
//             split, fp32 online softmax in the exp2 domain, P rounded to bf16 for P·Ĉ — one of:
//     attn_wgmma (STRATA_MLA_DECODE=wgmma; grid: head block × split × sequence, 256 threads;
//             not yet run on a GPU in this form, checked by scripts/mla-emu) — H split evenly
//             into blocks of at most 64 heads (96 → 2 × 48), each one wgmma M tile of 64 rows
//             (rows past the block zero), so each 64-row cache tile is read from shared memory
//             once per block (the cache tile is the B operand of both products). Two warpgroups
//             in seesaw: warpgroup w owns O[64 × 256] for value columns 256w .. +255 (128 fp32
//             accumulators per thread) and the tiles j ≡ w (mod 2). For its own tile it computes
//             S = Q·Kᵀ [64 × 64] over all 576 dims (36 m64n64k16, q_lat and the tile both from
//             shared memory), the new running maxima from the previous tile's (whichever
//             warpgroup computed them), P = bf16(2^(s − m)), publishes P (into the tile's k_pe
//             chunks, which S no longer needs), m and α = 2^(m_old − m) through a named barrier
//             (bar.arrive; the other warpgroup bar.syncs), and adds P·V from registers (4 × 2
//             m64n128k16, V read MN-major from the tile); for the other warpgroup's tile it scales
//             O by that α and adds P·V with P read from shared memory. Only P, m and α cross
//             between the warpgroups, once per tile (the earlier form split S by dims and exchanged
//             partial scores, maxima and P: three barriers per tile, 20.7-22.4 % of copy). Cache
//             tiles: a 2-stage ring of 64 rows in the no-swizzle core-matrix layout (wgmma.cuh),
//             q_lat beside it (3 × 72 KB), filled by cp.async and tracked by one mbarrier per stage
//             (cp.async.mbarrier.arrive.noinc from all 256 threads, waited by parity, then a proxy
//             fence); rows past the split's end zero-filled. As soon as a warpgroup's P·V on
//             tile j − 1 is done it refills its share of that stage with tile j + 1: its value
//             columns, and the k_pe chunks if it read tile j − 1's P from them. No producer warp: a
//             9th warp caps every thread at 168 registers (three warps on one SM sub-partition); as
//             is, 236 registers, no spills, 222 KB of shared memory, one block per SM.
//     attn_split (the default; grid: split × group of 48 heads × sequence)
//             — one block streams its slice of the sequence's latent cache through shared memory
//             once (cp.async, 2 stages of 64 rows) for 48 heads. 12 warps: warp (m, q) owns heads
//             16m .. 16m+15 and, for QKᵀ, the 144-wide k-slice q of [ĉ | k_pe] (its q_lat
//             fragments live in registers), for P·Ĉ the 128 value columns 128q .. 128q+127
//             (bf16 mma.sync m16n8k16, fp32 accumulate). The four k-slice partial scores of a
//             head group are summed through shared memory.
//     Either way the head groups of one split read the same cache rows; the second read mostly
//     hits L2, so the cache is read from DRAM about once.
//   merge_ctx (grid: head × sequence × 128-column quarter) — merges the splits' softmax states into
//   ctx (fp32). out_uv    (grid: head × 32-row quarter of W_UV_h) — o = bf16(W_UV·ctx), weights in
//   registers.
// Napkin (B = 1, S = 128K, 96 heads): 151 MB of cache, 27 GFLOP; the DRAM floor is 35 µs on the
// H200 (4.3 TB/s copy), 60 % of copy is 59 µs. attn_split: every 16-head group re-reads each
// cache tile from shared memory through ldmatrix (6 × (576 + 512) × 2 B per row = 1.7 GB at
// 128 B/clk/SM ≈ 51 µs on 132 SMs), measured 26-29 % of copy, shared-memory bound. attn_wgmma,
// per 64-row tile and head block: 2.36 M + 2.10 M multiply-adds = 2176 clk at 2048 bf16
// MAC/clk/SM, against 144 KB of shared reads for S (128 B/clk, the limit, while S runs), 72 KB for
// P·V and 74 KB of cache written: per SM near both the tensor and the shared-memory ceilings. 96
// heads as 2 × 48 pad 25 % of the tensor work: 2 × 2176 clk per tile, 2048 tiles on 132 SMs
// ≈ 39 µs at 1.75 GHz, so the kernel sits at the ridge on the H200 (tensor floor ≈ DRAM floor:
// 60 % of copy needs ≈ 65 % of the tensor floor) and is DRAM-bound on the H100 (≈ 3 TB/s). Per
// tile the chain is S (1152 clk) → softmax → both P·V halves (1024 clk), the softmax exposed
// (the next S waits for its stage, which the ring refills only after the previous tile's P·V);
// the refill has that one tile (≈ 1.4 µs) to land.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kernels/kda/cuda_util.cuh"
#include "kernels/mla/mla.h"
#include "kernels/mla/mma.cuh"
#include "kernels/mla/wgmma.cuh"

namespace strata::kernels::mla {
namespace {

using namespace strata::kernels::detail;

constexpr int kKv = kNope + kV;
constexpr int HC = 48;                  // heads per attention block
constexpr int MT = HC / 16;             // 16-head m-tiles per block
constexpr int QW = 4;                   // warps per m-tile
constexpr int kWarps = MT * QW;         // 12
constexpr int kThreads = kWarps * 32;   // 384
constexpr int BK = 64;                  // cache rows per tile
constexpr int KSLICE = kCacheDim / QW;  // 144: QKᵀ k-slice of one warp (9 k-steps)
constexpr int VSLICE = kLatent / QW;    // 128: P·Ĉ columns of one warp
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
// heads_per_block: HC (attn_split) or wg_heads(H) (attn_wgmma).
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

// Block (h, quarter): thread (dg = tid / 16, c16 = tid % 16) owns columns quarter·128 + 8·c16 .. +7
// over d = 8·dg .. +7 (its 8×8 slice of W_UK_h stays in registers for every sequence); the 16
// d-groups are added in a fixed order.
__global__ void __launch_bounds__(256)
    absorb_q(int H, int B, const uint16_t* q, const uint16_t* kv_b, uint16_t* qlat) {
  const int h = blockIdx.x, quarter = blockIdx.y, tid = threadIdx.x, dg = tid / 16, c16 = tid % 16;
  __shared__ float qs[kNope];
  __shared__ __align__(16) float red[16][128];
  uint4 w[8];
  const uint16_t* wk = kv_b + (int64_t(h) * kKv + dg * 8) * kLatent + quarter * 128 + c16 * 8;
#pragma unroll
  for (int i = 0; i < 8; i++) w[i] = *reinterpret_cast<const uint4*>(wk + int64_t(i) * kLatent);
  for (int b = 0; b < B; b++) {
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
#pragma unroll
      for (int nt = 0; nt < VSLICE / 8; nt++) {
        acc[nt][0] *= a_lo;
        acc[nt][1] *= a_lo;
        acc[nt][2] *= a_hi;
        acc[nt][3] *= a_hi;
      }
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

// ---- attn_wgmma: 64-row wgmma tiles, two warpgroups in seesaw (see the file's opening comment)
// ----
constexpr int WH = 64;                     // wgmma M tile: rows (heads) per block, padded
constexpr int kWThreads = 256;             // two warpgroups
constexpr int kRowChunks = kCacheDim / 8;  // 72 16-byte chunks per cache row
constexpr int kKSteps = kCacheDim / 16;    // 36 k-steps of S = Q·Kᵀ
constexpr uint32_t kWTile = uint32_t(BK) * kCacheDim * 2;  // 73728 B: one 64-row cache tile
constexpr uint32_t kWQ = uint32_t(WH) * kCacheDim * 2;     // 73728 B: q_lat of the block's heads
constexpr uint32_t kWRope = uint32_t(kLatent / 8) * 1024;  // offset of a tile's k_pe chunks (8 KB)
constexpr uint32_t kWOffStage = kWQ;
constexpr uint32_t kWOffStat = kWQ + 2 * kWTile;           // [2 stages][m | α][64] fp32
constexpr uint32_t kWOffBar = kWOffStat + 2 * 2 * WH * 4;  // full[2] mbarriers
constexpr size_t kWSmem = kWOffBar + 2 * 8;
static_assert(kWSmem <= 227 * 1024, "attn_wgmma shared memory");
static_assert(BK == 64 && WH == 64, "the core-matrix layout below is for 64-row operands");

// Rows (heads) per block: H split evenly over the fewest blocks of at most 64 (96 → 2 × 48).
int wg_heads(int H) {
  const int blocks = (H + WH - 1) / WH;
  return (H + blocks - 1) / blocks;
}

// Byte offset of chunk c8 of row r in a 64-row operand (Q, a cache tile, P), wgmma.cuh's layout:
// descriptors K-major (lead 1024, stride 128) and MN-major (lead 128, stride 1024).
__device__ __forceinline__ uint32_t core_off(int r, int c8) {
  return uint32_t(c8) * 1024u + uint32_t(r >> 3) * 128u + uint32_t(r & 7) * 16u;
}

__global__ void __launch_bounds__(kWThreads, 1)
    attn_wgmma(int H, int hpb, const uint16_t* cache, int64_t cache_stride, const Lens lens,
               const int32_t* pos_dev, int max_len, int64_t chunk, int splits, float qscale,
               Ws ws) {
  const int hb = blockIdx.x * hpb, split = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  extern __shared__ __align__(1024) uint8_t wsmem[];
  const uint32_t sbase = smem_addr(wsmem);
  float* stat = reinterpret_cast<float*>(wsmem + kWOffStat);
  const uint32_t full0 = sbase + kWOffBar;  // full[s] = full0 + 8·s
  const int len = pos_dev ? min(max(__ldg(pos_dev + b), 0) + 1, max_len) : lens.len[b];
  const int64_t sb = int64_t(split) * chunk, se = std::min<int64_t>(sb + chunk, len);
  const int ntiles = se > sb ? int((se - sb + BK - 1) / BK) : 0;
  const uint16_t* cb = cache + int64_t(b) * cache_stride;

  // Warpgroup w (threads wt = 0 .. 127, warp ww of it) owns the value columns 256·w .. +255 of O
  // and the tiles j ≡ w (mod 2) (their S and softmax); its thread holds rows r_lo = 16·ww + g and
  // r_hi = r_lo + 8 of every accumulator.
  const int w = warp >> 2, wt = tid & 127, ww = wt >> 5;
  const int r_lo = ww * 16 + g, r_hi = r_lo + 8;
  const bool lo_ok = r_lo < hpb && hb + r_lo < H, hi_ok = r_hi < hpb && hb + r_hi < H;
  const int64_t row0 = (int64_t(b) * splits + split) * H + hb;

  if (ntiles == 0) {  // empty split: m = −inf, l = 0, ctx = 0
    for (int i = tid; i < WH * kLatent / 4; i += kWThreads) {
      const int r = i / (kLatent / 4), c4 = i % (kLatent / 4);
      if (r < hpb && hb + r < H)
        reinterpret_cast<float4*>(ws.part + (row0 + r) * kLatent)[c4] =
            make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (tid < hpb && hb + tid < H)
      *reinterpret_cast<float2*>(ws.ml + (row0 + tid) * 2) = make_float2(-INFINITY, 0.f);
    return;
  }
  if (tid == 0) {
    mbar_init(full0, kWThreads);
    mbar_init(full0 + 8, kWThreads);
    fence_mbar_init();
  }
  __syncthreads();

  // q_lat of the block's rows (rows past hpb or H zero) in the core-matrix layout. Lane
  // (lane % 8, lane / 8) copies chunk 4·cq + lane / 8 of row 8·rb + lane % 8: a quarter-warp writes
  // 128 contiguous bytes (conflict-free), a warp reads 64 contiguous bytes of each of 8 rows.
#pragma unroll 1
  for (int i = tid; i < WH / 8 * (kRowChunks / 4) * 32; i += kWThreads) {
    const int q = i >> 5, rb = q / (kRowChunks / 4), cq = q % (kRowChunks / 4);
    const int r = rb * 8 + (lane & 7), c8 = cq * 4 + (lane >> 3);
    const bool valid = r < hpb && hb + r < H;
    cp_async16_at(sbase + core_off(r, c8),
                  ws.qlat + (int64_t(b) * H + (valid ? hb + r : 0)) * kCacheDim + c8 * 8,
                  valid ? 16u : 0u);
  }
  // This warpgroup's share of tile tt (stage tt % 2), same lane map as above: the value chunks
  // 32·w .. +31 (only its own P·V reads them after the tile's S) and, with_rope, the k_pe chunks
  // 64 .. 71, which hold the tile's P once its S is done and are refilled by the warpgroup that
  // reads that P. Rows at or past the split's end are zero-filled (their scores are masked, and
  // 0·V keeps P·V finite).
  auto load_part = [&](int tt, bool with_rope) {
    const int64_t s0 = sb + int64_t(tt) * BK;
    const uint32_t st = sbase + kWOffStage + uint32_t(tt & 1) * kWTile;
#pragma unroll
    for (int i = 0; i < 16; i++) {  // 8 row blocks × 8 chunk quads over 4 warps
      const int item = i * 4 + ww, rb = item >> 3, cq = item & 7;
      const int j = rb * 8 + (lane & 7), c8 = 32 * w + 4 * cq + (lane >> 3);
      const bool valid = s0 + j < se;
      cp_async16_at(st + core_off(j, c8), cb + (valid ? s0 + j : sb) * kCacheDim + c8 * 8,
                    valid ? 16u : 0u);
    }
    if (with_rope) {
#pragma unroll
      for (int i = 0; i < 4; i++) {  // 8 row blocks × 2 chunk quads over 4 warps
        const int item = i * 4 + ww, rb = item >> 1, cq = item & 1;
        const int j = rb * 8 + (lane & 7), c8 = 64 + 4 * cq + (lane >> 3);
        const bool valid = s0 + j < se;
        cp_async16_at(st + core_off(j, c8), cb + (valid ? s0 + j : sb) * kCacheDim + c8 * 8,
                      valid ? 16u : 0u);
      }
    }
  };
  // Tiles 0 and 1; each thread's copies so far (q_lat included) arrive on the stage's barrier.
  load_part(0, w == 1);
  cp_async_arrive(full0);
  if (ntiles > 1) {
    load_part(1, w == 0);
    cp_async_arrive(full0 + 8);
  }

  float m_lo = -INFINITY, m_hi = -INFINITY;  // running maxima (scaled log2 domain), both WGs
  float l_lo = 0.f, l_hi = 0.f;  // this thread's share of the row sums over its own tiles
  float o[2][16][4];             // O[64 rows, 256·w + 128·h + 8·nt + 2t ..]
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int nt = 0; nt < 16; nt++) o[h][nt][0] = o[h][nt][1] = o[h][nt][2] = o[h][nt][3] = 0.f;
  float sc[8][4];  // S[64 rows, 64 keys] of an own tile

  auto fence_o = [&] {
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int nt = 0; nt < 16; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) reg_fence(o[h][nt][e]);
  };
  auto scale_o = [&](float a_lo, float a_hi) {
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
      for (int nt = 0; nt < 16; nt++) {
        o[h][nt][0] *= a_lo, o[h][nt][1] *= a_lo;
        o[h][nt][2] *= a_hi, o[h][nt][3] *= a_hi;
#pragma unroll
        for (int e = 0; e < 4; e++) reg_fence(o[h][nt][e]);
      }
  };

  // Tile j's stage, barrier parity, [m | α] entries, and whether tile j + 1 goes into the other
  // stage during step j (tiles 0 and 1 are loaded above).
  auto stage_of = [&](int j) { return sbase + kWOffStage + uint32_t(j & 1) * kWTile; };
  auto full_of = [&](int j) { return full0 + 8u * uint32_t(j & 1); };
  auto parity_of = [](int j) { return uint32_t(j >> 1) & 1u; };
  auto stat_of = [&](int j) { return stat + (j & 1) * 2 * WH; };

  auto own_step = [&](int j) {
    const int s = j & 1;
    const uint32_t st = stage_of(j);
    float* mst = stat_of(j);
    const bool refill = j >= 1 && j + 1 < ntiles;
    {
      // ---- own tile: S = Q·Kᵀ, softmax, publish P (and m, α), O += P·V from registers ----
      // This warpgroup's P·V of tile j − 1 (from shared memory) is done: refill its share of that
      // stage (the k_pe chunks too: it read tile j − 1's P from them) with tile j + 1. (Waiting
      // for it here rather than behind this tile's S: ptxas cannot tell that a wait_group 1 after
      // S retires it, and serialises every wgmma of the kernel.)
      wgmma_wait<0>();
      if (refill) {
        load_part(j + 1, true);
        cp_async_arrive(full0 + 8u * uint32_t(s ^ 1));
      }
      mbar_wait(full_of(j), parity_of(j));
      fence_proxy_async();
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
        for (int e = 0; e < 4; e++) reg_fence(sc[nt][e]);
      }
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kKSteps; k++) {
        const uint32_t off = uint32_t(k) * 2048u;  // 2 K-direction core matrices
        wgmma_m64n64k16_ss(sc, wgmma_desc(sbase + off, 1024, 128), wgmma_desc(st + off, 1024, 128));
      }
      wgmma_commit();
      wgmma_wait<0>();
#pragma unroll
      for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) reg_fence(sc[nt][e]);
      // Scores scaled and masked (keys 8nt + 2t + {0, 1}), row maxima over the quad.
      const int64_t s0 = sb + int64_t(j) * BK;
      float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const int64_t key = s0 + nt * 8 + 2 * t;
        const bool ok0 = key < se, ok1 = key + 1 < se;
        sc[nt][0] = ok0 ? sc[nt][0] * qscale : -INFINITY;
        sc[nt][1] = ok1 ? sc[nt][1] * qscale : -INFINITY;
        sc[nt][2] = ok0 ? sc[nt][2] * qscale : -INFINITY;
        sc[nt][3] = ok1 ? sc[nt][3] * qscale : -INFINITY;
        mx_lo = fmaxf(mx_lo, fmaxf(sc[nt][0], sc[nt][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(sc[nt][2], sc[nt][3]));
      }
#pragma unroll
      for (int o2 = 1; o2 < 4; o2 <<= 1) {
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o2));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o2));
      }
      // m_lo/m_hi hold tile j − 1's maxima (from either warpgroup); the tile's first key is
      // valid, so the new maxima are finite (α = 2^−inf = 0 on the first tile).
      const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
      const float a_lo = fast_exp2(m_lo - mn_lo), a_hi = fast_exp2(m_hi - mn_hi);
      m_lo = mn_lo, m_hi = mn_hi;
      uint32_t pa[4][4];  // P = bf16(2^(s − m)) as the A fragments of the 4 k-steps
      float ps_lo = 0.f, ps_hi = 0.f;
#pragma unroll
      for (int nt = 0; nt < 8; nt++) {
        const uint32_t p01 = pack_bf2(fast_exp2(sc[nt][0] - mn_lo), fast_exp2(sc[nt][1] - mn_lo));
        const uint32_t p23 = pack_bf2(fast_exp2(sc[nt][2] - mn_hi), fast_exp2(sc[nt][3] - mn_hi));
        // the row sums add the rounded P that the P·V product uses
        ps_lo += __uint_as_float(p01 << 16) + __uint_as_float(p01 & 0xffff0000u);
        ps_hi += __uint_as_float(p23 << 16) + __uint_as_float(p23 & 0xffff0000u);
        pa[nt / 2][(nt % 2) * 2 + 0] = p01;  // a0/a2: row g, keys 16kk + 2t (+8)
        pa[nt / 2][(nt % 2) * 2 + 1] = p23;  // a1/a3: row g + 8
      }
      l_lo = l_lo * a_lo + ps_lo;
      l_hi = l_hi * a_hi + ps_hi;
      // (the sums read the P registers: done here, not sunk between the wgmmas below, which
      // would make ptxas serialise them)
      reg_fence(l_lo);
      reg_fence(l_hi);
      // Publish P (into this tile's k_pe chunks, read by the S above: done), m and α for the
      // other warpgroup's P·V of the tile; the proxy fence makes the P stores visible to its
      // wgmmas.
      {
        uint8_t* pbase = wsmem + kWOffStage + uint32_t(s) * kWTile + kWRope;
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
          *reinterpret_cast<uint32_t*>(pbase + core_off(r_lo, nt) + 4 * t) =
              pa[nt / 2][(nt % 2) * 2 + 0];
          *reinterpret_cast<uint32_t*>(pbase + core_off(r_hi, nt) + 4 * t) =
              pa[nt / 2][(nt % 2) * 2 + 1];
        }
        if (t == 0) {
          mst[r_lo] = mn_lo, mst[r_hi] = mn_hi;
          mst[WH + r_lo] = a_lo, mst[WH + r_hi] = a_hi;
        }
      }
      fence_proxy_async();
      named_bar_arrive(1 + s, kWThreads);
      scale_o(a_lo, a_hi);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; kk++) {
#pragma unroll
        for (int h = 0; h < 2; h++)
          wgmma_m64n128k16_tb(
              o[h], pa[kk],
              wgmma_desc(st + uint32_t(32 * w + 16 * h) * 1024u + uint32_t(kk) * 256u, 128, 1024));
      }
      wgmma_commit();
    }
  };
  auto foreign_step = [&](int j) {
    const int s = j & 1;
    const uint32_t st = stage_of(j);
    const float* mst = stat_of(j);
    const bool refill = j >= 1 && j + 1 < ntiles;
    {
      // ---- the other warpgroup's tile: O = O·α + P·V with P from shared memory ----
      wgmma_wait<0>();  // P·V of tile j − 1 (this warpgroup's own) is done
      fence_o();
      if (refill) {  // its value chunks of that stage (the other warpgroup refills the k_pe ones)
        load_part(j + 1, false);
        cp_async_arrive(full0 + 8u * uint32_t(s ^ 1));
      }
      named_bar(1 + s, kWThreads);  // tile j's P, m and α are published
      const float mn_lo = mst[r_lo], mn_hi = mst[r_hi];
      const float a_lo = mst[WH + r_lo], a_hi = mst[WH + r_hi];
      m_lo = mn_lo, m_hi = mn_hi;
      l_lo *= a_lo, l_hi *= a_hi;
      mbar_wait(full_of(j),
                parity_of(j));  // this warpgroup's own copies of the tile's value chunks
      fence_proxy_async();
      scale_o(a_lo, a_hi);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; kk++) {
#pragma unroll
        for (int h = 0; h < 2; h++)
          wgmma_m64n128k16_ss_tb(
              o[h], wgmma_desc(st + kWRope + uint32_t(kk) * 2048u, 1024, 128),
              wgmma_desc(st + uint32_t(32 * w + 16 * h) * 1024u + uint32_t(kk) * 256u, 128, 1024));
      }
      wgmma_commit();
    }
  };
  // Warpgroup w runs tiles w, w + 2, .. as its own and the others as foreign, in tile order;
  // written as an explicit alternation so that ptxas sees every own step follow a foreign one
  // (which waits for all of this warpgroup's wgmmas) and does not serialise the wgmmas.
  int j0 = 0;
  if (w == 1) {
    foreign_step(0);
    j0 = 1;
  }
  for (int j = j0; j < ntiles; j += 2) {
    own_step(j);
    if (j + 1 >= ntiles) break;
    foreign_step(j + 1);
  }
  wgmma_wait<0>();
  fence_o();

  // Partial state of this split: l summed over the quad, then over the two warpgroups (both hold
  // the final maxima; after the barrier no stat entry is read any more).
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o2);
  }
  __syncthreads();
  if (t == 0) stat[w * WH + r_lo] = l_lo, stat[w * WH + r_hi] = l_hi;
  __syncthreads();
  if (w == 0 && t == 0) {
    if (lo_ok)
      *reinterpret_cast<float2*>(ws.ml + (row0 + r_lo) * 2) =
          make_float2(m_lo, stat[r_lo] + stat[WH + r_lo]);
    if (hi_ok)
      *reinterpret_cast<float2*>(ws.ml + (row0 + r_hi) * 2) =
          make_float2(m_hi, stat[r_hi] + stat[WH + r_hi]);
  }
#pragma unroll
  for (int h = 0; h < 2; h++)
#pragma unroll
    for (int nt = 0; nt < 16; nt++) {
      const int col = w * 256 + h * 128 + nt * 8 + 2 * t;
      if (lo_ok)
        *reinterpret_cast<float2*>(ws.part + (row0 + r_lo) * kLatent + col) =
            make_float2(o[h][nt][0], o[h][nt][1]);
      if (hi_ok)
        *reinterpret_cast<float2*>(ws.part + (row0 + r_hi) * kLatent + col) =
            make_float2(o[h][nt][2], o[h][nt][3]);
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

// Block (h, quarter), 256 threads: warp w owns rows quarter·32 + 4w .. +3 of W_UV_h; lane holds
// columns 8·lane .. +7 and 256 + 8·lane .. +7 of each (in registers, reused for every sequence).
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
  for (int b = 0; b < B; b++) {
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
    return e && std::strcmp(e, "wgmma") == 0 ? DecodeKernel::wgmma : DecodeKernel::mma;
  }();
  return k;
}

const char* decode_kernel_name(DecodeKernel k) {
  return k == DecodeKernel::mma ? "mma" : "wgmma";
}

size_t decode_workspace_bytes(int H, int B, int64_t max_len) {
  // Either kernel's plan fits (the two block widths can give different split counts).
  max_len = std::max<int64_t>(max_len, 1);
  const int splits = std::max(plan_splits(H, B, max_len, HC).splits,
                              plan_splits(H, B, max_len, wg_heads(H)).splits);
  return ws_bytes(H, B, splits);
}

namespace {

// The launches of decode() and decode_device(): lengths from `lens` (host) or pos_dev (device),
// the plan and grids for max_len positions.
Status launch_decode(int H, const uint16_t* q, const uint16_t* cache, int64_t cache_stride,
                     const Lens& lens, const int32_t* pos_dev, int B, int64_t max_len,
                     const uint16_t* kv_b, uint16_t* out, void* workspace, size_t workspace_bytes,
                     void* stream, DecodeKernel kernel) {
  const bool wg = kernel == DecodeKernel::wgmma;
  const int hpb = wg ? wg_heads(H) : HC;
  const Plan plan = plan_splits(H, B, max_len, hpb);
  if (plan.splits > kMaxSplits)
    return invalid("mla decode: more than 128 splits (internal plan error)");
  if (workspace_bytes < ws_bytes(H, B, plan.splits))
    return invalid("mla decode: workspace smaller than decode_workspace_bytes(H, B, max_len)");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Ws ws = carve(workspace, H, B, plan.splits);
  if (wg) {
    if (Status a = rt::allow_dynamic_smem(attn_wgmma, int(kWSmem)); !a.ok()) return a;
  } else {
    if (Status a = rt::allow_dynamic_smem(attn_split, int(kSplitSmem)); !a.ok()) return a;
  }
  absorb_q<<<dim3(H, kLatent / 128), 256, 0, s>>>(H, B, q, kv_b, ws.qlat);
  const float qscale = float(1.0 / std::sqrt(double(kQDim)) * 1.4426950408889634);
  if (wg) {
    // The head groups of a split innermost: they read the same cache rows close together in time,
    // so the second read mostly hits L2.
    attn_wgmma<<<dim3((H + hpb - 1) / hpb, plan.splits, B), kWThreads, kWSmem, s>>>(
        H, hpb, cache, cache_stride, lens, pos_dev, int(max_len), plan.chunk, plan.splits, qscale,
        ws);
  } else {
    attn_split<<<dim3(plan.splits, (H + HC - 1) / HC, B), kThreads, kSplitSmem, s>>>(
        H, cache, cache_stride, lens, pos_dev, int(max_len), plan.chunk, plan.splits, qscale, ws);
  }
  merge_ctx<<<dim3(H, B, kLatent / 128), 128, 0, s>>>(H, plan.splits, ws);
  out_uv<<<dim3(H, kV / 32), 256, 0, s>>>(H, B, kv_b, ws.ctx, out);
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
