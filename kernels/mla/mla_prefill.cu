// MLA latent-cache write and prefill attention (see mla.h). Prefill expands the latent cache to
// per-head [k_nope | v] with cuBLASLt, then a flash-style kernel walks the causal key tiles on
// tensor cores (bf16 wgmma / mma.sync, fp32 accumulate) with an fp32 online softmax (exp2 domain:
// scores are scaled by scale·log2 e); P is rounded to bf16 for the P·V product. Not here: the
// absorbed decode (mla_decode.cu).
//
// Long caches: the expansion runs tile by tile (prefill_tile_positions, 16K positions by default)
// into one bounded buffer, and the attention kernel runs over each tile in turn, carrying the fp32
// softmax state (row max, row sum, unnormalised O) across the launches in the workspace. Why the
// expanded form and not the absorbed one for the cached part — per chunk of T = 4096 queries
// against S = 1M positions at H = 96 (FLOPs = 2 per multiply-add):
//   expanded, tiled: expansion 2·S·512·H·256 = 2.6e13, attention 2·H·T·S·(192 + 128) = 2.6e14;
//     2.9e14 in all. Bytes: the latent cache once (1.2 GB), each expanded tile written once and
//     read by the T/128 query blocks of each head mostly from L2 (51 GB written + read), the state
//     read and written once per tile (0.4 GB per tile, 26 GB over 64 tiles): ≈ 30 ms at 4 TB/s.
//   absorbed: scores over the 576-wide rows and the context over 512 per (query, head, position):
//     2·H·T·S·(576 + 512) = 9.0e14, 3.1× the expanded form; its bytes are smaller (the 1.2 GB
//     latent, shared by the heads) but both forms are compute-bound by two orders of magnitude.
// On the H200's tensor cores (≈ 790 TFLOP/s bf16 measured) the expanded form's floor is 0.37 s
// per chunk against 1.1 s absorbed, and the absorbed kernel would be the harder one to run fast (a
// 512-wide fp32 accumulator per query row and head, and rounding q_lat to bf16 changes the
// numerics against HF's expanded order). So: expanded, tiled; the expansion adds 512·256 /
// (T·320) = 10% of the FLOPs at T = 4096 at twice the attention's rate (cuBLASLt), ~5% of time.
#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>

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

constexpr int kKv = kNope + kV;  // 256 expanded values per head and position
constexpr size_t kGemmScratch = size_t(32) << 20;

// Row t goes to position pos0 + t of one cache, or (pos_dev set: decode) to position pos_dev[t] of
// cache t, cache_stride elements after cache t − 1, when that position is below capacity.
__global__ void latent_rows(const uint16_t* ckv, const float* w, float eps, uint16_t* cache,
                            int64_t pos0, int64_t T, const int32_t* pos_dev, int64_t cache_stride,
                            int64_t capacity) {
  const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= T) return;
  if (pos_dev && (pos_dev[t] < 0 || pos_dev[t] >= capacity)) return;
  const int lane = threadIdx.x % 32;
  const uint16_t* x = ckv + t * kCacheDim;
  uint16_t* o = pos_dev ? cache + t * cache_stride + int64_t(pos_dev[t]) * kCacheDim
                        : cache + (pos0 + t) * kCacheDim;
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

// ---- attention: FA2 structure with a cp.async pipeline -------------------------------------
// Block = 128 queries of one head, 8 warps × 16 query rows (two warpgroups × 64), so every K/V
// tile in shared memory feeds twice as many queries as the first (64-query) kernel did. Tiles of 64
// keys stream through a 3-stage cp.async ring (tiles j+1 and j+2 in flight while tile j is
// computed; one barrier per tile). Q fragments stay in registers for the whole block. S = QKᵀ by
// wgmma (v3, v4: K read by the tensor cores straight from shared memory) or by mma.sync with
// ldmatrix fragments (v2); O += P·V by mma.sync with ldmatrix.trans V fragments (v2, v3) or by
// wgmma (v4). The causal mask is applied only on the tiles that cross a warp's diagonal, and a warp
// (wgmma: a warpgroup) skips the tiles that lie wholly above its rows.
constexpr int kBQ2 = 128, kBK2 = kKeyTile, kWarps2 = 8, kThreads2 = 32 * kWarps2, kStages2 = 3;
constexpr int kKst = kQDim + 8;  // bf16 row stride of Q and K tiles: rows 400 B apart, so the 8
                                 // row addresses of an ldmatrix hit distinct bank groups
constexpr int kVst = kV + 8;     // bf16 row stride of V tiles (272 B)
constexpr int kQElems2 = kBQ2 * kKst;
constexpr int kStageElems2 = kBK2 * kKst + kBK2 * kVst;
constexpr size_t kAttnSmem2 =
    sizeof(uint16_t) * (size_t(kQElems2) + size_t(kStages2) * kStageElems2);
static_assert(kAttnSmem2 <= 227 * 1024, "attn_prefill tiles exceed sm_90 shared memory");
static_assert(kBQ2 == 16 * kWarps2, "one warp per 16 query rows");

// 16-byte global → shared copy that bypasses L1; a false `valid` writes 16 zero bytes instead.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// cp_async_commit() / cp_async_wait<N>(): kernels/mla/mma.cuh.

// Four 8×8 bf16 matrices; lane l supplies the row address of matrix l/8, row l%8.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                        uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                              uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// Prefill attention variants, a compile-time choice. Measured on the H200 (strata bench kernels,
// T = 16K, 2026-11-29): kMma 291 TFLOP/s, kWgmmaS 311, kWgmmaSPV 280 — prefill() launches
// kWgmmaS; the other two stay as the measured alternatives (both passed the op-checks). A v5 with
// Q read by wgmma from shared memory and the next tile's S overlapped with this tile's softmax
// measured 305 TFLOP/s and was dropped; so was the first 64-query kernel (36 TFLOP/s).
enum PrefillMode : int {
  kMma = 0,       // S = QKᵀ and O += P·V by mma.sync, fragments from ldmatrix (v2)
  kWgmmaS = 1,    // S = QKᵀ by wgmma (one warpgroup per 64 query rows, K read from shared
                  // memory once per warpgroup instead of once per warp), P·V by mma.sync (v3)
  kWgmmaSPV = 2,  // S = QKᵀ and O += P·V by wgmma (P from registers, V as an MN-major operand
                  // in core-matrix layout: leading byte offset along the keys) (v4)
};
constexpr bool wgmma_s(int mode) {
  return mode >= kWgmmaS;
}
constexpr bool wgmma_pv(int mode) {
  return mode >= kWgmmaSPV;
}

