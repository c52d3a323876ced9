// GEMV path of the grouped MXFP4 experts (few tokens per expert; decode). The work is the list of
// "virtual rows" v = g·N + o over the groups g and the N output rows of one projection (gate|up:
// the I rows of w1, then the I rows of w3, so the output [P, 2, I] is row-contiguous the same way;
// down: the H rows of w2). With at most one token per group on average (decode) the grid is
// persistent: for K ≤ 4096 one block per SM whose warps share the SM's contiguous range of rows in
// 2-row chunks claimed from a shared-memory counter (gemv_sm_kernel), above that as many blocks as
// fit, each warp an equal contiguous share (gemv_kernel). With more tokens per group (their counts
// differ) a warp takes a strip of kStripRows rows of one group and the hardware balances the
// strips (gemv_kernel).
//
// Per row, lane j holds blocks j, j+32, … (16 packed bytes + 1 scale byte each: the warp reads 512
// contiguous bytes per step) in registers, and the next row's loads are in flight while it
// computes. Per token the lane forms exact int32 block dots (E2M1 decoded by PRMT sign-mode
// lookups, dp4a; contract_device.cuh), turns them into exact fp64 block terms by bits and sums
// them in increasing block order; the warp butterfly (off 16, 8, 4, 2, 1) finishes — exactly the
// reduction order of numerics.md §3, so the result is the contract's bit for bit.
//
// The kernels take part in programmatic dependent launch: a GEMV is launched while its producer
// (the activation quantization) still runs, issues its first weight loads, and only then waits
// for the producer's results (griddepcontrol.wait); launched plainly, the wait is a no-op.
//
// Measured on the H200 and dropped: L2 prefetch of the rows 1–10 ahead (per-lane prefetch, 7–19 %
// slower) and a per-warp shared-memory ring fed by cp.async.bulk with 2–6 stages (110 µs against
// 90 µs for the decode line): the kernel is bound by the instructions it issues per row, not by
// bytes in flight — the decode kernel's chunk pairs, which cut them by 20 %, took the line from
// 85.3 to 80.8 µs (docs/performance.md).
//
// Requirement: packed rows 16-byte aligned (K/2 is a multiple of 16, so the matrix base must be).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/moe/contract_device.cuh"
#include "kernels/moe/paths.h"
#include "kernels/ops/launch.cuh"
#include "storage/expert_contract.h"

