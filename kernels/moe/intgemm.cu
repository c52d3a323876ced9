// Grouped-GEMM path of the MXFP4 experts (many tokens per expert; prefill): int8 tensor cores with
// ONE exact epilogue per output instead of one fp64 block term per output per 32-block (the IMMA
// path's cost), bit-identical to the contract (docs/numerics.md §3.2,
// storage/expert_contract_int.h).
//
// The integer method (bounds proved in storage/expert_contract_int.h; K ≤ 4096):
//   per token (activation row): e_min = min e_x over nonzero blocks, sx(b) = e_x(b) − e_min ≤ 7;
//     a = q · 2^sx (0 in zero blocks), |a| ≤ 16,256, split a = 128·hi + lo, hi ∈ [−127, 127],
//     lo ∈ [0, 127]: two int8 planes, written once per row by planes_kernel;
//   per weight row o: s_min = min scale code, sw(b) = s_w(o, b) − s_min ≤ 3; w' = w2 · 2^sw,
//     |w'| ≤ 96, decoded from the packed nibbles in registers by byte permutes of shifted tables;
//   D_hi = Σ_K hi·w', D_lo = Σ_K lo·w' in the mma's int32 accumulators (|.| ≤ 4096·127·96 < 2^31,
//     every partial sum too, so no wrap in any order);
//   out = (float)((128·D_hi + D_lo) · 2^(e_min + s_min − 128)): exact in fp64 (|D| < 2^33, the
//     exponent in [−283, 247]); the nonzero block terms span ≤ 7 + 3 = 10 ≤ 30 binades, so by the
//     lemma of §3.1 this is the fixed-order sum of §3, and (float) of it the contract's bits.
// Outputs outside the window — a row whose codes span > 3 or a token whose nonzero blocks span > 7
// — are computed by the strict per-block contract (one warp per output: lane j sums blocks j,
// j+32, … from the exact block terms, then the butterfly; the GEMV's order) inside the same CTA,
// after its tile; a poisoned token's outputs are the canonical NaN. So every input is exact; only
// the speed depends on the window (strata synth and the bench pool: 2–4 scale codes per row).
//
// Tiling: a CTA (8 warps) owns 128 output rows of one expert (grid: row tiles × groups, sized from
// host counts — fine for prefill, which the engine does not capture in CUDA graphs) and walks the
// group's tokens in tiles of BN; per token tile it streams the rows' packed weights and the
// tokens' two planes through a cp.async pipeline of 128-column stages. BN and the depth are picked
// from the mean tokens per expert: 32 tokens × 3 stages at three CTAs per SM, 64 × 3 at two; below
// a mean of 8, strip_kernel (its own comment below) takes the work. Warp w computes rows
// 16w..16w+15 against the whole token tile: per 32-column block one A fragment (two blocks' worth
// per ldmatrix.x4, decoded once), two mma.m16n8k32 (hi, lo planes) per 8 tokens, skipping the
// 8-token fragments past the tile's count. The k-slot permutation of the IMMA path (lane t:
// elements 8t..8t+3 in slots 4t..4t+3 and 8t+4..8t+7 in 16+4t..) is applied to A and B alike, which
// leaves each dot product unchanged. The scale codes of the CTA's rows are copied once into shared
// memory; each warp scans its rows' windows and rewrites the codes as offsets of the decode tables
// for their shift (s_tab: one 16-byte load per row and block).
//
// A second form of the same kernel, wgmma_kernel (ExpertPath::wgmma; see its own comment below),
// is warp-specialized: a producer warpgroup decodes the weights once per token tile into shared
// memory, and two consumer warpgroups run Hopper's warpgroup MMA on them and on the planes, both
// operands from shared memory; the integer method, window scan, epilogue and strict fallback are
// gemm_kernel's, so its outputs are the same bits.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "kernels/moe/contract_device.cuh"
#include "kernels/moe/paths.h"
#include "kernels/ops/launch.cuh"
#include "storage/expert_contract.h"
#include "storage/expert_contract_int.h"

namespace strata::kernels::moe::detail {
namespace {

namespace c = strata::contract;
namespace is = strata::contract::intsum;

constexpr int kBM = 128;               // output rows per CTA
constexpr int kBK = 128;               // columns per pipeline stage
constexpr int kKB = kBK / c::kBlock;   // 32-blocks per stage
constexpr int kWarps = kBM / 16;       // one 16-row mma fragment per warp
constexpr int kThreads = kWarps * 32;  // 256
static_assert(kBM * kKB == 2 * kThreads, "A stage: 2 chunks (one block of one row) per thread");

// gemm_kernel's stages in shared memory, 16-byte chunks placed so that the 8 rows of an ldmatrix
// and the tokens of a B fragment load (served per half-warp: 4 tokens × 32 bytes) hit distinct
// banks, in one of two layouts:
//   padded (two CTAs per SM): A rows of 80 bytes (blocks 0–3 of the stage, then 16 unused), B
//     token rows of 160 bytes per plane;
//   swizzled (three CTAs per SM: 20 % less shared memory per stage): A rows of 64 bytes, block j
//     at chunk j ^ ((r / 2) mod 4); B token rows of 128 bytes, chunk j at j ^ (2·(t mod 4)).
template <bool SW>
struct Layout {
  static constexpr bool kSW = SW;
  static constexpr int kARow = SW ? kBK / 2 : kBK / 2 + 16, kBRow = SW ? kBK : kBK + 32;
  static constexpr int kAStage = kBM * kARow;
  // Offsets of block j of weight row r, and of chunk j of token row t of a plane; b(t + 8f, j) =
  // b(t, j) + 8f·kBRow.
  __device__ static int a(int r, int j) { return r * kARow + 16 * (SW ? j ^ ((r >> 1) & 3) : j); }
  __device__ static int b(int t, int j) { return t * kBRow + 16 * (SW ? j ^ (2 * (t & 3)) : j); }
};

// Token-tile variants (BN tokens per tile, STAGES pipeline stages, MINB CTAs per SM; K3's 112
// scale bytes per row take 14 KB more): small tiles leave room for deeper pipelines, which the
// weight-streaming (memory-bound) regime of few tokens per expert needs; large tiles read each
// expert's weights fewer times when groups are large. Three CTAs per SM (80 registers per thread)
// take the swizzled layout.
template <int BN, int STAGES, int MINB>
struct Tile {
  using L = Layout<(MINB >= 3)>;
  static constexpr int kFrags = BN / 8;                            // 8-token mma fragments per tile
  static constexpr int kBStage = 2 * BN * L::kBRow;                // hi and lo planes
  static constexpr int kBChunks = 2 * BN * (kBK / 16) / kThreads;  // 16-byte copies per thread
  static_assert(kBChunks * kThreads == 2 * BN * (kBK / 16), "B stage: whole chunks per thread");
  static size_t smem(int nb) { return size_t(STAGES) * (L::kAStage + kBStage) + size_t(kBM) * nb; }
};

struct GemmArgs {
  const Mxfp4ExpertView* experts;
  const int32_t* group_offsets;
  const int32_t* row_map;  // pair → input row (nullptr: the pair itself)
  QuantRows in;            // q, e of the input rows (strict path)
  Planes planes;           // hi, lo planes and per-row metadata of the input rows
  int K, N, split;         // input width, output rows; rows ≥ split from w3 (gate|up) — N: w2
  float* out;              // [P, N]
};

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(unsigned(__cvta_generic_to_shared(dst))),
      "l"(src)
      : "memory");
}
__device__ __forceinline__ void cp4(void* dst, const void* src) {
  asm volatile(
      "cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(unsigned(__cvta_generic_to_shared(dst))),
      "l"(src)
      : "memory");
}
__device__ __forceinline__ void cp_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// prmt.b32 in the default mode, without __byte_perm's masking of the selector (callers pass
// selectors whose nibbles have bit 3 clear).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
// decode4 of contract_device.cuh with the tables of w2 · 2^sw (is::shifted_tables), for the 8
// codes of a word at once: lo from codes 0–3, hi from codes 4–7. The
// selector takes byte j of neg (index 4 + j) where code j's sign is set, else byte j of pos.
__device__ __forceinline__ void decode8_shifted(uint32_t codes, const is::ShiftedTables& t,
                                                uint32_t& lo, uint32_t& hi) {
  const uint32_t idx = codes & 0x77777777u;
  const uint32_t sel = ((codes & 0x88888888u) >> 1) + 0x32103210u;
  const uint32_t idx_hi = idx >> 16, sel_hi = sel >> 16;
  lo = prmt(prmt(t.pos0, t.pos1, idx), prmt(t.neg0, t.neg1, idx), sel);
  hi = prmt(prmt(t.pos0, t.pos1, idx_hi), prmt(t.neg0, t.neg1, idx_hi), sel_hi);
}

// The tables of w2 · 2^sw for sw = 0 … kMaxWeightShift in shared memory: gemm_kernel's main loop
// reads a row's tables for a block with one 16-byte load at the offset 16·sw that its window scan
// wrote over the row's scale code.
__shared__ __align__(16) is::ShiftedTables s_tab[is::kMaxWeightShift + 1];
static_assert(sizeof(is::ShiftedTables) == 16, "one 16-byte load per table set");

__device__ __forceinline__ is::ShiftedTables shift_table(uint8_t offset) {
  const uint4 v = *reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(s_tab) + offset);
  return {v.x, v.y, v.z, v.w};
}

// ldmatrix.x4 of b16 8×8 matrices: lane l gives the row address of matrix l / 8 and receives in
// r[i] the 4 bytes 4·(l mod 4) … of row l / 4 of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint8_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(unsigned(__cvta_generic_to_shared(p))));
}

// Packed weights and scale codes of output row o (clamped to the last row: rows past N are read,
// never stored).
__device__ __forceinline__ void row_source(const GemmArgs& a, const Mxfp4ExpertView& v, int o,
                                           const uint8_t*& pk, const uint8_t*& sc) {
  o = min(o, a.N - 1);
  const bool down = a.split == a.N, second = !down && o >= a.split;
  const int r = second ? o - a.split : o;
  pk = (down ? v.w2_packed : second ? v.w3_packed : v.w1_packed) + size_t(r) * size_t(a.K / 2);
  sc = (down ? v.w2_scale : second ? v.w3_scale : v.w1_scale) + size_t(r) * size_t(a.K / c::kBlock);
}

// The scale codes of the CTA's rows row0 … row0 + kBM − 1 into sS [kBM, nb] by cp.async (16-byte
// copies where rows allow — K3's 112 and 96 codes per row in the released layout — else 4-byte,
// else plain loads), committed with the caller's first group.
__device__ __forceinline__ void load_scale_codes(const GemmArgs& a, const Mxfp4ExpertView& v,
                                                 int row0, int nb, uint8_t* sS, int tid,
                                                 int nthreads, int rows = kBM) {
  const bool down = a.split == a.N;
  const auto aligned = [&](uintptr_t m) {
    const auto al = [m](const uint8_t* p) { return (reinterpret_cast<uintptr_t>(p) & m) == 0u; };
    return down ? al(v.w2_scale) : al(v.w1_scale) && al(v.w3_scale);
  };
  if (nb % 16 == 0 && aligned(15u)) {
    for (int i = tid; i < rows * (nb / 16); i += nthreads) {
      const int r = i / (nb / 16), j = i - r * (nb / 16);
      const uint8_t *pk, *sc;
      row_source(a, v, row0 + r, pk, sc);
      cp16(sS + r * nb + 16 * j, sc + 16 * j);
    }
  } else if (nb % 4 == 0 && aligned(3u)) {
    for (int i = tid; i < rows * (nb / 4); i += nthreads) {
      const int r = i / (nb / 4), j = i - r * (nb / 4);
      const uint8_t *pk, *sc;
      row_source(a, v, row0 + r, pk, sc);
      cp4(sS + r * nb + 4 * j, sc + 4 * j);
    }
  } else {
    for (int i = tid; i < rows * nb; i += nthreads) {
      const int r = i / nb, j = i - r * nb;
      const uint8_t *pk, *sc;
      row_source(a, v, row0 + r, pk, sc);
      sS[i] = __ldg(sc + j);
    }
  }
}