// Byte offset of the 16-byte chunk c8 (dims 8·c8 ..) of key j in a K tile. mma.sync modes: padded
// rows (ldmatrix). kWgmmaS: the canonical no-swizzle K-major wgmma layout of 8×8 core matrices
// (8 keys × 16 bytes, 128 contiguous bytes): core (dim block c8, key block j/8) at
// c8·1024 + (j/8)·128, so the descriptor's leading (K-direction) byte offset is 1024 and its
// stride (N-direction) byte offset 128.
template <int kMode>
__device__ __forceinline__ int k_chunk_offset(int j, int c8) {
  if constexpr (wgmma_s(kMode)) return c8 * 1024 + (j / 8) * 128 + (j % 8) * 16;
  return 2 * (j * kKst + c8 * 8);
}
// Byte offset of the chunk c8 (values 8·c8 ..) of key j in a V tile. mma.sync P·V: padded rows
// (ldmatrix.trans). wgmma P·V: V is B = [keys × values] with the values contiguous (MN-major);
// the 8×8 core matrices (8 keys × 8 values, one 16-byte row per key) lie at c8·1024 + (j/8)·128:
// 128 bytes between key blocks (K direction), 1024 between value blocks (N direction).
template <int kMode>
__device__ __forceinline__ int v_chunk_offset(int j, int c8) {
  if constexpr (wgmma_pv(kMode)) return c8 * 1024 + (j / 8) * 128 + (j % 8) * 16;
  return 2 * (j * kVst + c8 * 8);
}

// Issue the copies of key tile s0 (64 rows: K = [k_nope | k_pe], V) into one ring stage. Rows at
// or past S are zero-filled: their scores are masked, and zero V keeps 0·V finite. Each warp
// instruction copies 4 chunks (64 contiguous bytes) of 8 consecutive keys: in every layout above
// the 8 keys' chunks land in distinct 16-byte bank groups, so the shared-memory writes are
// conflict-free (one chunk column of the core-matrix layouts is 128 contiguous bytes).
// kv_row / pe_row: this thread's row of tile 0 in the expanded kv buffer / the latent cache, at
// its first chunk, both counted from the first position of the cache tile (n rows; s0 is the key
// tile's first row in it).
template <int kMode>
__device__ __forceinline__ void load_kv_tile(uint32_t stage, const uint16_t* kv_row,
                                             const uint16_t* pe_row, int64_t H, int64_t n,
                                             int64_t s0, int lj, int lc) {
  // This thread's key is lj of the tile (warp·8 + lane%8), its chunks lc, lc+4, lc+8, ...
  const bool ok = s0 + lj < n;
  const int64_t t = ok ? s0 : -int64_t(lj);  // zero-filled: reads nothing; point at row 0
  const uint16_t* src = kv_row + t * H * kKv;
  const uint32_t vs = stage + uint32_t(2 * kBK2 * kKst);
  // [k_nope | v] of one position and head: 512 contiguous bytes = 32 chunks (16 K, 16 V).
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int c = i * 4 + lc;
    const uint32_t dst = c < 16 ? stage + uint32_t(k_chunk_offset<kMode>(lj, c))
                                : vs + uint32_t(v_chunk_offset<kMode>(lj, c - 16));
    cp_async16(dst, src + i * 32, ok);
  }
  // k_pe (64 values = 8 chunks) from the latent cache row, shared by all heads.
  const uint16_t* pe = pe_row + t * kCacheDim;
#pragma unroll
  for (int i = 0; i < 2; i++)
    cp_async16(stage + uint32_t(k_chunk_offset<kMode>(lj, kNope / 8 + i * 4 + lc)), pe + i * 32,
               ok);
}

__device__ __forceinline__ void online_softmax(float (&sc)[kBK2 / 8][4],
                                               uint32_t (&pa)[kBK2 / 16][4], float (&o)[kV / 8][4],
                                               float& m_lo, float& m_hi, float& l_lo, float& l_hi,
                                               int64_t s0, int64_t wpos0, int64_t pos_lo,
                                               int64_t pos_hi, int64_t end, int t, float qscale) {
  float a_lo, a_hi;
  softmax_tile(sc, pa, m_lo, m_hi, l_lo, l_hi, a_lo, a_hi, s0, wpos0, pos_lo, pos_hi, end, t,
               qscale);
  scale_o(o, a_lo, a_hi);
}

// O += P·V for one 64-key tile by mma.sync; v_addr: this lane's ldmatrix.trans address of the
// tile's V (stage + v_off).
__device__ __forceinline__ void pv_mma(float (&o)[kV / 8][4], const uint32_t (&pa)[kBK2 / 16][4],
                                       uint32_t v_addr) {
#pragma unroll
  for (int kk = 0; kk < kBK2 / 16; kk++) {
#pragma unroll
    for (int np = 0; np < kV / 16; np++) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_trans(v_addr + 2u * uint32_t(kk * 16 * kVst + np * 16), b0, b1, b2, b3);
      mma16816(o[2 * np], pa[kk], b0, b1);
      mma16816(o[2 * np + 1], pa[kk], b2, b3);
    }
  }
}

// S = Q·Kᵀ of one 64-key tile by wgmma for the warpgroup's 64 query rows (Q from registers as A);
// desc(ks) is the K operand's descriptor for the k-step of dims 16·ks ...
template <class Desc>
__device__ __forceinline__ void s_wgmma(float (&sc)[kBK2 / 8][4],
                                        const uint32_t (&qa)[kQDim / 16][4], Desc desc) {
  zero_for_wgmma(sc);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kQDim / 16; ks++) wgmma_m64n64k16(sc, qa[ks], desc(ks));
  wgmma_commit();
  wgmma_wait_all();
  reg_fence(sc);
}

// One cache tile of a prefill call: positions [c0, end) of the cache, whose expanded [k_nope | v]
// rows sit in `kv` from row 0. A call in one tile (first and last) keeps the softmax state in
// registers only; otherwise the state of every query row and head crosses the launches in fp32:
// O unnormalised [T, H, 128] and (m, l) [T, H, 2] (m in the scaled log2 domain, l the full row
// sum), read at the start unless first, written at the end unless last (then out is written).
struct CacheTile {
  int64_t c0 = 0, end = 0;
  float* st_o = nullptr;
  float* st_ml = nullptr;
  bool first = true, last = true;
};

// The fp32 softmax state of one query row and head (row = t·H + h) across cache tiles: this
// thread's columns nt·8 + 2t, +1 of O (o[nt][e0], o[nt][e0 + 1]), the row max m and, in the quad's
// lane 0, the row sum l.
__device__ __forceinline__ void load_state(const CacheTile& ct, int64_t row, int t,
                                           float (&o)[kV / 8][4], int e0, float& m, float& l) {
  const float* so = ct.st_o + row * kV + 2 * t;
#pragma unroll
  for (int nt = 0; nt < kV / 8; nt++) {
    const float2 v = *reinterpret_cast<const float2*>(so + nt * 8);
    o[nt][e0] = v.x;
    o[nt][e0 + 1] = v.y;
  }
  const float2 ml = *reinterpret_cast<const float2*>(ct.st_ml + row * 2);
  m = ml.x;
  l = t == 0 ? ml.y : 0.f;
}
__device__ __forceinline__ void store_state(const CacheTile& ct, int64_t row, int t,
                                            const float (&o)[kV / 8][4], int e0, float m, float l) {
  float* so = ct.st_o + row * kV + 2 * t;
#pragma unroll
  for (int nt = 0; nt < kV / 8; nt++)
    *reinterpret_cast<float2*>(so + nt * 8) = make_float2(o[nt][e0], o[nt][e0 + 1]);
  if (t == 0) *reinterpret_cast<float2*>(ct.st_ml + row * 2) = make_float2(m, l);
}