namespace strata::kernels::moe::detail {
namespace {

namespace c = strata::contract;

constexpr int kWarps = 4;      // warps per block
constexpr int kStripRows = 8;  // rows per warp when groups have several tokens

struct GemvArgs {
  const Mxfp4ExpertView* experts;
  const int32_t* group_offsets;
  const int32_t* row_map;  // pair → input row (nullptr: the pair itself)
  QuantRows in;            // quantized inputs [rows, K]
  int K, N;                // input width, output rows per expert (2·I for gate|up)
  int split;               // rows ≥ split come from the second matrix (gate|up: I; down: N)
  float* out;              // [P, N]
  int G;                   // groups
  int rows_per_unit;       // persistent: rows per warp (equal shares) or per block (SM kernel);
                           // 0: strip mode
};

// Where the weights of virtual row (g, on) start, and the cursor that walks the rows.
struct Cursor {
  int g, on;
  const uint8_t* pk;
  const uint8_t* sc;
};

__device__ __forceinline__ void seek(const GemvArgs& a, Cursor& cu, int g, int on) {
  cu.g = g, cu.on = on;
  if (g >= a.G) return;  // past the end: never read
  const Mxfp4ExpertView* ev = a.experts + g;
  const bool second = on >= a.split;
  const int o = second ? on - a.split : on;
  const uint8_t* pk = a.split == a.N ? ev->w2_packed : second ? ev->w3_packed : ev->w1_packed;
  const uint8_t* sc = a.split == a.N ? ev->w2_scale : second ? ev->w3_scale : ev->w1_scale;
  cu.pk = pk + size_t(o) * size_t(a.K / 2);
  cu.sc = sc + size_t(o) * size_t(a.K / c::kBlock);
}

__device__ __forceinline__ void advance(const GemvArgs& a, Cursor& cu) {
  const int on = cu.on + 1;
  if (on == a.N) {
    seek(a, cu, cu.g + 1, 0);
  } else if (on == a.split) {
    seek(a, cu, cu.g, on);
  } else {
    cu.on = on, cu.pk += a.K / 2, cu.sc += a.K / c::kBlock;
  }
}

// Lane's partial sum for one token (numerics.md §3: its blocks lane, lane + 32, … in increasing
// order): qr / er are the token's activations and block exponents at the lane's first block, w / s
// the row's packed weights and scale codes held by load_row. emin: the smallest block exponent
// seen (kPoisonedBlock, INT32_MIN, names a poison).
template <int MAXI>
__device__ __forceinline__ double lane_sum(const int8_t* qr, const int32_t* er, int nb, int lane,
                                           const uint4* w, const int* s, int& emin) {
  double L = 0.0;
#pragma unroll
  for (int i = 0; i < MAXI; i++) {
    const int b = lane + 32 * i;
    if (i < MAXI - 1 || b < nb) {
      const uint4* qb = reinterpret_cast<const uint4*>(qr + 32 * c::kBlock * i);
      const uint4 q0 = __ldg(qb), q1 = __ldg(qb + 1);
      const int ex = __ldg(er + 32 * i);
      emin = min(emin, ex);
      const double t = block_term_bits(dot_block_biased(w[i], q0, q1), ex, s[i]);
      // 0 + t is t: a term is never −0 (the bits subtraction of equal values gives +0).
      L = i == 0 ? t : c::dadd(L, t);
    }
  }
  return L;
}

// A lane's 32-block of a weight row decoded once for every token of the row: the four PRMT
// lookups per packed word of dot8_split (contract_device.cuh), p = the positive weights, n = the
// negative ones' magnitudes, word j against activation word j (qa.x, qa.y, qa.z, qa.w, qb.x, …).
struct DecodedBlock {
  uint32_t p[8], n[8];
};

__device__ __forceinline__ void decode_block(uint4 w, DecodedBlock& d) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    const uint32_t wn = ws[k] ^ 0x88888888u;
    d.p[2 * k] = prmt(kPos0, kPos1, ws[k]);
    d.p[2 * k + 1] = prmt(kPos0, kPos1, ws[k] >> 16);
    d.n[2 * k] = prmt(kPos0, kPos1, wn);
    d.n[2 * k + 1] = prmt(kPos0, kPos1, wn >> 16);
  }
}

// dot_block_biased from a decoded block: the same int32 sums (wrapping addition is associative),
// so the same biased dot.
__device__ __forceinline__ uint32_t dot_decoded(const DecodedBlock& d, uint4 qa, uint4 qb) {
  const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
  int pos = int(0x80000000u), neg = 0;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    pos = __dp4a(int(d.p[j]), int(q[j]), pos);
    neg = __dp4a(int(d.n[j]), int(q[j]), neg);
  }
  return uint32_t(pos) - uint32_t(neg);
}

// One token's block term on a decoded block: its activations and exponent at the lane's block i.
__device__ __forceinline__ double token_term(const DecodedBlock& d, const int8_t* qr,
                                             const int32_t* er, int i, int s, int& emin) {
  const uint4* qb = reinterpret_cast<const uint4*>(qr + 32 * c::kBlock * i);
  const uint4 q0 = __ldg(qb), q1 = __ldg(qb + 1);
  const int ex = __ldg(er + 32 * i);
  emin = min(emin, ex);
  return block_term_bits(dot_decoded(d, q0, q1), ex, s);
}

// The warp's sum of a token's lane partials (butterfly off 16 … 1, numerics.md §3) and its store.
__device__ __forceinline__ void finish_token(const GemvArgs& a, int p, int on, int lane, double L,
                                             int emin) {
  const bool poisoned = __any_sync(0xffffffffu, emin == kPoisonedBlock);
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) L = c::dadd(L, __shfl_down_sync(0xffffffffu, L, off));
  if (lane == 0) a.out[size_t(p) * a.N + on] = poisoned ? c::canonical_nan() : float(L);
}