// The strict contract (numerics.md §3) for one output, by one warp: lane j sums the exact terms of
// blocks j, j+32, … in increasing order from +0.0, then the butterfly (off 16 … 1). Lane 0 holds
// the result.
__device__ float strict_element(const uint8_t* pk, const uint8_t* sc, const int8_t* q,
                                const int32_t* e, int nb, int lane) {
  double L = 0.0;
  for (int b = lane; b < nb; b += 32) {
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(pk) + b);
    const uint4* qb = reinterpret_cast<const uint4*>(q + size_t(b) * c::kBlock);
    const uint32_t d = dot_block_biased(w, __ldg(qb), __ldg(qb + 1));
    L = c::dadd(L, block_term_bits(d, __ldg(e + b), __ldg(sc + b)));
  }
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) L = c::dadd(L, __shfl_down_sync(0xffffffffu, L, off));
  return float(L);
}

// One output of a token tile by the integer method (row of the CTA, col of the tile; the
// accumulators' d_hi, d_lo): the canonical NaN for a poisoned token, nothing past the tile or the
// matrix or outside the windows (the strict path's outputs), else the contract's value.
__device__ __forceinline__ void store_output(const GemmArgs& a, int row0, int pt, int cnt, int row,
                                             int col, int32_t d_hi, int32_t d_lo,
                                             const int32_t* s_tokst, const int32_t* s_tokemin,
                                             const int32_t* s_rowok, const int32_t* s_smin) {
  if (col >= cnt || row0 + row >= a.N) return;
  const int st = s_tokst[col];
  float val;
  if (st == is::kTokenPoisoned)
    val = c::canonical_nan();
  else if (st == is::kTokenOk && s_rowok[row])
    val = is::finish(d_hi, d_lo, s_tokemin[col], s_smin[row]);
  else
    return;
  a.out[size_t(pt + col) * a.N + row0 + row] = val;
}

// The strict path of a token tile, by warp w of a CTA (rows 16·w … 16·w + 15): the warp's rows
// outside their window for every token of the tile, and its other rows for the tile's tokens
// outside theirs (s_bad[0, nbad)). Warp-uniform loops; poisoned tokens are the epilogue's.
__device__ void strict_rows(const GemmArgs& a, const Mxfp4ExpertView& v, int w, int lane, int row0,
                            int pt, int cnt, const int32_t* s_rowok, const int32_t* s_tokst,
                            const int32_t* s_tokrow, const int32_t* s_bad, int nbad) {
  const unsigned badrows = __ballot_sync(0xffffffffu, lane < 16 && !s_rowok[w * 16 + lane]);
  if (badrows == 0u && nbad == 0) return;
  const int K = a.K, nb = K / c::kBlock;
  for (int rr = 0; rr < 16; rr++) {
    const int row = w * 16 + rr;
    if (row0 + row >= a.N) break;
    const bool rbad = (badrows >> rr) & 1u;
    const int n = rbad ? cnt : nbad;
    if (n == 0) continue;
    const uint8_t *pk, *sc;
    row_source(a, v, row0 + row, pk, sc);
    for (int i = 0; i < n; i++) {
      const int col = rbad ? i : s_bad[i];
      if (s_tokst[col] == is::kTokenPoisoned) continue;
      const size_t in_row = size_t(s_tokrow[col]);
      const float val = strict_element(pk, sc, a.in.q + in_row * size_t(K),
                                       a.in.e + in_row * size_t(nb), nb, lane);
      if (lane == 0) a.out[size_t(pt + col) * a.N + row0 + row] = val;
    }
  }
}

// The window of weight row r (CTA row; rows past N count as inside): lanes 0–15 and 16–31 of the
// calling warp scan halves of row r = (its rows) + lane mod 16 of sS [kBM, nb]; lanes < 16 write
// s_smin[r] and s_rowok[r]. With `rewrite`, the codes become byte offsets 16·(code − s_min) of
// their shift's tables in s_tab (0 for rows outside their window: their outputs come from the
// strict path). Whole 4-code words when nb % 8 == 0 (K3). Ends with __syncwarp: only the calling
// warp reads its rows' results.
__device__ void scan_windows(uint8_t* sS, int nb, int r, int lane, int row0, int N, int32_t* s_smin,
                             int32_t* s_rowok, bool rewrite) {
  const int half = (nb + 1) / 2;
  const int b0 = lane < 16 ? 0 : half, b1 = lane < 16 ? half : nb;
  uint32_t* const wds = reinterpret_cast<uint32_t*>(sS + r * nb + b0);
  const bool words = nb % 8 == 0;
  int mn = 255, mx = 0;
  if (words) {
    uint32_t vmn = 0xFFFFFFFFu, vmx = 0u;
    for (int i = 0; i < (b1 - b0) / 4; i++)
      vmn = __vminu4(vmn, wds[i]), vmx = __vmaxu4(vmx, wds[i]);
    mn = int(min(min(vmn & 255u, (vmn >> 8) & 255u), min((vmn >> 16) & 255u, vmn >> 24)));
    mx = int(max(max(vmx & 255u, (vmx >> 8) & 255u), max((vmx >> 16) & 255u, vmx >> 24)));
  } else {
    for (int b = b0; b < b1; b++) {
      const int sv = sS[r * nb + b];
      mn = min(mn, sv), mx = max(mx, sv);
    }
  }
  mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, 16));
  mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
  const bool in_window = mx - mn <= is::kMaxWeightShift;
  if (lane < 16) {
    s_smin[r] = mn;
    s_rowok[r] = row0 + r >= N || in_window;  // past N: never used
  }
  if (rewrite) {
    if (words) {
      const uint32_t sub = uint32_t(mn) * 0x01010101u;  // no borrow: every code ≥ mn
      for (int i = 0; i < (b1 - b0) / 4; i++) wds[i] = in_window ? (wds[i] - sub) << 4 : 0u;
    } else {
      for (int b = b0; b < b1; b++) {
        uint8_t& sv = sS[r * nb + b];
        sv = in_window ? uint8_t(16 * (int(sv) - mn)) : uint8_t(0);
      }
    }
  }
  __syncwarp();
}

template <int BN, int STAGES, int MINB>
__global__ void __launch_bounds__(kThreads, MINB) gemm_kernel(GemmArgs a) {
  using Tl = Tile<BN, STAGES, MINB>;
  using L = typename Tl::L;
  constexpr int kBN = BN, kStages = STAGES, kFrags = Tl::kFrags, kBStage = Tl::kBStage;
  constexpr int kAStg = L::kAStage;
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* const sA = smem;
  uint8_t* const sB = smem + kStages * kAStg;
  uint8_t* const sS = sB + kStages * kBStage;  // [kBM, nb] scale codes
  __shared__ int32_t s_smin[kBM], s_rowok[kBM];
  __shared__ int32_t s_tokrow[kBN], s_tokemin[kBN], s_tokst[kBN], s_bad[kBN];
  __shared__ int32_t s_nbad;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int g = blockIdx.y, row0 = blockIdx.x * kBM;
  const int p0 = a.group_offsets[g], p1 = a.group_offsets[g + 1];
  if (p1 <= p0 || row0 >= a.N) return;
  if (tid <= is::kMaxWeightShift) s_tab[tid] = is::shifted_tables(tid);  // read after a barrier
  const Mxfp4ExpertView v = a.experts[g];
  const int K = a.K, nb = K / c::kBlock, nkt = (nb + kKB - 1) / kKB;

  // The rows' scale codes into shared memory, issued ahead of the first weight stages; each warp
  // derives its own rows' windows once they have landed (first K step of the first tile).
  load_scale_codes(a, v, row0, nb, sS, tid, kThreads);
  bool windows_done = false;

  // Per-thread shared-memory offsets that the main loop needs at every stage, kept in shared
  // memory (read back after each stage's barrier: one 16-byte load) rather than in registers,
  // which the 80-register build otherwise spends recomputing them:
  //   x: the A copy destination of block ablk of row ar (blocks ablk and ablk + 1 of row ar are
  //      this thread's A copies; ablk + 1 lies at x ^ 16 swizzled, x + 16 padded);
  //   y: this lane's ldmatrix row address for blocks 0–1 (matrix lane / 8 is rows
  //      16·warp + 8·(lane / 8 mod 2) … of block lane / 16); blocks 2–3 at y ^ 32 / y + 32;
  //   z: this lane's B fragment bytes of block 0 (token gid, k-bytes 8·tig … + 7 of chunk
  //      tig / 2); block kb at z ^ 32·kb swizzled (chunk 2·kb + tig / 2 lies at
  //      (2·kb + tig / 2) ^ 2·(gid mod 4)), z + 32·kb padded; the next 8-token fragment 8·kBRow on;
  //   w: this lane's rows' scale codes, r_lo · nb (r_hi's 8 rows on), offsets in sS.
  // s_bdst: the B copy destination of chunk i = 0 (chunk c = tid + 256·i of a stage is plane
  // c / (8·BN), token (c / 8) mod BN, bytes (c mod 8)·16: row c / 8 of the stage's 2·BN token
  // rows, so chunk i lies 32·i rows after chunk 0, in the same swizzle phase).
  __shared__ int4 s_lane[kThreads];
  __shared__ int32_t s_bdst[kThreads];
  const int ar = tid >> 1, ablk = 2 * (tid & 1), bpart = tid & 7;
  const int r_lo = warp * 16 + gid, r_hi = r_lo + 8;
  s_lane[tid] = make_int4(L::a(ar, ablk), L::a(warp * 16 + (lane & 15), lane >> 4),
                          L::b(gid, tig >> 1) + 8 * (tig & 1), r_lo * nb);
  s_bdst[tid] = L::b(tid >> 3, bpart);
  const auto next_block = [](int off, int d) { return L::kSW ? off ^ d : off + d; };
  // This thread's A source: row ar, from block ablk; carried from stage to stage.
  const uint8_t* a_src;
  {
    const uint8_t* sc;
    row_source(a, v, row0 + ar, a_src, sc);
    a_src += size_t(ablk) * 16;
  }
  __syncthreads();  // s_lane, s_bdst

  for (int pt = p0; pt < p1; pt += kBN) {
    const int cnt = min(kBN, p1 - pt), nfrag = (cnt + 7) / 8;
    // Stage kt of this thread's A copies into slot st; a_next is stage kt's source (the stages
    // are loaded in order).
    const uint8_t* a_next = a_src;
    auto load_a = [&](int st, int kt, int dst) {
      uint8_t* const d = sA + st * kAStg;
      if (kt * kKB + ablk < nb) cp16(d + dst, a_next);
      if (kt * kKB + ablk + 1 < nb) cp16(d + next_block(dst, 16), a_next + 16);
      a_next += kBK / 2;
    };
    // The weights of the first stages go out before the tokens' metadata is known.
    {
      const int dst = s_lane[tid].x;
#pragma unroll
      for (int s = 0; s < kStages - 1; s++)
        if (s < nkt) load_a(s, s, dst);
    }
    if (tid < kBN) {
      int row = 0, em = 0, st = is::kTokenOk;
      if (tid < cnt) {
        const int p = pt + tid;
        row = a.row_map ? __ldg(a.row_map + p) : p;
        em = __ldg(a.planes.meta + 2 * size_t(row));
        st = __ldg(a.planes.meta + 2 * size_t(row) + 1);
      }
      s_tokrow[tid] = row, s_tokemin[tid] = em, s_tokst[tid] = st;
    }
    if (tid == 0) s_nbad = 0;
    __syncthreads();
    if (tid < cnt && s_tokst[tid] == is::kTokenSpan) s_bad[atomicAdd(&s_nbad, 1)] = tid;
    // This thread's B sources (b_live bit i: chunk i's token is in the tile; a token past it
    // reads nothing and its pointer walks row 0), carried like a_next.
    const int8_t* b_next[Tl::kBChunks];
    unsigned b_live = 0u;
#pragma unroll
    for (int i = 0; i < Tl::kBChunks; i++) {
      const int ch = tid + kThreads * i, pl = ch / (8 * kBN), t = (ch >> 3) % kBN;
      const size_t row = t < cnt ? size_t(s_tokrow[t]) : 0u;
      b_next[i] = (pl ? a.planes.lo : a.planes.hi) + row * size_t(K) + size_t(bpart) * 16;
      b_live |= unsigned(t < cnt) << i;
    }
    auto load_b = [&](int st, int kt, int bdst) {
      if (kt * kKB + (bpart >> 1) < nb) {
#pragma unroll
        for (int i = 0; i < Tl::kBChunks; i++)
          if ((b_live >> i) & 1u) cp16(sB + st * kBStage + bdst + 32 * i * L::kBRow, b_next[i]);
      }
#pragma unroll
      for (int i = 0; i < Tl::kBChunks; i++) b_next[i] += kBK;
    };
    // Groups: [scales (first tile) + A of stages 0..S-2 + B of stage 0], [B of stage 1], …
#pragma unroll
    for (int s = 0; s < kStages - 1; s++) {
      if (s < nkt) load_b(s, s, s_bdst[tid]);
      cp_commit();
    }

    int acc_hi[kFrags][4], acc_lo[kFrags][4];
#pragma unroll
    for (int f = 0; f < kFrags; f++)
#pragma unroll
      for (int r = 0; r < 4; r++) acc_hi[f][r] = 0, acc_lo[f][r] = 0;

    // One 32-column block: the two rows' tables, the A fragment decoded once, two MMAs (hi, lo
    // planes) per 8-token fragment; NF fragments (0: all of the tile's, predicated).
    const auto block = [&](auto nf_tag, const uint8_t* A, const uint8_t* B, const uint8_t* codes,
                           int4 lc, int kb, uint32_t(&w4)[4]) {
      constexpr int NF = decltype(nf_tag)::value;
      if (kb % 2 == 0) ldmatrix_x4(w4, A + (kb == 0 ? lc.y : next_block(lc.y, 32)));
      const is::ShiftedTables tl = shift_table(codes[kb]);
      const is::ShiftedTables th = shift_table(codes[kb + 8 * nb]);
      uint32_t a0, a1, a2, a3;
      decode8_shifted(w4[2 * (kb % 2)], tl, a0, a2);
      decode8_shifted(w4[2 * (kb % 2) + 1], th, a1, a3);
      const uint8_t* bk = B + next_block(lc.z, 32 * kb);
#pragma unroll
      for (int f = 0; f < (NF ? NF : kFrags); f++) {
        if (NF || f < nfrag) {
          const uint2 bh = *reinterpret_cast<const uint2*>(bk + f * 8 * L::kBRow);
          const uint2 bl = *reinterpret_cast<const uint2*>(bk + (f * 8 + kBN) * L::kBRow);
          mma_s8(acc_hi[f], a0, a1, a2, a3, bh.x, bh.y);
          mma_s8(acc_lo[f], a0, a1, a2, a3, bl.x, bl.y);
        }
      }
    };

    for (int kt = 0; kt < nkt; kt++) {
      cp_wait<kStages - 2>();
      __syncthreads();
      if (!windows_done) {
        // The scales (first group) have landed; each warp scans and rewrites its own rows.
        windows_done = true;
        scan_windows(sS, nb, warp * 16 + (lane & 15), lane, row0, a.N, s_smin, s_rowok, true);
      }
      const int4 lc = s_lane[tid];
      if (kt + kStages - 1 < nkt) {
        load_a((kt + kStages - 1) % kStages, kt + kStages - 1, lc.x);
        load_b((kt + kStages - 1) % kStages, kt + kStages - 1, s_bdst[tid]);
      }
      cp_commit();
      const int st = kt % kStages;
      const uint8_t* A = sA + st * kAStg;
      const uint8_t* B = sB + st * kBStage;
      const uint8_t* codes = sS + lc.w + kt * kKB;
      uint32_t w4[4];  // ldmatrix.x4 of two blocks: (rows lo, kb), (rows hi, kb), kb + 1 likewise
      if ((kt + 1) * kKB <= nb) {  // a whole stage (K3's widths): no per-block bound
        if (nfrag == 1) {
#pragma unroll
          for (int kb = 0; kb < kKB; kb++)
            block(std::integral_constant<int, 1>{}, A, B, codes, lc, kb, w4);
        } else {
#pragma unroll
          for (int kb = 0; kb < kKB; kb++)
            block(std::integral_constant<int, 0>{}, A, B, codes, lc, kb, w4);
        }
      } else {
#pragma unroll
        for (int kb = 0; kb < kKB; kb++)  // past nb the ldmatrix's second block is stale
          if (kt * kKB + kb < nb) block(std::integral_constant<int, 0>{}, A, B, codes, lc, kb, w4);
      }
    }
    cp_wait<0>();

    // Epilogue: fragment element r of fragment f is (row gid + 8·(r ≥ 2), token 8f + 2·tig + r%2).
#pragma unroll
    for (int f = 0; f < kFrags; f++) {
      if (f >= nfrag) continue;
#pragma unroll
      for (int r = 0; r < 4; r++)
        store_output(a, row0, pt, cnt, r >= 2 ? r_hi : r_lo, f * 8 + 2 * tig + (r & 1),
                     acc_hi[f][r], acc_lo[f][r], s_tokst, s_tokemin, s_rowok, s_smin);
    }

    strict_rows(a, v, warp, lane, row0, pt, cnt, s_rowok, s_tokst, s_tokrow, s_bad, s_nbad);
    __syncthreads();  // the next tile rewrites the token tables and the stages
  }
}