// The end of a block's two rows per thread: the row sums over the quad, then the fp32 state for
// the next cache tile (not the last tile; a warp that ran no key tile leaves its rows' state as it
// found it — the first tile always runs key tile 0, so the state is written before it is read) or
// the normalised bf16 output.
__device__ __forceinline__ void finish_rows(const CacheTile& ct, int H, int h, int64_t T, int t,
                                            int64_t t_lo, int64_t t_hi, const float (&o)[kV / 8][4],
                                            float m_lo, float m_hi, float l_lo, float l_hi,
                                            bool touched, uint16_t* out) {
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o2);
  }
  if (!ct.last) {
    if (touched || ct.first) {
      if (t_lo < T) store_state(ct, (t_lo * H + h), t, o, 0, m_lo, l_lo);
      if (t_hi < T) store_state(ct, (t_hi * H + h), t, o, 2, m_hi, l_hi);
    }
    return;
  }
  const float i_lo = 1.0f / l_lo, i_hi = 1.0f / l_hi;
#pragma unroll
  for (int nt = 0; nt < kV / 8; nt++) {
    const int col = nt * 8 + 2 * t;
    if (t_lo < T)
      *reinterpret_cast<uint32_t*>(out + (t_lo * H + h) * kV + col) =
          pack_bf2(o[nt][0] * i_lo, o[nt][1] * i_lo);
    if (t_hi < T)
      *reinterpret_cast<uint32_t*>(out + (t_hi * H + h) * kV + col) =
          pack_bf2(o[nt][2] * i_hi, o[nt][3] * i_hi);
  }
}

template <int kMode>
__global__ void __launch_bounds__(kThreads2, 1)
    attn_prefill(int H, const uint16_t* q, const uint16_t* kv, const uint16_t* cache, int64_t S,
                 int64_t T, uint16_t* out, float qscale, int head_group, CacheTile ct) {
  // 1-D grid of n_q·H blocks in this order: groups of head_group heads; within a group the longest
  // (latest) query tiles first, the group's heads innermost. The ~132 resident blocks then stream
  // the keys of a few heads that fit in L2 together, and the short tiles fill the tail.
  const int n_q = int((T + kBQ2 - 1) / kBQ2);
  const int b = blockIdx.x, grp = b / (n_q * head_group);
  const int g_heads = std::min(head_group, H - grp * head_group), r = b - grp * n_q * head_group;
  const int qt = n_q - 1 - r / g_heads, h = grp * head_group + r % g_heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int t = lane % 4;
  extern __shared__ __align__(128) uint16_t smem2[];
  uint16_t* Qs = smem2;  // [kBQ2][kKst], then kStages2 × {K [kBK2][kKst], V [kBK2][kVst]}
  const int64_t t0 = int64_t(qt) * kBQ2, base = S - T;
  const int64_t last_pos = std::min<int64_t>(base + t0 + kBQ2 - 1, S - 1);
  // Key tiles of 64 this block needs from the cache tile: positions c0 .. min(end, last_pos + 1).
  const int64_t c0 = ct.c0, n_ct = ct.end - c0, lim = std::min<int64_t>(ct.end, last_pos + 1);
  const int n_tiles = lim > c0 ? int((lim - c0 + kBK2 - 1) / kBK2) : 0;
  // A block whose queries all precede the tile has nothing to add (but writes out on the last).
  if (n_tiles == 0 && !ct.last) {
    return;
  }

  // Q tile (rows past T zero-filled) and the first two key tiles.
#pragma unroll
  for (int i = 0; i < kBQ2 * (kQDim / 8) / kThreads2; i++) {
    const int idx = tid + i * kThreads2, r = idx / (kQDim / 8), c = idx % (kQDim / 8);
    const int64_t tt = t0 + r;
    const bool ok = tt < T;
    cp_async16(smem_addr(Qs + r * kKst + c * 8), q + ((ok ? tt : 0) * H + h) * kQDim + c * 8, ok);
  }
  const int lj = warp * 8 + lane % 8, lc = lane / 8;
  const uint16_t* kv_row = kv + (int64_t(lj) * H + h) * kKv + lc * 8;
  const uint16_t* pe_row = cache + (c0 + lj) * kCacheDim + kLatent + lc * 8;
  const uint32_t ring = smem_addr(Qs + kQElems2);
  if (n_tiles > 0) load_kv_tile<kMode>(ring, kv_row, pe_row, H, n_ct, 0, lj, lc);
  cp_async_commit();
  if (n_tiles > 1)
    load_kv_tile<kMode>(ring + 2u * kStageElems2, kv_row, pe_row, H, n_ct, kBK2, lj, lc);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  // Q fragments (A operand, 12 k-steps of 16): matrices (rows 0-7 | 8-15) × (cols 0-7 | 8-15).
  const uint32_t q_addr = smem_addr(Qs + (warp * 16 + lane % 16) * kKst + (lane / 16) * 8);
  uint32_t qa[kQDim / 16][4];
  {
#pragma unroll
    for (int ks = 0; ks < kQDim / 16; ks++)
      ldsm_x4(q_addr + ks * 32, qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3]);
  }
  // Positions of this thread's two rows (g and g + 8 of the warp's 16) and of the warp's rows.
  const int64_t wpos0 = base + t0 + warp * 16, wpos1 = wpos0 + 15;
  const int64_t pos_lo = wpos0 + lane / 4, pos_hi = pos_lo + 8;
  // Per-lane ldmatrix offsets (bytes) inside a stage: K as B of S = QKᵀ (matrices: keys 0-7 dims
  // 0-7 | keys 0-7 dims 8-15 | keys 8-15 dims 0-7 | keys 8-15 dims 8-15) and V as B of O = PV via
  // .trans (keys 0-7 | keys 8-15) × (values 0-7 | 8-15).
  const uint32_t k_off = 2u * uint32_t((lane % 8 + (lane / 16) * 8) * kKst + ((lane / 8) % 2) * 8);
  const uint32_t v_off = 2u * uint32_t(kBK2 * kKst + (lane % 16) * kVst + (lane / 16) * 8);

  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;  // m: scaled (log2) domain
  float o[kV / 8][4];