// Row `on` of the current group for its tokens [p0, p1), from the row held in registers, tokens two
// at a time over one decode of each block (the decode was half of a token's instructions;
// groups of several tokens were bound by them: 2.1 TB/s at 2 tokens per group against 3.5-3.8 for
// one, ncu on the H200). Each token's terms are summed in increasing block order as lane_sum does:
// the same bits.
template <int MAXI>
__device__ __forceinline__ void row_tokens_paired(const GemvArgs& a, int p0, int p1, int on, int nb,
                                                  int lane, const uint4* w, const int* s) {
  for (int p = p0; p < p1; p += 2) {
    const bool two = p + 1 < p1;  // warp-uniform
    const int ra = a.row_map ? __ldg(a.row_map + p) : p;
    const int rb = !two ? ra : a.row_map ? __ldg(a.row_map + p + 1) : p + 1;
    const int8_t* qa = a.in.q + size_t(ra) * a.K + lane * c::kBlock;
    const int8_t* qb = a.in.q + size_t(rb) * a.K + lane * c::kBlock;
    const int32_t* ea = a.in.e + size_t(ra) * nb + lane;
    const int32_t* eb = a.in.e + size_t(rb) * nb + lane;
    double LA = 0.0, LB = 0.0;
    int emin_a = 0, emin_b = 0;
#pragma unroll
    for (int i = 0; i < MAXI; i++) {
      const int b = lane + 32 * i;
      if (i < MAXI - 1 || b < nb) {
        DecodedBlock d;
        decode_block(w[i], d);
        // 0 + t is t: a term is never −0 (the bits subtraction of equal values gives +0).
        const double ta = token_term(d, qa, ea, i, s[i], emin_a);
        LA = i == 0 ? ta : c::dadd(LA, ta);
        if (two) {
          const double tb = token_term(d, qb, eb, i, s[i], emin_b);
          LB = i == 0 ? tb : c::dadd(LB, tb);
        }
      }
    }
    finish_token(a, p, on, lane, LA, emin_a);
    if (two) finish_token(a, p + 1, on, lane, LB, emin_b);
  }
}

// Row `on` of the current group for its tokens [p0, p1), from the row held in registers.
template <int MAXI>
__device__ __forceinline__ void row_tokens(const GemvArgs& a, int p0, int p1, int on, int nb,
                                           int lane, const uint4* w, const int* s) {
  for (int p = p0; p < p1; p++) {
    const int row = a.row_map ? __ldg(a.row_map + p) : p;
    int emin = 0;
    double L = lane_sum<MAXI>(a.in.q + size_t(row) * a.K + lane * c::kBlock,
                              a.in.e + size_t(row) * nb + lane, nb, lane, w, s, emin);
    finish_token(a, p, on, lane, L, emin);
  }
}

// Lane's blocks of the row at cu into registers: 16 packed bytes and the scale code per lane
// round (blocks lane, lane + 32, …; only the last round is partial).
template <int MAXI>
__device__ __forceinline__ void load_row(const Cursor& cu, int nb, int lane, uint4* w, int* s) {
  const uint4* wp = reinterpret_cast<const uint4*>(cu.pk) + lane;
  const uint8_t* sp = cu.sc + lane;
#pragma unroll
  for (int i = 0; i < MAXI; i++)
    if (i < MAXI - 1 || lane + 32 * i < nb) w[i] = __ldcs(wp + 32 * i), s[i] = __ldcs(sp + 32 * i);
}

// This warp's virtual rows [v0, v1).
__device__ __forceinline__ void warp_range(const GemvArgs& a, long long& v0, long long& v1) {
  const int warp_in_block = threadIdx.x >> 5;
  if (a.rows_per_unit > 0) {
    const long long R = (long long)a.G * a.N;
    v0 = ((long long)blockIdx.x * kWarps + warp_in_block) * a.rows_per_unit;
    v1 = min(R, v0 + a.rows_per_unit);
  } else {
    const long long g0 = (long long)blockIdx.y * a.N;
    const int o = (blockIdx.x * kWarps + warp_in_block) * kStripRows;
    v0 = g0 + o;
    v1 = g0 + min(a.N, o + kStripRows);
  }
}