// ---- The strip form of the same kernel, for few tokens per expert (batched decode) ----
//
// gemm_kernel at one or two tokens per expert issues ≈ 59 warp instructions per 16-row × 32-column
// block step (ncu, moe-batch M = 2: IPC 2.17, the ALU pipe 61.5 % busy, 2.3 TB/s): the weights pass
// through shared memory, every stage pays copies, barriers and per-block table lookups for all
// four blocks of a lane, and the decode of a word takes 11 ALU instructions. strip_kernel keeps
// the integer method, window scan, epilogue and strict fallback (the same bits) and issues ≈ 23
// per step:
//   - the tile's tokens' planes (≤ 8 tokens, the whole K) are copied into shared memory once per
//     token tile; the packed weights go from global memory straight into registers (a ring of D
//     stages of W·128 columns, the rows' stages PF further on prefetched into L2), and each warp
//     runs its 16 rows over the whole K without a barrier; a CTA takes R row tiles of its expert
//     in turn (the planes stay; the next tile's first stages load during the epilogue);
//   - the k slots of a mma.m16n8k32 are assigned by block: lane t owns blocks W·t … W·t + W − 1
//     of a stage (StripStage), and at step j of block b it holds elements 8j … 8j + 7 of b (slots
//     4t … 4t + 3 and 16 + 4t …), for A and B alike. A lane thus needs one 16-byte load per row
//     and block, one scale code and one table per row and block, and its B bytes of a block are 32
//     contiguous bytes per plane; with W = 2 a row's 4 lanes read a whole 128-byte line per stage
//     (W = 1: half lines, 8 % slower at M = 2 — L2 requests, not bytes, were part of the bound);
//   - the decode splits w' = p − n (p = |w'| where the sign bit is clear, else 0; n the other
//     way round): p = prmt(pos, codes) with the selector's sign-replicate mode turning negative
//     codes into 0 (the magnitudes' top bit is 0), n the same with the sign bits flipped — 7 ALU
//     instructions per 8 codes instead of 11 — and four mma per step accumulate hi·p, hi·n,
//     lo·p, lo·n; D = Σ·p − Σ·n is exact (each sum's bound is the method's, |.| < 2^31).
// Rows, warps and the epilogue map are gemm_kernel's (128 rows per CTA, warp w rows 16w …).
// What bounded the W = 1 form at three CTAs per SM (ncu, M = 2, before the L2 prefetch): the
// warps waited on their weight loads (31 % of stall samples at the first use), DRAM 62 %, L2 81 %.
constexpr int kStripTokens = 8;  // one n8 fragment per token tile
constexpr int kStripPad = 16;    // bytes after a token's plane row at W = 1 (StripStage::row)

// A stage of W·128 columns: lane t of a row owns blocks W·t … W·t + W − 1 of it. W = 2 makes a
// row's 4 lanes read one whole 128-byte line per stage. Its B chunks (16 bytes) are swizzled,
// chunk c of a token row at c ^ ((c / 8) mod 2), and rows padded by 32 bytes, so that a
// quarter-warp's 16-byte B loads (2 tokens × 4 lanes) fall on 8 distinct bank groups.
template <int W>
struct StripStage {
  static constexpr int kBlocks = 4 * W, kCols = kBK * W;
  __host__ __device__ static constexpr int row(int K) { return K + (W == 2 ? 32 : kStripPad); }
  __device__ static int chunk(int c) { return W == 2 ? c ^ ((c >> 3) & 1) : c; }
};

template <int W>
constexpr size_t strip_smem(int K) {
  // hi and lo planes of the tile's tokens, the rows' scale codes, slack for the partial stage's
  // (never used) reads past the last row
  return size_t(2) * kStripTokens * size_t(StripStage<W>::row(K)) +
         size_t(kBM) * size_t(K / c::kBlock) + 256;
}

// Brings the line at p into L2 (no registers held; strip_kernel's weight rows PF stages ahead).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

// p and n of 8 codes: bytes of |w'| for codes 0–3 (lo) and 4–7 (hi) of a packed word.
__device__ __forceinline__ void decode8_pn(uint32_t codes, uint32_t pos0, uint32_t pos1,
                                           uint32_t& p_lo, uint32_t& p_hi, uint32_t& n_lo,
                                           uint32_t& n_hi) {
  const uint32_t flip = codes ^ 0x88888888u;
  p_lo = prmt(pos0, pos1, codes);
  p_hi = prmt(pos0, pos1, codes >> 16);
  n_lo = prmt(pos0, pos1, flip);
  n_hi = prmt(pos0, pos1, flip >> 16);
}