#pragma unroll
  for (int nt = 0; nt < kV / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
  // This thread's two query rows; the state of earlier cache tiles (l whole in the quad's lane 0,
  // as the per-thread partial sums are added over the quad at the end).
  const int64_t t_lo = t0 + warp * 16 + lane / 4, t_hi = t_lo + 8;
  if (!ct.first) {
    if (t_lo < T) load_state(ct, (t_lo * H + h), t, o, 0, m_lo, l_lo);
    if (t_hi < T) load_state(ct, (t_hi * H + h), t, o, 2, m_hi, l_hi);
  }
  bool touched = false;  // this warp ran at least one key tile (warp-uniform)

  for (int j = 0; j < n_tiles; j++) {
    cp_async_wait<1>();  // tile j has landed (this thread's copies) ...
    if constexpr (wgmma_s(kMode)) fence_proxy_async();  // ... visible to wgmma ...
    __syncthreads();  // ... everyone's, and every warp is done with tile j - 1's stage
    if (j + 2 < n_tiles) {
      load_kv_tile<kMode>(ring + 2u * uint32_t(((j + 2) % kStages2) * kStageElems2), kv_row, pe_row,
                          H, n_ct, int64_t(j + 2) * kBK2, lj, lc);
    }
    cp_async_commit();  // (empty near the end: keeps the group count uniform)
    const int64_t s0 = c0 + int64_t(j) * kBK2;  // the key tile's first position
    // Skip the tile when it lies wholly above the diagonal of this warp's rows (kWgmmaS: of the
    // warpgroup's 64 rows, as the four warps issue each wgmma together).
    if (s0 > (wgmma_s(kMode) ? wpos0 - (warp % 4) * 16 + 63 : wpos1)) continue;
    touched = true;
    const uint32_t stage = smem_addr(Qs + kQElems2 + (j % kStages2) * kStageElems2);

    float sc[kBK2 / 8][4];
    if constexpr (wgmma_s(kMode)) {
      // 16 dims = 2 K-direction core matrices per k-step
      s_wgmma(sc, qa,
              [&](int ks) { return wgmma_desc(stage + uint32_t(ks * 2 * 1024), 1024, 128); });
    } else {
#pragma unroll
      for (int nt = 0; nt < kBK2 / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kQDim / 16; ks++) {
#pragma unroll
        for (int np = 0; np < kBK2 / 16; np++) {
          uint32_t b0, b1, b2, b3;
          ldsm_x4(stage + k_off + 2u * uint32_t(np * 16 * kKst + ks * 16), b0, b1, b2, b3);
          mma16816(sc[2 * np], qa[ks], b0, b1);
          mma16816(sc[2 * np + 1], qa[ks], b2, b3);
        }
      }
    }
    uint32_t pa[kBK2 / 16][4];
    online_softmax(sc, pa, o, m_lo, m_hi, l_lo, l_hi, s0, wpos0, pos_lo, pos_hi, ct.end, t, qscale);
    if constexpr (wgmma_pv(kMode)) {
      // 16 keys = 2 key blocks of V per k-step; descriptor offsets (leading, stride) in bytes.
      constexpr uint32_t kLead = 128, kStride = 1024;
      const uint32_t v_base = stage + uint32_t(2 * kBK2 * kKst);
      reg_fence(o);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK2 / 16; kk++)
        wgmma_m64n128k16_tb(o, pa[kk], wgmma_desc(v_base + uint32_t(kk * 2 * 128), kLead, kStride));
      wgmma_commit();
      wgmma_wait_all();
      reg_fence(o);
    } else {
      pv_mma(o, pa, stage + v_off);
    }
  }
  finish_rows(ct, H, h, T, t, t_lo, t_hi, o, m_lo, m_hi, l_lo, l_hi, touched, out);
}

// ---- attention, TMA form: a cluster of query blocks shares each key tile ----------------------
// The same block as attn_prefill<kWgmmaS> (128 queries of one head, 8 warps, S = QKᵀ by wgmma,
// P·V by mma.sync, 64-key tiles) and the same arithmetic in the same order, so the same bits.
// What changes is how the tiles arrive: the cl CTAs of a cluster (cl = 2) hold consecutive query
// tiles of one head (rank 0 the latest) and walk the same key tiles; each issues its 64/cl rows of
// every tile as TMA boxes multicast into all of them, so a tile crosses L2 → SM once per cluster
// instead of once per block (ncu, H100, T = 2048: L2 50 % busy against 74 % for the cp.async
// kernel). Stage layout (40 KB, 1024-aligned, four stages): five boxes of 64 keys × 64 bf16 in
// the 128-byte swizzle — k_nope 0-63, k_nope 64-127, k_pe (from the latent cache), v 0-63,
// v 64-127. Hand-over: `full[s]` (one local arrival with the tile's 40960 bytes expected,
// completed by the cluster's copies) and `empty[s]` (one arrival per warp of every CTA once it is
// done with the stage); thread 0 of each CTA issues tile j + 2 after its softmax of tile j, once
// `empty` says the cluster is done with tile j − 2. A later rank's tiles past its own diagonal
// (and every tile of a padding CTA when the query tiles are not a multiple of cl) are received
// and released without compute (kPipe: computed, and masked whole). Rows past the cache tile (kv)
// or the cache (k_pe) are zero-filled by the TMA; rows in [end, S) of k_pe are real keys whose
// scores are masked, as in attn_prefill.
// kPipe (tma_pipe and the tma_fa3 kernels): the S of tile j + 1 is issued before tile j's softmax,
// so the tensor cores work on it during the softmax and P·V; tma_pipe reads Q by wgmma from
// shared memory (48 registers freed for its mma.sync P·V). Nothing is in flight at a loop edge or
// inside a branch that skips a tile: otherwise ptxas serialises every wgmma of the kernel (C7514,
// C7518).
constexpr int kStages3 = 4, kBox = kBK2 * 128, kStage3 = 5 * kBox;
constexpr int kBoxKpe = 2, kBoxV = 3;  // box index of k_pe and of the first v box in a stage
constexpr int kQWg = 64 * kQDim * 2;   // bytes of one warpgroup's Q (kPipe layout)
static_assert(2 * kQWg <= 2 * kQElems2, "kPipe's Q fits the Q region");
constexpr size_t kAttnSmem3 = 1024 + 1024 + sizeof(uint16_t) * size_t(kQElems2) +
                              size_t(kStages3) * kStage3;  // alignment slack, barriers, Q, ring
static_assert((1024 + 2 * kQElems2) % 1024 == 0, "the ring must start 1024-aligned");
static_assert(kAttnSmem3 <= 227 * 1024, "attn_prefill_tma exceeds sm_90 shared memory");