// MAXI = ceil(nb / 32): blocks per lane; every lane has blocks i < MAXI − 1, only the last round
// is partial. K ≤ 4096 (MAXI ≤ 4) fits 4 blocks of 4 warps per SM (≤ 128 registers): the paired
// token path (row_tokens_paired) spilled at 80 and 96 registers (ptxas, MAXI 2–4); 93–123 without.
template <int MAXI>
__global__ void __launch_bounds__(kWarps * 32, MAXI <= 4 ? 4 : 3) gemv_kernel(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int nb = a.K / c::kBlock;
  kernels::detail::grid_launch_dependents();
  long long v0, v1;
  warp_range(a, v0, v1);
  if (v0 >= v1) return;
  const int count = int(v1 - v0);
  Cursor cc;
  seek(a, cc, int(v0 / a.N), int(v0 % a.N));
  uint4 cw[MAXI], nw[MAXI];
  int cs[MAXI], ns[MAXI];
  auto load = [&](const Cursor& cu, uint4* w, int* s) { load_row<MAXI>(cu, nb, lane, w, s); };
  int p0, p1;
  if (a.rows_per_unit > 0) {  // persistent: the first row's loads overlap the producer's tail
    load(cc, cw, cs);
    kernels::detail::grid_dependency_wait();
    p0 = __ldg(a.group_offsets + cc.g), p1 = __ldg(a.group_offsets + cc.g + 1);
  } else {  // strip of one group: an empty group (device groups pad to g_cap) reads no weights
    kernels::detail::grid_dependency_wait();
    p0 = __ldg(a.group_offsets + cc.g), p1 = __ldg(a.group_offsets + cc.g + 1);
    if (p0 == p1) return;
    load(cc, cw, cs);
  }
  Cursor nc = cc;
  for (int k = 0; k < count; k++) {
    advance(a, nc);
    if (k + 1 < count) load(nc, nw, ns);
    row_tokens_paired<MAXI>(a, p0, p1, cc.on, nb, lane, cw, cs);
#pragma unroll
    for (int i = 0; i < MAXI; i++) cw[i] = nw[i], cs[i] = ns[i];
    if (k + 1 < count && nc.g != cc.g) p0 = p1, p1 = __ldg(a.group_offsets + nc.g + 1);
    cc = nc;
  }
}

// Persistent decode mode for K ≤ 4096, one block of 24 warps per SM. With equal fixed shares per
// warp the warps of one SM finished up to 15 µs apart (the schedulers favour some warps; on the
// H200 at K3's gate|up the first warp of an SM was done after ≈ 39 µs, the last after ≈ 53), and
// the SM ran its tail with ever fewer warps. So the block takes a contiguous range of rows and its
// warps share it in chunks of two rows (2c, 2c + 1): warp i starts with chunk i, then claims chunk
// nwarps + t for the t-th increment of a shared-memory counter (each claim issued a chunk ahead of
// its use).
//
// A warp's trip is one chunk: the second row's loads go out, the first row is computed, the next
// chunk's first row's loads go out, the second row is computed — always one row in flight while
// one is computed, in two register buffers. The pointers of the next row come from the current
// row's by a step while both lie in one run of rows contiguous in memory (same group, same
// matrix); only a new run goes through seek. For a group of one token (decode) the two rows'
// butterflies run as one: lanes < 16 add row A's upper half (off 16) while lanes ≥ 16 add row B's
// lower half — the same sums, as fp64 addition commutes — then lanes 0–15 hold row A's partials and
// lanes 16–31 row B's, the levels 8, 4, 2, 1 run in both halves at once, and lanes 0 and 16 store.
// One butterfly, one poison vote and one store per chunk instead of per row, and the token's
// activation address kept per group: 20 % fewer instructions than row by row, and on the H200 the
// decode line at 80.8 µs against 85.3 µs (docs/performance.md). Groups of several tokens (or
// none) take the row-by-row path (row_tokens).
//
// Launcher's requirements: rows_per_unit even (with N even, every block's row count is even and a
// chunk never straddles a run), G·N < 2^30 and (input rows)·K < 2^31 (32-bit row arithmetic).
constexpr int kSmChunk = 2;      // rows per chunk (the trip structure assumes exactly two)
constexpr int kSmMaxWarps = 24;  // block size bound (80 registers per thread)
// Mean tokens per group up to which the launcher takes the persistent kernel: 1. Tried at 4 on the
// H200 (8-layer slice, 8 sequences: 128 pairs over at most 64 experts, 2 tokens per group): decode
// fell from 739 to 628 tok/s (MoE 7.1 ms of a 13.2 ms eager step). With several tokens per row
// both kernels are bound by the per-token instructions (row_tokens decodes and reduces each token
// alone), and the strip kernel (2.1 TB/s there, ncu) balances its strips better.
constexpr int kSmMaxMeanTokens = 1;

// Lane 0's claim of the next chunk. atom.inc with a limit never reached rather than atom.add:
// ptxas wraps a lane-0-only add in its warp-aggregation sequence (vote, popc, shuffle: 13
// instructions per claim).
__device__ __forceinline__ int claim_chunk(int* counter) {
  unsigned v;
  asm volatile("atom.shared.inc.u32 %0, [%1], 0x7FFFFFFF;"
               : "=r"(v)
               : "r"(unsigned(__cvta_generic_to_shared(counter)))
               : "memory");
  return int(v);
}