template <int D, int PF, int R, int MINB, int W>
__global__ void __launch_bounds__(kThreads, MINB) strip_kernel(GemmArgs a) {
  using Sw = StripStage<W>;
  constexpr int kSK = Sw::kBlocks, kSBK = Sw::kCols;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int32_t s_smin[kBM], s_rowok[kBM];
  __shared__ int32_t s_tokrow[kStripTokens], s_tokemin[kStripTokens], s_tokst[kStripTokens],
      s_bad[kStripTokens];
  __shared__ int32_t s_nbad;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int g = blockIdx.y, tile0 = blockIdx.x * R;
  const int p0 = a.group_offsets[g], p1 = a.group_offsets[g + 1];
  if (p1 <= p0 || tile0 * kBM >= a.N) return;
  const int ntiles = min(R, (a.N + kBM - 1) / kBM - tile0);
  if (tid <= is::kMaxWeightShift) s_tab[tid] = is::shifted_tables(tid);
  const Mxfp4ExpertView v = a.experts[g];
  const int K = a.K, nb = K / c::kBlock, nkt = (nb + kSK - 1) / kSK, prow = Sw::row(K);
  uint8_t* const sHi = smem;
  uint8_t* const sLo = sHi + kStripTokens * prow;
  uint8_t* const sS = sLo + kStripTokens * prow;      // [kBM, nb] scale codes of the row tile
  const int r_lo = warp * 16 + gid, r_hi = r_lo + 8;  // this lane's rows of a row tile

  // The weight stream of this lane's two rows: ws_lo / ws_hi the next stage to load (blocks
  // kSK·kt + W·tig + u, u < W); checked: the last stage may be partial (past the row's end, zero
  // codes decode to zero weights). start_rows points it at a row tile's first stage and loads D
  // stages.
  const uint8_t *ws_lo = nullptr, *ws_hi = nullptr;
  int next_kt = 0;
  uint4 wl[D][W], wh[D][W];
  const auto load_w = [&](auto checked, uint4(&l)[W], uint4(&h)[W]) {
#pragma unroll
    for (int u = 0; u < W; u++) {
      if (!decltype(checked)::value || next_kt * kSK + W * tig + u < nb) {
        l[u] = __ldg(reinterpret_cast<const uint4*>(ws_lo) + u);
        h[u] = __ldg(reinterpret_cast<const uint4*>(ws_hi) + u);
      } else {
        l[u] = make_uint4(0u, 0u, 0u, 0u), h[u] = l[u];
      }
    }
    ws_lo += kSBK / 2, ws_hi += kSBK / 2, next_kt++;
  };
  const std::true_type checked;
  const std::false_type unchecked;
  const auto start_rows = [&](int row0) {
    const uint8_t* sc;
    row_source(a, v, row0 + r_lo, ws_lo, sc);
    row_source(a, v, row0 + r_hi, ws_hi, sc);
    ws_lo += tig * 16 * W, ws_hi += tig * 16 * W, next_kt = 0;
#pragma unroll
    for (int d = 0; d < D; d++)
      if (d < nkt) load_w(checked, wl[d], wh[d]);
  };

  for (int pt = p0; pt < p1; pt += kStripTokens) {
    const int cnt = min(kStripTokens, p1 - pt);
    // The first row tile's codes and weights, the token tables (warp 0: lane t for token t;
    // s_bad by ballot, so no atomics) and the tile's planes (each copy looks its token's row up
    // itself: no round trip through the tables first), then one wait and one barrier for all.
    load_scale_codes(a, v, tile0 * kBM, nb, sS, tid, kThreads);
    start_rows(tile0 * kBM);
    if (warp == 0) {
      int row = 0, em = 0, st = is::kTokenOk;
      if (lane < cnt) {
        const int p = pt + lane;
        row = a.row_map ? __ldg(a.row_map + p) : p;
        em = __ldg(a.planes.meta + 2 * size_t(row));
        st = __ldg(a.planes.meta + 2 * size_t(row) + 1);
      }
      const bool bad = lane < cnt && st == is::kTokenSpan;
      const unsigned m = __ballot_sync(0xffffffffu, bad);
      if (bad) s_bad[__popc(m & ((1u << lane) - 1u))] = lane;
      if (lane < kStripTokens) s_tokrow[lane] = row, s_tokemin[lane] = em, s_tokst[lane] = st;
      if (lane == 0) s_nbad = __popc(m);
    }
    // Plane chunk i: 16-byte piece i mod (K/16) of token (i / (K/16)) mod cnt, plane
    // i / (cnt·K/16).
    {
      const int cpr = K / 16, per_plane = cnt * cpr;
      for (int i = tid; i < 2 * per_plane; i += kThreads) {
        const int pl = i >= per_plane, j = pl ? i - per_plane : i;
        const int t = j / cpr, ch = j - t * cpr;
        const int row = a.row_map ? __ldg(a.row_map + pt + t) : pt + t;
        const size_t src = size_t(row) * size_t(K) + size_t(ch) * 16;
        cp16((pl ? sLo : sHi) + t * prow + Sw::chunk(ch) * 16,
             (pl ? a.planes.lo : a.planes.hi) + src);
      }
    }
    cp_commit();

    for (int rt = 0; rt < ntiles; rt++) {
      const int row0 = (tile0 + rt) * kBM;
      if (rt > 0) load_scale_codes(a, v, row0, nb, sS, tid, kThreads), cp_commit();
      cp_wait<0>();
      __syncthreads();  // codes (and at rt = 0 the planes and token tables) have landed
      scan_windows(sS, nb, warp * 16 + (lane & 15), lane, row0, a.N, s_smin, s_rowok, true);

      int hp[4] = {0, 0, 0, 0}, hn[4] = {0, 0, 0, 0}, lp[4] = {0, 0, 0, 0}, ln[4] = {0, 0, 0, 0};
      // This lane's scale codes (offsets of their tables in s_tab after the window scan) and B
      // bytes of the next stage to compute.
      const uint8_t *cd_lo = sS + r_lo * nb + W * tig, *cd_hi = sS + r_hi * nb + W * tig;
      // B: chunk e of the lane's 2·W chunks of a stage at 16·(e ^ sx) (Sw::chunk's swizzle).
      const int sx = W == 2 ? (tig >> 1) : 0;
      const uint8_t *bh = sHi + gid * prow + tig * 32 * W, *bl = sLo + gid * prow + tig * 32 * W;
      int stage_kt = 0;
      // One stage: the lane's W blocks W·(kSK/W·kt + tig) + u of both rows, four steps of 8
      // elements each.
      const auto stage = [&](auto checked_tag, const uint4(&w_lo)[W], const uint4(&w_hi)[W]) {
        const uint8_t* const tab = reinterpret_cast<const uint8_t*>(s_tab);
#pragma unroll
        for (int u = 0; u < W; u++) {
          // Past the row's end (a partial last stage) the weights are zero: any table will do.
          const bool in = !decltype(checked_tag)::value || stage_kt * kSK + W * tig + u < nb;
          const uint2 tl = *reinterpret_cast<const uint2*>(tab + (in ? cd_lo[u] : 0));
          const uint2 th = *reinterpret_cast<const uint2*>(tab + (in ? cd_hi[u] : 0));
          const uint32_t cl[4] = {w_lo[u].x, w_lo[u].y, w_lo[u].z, w_lo[u].w};
          const uint32_t ch[4] = {w_hi[u].x, w_hi[u].y, w_hi[u].z, w_hi[u].w};
#pragma unroll
          for (int h = 0; h < 2; h++) {
            const int e = (2 * u + h) ^ sx;
            const uint4 qh = *reinterpret_cast<const uint4*>(bh + 16 * e);
            const uint4 ql = *reinterpret_cast<const uint4*>(bl + 16 * e);
#pragma unroll
            for (int s = 0; s < 2; s++) {
              const int j = 2 * h + s;
              uint32_t pa0, pa2, na0, na2, pa1, pa3, na1, na3;
              decode8_pn(cl[j], tl.x, tl.y, pa0, pa2, na0, na2);
              decode8_pn(ch[j], th.x, th.y, pa1, pa3, na1, na3);
              const uint32_t bh0 = s ? qh.z : qh.x, bh1 = s ? qh.w : qh.y;
              const uint32_t bl0 = s ? ql.z : ql.x, bl1 = s ? ql.w : ql.y;
              mma_s8(hp, pa0, pa1, pa2, pa3, bh0, bh1);
              mma_s8(lp, pa0, pa1, pa2, pa3, bl0, bl1);
              mma_s8(hn, na0, na1, na2, na3, bh0, bh1);
              mma_s8(ln, na0, na1, na2, na3, bl0, bl1);
            }
          }
        }
        cd_lo += kSK, cd_hi += kSK, bh += kSBK, bl += kSBK, stage_kt++;
      };
      // D stages per trip: stage kt + d from slot d while the next D − 1 are in flight, then the
      // slot takes kt + d + D; the rows' stages PF ahead of the loads are prefetched into L2.
      // Whole stages (K a multiple of 128, K3's widths) run unchecked until the last D.
      int kt = 0;
      if (nb % kSK == 0) {
        for (; kt + 2 * D <= nkt; kt += D) {
#pragma unroll
          for (int d = 0; d < D; d++) {
            stage(unchecked, wl[d], wh[d]);
            if (PF > 0 && tig == 0 && kt + d + D + PF < nkt) {
              prefetch_l2(ws_lo + PF * (kSBK / 2));
              prefetch_l2(ws_hi + PF * (kSBK / 2));
            }
            load_w(unchecked, wl[d], wh[d]);
          }
        }
      }
      for (; kt < nkt; kt += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
          if (kt + d < nkt) {
            stage(checked, wl[d], wh[d]);
            if (kt + d + D < nkt) load_w(checked, wl[d], wh[d]);
          }
        }
      }
      // The next row tile's first stages go out now, in flight during this tile's epilogue.
      if (rt + 1 < ntiles) start_rows(row0 + kBM);

        // Epilogue: element r is (row gid + 8·(r ≥ 2), token 2·tig + r%2), D = Σ·p − Σ·n per plane.
#pragma unroll
      for (int r = 0; r < 4; r++)
        store_output(a, row0, pt, cnt, r >= 2 ? r_hi : r_lo, 2 * tig + (r & 1), hp[r] - hn[r],
                     lp[r] - ln[r], s_tokst, s_tokemin, s_rowok, s_smin);
      strict_rows(a, v, warp, lane, row0, pt, cnt, s_rowok, s_tokst, s_tokrow, s_bad, s_nbad);
      // The next row tile rewrites the codes and windows, the next token tile the token tables
      // and planes; after the last, nothing waits.
      if (rt + 1 < ntiles || pt + kStripTokens < p1) __syncthreads();
    }
  }
}

// ---- The warp-specialized wgmma form of the same kernel (ExpertPath::wgmma; sm_90a) ----
//
// Same integer method, 128-row tiles, window scan, epilogue and strict fallback as gemm_kernel;
// the work is split by roles instead of every warp doing everything:
//   producer warpgroup (warps 0–3): streams the rows' packed weights through a ring of packed
//     stages (cp.async, PD stages ahead), decodes each 32-column block once into the shifted int8
//     weights w' = w2 · 2^sw in a ring of SA A stages, and publishes a stage on its `full` mbarrier
//     (after a proxy fence); past the row's end it writes zero weights, so every stage has 4
//     blocks;
//   two consumer warpgroups (warps 4–7: rows 0–63, warps 8–11: rows 64–127): copy the tile's
//     tokens' two planes into a ring of SB B stages (cp.async, SB − 2 stages ahead: a thread's
//     queue holds only its own kind of copies, so each stream waits for its own), and per 32-column
//     block issue two wgmma.mma_async m64nNk32 s32.s8.s8 (hi and lo planes) with both operands
//     read from shared memory by descriptors; an A slot is released on its `empty` mbarrier once
//     the next stage's wgmmas are issued and the slot's own have completed (wait_group 1).
// So the decode, the copies and the tensor cores overlap: the decode costs the producer's issue
// slots, not the consumers', and each weight is decoded once per token tile.
// Shared-memory layouts (K-major, no swizzle; a core matrix is 8 rows × 16 bytes = 128 contiguous
// bytes; descriptors: leading-dimension offset 128 B = the next 16 columns, stride offset = the
// next 8 rows or tokens):
//   A stage (4 blocks of 4 KB, 4128 bytes apart): row r, column 32·kb + 16·kc + j at kb·4128 +
//     (r / 8)·256 + kc·128 + (r mod 8)·16 + j (stride offset 256 B); consumer warpgroup c starts
//     2048·c into each block. The 32-byte skew between blocks puts the 16-byte stores of a decode
//     quarter-warp (2 rows × 4 blocks) in distinct banks;
//   B stage: plane p, token t, column 16·ch + j (ch = 2·kb + kc) at p·BN·128 + (t / 8)·1024 +
//     ch·128 + (t mod 8)·16 + j (stride offset 1024 B);
//   packed stage (8 KB): row r's 64 packed bytes of the stage at r·64.
// N (tokens per wgmma) is the tile's count rounded up to a quarter of BN (8 or 16 at BN = 16);
// columns past the count read stale shared memory and are never stored.
template <int N>
__device__ __forceinline__ void wgmma_ss(int* d, uint64_t da, uint64_t db);
template <>
__device__ __forceinline__ void wgmma_ss<8>(int* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.s32.s8.s8 {%0, %1, %2, %3}, %4, %5, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_ss<16>(int* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, "
      "p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7])
      : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_ss<24>(int* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %14, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n24k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11}, %12, %13, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11])
      : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_ss<32>(int* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15}, %16, %17, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15])
      : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_ss<48>(int* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]),
        "+r"(d[21]), "+r"(d[22]), "+r"(d[23])
      : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_ss<64>(int* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, "
      "%28, %29, %30, %31}, %32, %33, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]),
        "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]),
        "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_ss<96>(int* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, "
      "%28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47}, %48, %49, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]),
        "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]),
        "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]),
        "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]),
        "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47])
      : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_ss<128>(int* d, uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
      "%10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, "
      "%28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]),
        "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]),
        "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]),
        "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]),
        "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]),
        "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]),
        "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]),
        "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]),
        "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]),
        "+r"(d[63])
      : "l"(da), "l"(db), "r"(1));
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return unsigned(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(b))
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  unsigned done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, 1000000;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
  } while (!done);
}
// Pins an accumulator register around the wgmmas (no code): keeps ptxas from moving it between
// them, which would need a compiler-inserted warpgroup.arrive.
__device__ __forceinline__ void pin(int& r) {
  asm volatile("" : "+r"(r)::"memory");
}
// Named barrier of `count` threads (ids 1 and 2; 0 is __syncthreads).
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Shared-memory matrix descriptor (no swizzle): start address, leading- and stride-dimension byte
// offsets, each in 16-byte units.
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t addr = smem_u32(p);
  return uint64_t((addr & 0x3FFFFu) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32);
}

constexpr int kCoreBytes = 128;            // one 8 × 16-byte core matrix
constexpr int kCoreGroup = 1024;           // B: the next 8 tokens of one stage
constexpr int kACoreGroup = 256;           // A: the next 8 rows of one block
constexpr int kABlock = 4096 + 32;         // A: one block's 128 rows, skewed by 32 bytes
constexpr int kWsConsumers = 256;          // two warpgroups
constexpr int kWsAStage = kKB * kABlock;   // decoded int8 weights of a stage (16.1 KB)
constexpr int kWsPkStage = kBM * kBK / 2;  // packed weights of a stage: 8 KB
static_assert(kBM == 128 && kKB == 4, "the producer's maps: 16 passes of 8 rows × 4 blocks");
static_assert(kWsAStage % 128 == 0 && kABlock % 16 == 0, "descriptor alignment");