// O += P·V for one 64-key tile by mma.sync, V from the two swizzled boxes at v_base: lane l reads
// key (l % 16) of each 16-key step and value chunk 2·np + l / 16 (box np / 4).
__device__ __forceinline__ void pv_mma_sw128(float (&o)[kV / 8][4],
                                             const uint32_t (&pa)[kBK2 / 16][4], uint32_t v_base,
                                             int lane) {
  const uint32_t row = v_base + uint32_t(lane % 16) * 128;
  const uint32_t x = lane % 8, hi = lane / 16;
#pragma unroll
  for (int kk = 0; kk < kBK2 / 16; kk++) {
#pragma unroll
    for (int np = 0; np < kV / 16; np++) {
      const uint32_t chunk = (uint32_t((np % 4) * 2) + hi) ^ x;
      uint32_t b0, b1, b2, b3;
      ldsm_x4_trans(row + uint32_t((np / 4) * kBox + kk * 16 * 128) + chunk * 16, b0, b1, b2, b3);
      mma16816(o[2 * np], pa[kk], b0, b1);
      mma16816(o[2 * np + 1], pa[kk], b2, b3);
    }
  }
}

// O += P·V of one 64-key tile by wgmma (the tma_fa3 kernels), issued and committed, not waited
// for: P from registers, V read by the tensor cores from its two swizzled boxes as an MN-major
// operand, one m64n128 per 16 keys (the boxes, 8192 bytes apart, are its two 64-wide N blocks;
// the 16-key steps are 2048 bytes apart: two 1024-byte atoms of 8 keys).
__device__ __forceinline__ void pv_wgmma(float (&o)[kV / 8][4], const uint32_t (&pa)[kBK2 / 16][4],
                                         uint32_t v_base) {
#pragma unroll
  for (int kk = 0; kk < kBK2 / 16; kk++)
    wgmma_m64n128k16_tb(o, pa[kk], wgmma_desc_sw128_mn(v_base + uint32_t(kk * 2048), kBox, 1024));
  wgmma_commit();
}

// Tiles 0 .. n − 1 with two register sets that swap roles from tile to tile (the loop unrolled by
// two, so each set keeps its registers): step(j, cur, nxt) for every tile but the last, then
// last(j, cur) for the last one.
template <class Set, class Step, class Last>
__device__ __forceinline__ void alternate_tiles(int n, Set& a, Set& b, const Step& step,
                                                const Last& last) {
  int j = 0;
  for (; j + 2 < n; j += 2) {
    step(j, a, b);
    step(j + 1, b, a);
  }
  if (j + 1 < n) {
    step(j, a, b);
    last(j + 1, b);
  } else if (j < n) {
    last(j, a);
  }
}

// Named barriers of the ping-pong schedule (kPingPong): warpgroup w waits on barrier 1 + w for its
// turn to issue, and arrives on the other's once it has issued (256 = the two warpgroups).
__device__ __forceinline__ void named_sync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void named_arrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

// kPvWgmma (with kPipe: the tma_fa3 kernels): P·V on wgmma too, and Q stays wgmma's A operand
// from registers as in tma (S's products then read only K from shared memory); kPingPong (with
// kPvWgmma): the two warpgroups issue their products in turns.
template <bool kPipe, bool kPvWgmma = false, bool kPingPong = false>
__global__ void __launch_bounds__(kThreads2, 1)
    attn_prefill_tma(const __grid_constant__ CUtensorMap tm_kv,
                     const __grid_constant__ CUtensorMap tm_pe, int H, const uint16_t* q, int64_t S,
                     int64_t T, uint16_t* out, float qscale, int head_group, CacheTile ct,
                     bool share) {
  constexpr bool kQSmem = kPipe && !kPvWgmma;  // Q read by wgmma from shared memory
  // Grid: clusters of cl CTAs ordered as attn_prefill's blocks, by groups of cl query tiles.
  const unsigned rank = detail::cluster_ctarank(), cl = detail::cluster_nctarank();
  const int n_q = int((T + kBQ2 - 1) / kBQ2), n_p = (n_q + int(cl) - 1) / int(cl);
  const int c = blockIdx.x / int(cl), grp = c / (n_p * head_group);
  const int g_heads = std::min(head_group, H - grp * head_group), r = c - grp * n_p * head_group;
  const int qt0 = n_q - 1 - int(cl) * (r / g_heads), h = grp * head_group + r % g_heads;
  const int qt = qt0 - int(rank);
  const bool pad = qt < 0;  // no query tile (n_q not a multiple of cl): copies only
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int t = lane % 4;
  extern __shared__ uint8_t smem3[];
  const uint32_t raw = smem_addr(smem3), base = (raw + 1023u) & ~1023u;
  const uint32_t full = base, empty = base + 8 * kStages3;  // mbarriers, 8 bytes each
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem3 + (base - raw) + 1024);
  const uint32_t ring = base + 1024 + uint32_t(2 * kQElems2);
  const int64_t t0 = int64_t(qt) * kBQ2, first_pos = S - T;
  // The pair's key tiles: those rank 0 (the later queries) needs from the cache tile.
  const int64_t last0 = std::min<int64_t>(first_pos + int64_t(qt0) * kBQ2 + kBQ2 - 1, S - 1);
  const int64_t c0 = ct.c0, lim = std::min<int64_t>(ct.end, last0 + 1);
  const int n_tiles = lim > c0 ? int((lim - c0 + kBK2 - 1) / kBK2) : 0;
  if (n_tiles == 0 && !ct.last) return;  // both CTAs, before any cluster operation

  if (tid == 0) {
    for (int i = 0; i < kStages3; i++) {
      mbar_init(full + 8 * i, 1);
      mbar_init(empty + 8 * i, cl * kWarps2);
    }
    fence_mbarrier_init();
  }
  if (!pad) {
#pragma unroll
    for (int i = 0; i < kBQ2 * (kQDim / 8) / kThreads2; i++) {
      const int idx = tid + i * kThreads2, rr = idx / (kQDim / 8), cc = idx % (kQDim / 8);
      const int64_t tt = t0 + rr;
      const bool ok = tt < T;
      // kQSmem (tma_pipe): Q is wgmma's A operand from shared memory, each warpgroup's 64 rows in
      // the no-swizzle core-matrix layout (chunk cc of row r at cc·1024 + (r/8)·128 + (r%8)·16);
      // otherwise padded rows for the ldmatrix into registers.
      const uint32_t dst = kQSmem ? smem_addr(Qs) + uint32_t((rr / 64) * kQWg + cc * 1024 +
                                                             (rr % 64 / 8) * 128 + (rr % 8) * 16)
                                  : smem_addr(Qs + rr * kKst + cc * 8);
      cp_async16(dst, q + ((ok ? tt : 0) * H + h) * kQDim + cc * 8, ok);
    }
  }
  cp_async_commit();
  // Both CTAs' barriers initialised (published by the fence above) before any copy or remote
  // arrival; relaxed, so the arrival does not wait for the Q copies just issued.
  detail::cluster_arrive_relaxed();
  detail::cluster_wait();
  // Tile jj into its stage: this CTA's part (64/cl rows) of each box, multicast to the cluster
  // (share), or every part into this CTA only (the tma_solo measurement form).
  const CUtensorMap *map_kv = &tm_kv, *map_pe = &tm_pe;
  const int part_rows = kBK2 / int(cl);
  auto issue = [&](int jj) {
    const uint32_t bar = full + 8 * (jj % kStages3);
    mbar_arrive_expect_tx(bar, kStage3);
    for (unsigned part = share ? rank : 0; part < (share ? rank + 1 : cl); part++) {
      const uint16_t mask = share ? uint16_t((1u << cl) - 1) : uint16_t(1u << rank);
      const uint32_t st =
          ring + uint32_t((jj % kStages3) * kStage3) + part * uint32_t(part_rows * 128);
      const int row = jj * kBK2 + int(part) * part_rows;  // in the cache tile
      tma_load_mc(st, map_kv, 0, h, row, bar, mask);
      tma_load_mc(st + kBox, map_kv, 64, h, row, bar, mask);
      tma_load_mc(st + kBoxKpe * kBox, map_pe, kLatent, int(c0) + row, bar, mask);
      tma_load_mc(st + kBoxV * kBox, map_kv, kNope, h, row, bar, mask);
      tma_load_mc(st + (kBoxV + 1) * kBox, map_kv, kNope + 64, h, row, bar, mask);
    }
  };
  if (tid == 0) {
    if (n_tiles > 0) issue(0);
    if (n_tiles > 1) issue(1);
  }
  cp_async_wait<0>();
  __syncthreads();

  const uint32_t q_addr = smem_addr(Qs + (warp * 16 + lane % 16) * kKst + (lane / 16) * 8);
  uint32_t qa[kQSmem ? 1 : kQDim / 16][4];
  if constexpr (!kQSmem) {
#pragma unroll
    for (int ks = 0; ks < kQDim / 16; ks++)
      ldsm_x4(q_addr + ks * 32, qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3]);
  }
  const uint32_t q_wg = smem_addr(Qs) + uint32_t((warp / 4) * kQWg);  // kPipe: this warpgroup's Q
  const int64_t wpos0 = first_pos + t0 + warp * 16;
  const int64_t pos_lo = wpos0 + lane / 4, pos_hi = pos_lo + 8;
  const int64_t wg_last = wpos0 - (warp % 4) * 16 + 63;  // the warpgroup's last row

  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  float o[kV / 8][4];