// The row at relative row d of the block starting at absolute row b0: its cursor, and the end
// (relative) of its run.
__device__ __forceinline__ void locate(const GemvArgs& a, int b0, int rows, int d, Cursor& cu,
                                       int& end) {
  const int v = b0 + d;
  const int g = v / a.N, on = v - g * a.N;
  seek(a, cu, g, on);
  end = min(rows, g * a.N + (on < a.split ? a.split : a.N) - b0);
}

template <int MAXI>
__global__ void __launch_bounds__(kSmMaxWarps * 32, 1) gemv_sm_kernel(GemvArgs a) {
  __shared__ int claimed;
  if (threadIdx.x == 0) claimed = 0;
  __syncthreads();
  kernels::detail::grid_launch_dependents();
  const int lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
  const int nb = a.K / c::kBlock;
  const int b0 = blockIdx.x * a.rows_per_unit;
  const int rows = max(0, min(a.G * a.N, b0 + a.rows_per_unit) - b0);
  int d = (threadIdx.x >> 5) * kSmChunk;  // the chunk's first row, relative to b0
  if (d >= rows) return;
  int end;
  Cursor cc;
  locate(a, b0, rows, d, cc, end);
  uint4 w0[MAXI], w1[MAXI];
  int s0[MAXI], s1[MAXI];
  auto load = [&](const Cursor& cu, uint4* w, int* s) { load_row<MAXI>(cu, nb, lane, w, s); };
  load(cc, w0, s0);
  int pending = lane == 0 ? claim_chunk(&claimed) : 0;
  kernels::detail::grid_dependency_wait();
  // The group's tokens [p0, p1); qoff: the first token's activations relative to a.in.q, the lane
  // included (its block exponents are at a.in.e + qoff / 32, as K is a multiple of 32).
  int p0, p1;
  unsigned qoff = 0;
  auto tokens = [&](int g) {
    p0 = __ldg(a.group_offsets + g), p1 = __ldg(a.group_offsets + g + 1);
    const int r0 = p0 < p1 && a.row_map ? __ldg(a.row_map + p0) : p0;
    qoff = unsigned(r0) * unsigned(a.K) + unsigned(lane * c::kBlock);
  };
  tokens(cc.g);
  for (;;) {
    Cursor c1 = cc;  // the chunk's second row: same run
    c1.on++, c1.pk += a.K / 2, c1.sc += nb;
    load(c1, w1, s1);
    const bool single = p1 - p0 == 1;
    double LA = 0.0;
    int emin = 0;
    if (single)
      LA = lane_sum<MAXI>(a.in.q + qoff, a.in.e + (qoff >> 5), nb, lane, w0, s0, emin);
    else
      row_tokens<MAXI>(a, p0, p1, cc.on, nb, lane, w0, s0);
    const int nd = kSmChunk * (nwarps + __shfl_sync(0xffffffffu, pending, 0));
    const bool more = nd < rows;
    Cursor nc = cc;
    int nend = end;
    if (more) {
      if (lane == 0) pending = claim_chunk(&claimed);
      if (nd < end) {
        const int j = nd - d;
        nc.on += j, nc.pk += size_t(j) * (a.K / 2), nc.sc += size_t(j) * nb;
      } else {
        locate(a, b0, rows, nd, nc, nend);
      }
      load(nc, w0, s0);
    }
    if (single) {
      int same = 0;  // the same token's exponents: row A's vote covers row B
      const double LB = lane_sum<MAXI>(a.in.q + qoff, a.in.e + (qoff >> 5), nb, lane, w1, s1, same);
      const bool poisoned = __any_sync(0xffffffffu, emin == kPoisonedBlock);
      const bool upper = lane >= 16;
      double x = c::dadd(upper ? LB : LA, __shfl_xor_sync(0xffffffffu, upper ? LA : LB, 16));
#pragma unroll
      for (int off = 8; off >= 1; off >>= 1)
        x = c::dadd(x, __shfl_down_sync(0xffffffffu, x, off, 16));
      if ((lane & 15) == 0)
        a.out[size_t(p0) * a.N + cc.on + (lane >> 4)] = poisoned ? c::canonical_nan() : float(x);
    } else {
      row_tokens<MAXI>(a, p0, p1, c1.on, nb, lane, w1, s1);
    }
    if (!more) return;
    if (nc.g != cc.g) tokens(nc.g);
    cc = nc, d = nd, end = nend;
  }
}