// BN tokens per tile; one producer warpgroup; SA decoded-weight stages (the decode runs up to
// SA − 1 stages ahead of the wgmmas), SB plane stages (copied SB − 2 stages ahead: their latency is
// an L2 or DRAM trip), packed weights PD stages ahead in PD + 1 slots; MINB CTAs per SM.
template <int BN, int SA, int SB, int PD, int MINB>
struct WsTile {
  static constexpr int kProducers = 128, kThreads = kProducers + kWsConsumers;
  static constexpr int kItems = 4;  // (row, block) items a producer thread decodes per stage
  static constexpr int kBStage = 2 * BN * kBK;  // hi and lo planes
  // The consumers' plane copies (issue_b): from BN = 32 on, 32 tokens of 8 chunks per pass of the
  // 256 threads; at BN = 16 one chunk per thread.
  static_assert(BN >= 32 ? kWsConsumers == 32 * (kBK / 16) : kWsConsumers == 2 * BN * (kBK / 16),
                "the consumers' plane-copy map");
  static_assert(BN == 16 || BN == 32 || BN == 64 || BN == 128,
                "wgmma N: the quarters of BN must be s8 widths");
  static_assert(SA >= 2 && SB >= 3 && PD >= 1, "B slots: kt − 2 is refilled at stage kt");
  static size_t smem(int nb) {
    return size_t(SA) * kWsAStage + size_t(SB) * kBStage + size_t(PD + 1) * kWsPkStage +
           size_t(kBM) * nb;
  }
};

template <int BN, int SA, int SB, int PD, int MINB>
__global__ void __launch_bounds__(WsTile<BN, SA, SB, PD, MINB>::kThreads, MINB)
    wgmma_kernel(GemmArgs a) {
  using Tl = WsTile<BN, SA, SB, PD, MINB>;
  constexpr int kBStage = Tl::kBStage, kPk = PD + 1, kDB = SB - 2;
  constexpr int kProducers = Tl::kProducers, kThreadsAll = Tl::kThreads, kItems = Tl::kItems;
  // Instruction widths for tiles of up to BN/4 and 3·BN/4 tokens (BN = 16: 8 and 16).
  constexpr int kNq1 = BN == 16 ? 8 : BN / 4, kNq3 = BN == 16 ? 16 : 3 * BN / 4;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const sA = smem;                   // SA decoded stages
  uint8_t* const sB = sA + SA * kWsAStage;    // SB plane stages
  uint8_t* const sP = sB + SB * kBStage;      // kPk packed stages
  uint8_t* const sS = sP + kPk * kWsPkStage;  // [kBM, nb] scale codes
  // full[a]: the stage in A slot a is decoded (producers arrive); empty[a]: the consumers' wgmmas
  // of that stage are done.
  __shared__ __align__(8) uint64_t full[SA], empty[SA];
  __shared__ int32_t s_smin[kBM], s_rowok[kBM];
  __shared__ int32_t s_tokrow[BN], s_tokemin[BN], s_tokst[BN], s_bad[BN];
  __shared__ int32_t s_nbad;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = blockIdx.y, row0 = blockIdx.x * kBM;
  const int p0 = a.group_offsets[g], p1 = a.group_offsets[g + 1];
  if (p1 <= p0 || row0 >= a.N) return;
  const Mxfp4ExpertView v = a.experts[g];
  const int K = a.K, nb = K / c::kBlock, nkt = (nb + kKB - 1) / kKB;
  // Warp-uniform by construction (a shuffle from lane 0), so that ptxas sees the roles' branches
  // and the wgmma widths below as uniform and does not serialize the wgmmas.
  const bool producer = __shfl_sync(0xffffffffu, tid < kProducers, 0) != 0;
  if (tid <= is::kMaxWeightShift) s_tab[tid] = is::shifted_tables(tid);
  if (tid == 0) {
    for (int s = 0; s < SA; s++)
      mbar_init(&full[s], kProducers), mbar_init(&empty[s], kWsConsumers);
  }

  // Producer: its 16-byte packed chunks (rows tid / 4 + 32·i, block tid mod 4 of each
  // stage).
  constexpr int kRowStep = kProducers / 4;
  const uint8_t* pk_src[kItems];
  const int pkb = tid & 3;
  if (producer) {
#pragma unroll
    for (int i = 0; i < kItems; i++) {
      const uint8_t* sc;
      row_source(a, v, row0 + (tid >> 2) + kRowStep * i, pk_src[i], sc);
      pk_src[i] += pkb * 16;
    }
  }
  auto issue_packed = [&](int kt) {
    if (kt * kKB + pkb < nb) {
      uint8_t* const d = sP + (kt % kPk) * kWsPkStage + (tid >> 2) * (kBK / 2) + pkb * 16;
#pragma unroll
      for (int i = 0; i < kItems; i++)
        cp16(d + kRowStep * i * (kBK / 2), pk_src[i] + size_t(kt) * (kBK / 2));
    }
  };

  // The scale codes and the first tile's first packed stages, then the windows (consumer warps:
  // 16 rows each; the producer decodes with the rewritten codes).
  load_scale_codes(a, v, row0, nb, sS, tid, kThreadsAll);
  if (producer)
    for (int s = 0; s < PD && s < nkt; s++) issue_packed(s);
  cp_commit();
  cp_wait<0>();
  __syncthreads();
  if (!producer)
    scan_windows(sS, nb, (warp - 4) * 16 + (lane & 15), lane, row0, a.N, s_smin, s_rowok, true);
  __syncthreads();

  int it0 = 0;  // stages of the CTA before this tile (the A ring's sequence number)
  for (int pt = p0; pt < p1; pt += BN) {
    const int cnt = min(BN, p1 - pt);
    // The N = nq·BN/4 instruction covers the tile.
    const int nq = __shfl_sync(0xffffffffu, (cnt * 4 + BN - 1) / BN, 0);
    if (tid < BN) {
      int row = 0, em = 0, st = is::kTokenOk;
      if (tid < cnt) {
        const int p = pt + tid;
        row = a.row_map ? __ldg(a.row_map + p) : p;
        em = __ldg(a.planes.meta + 2 * size_t(row));
        st = __ldg(a.planes.meta + 2 * size_t(row) + 1);
      }
      s_tokrow[tid] = row, s_tokemin[tid] = em, s_tokst[tid] = st;
    }
    if (tid == 0) s_nbad = 0;
    __syncthreads();

    if (producer) {
      // Packed stages PD ahead; this thread's cp.async queue holds only them, so stage kt's are
      // in the PD'th newest group at iteration kt (a later tile's prologue: PD groups).
      if (pt > p0) {
        for (int s = 0; s < PD; s++) {
          if (s < nkt) issue_packed(s);
          cp_commit();
        }
      }
      // The decode's map: lane l of warp w (of 4) decodes block l mod 4 of row
      // 8·(w + 4·i) + 2·(l / 8) + (l mod 8) / 4 for i < 4 (a quarter-warp: 2 rows × 4 blocks,
      // 128 contiguous packed bytes).
      const int dkb = lane & 3, drow = 8 * warp + 2 * (lane >> 3) + ((lane & 7) >> 2);
      constexpr int kPass = 8 * 4;  // rows between a thread's items
      for (int kt = 0; kt < nkt; kt++) {
        const int it = it0 + kt;
        cp_wait<PD - 1>();        // this thread's packed chunks of stage kt have landed
        bar_sync(1, kProducers);  // every producer's; and stage kt − 1 is decoded by all
        if (kt + PD < nkt) issue_packed(kt + PD);  // into stage kt − 1's slot
        cp_commit();
        mbar_wait(&empty[it % SA], ((it / SA) & 1) ^ 1);  // the A slot's last wgmmas are done
        const int b = kt * kKB + dkb;
        uint8_t* const A = sA + (it % SA) * kWsAStage + dkb * kABlock;
        if (b >= nb) {  // past the row's end (a partial last stage): zero weights
#pragma unroll
          for (int i = 0; i < kItems; i++) {
            const int r = drow + kPass * i;
            uint8_t* const d = A + (r >> 3) * kACoreGroup + (r & 7) * 16;
            *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
            *reinterpret_cast<uint4*>(d + kCoreBytes) = make_uint4(0u, 0u, 0u, 0u);
          }
        } else {
          const uint8_t* const P = sP + (kt % kPk) * kWsPkStage;
#pragma unroll
          for (int i = 0; i < kItems; i++) {
            const int r = drow + kPass * i;
            const uint4 w = *reinterpret_cast<const uint4*>(P + r * (kBK / 2) + 16 * dkb);
            const is::ShiftedTables t = shift_table(sS[r * nb + b]);
            uint4 lo, hi;
            decode8_shifted(w.x, t, lo.x, lo.y);
            decode8_shifted(w.y, t, lo.z, lo.w);
            decode8_shifted(w.z, t, hi.x, hi.y);
            decode8_shifted(w.w, t, hi.z, hi.w);
            uint8_t* const d = A + (r >> 3) * kACoreGroup + (r & 7) * 16;
            *reinterpret_cast<uint4*>(d) = lo;
            *reinterpret_cast<uint4*>(d + kCoreBytes) = hi;
          }
        }
        fence_proxy_async();  // the decoded weights, visible to the wgmmas
        mbar_arrive(&full[it % SA]);
      }
      cp_wait<0>();
    } else {
      const int ctid = tid - kProducers, cw = ctid >> 5, cg = ctid >> 7;
      const int gid = lane >> 2, tig = lane & 3;
      if (ctid < cnt && s_tokst[ctid] == is::kTokenSpan) s_bad[atomicAdd(&s_nbad, 1)] = ctid;
      // The consumers copy the planes themselves (their cp.async queue holds only these), kDB
      // stages ahead: chunk ch = ctid + 256·i of a stage is plane ch / (8·BN), token
      // (ch / 8) mod BN, column chunk ch mod 8 (= ctid mod 8). From BN = 32 on, a thread's chunks
      // are tokens ctid / 8 + 32·j of both planes; the token's row comes from s_tokrow at each
      // copy (the registers are the accumulators').
      const int bpart = ctid & 7;
      const uint32_t bdst0 =
          uint32_t(((ctid >> 6) & 3) * kCoreGroup + bpart * kCoreBytes + ((ctid >> 3) & 7) * 16);
      auto issue_b = [&](int kt) {
        if (kt * kKB + (bpart >> 1) >= nb) return;
        uint8_t* const d = sB + ((it0 + kt) % SB) * kBStage;
        const size_t col = size_t(kt * kBK + bpart * 16);
        if constexpr (BN >= 32) {
#pragma unroll
          for (int j = 0; j < BN / 32; j++) {
            const int t = (ctid >> 3) + 32 * j;
            if (t < cnt) {
              const size_t off = size_t(s_tokrow[t]) * size_t(K) + col;
              uint8_t* const dj = d + bdst0 + j * 4 * kCoreGroup;
              cp16(dj, a.planes.hi + off);
              cp16(dj + BN * kBK, a.planes.lo + off);
            }
          }
        } else {  // BN = 16: one chunk per thread, threads 0–127 the hi plane, 128–255 the lo
          const int t = (ctid >> 3) & 15;
          if (t < cnt) {
            const int pl = ctid >> 7;
            cp16(d + pl * BN * kBK + (t >> 3) * kCoreGroup + bpart * kCoreBytes + (t & 7) * 16,
                 (pl ? a.planes.lo : a.planes.hi) + size_t(s_tokrow[t]) * size_t(K) + col);
          }
        }
      };
      for (int s = 0; s < kDB; s++) {
        if (s < nkt) issue_b(s);
        cp_commit();
      }
      // The main loop and epilogue for one wgmma width N (the tile's count rounded up to a quarter
      // of BN), instantiated per width so that every wgmma of a loop writes the same accumulator
      // registers (a width chosen inside the loop made ptxas move them between stages).
      const auto consume = [&](auto n_tag) {
        constexpr int N = decltype(n_tag)::value;
        int acc_hi[N / 2], acc_lo[N / 2];
#pragma unroll
        for (int r = 0; r < N / 2; r++) acc_hi[r] = 0, acc_lo[r] = 0;
        for (int kt = 0; kt < nkt; kt++) {
          const int it = it0 + kt;
          cp_wait<kDB - 1>();   // this thread's planes of stage kt have landed
          fence_proxy_async();  // visible to the wgmmas
          mbar_wait(&full[it % SA], (it / SA) & 1);
          // Every consumer's planes of stage kt are in; every consumer is past stage kt − 1's
          // wgmma_wait<1>, so both warpgroups are done with stage kt − 2's B slot: refill it.
          bar_sync(2, kWsConsumers);
          if (kt + kDB < nkt) issue_b(kt + kDB);
          cp_commit();
          const uint8_t* A = sA + (it % SA) * kWsAStage + cg * 8 * kACoreGroup;
          const uint8_t* B = sB + (it % SB) * kBStage;
          // Every stage has kKB blocks: past nb the producer wrote zero weights, so the stale
          // planes there add nothing.
#pragma unroll
          for (int r = 0; r < N / 2; r++) pin(acc_hi[r]), pin(acc_lo[r]);
          wgmma_fence();
#pragma unroll
          for (int kb = 0; kb < kKB; kb++) {
            const uint64_t da = smem_desc(A + kb * kABlock, kCoreBytes, kACoreGroup);
            const uint8_t* bk = B + kb * 2 * kCoreBytes;
            wgmma_ss<N>(acc_hi, da, smem_desc(bk, kCoreBytes, kCoreGroup));
            wgmma_ss<N>(acc_lo, da, smem_desc(bk + BN * kBK, kCoreBytes, kCoreGroup));
          }
          wgmma_commit();
#pragma unroll
          for (int r = 0; r < N / 2; r++) pin(acc_hi[r]), pin(acc_lo[r]);
          wgmma_wait<1>();  // the previous stage's wgmmas are done: release its A slot
          if (kt > 0) mbar_arrive(&empty[(it - 1) % SA]);
        }
        wgmma_wait<0>();
#pragma unroll
        for (int r = 0; r < N / 2; r++) pin(acc_hi[r]), pin(acc_lo[r]);
        mbar_arrive(&empty[(it0 + nkt - 1) % SA]);
        cp_wait<0>();
        bar_sync(2, kWsConsumers);  // s_bad, s_nbad

        // Epilogue, as gemm_kernel's: accumulator 4·f + r is (row gid + 8·(r ≥ 2), token
        // 8f + 2·tig + r%2) of the warp's 16 rows.
        const int r_lo = cw * 16 + gid, r_hi = r_lo + 8;
#pragma unroll
        for (int f = 0; f < N / 8; f++) {
#pragma unroll
          for (int r = 0; r < 4; r++)
            store_output(a, row0, pt, cnt, r >= 2 ? r_hi : r_lo, f * 8 + 2 * tig + (r & 1),
                         acc_hi[4 * f + r], acc_lo[4 * f + r], s_tokst, s_tokemin, s_rowok, s_smin);
        }
      };
      if (nq == 1)
        consume(std::integral_constant<int, kNq1>{});
      else if (nq == 2)
        consume(std::integral_constant<int, BN / 2>{});
      else if (nq == 3)
        consume(std::integral_constant<int, kNq3>{});
      else
        consume(std::integral_constant<int, BN>{});
      strict_rows(a, v, cw, lane, row0, pt, cnt, s_rowok, s_tokst, s_tokrow, s_bad, s_nbad);
    }
    it0 += nkt;
    __syncthreads();  // the next tile rewrites the token tables
  }
}