#pragma unroll
  for (int nt = 0; nt < kV / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
  const int64_t t_lo = t0 + warp * 16 + lane / 4, t_hi = t_lo + 8;
  if (!ct.first && !pad) {
    if (t_lo < T) load_state(ct, (t_lo * H + h), t, o, 0, m_lo, l_lo);
    if (t_hi < T) load_state(ct, (t_hi * H + h), t, o, 2, m_hi, l_hi);
  }
  bool touched = false;

  // Thread 0 issues tile j + 2 once every warp of the cluster is done with tile j − 2 (its stage).
  auto produce = [&](int j) {
    if (tid == 0 && j + 2 < n_tiles) {
      const int jn = j + 2;
      if (jn >= kStages3)
        mbar_wait<true>(empty + 8 * (jn % kStages3), unsigned(jn / kStages3 - 1) & 1u);
      issue(jn);
    }
  };
  // This warp is done with tile j's stage: one arrival on its `empty` in every CTA of the cluster
  // (a plain local arrival for this CTA's own: the cluster form to itself costs ≈ 15 %).
  auto release = [&](int j) {
    release_slot_in_cluster(empty + 8 * (j % kStages3), rank, cl, lane);
  };
  auto wait_full = [&](int j) {  // every warp, every tile, in order
    mbar_wait<false>(full + 8 * (j % kStages3), unsigned(j / kStages3) & 1u);
  };
  // Whether this warpgroup has keys to add from tile j (false from some tile on).
  auto runs = [&](int j) { return !pad && c0 + int64_t(j) * kBK2 <= wg_last; };
  auto k_desc = [&](int j) {
    const uint32_t stage = ring + uint32_t((j % kStages3) * kStage3);
    return [stage](int ks) {
      return wgmma_desc_sw128(stage + uint32_t((ks / 4) * kBox + (ks % 4) * 32));
    };
  };
  // The rest of tile j once its scores are in sc: softmax, the issue of tile j + 2 (after the
  // softmax: by then the cluster is most likely done with tile j − 2), P·V, the release.
  auto finish_tile = [&](int j, float(&sc)[kBK2 / 8][4]) {
    uint32_t pa[kBK2 / 16][4];
    online_softmax(sc, pa, o, m_lo, m_hi, l_lo, l_hi, c0 + int64_t(j) * kBK2, wpos0, pos_lo, pos_hi,
                   ct.end, t, qscale);
    produce(j);
    __syncwarp();
    pv_mma_sw128(o, pa, ring + uint32_t((j % kStages3) * kStage3 + kBoxV * kBox), lane);
  };
  if constexpr (!kPipe) {
    for (int j = 0; j < n_tiles; j++) {
      wait_full(j);
      if (runs(j)) {
        touched = true;
        float sc[kBK2 / 8][4];
        s_wgmma(sc, qa, k_desc(j));
        finish_tile(j, sc);
      } else {
        produce(j);
      }
      release(j);
    }
  } else {
    // S of tile j + 1 issued before tile j's softmax (Q and K from shared memory), so the tensor
    // cores work on it while this warpgroup runs the softmax and P·V of tile j.
    auto start_s = [&](float(&d)[kBK2 / 8][4], int j) {
      const auto desc = k_desc(j);
      zero_for_wgmma(d);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kQDim / 16; ks++) {
        if constexpr (kQSmem)
          wgmma_m64n64k16_ss(d, wgmma_desc(q_wg + uint32_t(ks * 2048), 1024, 128), desc(ks));
        else
          wgmma_m64n64k16(d, qa[ks], desc(ks));
      }
      wgmma_commit();
    };
    // Every warpgroup runs every tile of the pair (no branch while a wgmma is in flight, which
    // would make ptxas serialise them): tiles above its rows are masked whole (p = 0, the state
    // unchanged bit for bit), a padding CTA's rows are never written.
    touched = !pad;
    if constexpr (kPvWgmma) {
      // P·V on wgmma too (tma_fa3): step j issues S(j + 1) and then P(j)·V(j), runs the softmax of
      // tile j + 1 while both are on the tensor cores (it writes the other P and leaves O alone),
      // then waits for P·V, releases tile j and applies tile j + 1's rescale to O. P alternates
      // between two register sets: one is read by the wgmma in flight while the other is written.
      float sc[kBK2 / 8][4];
      uint32_t pa[kBK2 / 16][4], pb[kBK2 / 16][4];
      float a_lo, a_hi;
      auto v_base = [&](int j) { return ring + uint32_t((j % kStages3) * kStage3 + kBoxV * kBox); };
      auto soft = [&](int j, uint32_t(&p)[kBK2 / 16][4]) {
        reg_fence(sc);
        softmax_tile(sc, p, m_lo, m_hi, l_lo, l_hi, a_lo, a_hi, c0 + int64_t(j) * kBK2, wpos0,
                     pos_lo, pos_hi, ct.end, t, qscale);
        produce(j);
        __syncwarp();
      };
      // kPingPong: the two warpgroups take turns to issue their tile's wgmmas, so one's softmax
      // runs while the tensor cores work on the other's products. Both issue n_tiles + 1 times;
      // warpgroup 1 opens the first turn and leaves out its last hand-over (nobody waits for it).
      const int wg = warp / 4;
      auto turn = [&] {
        if constexpr (kPingPong) named_sync(1 + wg);
      };
      auto hand_over = [&](bool fin) {
        if constexpr (kPingPong)
          if (!(fin && wg == 1)) named_arrive(2 - wg);
      };
      if (kPingPong && wg == 1 && n_tiles > 0) named_arrive(1);
      auto step = [&](int j, uint32_t(&cur)[kBK2 / 16][4], uint32_t(&nxt)[kBK2 / 16][4]) {
        wait_full(j + 1);
        turn();
        start_s(sc, j + 1);
        pv_wgmma(o, cur, v_base(j));
        hand_over(false);
        wgmma_wait<1>();
        soft(j + 1, nxt);
        wgmma_wait<0>();
        reg_fence(o);
        release(j);
        scale_o(o, a_lo, a_hi);
      };
      auto last = [&](int j, uint32_t(&cur)[kBK2 / 16][4]) {
        turn();
        wgmma_fence();
        pv_wgmma(o, cur, v_base(j));
        hand_over(true);
        wgmma_wait<0>();
        reg_fence(o);
        release(j);
      };
      if (n_tiles > 0) {
        wait_full(0);
        turn();
        start_s(sc, 0);
        hand_over(false);
        wgmma_wait<0>();
        soft(0, pa);
        scale_o(o, a_lo, a_hi);
      }
      alternate_tiles(n_tiles, pa, pb, step, last);
    } else {
      float sa[kBK2 / 8][4], sb[kBK2 / 8][4];
      auto body = [&](int j, float(&cur)[kBK2 / 8][4]) {
        reg_fence(cur);
        finish_tile(j, cur);
        release(j);
      };
      // Nothing is in flight at a loop edge: each half starts the next tile's S, runs this tile
      // (whose S is complete) and waits for the next S before the buffers swap roles.
      auto half = [&](int j, float(&cur)[kBK2 / 8][4], float(&nxt)[kBK2 / 8][4]) {
        wait_full(j + 1);
        start_s(nxt, j + 1);
        body(j, cur);
        wgmma_wait<0>();
      };
      if (n_tiles > 0) {
        wait_full(0);
        start_s(sa, 0);
        wgmma_wait<0>();
      }
      alternate_tiles(n_tiles, sa, sb, half, body);
    }
  }
  // Every copy into this CTA has landed (each warp waited on every tile); the cluster barrier
  // orders the peer's last arrivals on this CTA's barriers before either CTA exits.
  detail::cluster_arrive();
  detail::cluster_wait();
  if (pad) return;
  finish_rows(ct, H, h, T, t, t_lo, t_hi, o, m_lo, m_hi, l_lo, l_hi, touched, out);
}