using KernelFn = void (*)(GemvArgs);
constexpr KernelFn kSmKernels[4] = {gemv_sm_kernel<1>, gemv_sm_kernel<2>, gemv_sm_kernel<3>,
                                    gemv_sm_kernel<4>};

// MAXI = 1..8: input widths up to 8192.
constexpr KernelFn kKernels[8] = {gemv_kernel<1>, gemv_kernel<2>, gemv_kernel<3>, gemv_kernel<4>,
                                  gemv_kernel<5>, gemv_kernel<6>, gemv_kernel<7>, gemv_kernel<8>};

// The device's SM count and how many blocks of `threads` threads of kernel k fit on one SM.
Status device_fit(const void* k, int threads, int& sms, int& per_sm) {
  namespace kd = kernels::detail;
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return kd::status_of(e);
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      e != cudaSuccess)
    return kd::status_of(e);
  return kd::status_of(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, 0));
}

// Persistent equal shares of R virtual rows over as many warps as fit on the device.
Status persistent_plan(KernelFn k, long long R, int& rows_per_warp, long long& used_warps) {
  int sms = 0, per_sm = 0;
  if (Status s = device_fit(reinterpret_cast<const void*>(k), kWarps * 32, sms, per_sm); !s.ok())
    return s;
  const long long warps = (long long)std::max(1, sms * std::max(1, per_sm)) * kWarps;
  rows_per_warp = int((R + warps - 1) / warps);
  used_warps = (R + rows_per_warp - 1) / rows_per_warp;
  return {};
}

Status launch(GemvArgs a, int P, void* stream) {
  if (a.G <= 0 || P <= 0) return {};
  namespace kd = kernels::detail;
  const int maxi = (a.K / c::kBlock + 31) / 32;  // 32-block rounds per lane
  if (maxi < 1 || maxi > 8) return kd::invalid("grouped_experts: input width above 8192");
  const long long R = (long long)a.G * a.N;
  // Decode: one block per SM, its warps sharing the SM's rows (the input rows are at most P), up
  // to kSmMaxMeanTokens tokens per group on average (groups of several tokens go row by row).
  if (P <= kSmMaxMeanTokens * a.G && maxi <= 4 && R < (1LL << 30) &&
      (long long)P * a.K < (1LL << 31)) {
    const KernelFn sk = kSmKernels[maxi - 1];
    int sms = 0, per_sm = 0;
    if (Status s = device_fit(reinterpret_cast<const void*>(sk), kSmMaxWarps * 32, sms, per_sm);
        !s.ok())
      return s;
    if (per_sm >= 1) {
      a.rows_per_unit = int((R + sms - 1) / sms);
      a.rows_per_unit += a.rows_per_unit & 1;  // whole chunks per block
      return kd::launch_pdl(sk, dim3(unsigned(sms)), dim3(kSmMaxWarps * 32), stream, true, a);
    }
  }
  const KernelFn k = kKernels[maxi - 1];
  dim3 grid;
  if (P <= a.G) {  // at most one token per group on average: persistent equal shares
    long long used_warps = 0;
    if (Status s = persistent_plan(k, R, a.rows_per_unit, used_warps); !s.ok()) return s;
    grid = dim3(unsigned((used_warps + kWarps - 1) / kWarps));
  } else {  // strips of one group each; the hardware balances groups of different token counts
    a.rows_per_unit = 0;
    grid = dim3(unsigned((a.N + kWarps * kStripRows - 1) / (kWarps * kStripRows)), unsigned(a.G));
  }
  return kd::launch_pdl(k, grid, dim3(kWarps * 32), stream, true, a);
}

}  // namespace

Status gemv_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream) {
  GemvArgs a{b.experts, b.group_offsets, b.pair_token, ws.x, b.H, 2 * b.I, b.I, ws.gu, b.G, 0};
  return launch(a, b.P, stream);
}

Status gemv_down(const ExpertBatch& b, const Workspace& ws, void* stream) {
  GemvArgs a{b.experts, b.group_offsets, nullptr, ws.h_q, b.I, b.H, b.H, b.y, b.G, 0};
  return launch(a, b.P, stream);
}

}  // namespace strata::kernels::moe::detail