// ---- The register-A wgmma form of the same kernel (ExpertPath::wgmma; sm_90a) ----
//
// The shifted weights never pass through shared memory: each warp decodes its 16 rows' packed
// nibbles straight into the A fragments of `wgmma.mma_async m64nNk32 s32.s8.s8` (A from registers,
// B = the planes from shared memory), so one decode per weight and token tile feeds the Hopper
// warpgroup MMA at its full rate, with no producer round trip. Two warpgroups of 64 rows (warp w:
// rows 16w … 16w + 15, gemm_kernel's map, so the window scan, epilogue and strict fallback are
// shared) take one token tile of up to BT tokens, N = the tile's count rounded up to a width of
// the kernel's set, one wgmma per plane (hi, lo) and k-step.
//   - The k order: the planes are written by planes_kernel<true> in the order of the A fragments,
//     rs_column: per 256 columns (8 blocks) lane t of a row's quad owns blocks 2t and 2t + 1, and
//     128-column stage u of them holds block 2t + u of each lane, step j (of 4) elements 8j … 8j + 7
//     of it in slots 4t … 4t + 3 and 16 + 4t … (the mma k32 A layout). So a lane loads 32 packed
//     bytes per row and 256 columns (a row's 4 lanes: one 128-byte line), decodes word j of its
//     block for step j, and needs one table per row and block; rows are padded to a multiple of
//     256 (zero planes past K, zero weights past nb).
//   - The planes of the tile's tokens go through a ring of SB stages of 128 columns by cp.async
//     (SB − 2 ahead; K-major, no swizzle, wgmma_kernel's B map); the packed weights from global
//     memory into a register ring of D stages of 256 columns, PF further ones prefetched into L2.
//   - Per stage: decode 4 steps' A fragments, one wgmma.fence, 8 wgmmas, commit, wait until the
//     stage before is done (so its A registers and, at the next barrier, its plane slot are free).
constexpr int kRsSuper = 256;  // columns per weight load (8 blocks)
constexpr int kRsStage = 128;  // columns per plane stage (4 k-steps)

__host__ __device__ constexpr int rs_stride(int K) {
  return (K + kRsSuper - 1) / kRsSuper * kRsSuper;
}
static_assert(kRsSuper == kPlaneRowAlign, "paths.h sizes the planes for this stride");

// The source column of position p of a plane row in the register-A form's order.
__device__ __forceinline__ int rs_column(int p) {
  const int m = p >> 8, u = (p >> 7) & 1, j = (p >> 5) & 3, k = p & 31;
  return 32 * (8 * m + 2 * ((k >> 2) & 3) + u) + 8 * j + 4 * (k >> 4) + (k & 3);
}

template <int N>
__device__ __forceinline__ void wgmma_rs(int* d, const uint32_t (&a)[4], uint64_t db);
template <>
__device__ __forceinline__ void wgmma_rs<8>(int* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %8, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.s32.s8.s8 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %9, "
      "p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(1), "l"(db));
}
template <>
__device__ __forceinline__ void wgmma_rs<16>(int* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %12, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, "
      "%9, %10, %11}, %13, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(1), "l"(db));
}
template <>
__device__ __forceinline__ void wgmma_rs<24>(int* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %16, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n24k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11}, {%12, %13, %14, %15}, %17, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(1), "l"(db));
}
template <>
__device__ __forceinline__ void wgmma_rs<32>(int* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %20, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %21, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(1), "l"(db));
}
template <>
__device__ __forceinline__ void wgmma_rs<48>(int* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %28, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, {%24, %25, "
      "%26, %27}, %29, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(1), "l"(db));
}
template <>
__device__ __forceinline__ void wgmma_rs<64>(int* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %36, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %37, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(1), "l"(db));
}
template <>
__device__ __forceinline__ void wgmma_rs<96>(int* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %52, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47}, {%48, %49, %50, %51}, %53, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(1), "l"(db));
}
template <>
__device__ __forceinline__ void wgmma_rs<128>(int* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %68, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
      "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
      "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "
      "%61, %62, %63}, {%64, %65, %66, %67}, %69, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(1), "l"(db));
}

template <int BT, int SB, int DS, int BM>
struct RsTile {
  static constexpr int kThreads = 2 * BM;  // a warpgroup per 64 rows
  static constexpr int kBStage = 2 * BT * kRsStage;                // hi then lo plane
  static constexpr int kChunks = 2 * BT * (kRsStage / 16) / kThreads;  // copies per thread
  // DS > 0: the packed weights through a ring of DS 256-column stages in shared memory (rows of
  // 128 bytes padded to 144: a quarter-warp's 16-byte loads of 2 rows × 4 lanes hit distinct banks)
  static constexpr int kWRow = kRsSuper / 2 + 16, kWStage = BM * kWRow;
  static constexpr int kWChunks = BM * (kRsSuper / 32) / kThreads;  // 4 copies per thread
  static_assert(BT % 16 == 0 && kChunks * kThreads == 2 * BT * (kRsStage / 16), "copy map");
  static_assert(SB >= 3, "plane slot kt − 2 is refilled at stage kt");
  static_assert(DS == 0 || SB <= 2 * DS, "weight stage m lands by plane stage 2m");
  static size_t smem(int nb) {
    return size_t(SB) * kBStage + size_t(DS) * kWStage + size_t(BM) * nb;
  }
};