// The instance of attn_prefill_tma that runs a TMA kernel (tma and tma_solo share one).
using TmaKernelFn = decltype(&attn_prefill_tma<false>);
TmaKernelFn tma_kernel(PrefillKernel k) {
  switch (k) {
    case PrefillKernel::tma_pipe:
      return attn_prefill_tma<true>;
    case PrefillKernel::tma_fa3:
      return attn_prefill_tma<true, true>;
    case PrefillKernel::tma_fa3_pp:
      return attn_prefill_tma<true, true, true>;
    default:
      return attn_prefill_tma<false>;
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
      ckv, norm_w, eps, cache, pos0, T, nullptr, 0, 0);
  return launch_status();
}

Status write_latent_decode(const uint16_t* ckv, const float* norm_w, float eps, uint16_t* cache,
                           int64_t cache_stride, int64_t capacity, const int32_t* pos_dev, int B,
                           void* stream) {
  if (!ckv || !norm_w || !cache || !pos_dev) return invalid("mla write_latent: null pointer");
  if (capacity < 1) return invalid("mla write_latent: capacity must be >= 1 position");
  if (B > 1 && cache_stride < capacity * kCacheDim)
    return invalid("mla write_latent: cache_stride must hold capacity rows of 576 elements");
  if (B <= 0) return Status{};
  latent_rows<<<unsigned((B + 7) / 8), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      ckv, norm_w, eps, cache, 0, B, pos_dev, cache_stride, capacity);
  return launch_status();
}

namespace {

size_t align256(size_t b) {
  return (b + 255) & ~size_t(255);
}
// Expanded [k_nope | v] of n positions, bf16.
size_t kv_bytes(int H, int64_t n) {
  return align256(size_t(n) * size_t(H) * kKv * sizeof(uint16_t));
}
// The softmax state across cache tiles: O [T, H, 128] and (m, l) [T, H, 2], fp32.
size_t state_o_bytes(int H, int64_t T) {
  return align256(size_t(T) * size_t(H) * kV * sizeof(float));
}
size_t state_bytes(int H, int64_t T) {
  return state_o_bytes(H, T) + align256(size_t(T) * size_t(H) * 2 * sizeof(float));
}

}  // namespace

EncodeTiled encode_tiled() {
  static const EncodeTiled f = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return f;
}

Status encode_map(EncodeTiled encode, CUtensorMap* map, unsigned rank, const void* base,
                  const cuuint64_t* dim, const cuuint64_t* stride, const cuuint32_t* box,
                  const char* what) {
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void*>(base), dim, stride, box,
             unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    Status st;
    st.code = 2000 + int(r);
    st.message = what;
    return st;
  }
  return Status{};
}

size_t prefill_workspace_bytes(int H, int64_t S) {
  return kv_bytes(H, S) + kGemmScratch;
}

size_t prefill_workspace_bytes_bounded(int H, int64_t T, int64_t max_tile) {
  const int64_t tile =
      std::max<int64_t>(kPrefillTileAlign,
                        (max_tile + kPrefillTileAlign - 1) / kPrefillTileAlign * kPrefillTileAlign);
  return kv_bytes(H, tile) + kGemmScratch + state_bytes(H, T);
}

int64_t prefill_tile_positions(int H, int64_t S, int64_t T, size_t workspace_bytes) {
  if (H < 1 || S < 1 || T < 1) return 0;
  if (workspace_bytes >= prefill_workspace_bytes(H, S)) return S;
  const size_t fixed = kGemmScratch + state_bytes(H, T);
  if (workspace_bytes <= fixed) return 0;
  const size_t per_pos = size_t(H) * kKv * sizeof(uint16_t);
  const int64_t tile = int64_t((workspace_bytes - fixed) / per_pos) / kPrefillTileAlign *
                       kPrefillTileAlign;  // a multiple of 64: its kv bytes are 256-aligned
  return std::min(tile, S);
}

// Every prefill kernel by its STRATA_MLA_PREFILL name (one table for both directions).
struct NamedPrefillKernel {
  PrefillKernel kernel;
  const char* name;
};
constexpr NamedPrefillKernel kPrefillKernelNames[] = {
    {PrefillKernel::cp_async, "cpasync"},  {PrefillKernel::tma, "tma"},
    {PrefillKernel::tma_pipe, "tma_pipe"}, {PrefillKernel::tma_solo, "tma_solo"},
    {PrefillKernel::tma_fa3, "tma_fa3"},   {PrefillKernel::tma_fa3_pp, "tma_fa3_pp"}};
static_assert(std::size(kPrefillKernelNames) == std::size(kPrefillKernels), "a name per kernel");

PrefillKernel default_prefill_kernel() {
  static const PrefillKernel k = [] {
    const char* e = std::getenv("STRATA_MLA_PREFILL");
    for (const NamedPrefillKernel& n : kPrefillKernelNames)
      if (e && std::strcmp(e, n.name) == 0) return n.kernel;
    return kPrefillKernels[0];  // the default
  }();
  return k;
}

const char* prefill_kernel_name(PrefillKernel k) {
  for (const NamedPrefillKernel& n : kPrefillKernelNames)
    if (n.kernel == k) return n.name;
  return "?";
}

Status prefill(int H, const uint16_t* q, const uint16_t* cache, int64_t S, const uint16_t* kv_b,
               uint16_t* out, int64_t T, void* workspace, size_t workspace_bytes, void* stream,
               PrefillKernel kernel) {
  static constexpr const char* kEncodeFailed = "mla prefill: cuTensorMapEncodeTiled failed";
  if (!q || !cache || !kv_b || !out || !workspace) return invalid("mla prefill: null pointer");
  if ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(cache) |
       reinterpret_cast<uintptr_t>(workspace)) %
          16 !=
      0)
    return invalid("mla prefill: q, cache and workspace must be 16-byte aligned");
  if (H < 1 || T < 1 || T > S) return invalid("mla prefill: need H >= 1 and 1 <= T <= S");
  if (((T + kBQ2 - 1) / kBQ2 + 1) * H > (int64_t(1) << 31) - 1 || H > 65535 ||
      S > (int64_t(1) << 31) - 1)
    return invalid("mla prefill: too large");
  const int64_t tile = prefill_tile_positions(H, S, T, workspace_bytes);
  if (tile < 1)
    return invalid(
        "mla prefill: workspace smaller than prefill_workspace_bytes_bounded(H, T, 64), the "
        "least for tiles of 64 cached positions");
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // Workspace: [expanded kv of one tile | GEMM scratch | softmax state (tiled calls only)].
  char* ws = static_cast<char*>(workspace);
  uint16_t* kv = reinterpret_cast<uint16_t*>(ws);
  char* scratch = ws + kv_bytes(H, tile);
  CacheTile ct;
  if (tile < S) {
    ct.st_o = reinterpret_cast<float*>(scratch + kGemmScratch);
    ct.st_ml = reinterpret_cast<float*>(scratch + kGemmScratch + state_o_bytes(H, T));
  }
  const float qscale = float(1.0 / std::sqrt(double(kQDim)) * 1.4426950408889634);
  // A driver without cuTensorMapEncodeTiled runs the cp.async kernel (the same bits).
  const EncodeTiled encode = kernel == PrefillKernel::cp_async ? nullptr : encode_tiled();
  const bool tma = encode != nullptr;
  auto* const tma_fn = tma_kernel(kernel);
  if (tma) {
    if (Status a = rt::allow_dynamic_smem(tma_fn, int(kAttnSmem3)); !a.ok()) return a;
  } else if (Status a = rt::allow_dynamic_smem(attn_prefill<kWgmmaS>, int(kAttnSmem2)); !a.ok()) {
    return a;
  }
  // The TMA kernel's cluster: the query blocks that share a key tile, each loading 64/cl rows
  // (clusters of 4 measured slower than 2: docs/performance.md).
  const unsigned cl = 2;
  const int64_t n_q = (T + kBQ2 - 1) / kBQ2;
  const int64_t blocks = tma ? (n_q + cl - 1) / cl * cl * H : n_q * H;
  CUtensorMap tm_pe{};
  if (tma) {
    // k_pe: columns 512 .. 575 of the S cache rows; boxes of 64 columns × 64/cl rows.
    const cuuint64_t dim[2] = {cuuint64_t(kCacheDim), cuuint64_t(S)};
    const cuuint64_t stride[1] = {cuuint64_t(kCacheDim) * 2};
    const cuuint32_t box[2] = {64, kBK2 / cl};
    if (Status st = encode_map(encode, &tm_pe, 2, cache, dim, stride, box, kEncodeFailed); !st.ok())
      return st;
  }
  for (int64_t c0 = 0; c0 < S; c0 += tile) {
    const int64_t n = std::min(tile, S - c0);
    if (Status st = expand_kv(H, cache + c0 * kCacheDim, n, kv_b, kv, scratch, kGemmScratch, s);
        !st.ok())
      return st;
    ct.c0 = c0;
    ct.end = c0 + n;
    ct.first = c0 == 0;
    ct.last = c0 + n == S;
    // Heads per group: as many as keep the group's keys and values of this tile (n·640 bytes per
    // head) within ~24 MB of the 50 MB L2.
    const int64_t per_head_bytes = n * int64_t(kKv + kRope) * int64_t(sizeof(uint16_t));
    const int head_group = int(std::clamp<int64_t>((int64_t(24) << 20) / per_head_bytes, 1, H));
    if (tma) {
      // [k_nope | v] of the tile: [n, H, 256]; boxes of 64 values × 1 head × 64/cl positions.
      const cuuint64_t dim[3] = {cuuint64_t(kKv), cuuint64_t(H), cuuint64_t(n)};
      const cuuint64_t stride[2] = {cuuint64_t(kKv) * 2, cuuint64_t(H) * kKv * 2};
      const cuuint32_t box[3] = {64, 1, kBK2 / cl};
      CUtensorMap tm_kv{};
      if (Status st = encode_map(encode, &tm_kv, 3, kv, dim, stride, box, kEncodeFailed); !st.ok())
        return st;
      const bool share = kernel != PrefillKernel::tma_solo;
      if (Status st = launch_clustered_smem(tma_fn, dim3(unsigned(blocks)), dim3(kThreads2),
                                            kAttnSmem3, cl, s, tm_kv, tm_pe, H, q, S, T, out,
                                            qscale, head_group, ct, share);
          !st.ok())
        return st;
    } else {
      attn_prefill<kWgmmaS><<<unsigned(blocks), kThreads2, kAttnSmem2, s>>>(
          H, q, kv, cache, S, T, out, qscale, head_group, ct);
    }
    if (Status st = launch_status(); !st.ok()) return st;
  }
  return Status{};
}

}  // namespace strata::kernels::mla