// The instruction widths of a BT-token tile: the tile's count rounded up to BT/4, BT/2, 3·BT/4 or
// BT.
template <int BT, int D, int SB, int PF, int MINB, int DS, int BM>
__global__ void __launch_bounds__(2 * BM, MINB) rs_kernel(GemmArgs a) {
  using Tl = RsTile<BT, SB, DS, BM>;
  constexpr int kBStage = Tl::kBStage, kWRow = Tl::kWRow, kWStage = Tl::kWStage;
  constexpr int kThreads = Tl::kThreads;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* const sB = smem;                  // SB plane stages
  uint8_t* const sW = sB + SB * kBStage;     // DS weight stages
  uint8_t* const sS = sW + DS * kWStage;     // [kBM, nb] scale codes
  __shared__ int32_t s_smin[BM], s_rowok[BM];
  __shared__ int32_t s_tokrow[BT], s_tokemin[BT], s_tokst[BT], s_bad[BT];
  __shared__ int32_t s_nbad;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int g = blockIdx.y, row0 = blockIdx.x * BM;
  const int p0 = a.group_offsets[g], p1 = a.group_offsets[g + 1];
  if (p1 <= p0 || row0 >= a.N) return;
  if (tid <= is::kMaxWeightShift) s_tab[tid] = is::shifted_tables(tid);
  const Mxfp4ExpertView v = a.experts[g];
  const int K = a.K, nb = K / c::kBlock, Kp = rs_stride(K), nkt = Kp / kRsStage, nm = nkt / 2;
  const int r_lo = warp * 16 + gid, r_hi = r_lo + 8;
  load_scale_codes(a, v, row0, nb, sS, tid, kThreads, BM);
  cp_commit();
  bool windows_done = false;
  // This lane's 32 bytes of rows r_lo and r_hi in the first 256 columns.
  const uint8_t *w_lo0, *w_hi0;
  {
    const uint8_t* sc;
    row_source(a, v, row0 + r_lo, w_lo0, sc);
    row_source(a, v, row0 + r_hi, w_hi0, sc);
    w_lo0 += 32 * tig, w_hi0 += 32 * tig;
  }

  for (int pt = p0; pt < p1; pt += BT) {
    const int cnt = min(BT, p1 - pt);
    if (tid < BT) {
      int row = 0, em = 0, st = is::kTokenOk;
      if (tid < cnt) {
        const int p = pt + tid;
        row = a.row_map ? __ldg(a.row_map + p) : p;
        em = __ldg(a.planes.meta + 2 * size_t(row));
        st = __ldg(a.planes.meta + 2 * size_t(row) + 1);
      }
      s_tokrow[tid] = row, s_tokemin[tid] = em, s_tokst[tid] = st;
    }
    if (tid == 0) s_nbad = 0;
    __syncthreads();
    if (tid < cnt && s_tokst[tid] == is::kTokenSpan) s_bad[atomicAdd(&s_nbad, 1)] = tid;
    // Plane chunk i = tid + 256·q of a stage: column chunk i mod 8, plane (i / 8) mod 2, token
    // i / 16 (at 1024·(t / 8) + 128·chunk + 16·(t mod 8) of its plane: wgmma_kernel's B map).
    const int bch = tid & 7, bpl = (tid >> 3) & 1;
    auto issue_b = [&](int kt) {
      uint8_t* const d = sB + (kt % SB) * kBStage + bpl * BT * kRsStage + bch * kCoreBytes;
      const int8_t* const src = (bpl ? a.planes.lo : a.planes.hi) + kt * kRsStage + bch * 16;
#pragma unroll
      for (int q = 0; q < Tl::kChunks; q++) {
        const int t = (tid >> 4) + (kThreads / 16) * q;
        if (t < cnt)
          cp16(d + (t >> 3) * kCoreGroup + (t & 7) * 16, src + size_t(s_tokrow[t]) * size_t(Kp));
      }
    };
    // DS > 0: weight copy i = tid + 256·q of a 256-column stage: row i / 8, 16-byte chunk i mod 8
    // (block 8m + i mod 8 of the row).
    const int wch = tid & 7;
    auto issue_w = [&](int m) {
      uint8_t* const d = sW + (m % DS) * kWStage + wch * 16;
      if (8 * m + wch >= nb) return;  // past the row's end: never decoded (zero weights)
#pragma unroll
      for (int q = 0; q < Tl::kWChunks; q++) {
        const int r = (tid >> 3) + (kThreads / 8) * q;
        const uint8_t *pk, *sc;
        row_source(a, v, row0 + r, pk, sc);
        cp16(d + r * kWRow, pk + size_t(m) * (kRsSuper / 2) + wch * 16);
        if (PF > 0 && wch == 0 && m + PF < nm) prefetch_l2(pk + size_t(m + PF) * (kRsSuper / 2));
      }
    };
    if constexpr (DS > 0) {
      for (int m = 0; m < DS - 1; m++)
        if (m < nm) issue_w(m);
    }
    for (int s = 0; s < SB - 2; s++) {
      if (s < nkt) issue_b(s);
      cp_commit();
    }

    const auto consume = [&](auto n_tag) {
      constexpr int N = decltype(n_tag)::value;
      int acc_hi[N / 2], acc_lo[N / 2];
#pragma unroll
      for (int r = 0; r < N / 2; r++) acc_hi[r] = 0, acc_lo[r] = 0;
      // The weight ring: slot d holds 256-column stage m (blocks 8m + 2·tig, + 1 of both rows).
      const uint8_t *wsl = w_lo0, *wsh = w_hi0;
      int next_m = 0;
      uint4 wl[D][2], wh[D][2];
      const auto load_w = [&](uint4(&l)[2], uint4(&h)[2]) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
          if (8 * next_m + 2 * tig + u < nb) {
            l[u] = __ldg(reinterpret_cast<const uint4*>(wsl) + u);
            h[u] = __ldg(reinterpret_cast<const uint4*>(wsh) + u);
          } else {
            l[u] = make_uint4(0u, 0u, 0u, 0u), h[u] = l[u];
          }
        }
        wsl += kRsSuper / 2, wsh += kRsSuper / 2, next_m++;
      };
      if constexpr (DS == 0) {
#pragma unroll
        for (int d = 0; d < D; d++)
          if (d < nm) load_w(wl[d], wh[d]);
      }

      // Plane stage kt = 2m + u from the weights ql / qh of the lane's block 8m + 2·tig + u.
      const auto stage = [&](int kt, const uint4 ql_in, const uint4 qh_in) {
        cp_wait<SB - 3>();    // this thread's planes of stage kt have landed
        fence_proxy_async();  // visible to the wgmmas
        __syncthreads();      // everyone's; and every wgmma of stage kt − 2 is done
        if (!windows_done) {  // the codes (the first group) have landed too
          windows_done = true;
          scan_windows(sS, nb, warp * 16 + (lane & 15), lane, row0, a.N, s_smin, s_rowok, true);
        }
        if (kt + SB - 2 < nkt) issue_b(kt + SB - 2);
        // The weight slot of 256-column stage m − 1, last read at plane stage 2m − 1.
        if (DS > 0 && (kt & 1) == 0 && (kt >> 1) + DS - 1 < nm) issue_w((kt >> 1) + DS - 1);
        cp_commit();
        const int b = 8 * (kt >> 1) + 2 * tig + (kt & 1);
        uint4 ql = ql_in, qh = qh_in;
        if constexpr (DS > 0) {
          const uint8_t* const W = sW + ((kt >> 1) % DS) * kWStage + tig * 32 + (kt & 1) * 16;
          if (b < nb) {
            ql = *reinterpret_cast<const uint4*>(W + r_lo * kWRow);
            qh = *reinterpret_cast<const uint4*>(W + r_hi * kWRow);
          } else {
            ql = make_uint4(0u, 0u, 0u, 0u), qh = ql;
          }
        }
        const is::ShiftedTables tl = shift_table(b < nb ? sS[r_lo * nb + b] : 0);
        const is::ShiftedTables th = shift_table(b < nb ? sS[r_hi * nb + b] : 0);
        const uint32_t cl[4] = {ql.x, ql.y, ql.z, ql.w}, ch[4] = {qh.x, qh.y, qh.z, qh.w};
        const uint8_t* const B = sB + (kt % SB) * kBStage;
        // One commit group per k-step: while it runs, the next step decodes; waiting for all but
        // the newest frees the step before's A registers (two steps' live at a time).
#pragma unroll
        for (int j = 0; j < 4; j++) {
          uint32_t af[4];
          decode8_shifted(cl[j], tl, af[0], af[2]);
          decode8_shifted(ch[j], th, af[1], af[3]);
#pragma unroll
          for (int r = 0; r < N / 2; r++) pin(acc_hi[r]), pin(acc_lo[r]);
          wgmma_fence();
          wgmma_rs<N>(acc_hi, af, smem_desc(B + 2 * j * kCoreBytes, kCoreBytes, kCoreGroup));
          wgmma_rs<N>(acc_lo, af,
                      smem_desc(B + BT * kRsStage + 2 * j * kCoreBytes, kCoreBytes, kCoreGroup));
          wgmma_commit();
#pragma unroll
          for (int r = 0; r < N / 2; r++) pin(acc_hi[r]), pin(acc_lo[r]);
          wgmma_wait<1>();
        }
      };
      if constexpr (DS > 0) {
        const uint4 z = make_uint4(0u, 0u, 0u, 0u);
        for (int kt = 0; kt < nkt; kt++) stage(kt, z, z);
      } else {
      for (int m = 0; m < nm; m += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
          if (m + d < nm) {
            stage(2 * (m + d), wl[d][0], wh[d][0]);
            stage(2 * (m + d) + 1, wl[d][1], wh[d][1]);
            if (PF > 0 && tig == 0 && m + d + D + PF < nm) {
              prefetch_l2(wsl + PF * (kRsSuper / 2));
              prefetch_l2(wsh + PF * (kRsSuper / 2));
            }
            if (m + d + D < nm) load_w(wl[d], wh[d]);
          }
        }
      }
      }
      wgmma_wait<0>();
#pragma unroll
      for (int r = 0; r < N / 2; r++) pin(acc_hi[r]), pin(acc_lo[r]);
      // Epilogue, as gemm_kernel's: accumulator 4·f + r is (row gid + 8·(r ≥ 2), token
      // 8f + 2·tig + r%2) of the warp's 16 rows.
#pragma unroll
      for (int f = 0; f < N / 8; f++) {
#pragma unroll
        for (int r = 0; r < 4; r++)
          store_output(a, row0, pt, cnt, r >= 2 ? r_hi : r_lo, f * 8 + 2 * tig + (r & 1),
                       acc_hi[4 * f + r], acc_lo[4 * f + r], s_tokst, s_tokemin, s_rowok, s_smin);
      }
    };
    // Warp-uniform (a shuffle from lane 0), so the wgmma widths are uniform branches.
    const int nq = __shfl_sync(0xffffffffu, (cnt * 4 + BT - 1) / BT, 0);
    if (nq == 1)
      consume(std::integral_constant<int, BT / 4>{});
    else if (nq == 2)
      consume(std::integral_constant<int, BT / 2>{});
    else if (nq == 3)
      consume(std::integral_constant<int, 3 * BT / 4>{});
    else
      consume(std::integral_constant<int, BT>{});
    cp_wait<0>();
    strict_rows(a, v, warp, lane, row0, pt, cnt, s_rowok, s_tokst, s_tokrow, s_bad, s_nbad);
    __syncthreads();  // the next tile rewrites the token tables and the plane stages
  }
}

// Layout probe (wgmma_probe): one warpgroup multiplies a known 64 × 32 A with a known 32 × N B
// (N = 16 and 24), both placed in shared memory by wgmma_kernel's maps and descriptors (block 0 of
// an A stage, columns 0–31 of a B stage), and stores D by its epilogue map: D[row][col] for the
// host to compare with the plain product. Values: A(r, k) = (7r + 3k) mod 11 − 5,
// B(k, t) = (5t + k) mod 13 − 6.
__device__ __forceinline__ int probe_a(int r, int k) {
  return (7 * r + 3 * k) % 11 - 5;
}
__device__ __forceinline__ int probe_b(int k, int t) {
  return (5 * t + k) % 13 - 6;
}
template <int N>
__device__ void probe_one(int32_t* out, uint8_t* sA, uint8_t* sB) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  for (int i = tid; i < 64 * 32; i += 128) {
    const int r = i / 32, k = i % 32;
    sA[(r >> 3) * kACoreGroup + (k >> 4) * kCoreBytes + (r & 7) * 16 + (k & 15)] =
        uint8_t(probe_a(r, k));
  }
  for (int i = tid; i < N * 32; i += 128) {
    const int t = i / 32, k = i % 32;
    sB[(t >> 3) * kCoreGroup + (k >> 4) * kCoreBytes + (t & 7) * 16 + (k & 15)] =
        uint8_t(probe_b(k, t));
  }
  fence_proxy_async();
  __syncthreads();
  int acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; i++) acc[i] = 0;
  wgmma_fence();
  wgmma_ss<N>(acc, smem_desc(sA, kCoreBytes, kACoreGroup), smem_desc(sB, kCoreBytes, kCoreGroup));
  wgmma_commit();
  wgmma_wait<0>();
  const int r_lo = warp * 16 + gid, r_hi = r_lo + 8;
#pragma unroll
  for (int f = 0; f < N / 8; f++)
#pragma unroll
    for (int r = 0; r < 4; r++)
      out[(r >= 2 ? r_hi : r_lo) * N + f * 8 + 2 * tig + (r & 1)] = acc[4 * f + r];
  __syncthreads();
}
// The register-A form's map: warp w's lane (gid, tig) holds A(16w + gid (+ 8), 4·tig + i (+ 16))
// in byte i of a[0] (a[1]; a[2]; a[3]), as rs_kernel's decode writes them.
__device__ void probe_rs(int32_t* out, uint8_t* sB) {
  constexpr int N = 16;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  for (int i = tid; i < N * 32; i += 128) {
    const int t = i / 32, k = i % 32;
    sB[(t >> 3) * kCoreGroup + (k >> 4) * kCoreBytes + (t & 7) * 16 + (k & 15)] =
        uint8_t(probe_b(k, t));
  }
  fence_proxy_async();
  __syncthreads();
  uint32_t af[4];
#pragma unroll
  for (int f = 0; f < 4; f++) {
    const int r = warp * 16 + gid + 8 * (f & 1), k0 = 4 * tig + 16 * (f >> 1);
    uint32_t w = 0;
    for (int i = 0; i < 4; i++) w |= uint32_t(uint8_t(probe_a(r, k0 + i))) << (8 * i);
    af[f] = w;
  }
  int acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; i++) acc[i] = 0;
  wgmma_fence();
  wgmma_rs<N>(acc, af, smem_desc(sB, kCoreBytes, kCoreGroup));
  wgmma_commit();
  wgmma_wait<0>();
  const int r_lo = warp * 16 + gid, r_hi = r_lo + 8;
#pragma unroll
  for (int f = 0; f < N / 8; f++)
#pragma unroll
    for (int r = 0; r < 4; r++)
      out[(r >= 2 ? r_hi : r_lo) * N + f * 8 + 2 * tig + (r & 1)] = acc[4 * f + r];
  __syncthreads();
}
__global__ void __launch_bounds__(128) wgmma_probe_kernel(int32_t* out) {
  __shared__ __align__(128) uint8_t sA[8 * kACoreGroup];
  __shared__ __align__(128) uint8_t sB[3 * kCoreGroup];
  probe_one<16>(out, sA, sB);
  probe_one<24>(out + 64 * 16, sA, sB);
  probe_rs(out + 64 * (16 + 24), sB);
}

// Per input row: metadata (e_min, status) and, for rows inside the window, the two planes. One
// CTA per row: its threads scan the row's blocks (min/max of the nonzero blocks' exponents,
// poisoned?) and reduce them, then split 16 bytes each. A zero element splits to (0, 0) whatever
// its block's exponent, so only nonzero elements are shifted (a zero block's exponent may lie
// outside the window).
constexpr int kPlaneThreads = 128;
template <bool RS>
__global__ void __launch_bounds__(kPlaneThreads) planes_kernel(QuantRows in, int K, Planes out) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const size_t row = blockIdx.x;
  const int nb = K / c::kBlock;
  const int8_t* q = in.q + row * size_t(K);
  const int32_t* e = in.e + row * size_t(nb);
  is::TokenScan s;
  for (int b = tid; b < nb; b += kPlaneThreads) {
    const uint4* qb = reinterpret_cast<const uint4*>(q + size_t(b) * c::kBlock);
    const uint4 x0 = qb[0], x1 = qb[1];
    const bool nz = (x0.x | x0.y | x0.z | x0.w | x1.x | x1.y | x1.z | x1.w) != 0u;
    const int ex = e[b];
    is::token_scan_add(s, ex, nz, ex == kPoisonedBlock);
  }
  __shared__ int32_t red[3][kPlaneThreads / 32];
  s.mn = __reduce_min_sync(0xffffffffu, s.mn);
  s.mx = __reduce_max_sync(0xffffffffu, s.mx);
  const bool poisoned = __any_sync(0xffffffffu, s.poisoned);
  if (lane == 0) red[0][warp] = s.mn, red[1][warp] = s.mx, red[2][warp] = poisoned;
  __syncthreads();
  for (int w = 0; w < kPlaneThreads / 32; w++) {
    s.mn = min(s.mn, red[0][w]);
    s.mx = max(s.mx, red[1][w]);
    s.poisoned = s.poisoned || red[2][w] != 0;
  }
  const is::TokenMeta m = is::token_meta_finish(s);
  if (tid == 0) out.meta[2 * row] = m.e_min, out.meta[2 * row + 1] = m.status;
  if (m.status != is::kTokenOk) return;  // planes unused: strict path or NaN
  if constexpr (RS) {
    // rs_kernel's order (rs_column), rows of rs_stride(K) with zeros past K; 4 bytes per item
    // (4 consecutive columns of one block).
    const int Kp = rs_stride(K);
    for (int w = tid; w < Kp / 4; w += kPlaneThreads) {
      const int col = rs_column(4 * w);
      alignas(4) int8_t hi[4] = {0, 0, 0, 0}, lo[4] = {0, 0, 0, 0};
      if (col < K) {
        const int sx = e[col / c::kBlock] - m.e_min;
        alignas(4) int8_t v[4];
        *reinterpret_cast<uint32_t*>(v) = *reinterpret_cast<const uint32_t*>(q + col);
#pragma unroll
        for (int j = 0; j < 4; j++)
          if (v[j] != 0) is::split_plane(v[j], sx, hi[j], lo[j]);
      }
      const size_t i = row * size_t(Kp) + size_t(4 * w);
      *reinterpret_cast<uint32_t*>(out.hi + i) = *reinterpret_cast<const uint32_t*>(hi);
      *reinterpret_cast<uint32_t*>(out.lo + i) = *reinterpret_cast<const uint32_t*>(lo);
    }
    return;
  }
  for (int c16 = tid; c16 < K / 16; c16 += kPlaneThreads) {
    const size_t i = row * size_t(K) + size_t(c16) * 16;
    const int sx = e[c16 >> 1] - m.e_min;
    alignas(16) int8_t v[16], hi[16], lo[16];
    *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(q + size_t(c16) * 16);
#pragma unroll
    for (int j = 0; j < 16; j++) {
      hi[j] = 0, lo[j] = 0;
      if (v[j] != 0) is::split_plane(v[j], sx, hi[j], lo[j]);
    }
    *reinterpret_cast<uint4*>(out.hi + i) = *reinterpret_cast<const uint4*>(hi);
    *reinterpret_cast<uint4*>(out.lo + i) = *reinterpret_cast<const uint4*>(lo);
  }
}

// rs: rs_kernel's order and row stride (rs_column, rs_stride), else the natural one.
Status planes_rows(const QuantRows& in, int rows, int K, const Planes& out, bool rs, void* stream) {
  if (rows == 0) return {};
  const auto st = kernels::detail::as_stream(stream);
  if (rs)
    planes_kernel<true><<<unsigned(rows), kPlaneThreads, 0, st>>>(in, K, out);
  else
    planes_kernel<false><<<unsigned(rows), kPlaneThreads, 0, st>>>(in, K, out);
  return kernels::detail::launch_status();
}

template <int BN, int STAGES, int MINB>
Status launch_tile(const GemmArgs& a, int G, void* stream) {
  const size_t smem = Tile<BN, STAGES, MINB>::smem(a.K / c::kBlock);
  if (Status st = rt::allow_dynamic_smem(gemm_kernel<BN, STAGES, MINB>, int(smem)); !st.ok())
    return st;
  const dim3 grid(unsigned((a.N + kBM - 1) / kBM), unsigned(G));
  gemm_kernel<BN, STAGES, MINB><<<grid, kThreads, smem, kernels::detail::as_stream(stream)>>>(a);
  return kernels::detail::launch_status();
}

template <int D, int PF, int R, int MINB, int W>
Status launch_strip(const GemmArgs& a, int G, void* stream) {
  const size_t smem = strip_smem<W>(a.K);
  if (Status st = rt::allow_dynamic_smem(strip_kernel<D, PF, R, MINB, W>, int(smem)); !st.ok())
    return st;
  const dim3 grid(unsigned(((a.N + kBM - 1) / kBM + R - 1) / R), unsigned(G));
  strip_kernel<D, PF, R, MINB, W><<<grid, kThreads, smem, kernels::detail::as_stream(stream)>>>(a);
  return kernels::detail::launch_status();
}

// The form and tile by the mean tokens per expert (host counts; the per-group counts are on the
// device). Below a mean of 8 the strip form, 256-column stages (W = 2) in a ring of 2, the L2
// prefetch 2 stages ahead, 2 row tiles per CTA, two CTAs per SM (measured on the H200, moe-batch
// M = 1–4: 0.70–0.77 ms against 1.02–1.06 for gemm_kernel's 16-token tile and 0.77–0.82 for the
// W = 1 form at three CTAs; `--tokens 64 256`: 3.15 / 5.16 ms against 4.61 / 7.12; the variants
// measured and dropped are in docs/performance.md). Three CTAs per SM for the 32-token tile
// (T = 1024 12.2 ms against 13.4 at 32 × 4 stages and two CTAs).
Status launch(const GemmArgs& a, int G, int P, void* stream) {
  if (P < 8 * G) return launch_strip<2, 2, 2, 2, 2>(a, G, stream);
  if (P < 32 * G) return launch_tile<32, 3, 3>(a, G, stream);
  return launch_tile<64, 3, 2>(a, G, stream);
}

template <int BN, int SA, int SB, int PD, int MINB>
Status launch_wgmma_tile(const GemmArgs& a, int G, void* stream) {
  using Tl = WsTile<BN, SA, SB, PD, MINB>;
  const size_t smem = Tl::smem(a.K / c::kBlock);
  if (Status st = rt::allow_dynamic_smem(wgmma_kernel<BN, SA, SB, PD, MINB>, int(smem)); !st.ok())
    return st;
  const dim3 grid(unsigned((a.N + kBM - 1) / kBM), unsigned(G));
  wgmma_kernel<BN, SA, SB, PD, MINB>
      <<<grid, Tl::kThreads, smem, kernels::detail::as_stream(stream)>>>(a);
  return kernels::detail::launch_status();
}

// The warp-specialized tiles by the mean tokens per expert. 16- and 32-token tiles (weight
// streaming): two CTAs per SM (≤ 105 KB of shared memory each at K3's widths), the decode one stage
// ahead — measured on the H200 against one CTA per SM with two producer warpgroups and the decode
// 3 stages ahead: T = 64 / 256 / 1024 lines 6.64 / 10.03 / 12.43 ms against 8.66 / 12.85 / 14.96
// (docs/performance.md). 64- and 128-token tiles: one CTA per SM (187 and 222 KB), the decode up
// to 3 (2) stages ahead: T = 4096 28.26 ms against 31.82 with 1 stage.
Status launch_wgmma(const GemmArgs& a, int G, int P, void* stream) {
  if (P < 8 * G) return launch_wgmma_tile<16, 2, 4, 4, 2>(a, G, stream);
  if (P < 32 * G) return launch_wgmma_tile<32, 2, 4, 2, 2>(a, G, stream);
  if (P < 64 * G) return launch_wgmma_tile<64, 4, 4, 4, 1>(a, G, stream);
  return launch_wgmma_tile<128, 3, 4, 3, 1>(a, G, stream);
}

template <int BT, int D, int SB, int PF, int MINB, int DS = 0, int BM = kBM>
Status launch_rs_tile(const GemmArgs& a, int G, void* stream) {
  const size_t smem = RsTile<BT, SB, DS, BM>::smem(a.K / c::kBlock);
  if (Status st = rt::allow_dynamic_smem(rs_kernel<BT, D, SB, PF, MINB, DS, BM>, int(smem));
      !st.ok())
    return st;
  const dim3 grid(unsigned((a.N + BM - 1) / BM), unsigned(G));
  rs_kernel<BT, D, SB, PF, MINB, DS, BM>
      <<<grid, 2 * BM, smem, kernels::detail::as_stream(stream)>>>(a);
  return kernels::detail::launch_status();
}

// The register-A tiles by the mean tokens per expert: 32-token tiles (N = 8 … 32 per plane) at
// two CTAs per SM, the weights two 256-column stages ahead in registers; from a mean of 32,
// 128-token tiles (N = 32 … 128) at one CTA per SM.
Status launch_rs(const GemmArgs& a, int G, int P, void* stream) {
  static const int alt = [] {
    const char* e = std::getenv("STRATA_MOE_RS");
    return e ? std::atoi(e) : 0;
  }();
  if (P < 32 * G) {
    if (alt == 1) return launch_rs_tile<32, 1, 6, 2, 2, 3>(a, G, stream);
    if (alt == 2) return launch_rs_tile<32, 1, 6, 4, 2, 3>(a, G, stream);
    if (alt == 3) return launch_rs_tile<32, 1, 8, 2, 1, 4>(a, G, stream);
    // 256-row CTAs (four warpgroups): each plane stage read once per 256 rows.
    if (alt == 4) return launch_rs_tile<32, 1, 6, 2, 1, 3, 256>(a, G, stream);
    if (alt == 5) return launch_rs_tile<32, 1, 6, 2, 1, 0, 256>(a, G, stream);
    return launch_rs_tile<32, 1, 6, 2, 2>(a, G, stream);
  }
  if (alt == 1) return launch_rs_tile<128, 1, 4, 2, 1, 3>(a, G, stream);
  return launch_rs_tile<128, 1, 4, 2, 1>(a, G, stream);
}

// STRATA_MOE_WGMMA=ss: the warp-specialized shared-memory form (wgmma_kernel) instead of the
// register-A form (rs_kernel) on ExpertPath::wgmma.
bool rs_form() {
  static const bool rs = [] {
    const char* e = std::getenv("STRATA_MOE_WGMMA");
    return !(e && std::string(e) == "ss");
  }();
  return rs;
}

Status not_supported() {
  return {int(cudaErrorNotSupported), "grouped_experts: the GEMM path takes input widths <= 4096"};
}

}  // namespace

Status wgmma_probe(int32_t* out, void* stream) {
  wgmma_probe_kernel<<<1, 128, 0, kernels::detail::as_stream(stream)>>>(out);
  return kernels::detail::launch_status();
}

bool gemm_supports(int K) {
  return K > 0 && K % c::kBlock == 0 && K <= is::kMaxK;
}

Status gemm_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream) {
  if (!gemm_supports(b.H)) return not_supported();
  if (Status s = planes_rows(ws.x, b.T, b.H, ws.xp, false, stream); !s.ok()) return s;
  GemmArgs a{b.experts, b.group_offsets, b.pair_token, ws.x, ws.xp, b.H, 2 * b.I, b.I, ws.gu};
  return launch(a, b.G, b.P, stream);
}

Status gemm_down(const ExpertBatch& b, const Workspace& ws, void* stream) {
  if (!gemm_supports(b.I)) return not_supported();
  if (Status s = planes_rows(ws.h_q, b.P, b.I, ws.hp, false, stream); !s.ok()) return s;
  GemmArgs a{b.experts, b.group_offsets, nullptr, ws.h_q, ws.hp, b.I, b.H, b.H, b.y};
  return launch(a, b.G, b.P, stream);
}

Status wgmma_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream) {
  if (!gemm_supports(b.H)) return not_supported();
  if (Status s = planes_rows(ws.x, b.T, b.H, ws.xp, rs_form(), stream); !s.ok()) return s;
  GemmArgs a{b.experts, b.group_offsets, b.pair_token, ws.x, ws.xp, b.H, 2 * b.I, b.I, ws.gu};
  return rs_form() ? launch_rs(a, b.G, b.P, stream) : launch_wgmma(a, b.G, b.P, stream);
}

Status wgmma_down(const ExpertBatch& b, const Workspace& ws, void* stream) {
  if (!gemm_supports(b.I)) return not_supported();
  if (Status s = planes_rows(ws.h_q, b.P, b.I, ws.hp, rs_form(), stream); !s.ok()) return s;
  GemmArgs a{b.experts, b.group_offsets, nullptr, ws.h_q, ws.hp, b.I, b.H, b.H, b.y};
  return rs_form() ? launch_rs(a, b.G, b.P, stream) : launch_wgmma(a, b.G, b.P, stream);
}

}  // namespace strata::kernels::moe::detail
