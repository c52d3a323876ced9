// GEMV path of the grouped MXFP4 experts (few tokens per expert; decode). The work is the list of
// "virtual rows" v = g·N + o over the groups g and the N output rows of one projection (gate|up:
// the I rows of w1, then the I rows of w3, so the output [P, 2, I] is row-contiguous the same way;
// down: the H rows of w2). Every warp walks one contiguous range of virtual rows: with at most one
// token per group on average (decode) the grid is persistent (as many blocks as fit) and the
// ranges are equal shares, so there is no tail wave and a warp's weights are one contiguous
// stream; with more tokens per group (their counts differ) a warp takes a strip of kStripRows rows
// of one group and the hardware balances the strips.
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
// 90 µs for the decode line): the kernel is bound by issuing the decode instructions, not by bytes
// in flight (docs/performance.md).
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
  int rows_per_warp;       // persistent mode: contiguous virtual rows per warp; 0: strip mode
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

// Computes row `on` of the current group for its tokens [p0, p1): wblk(i, w, s) gives lane's
// block i (packed 16 bytes and scale code).
template <int MAXI, class WBlk>
__device__ __forceinline__ void row_tokens(const GemvArgs& a, int p0, int p1, int on, int nb,
                                           int lane, WBlk&& wblk) {
  for (int p = p0; p < p1; p++) {
    const int row = a.row_map ? __ldg(a.row_map + p) : p;
    const int8_t* qr = a.in.q + size_t(row) * a.K + lane * c::kBlock;
    const int32_t* er = a.in.e + size_t(row) * nb + lane;
    double L = 0.0;
    int emin = 0;
#pragma unroll
    for (int i = 0; i < MAXI; i++) {
      const int b = lane + 32 * i;
      if (i < MAXI - 1 || b < nb) {
        const uint4* qb = reinterpret_cast<const uint4*>(qr + 32 * c::kBlock * i);
        const uint4 q0 = __ldg(qb), q1 = __ldg(qb + 1);
        const int ex = __ldg(er + 32 * i);
        emin = min(emin, ex);  // kPoisonedBlock is INT32_MIN: the minimum names a poison
        uint4 w;
        int s;
        wblk(i, w, s);
        L = c::dadd(L, block_term_bits(dot_block_biased(w, q0, q1), ex, s));
      }
    }
    const bool poisoned = __any_sync(0xffffffffu, emin == kPoisonedBlock);
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) L = c::dadd(L, __shfl_down_sync(0xffffffffu, L, off));
    if (lane == 0) a.out[size_t(p) * a.N + on] = poisoned ? c::canonical_nan() : float(L);
  }
}

// This warp's virtual rows [v0, v1).
__device__ __forceinline__ void warp_range(const GemvArgs& a, long long& v0, long long& v1) {
  const int warp_in_block = threadIdx.x >> 5;
  if (a.rows_per_warp > 0) {
    const long long R = (long long)a.G * a.N;
    v0 = ((long long)blockIdx.x * kWarps + warp_in_block) * a.rows_per_warp;
    v1 = min(R, v0 + a.rows_per_warp);
  } else {
    const long long g0 = (long long)blockIdx.y * a.N;
    const int o = (blockIdx.x * kWarps + warp_in_block) * kStripRows;
    v0 = g0 + o;
    v1 = g0 + min(a.N, o + kStripRows);
  }
}

// MAXI = ceil(nb / 32): blocks per lane; every lane has blocks i < MAXI − 1, only the last round
// is partial. K ≤ 4096 (MAXI ≤ 4) fits 6 blocks of 4 warps per SM (≤ 80 registers).
template <int MAXI>
__global__ void __launch_bounds__(kWarps * 32, MAXI <= 4 ? 6 : 3) gemv_kernel(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int nb = a.K / c::kBlock;
  asm volatile("griddepcontrol.launch_dependents;");
  long long v0, v1;
  warp_range(a, v0, v1);
  if (v0 >= v1) return;
  const int count = int(v1 - v0);
  Cursor cc;
  seek(a, cc, int(v0 / a.N), int(v0 % a.N));
  uint4 cw[MAXI], nw[MAXI];
  int cs[MAXI], ns[MAXI];
  auto load = [&](const Cursor& cu, uint4* w, int* s) {
    const uint4* wp = reinterpret_cast<const uint4*>(cu.pk) + lane;
    const uint8_t* sp = cu.sc + lane;
#pragma unroll
    for (int i = 0; i < MAXI; i++)
      if (i < MAXI - 1 || lane + 32 * i < nb)
        w[i] = __ldcs(wp + 32 * i), s[i] = __ldcs(sp + 32 * i);
  };
  load(cc, cw, cs);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  int p0 = __ldg(a.group_offsets + cc.g), p1 = __ldg(a.group_offsets + cc.g + 1);
  Cursor nc = cc;
  for (int k = 0; k < count; k++) {
    advance(a, nc);
    if (k + 1 < count) load(nc, nw, ns);
    row_tokens<MAXI>(a, p0, p1, cc.on, nb, lane, [&](int i, uint4& w, int& s) {
      w = cw[i];
      s = cs[i];
    });
#pragma unroll
    for (int i = 0; i < MAXI; i++) cw[i] = nw[i], cs[i] = ns[i];
    if (k + 1 < count && nc.g != cc.g) p0 = p1, p1 = __ldg(a.group_offsets + nc.g + 1);
    cc = nc;
  }
}

template <int MAXI>
Status launch_t(GemvArgs a, int P, void* stream) {
  static_assert(MAXI >= 1 && MAXI <= 8);
  namespace kd = kernels::detail;
  dim3 grid;
  if (P <= a.G) {  // at most one token per group on average: persistent equal shares
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return kd::status_of(e);
    if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        e != cudaSuccess)
      return kd::status_of(e);
    if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<MAXI>,
                                                                      kWarps * 32, 0);
        e != cudaSuccess)
      return kd::status_of(e);
    const long long R = (long long)a.G * a.N;
    const long long warps = (long long)std::max(1, sms * std::max(1, per_sm)) * kWarps;
    a.rows_per_warp = int((R + warps - 1) / warps);
    const long long used_warps = (R + a.rows_per_warp - 1) / a.rows_per_warp;
    grid = dim3(unsigned((used_warps + kWarps - 1) / kWarps));
  } else {  // strips of one group each; the hardware balances groups of different token counts
    a.rows_per_warp = 0;
    grid = dim3(unsigned((a.N + kWarps * kStripRows - 1) / (kWarps * kStripRows)), unsigned(a.G));
  }

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = kd::as_stream(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return kd::status_of(cudaLaunchKernelEx(&cfg, gemv_kernel<MAXI>, a));
}

Status launch(const GemvArgs& a, int P, void* stream) {
  if (a.G <= 0 || P <= 0) return {};
  switch ((a.K / c::kBlock + 31) / 32) {
    case 1:
      return launch_t<1>(a, P, stream);
    case 2:
      return launch_t<2>(a, P, stream);
    case 3:
      return launch_t<3>(a, P, stream);
    case 4:
      return launch_t<4>(a, P, stream);
    case 5:
      return launch_t<5>(a, P, stream);
    case 6:
      return launch_t<6>(a, P, stream);
    case 7:
      return launch_t<7>(a, P, stream);
    case 8:
      return launch_t<8>(a, P, stream);
    default:
      return kernels::detail::invalid("grouped_experts: input width above 8192");
  }
}

// ---- v2: the persistent (decode) kernel with fewer issued instructions per row ----
//
// Same work split, loads and reduction order as gemv_kernel in persistent mode, with:
//  - ping-pong row buffers (the row loop unrolled by two), so no register copies per row;
//  - paired partial rounds: when the last lane round is at most half full (rem = nb − 32·(MAXI−1)
//    ≤ 16, e.g. K = 3584: 16 blocks) and a row and the next one belong to the same single-token
//    group, the first row ("A") loads and computes the next row's ("B") last-round blocks on
//    lanes 16..16+rem−1, next to its own on lanes 0..rem−1. Lane 16+j's term of B is handed to
//    lane j by a shuffle after B's full rounds and added last, so lane j's sum is still
//    ((0 + t_j) + t_{j+32}) + … + t_{j+32(MAXI−1)} in increasing block order (numerics.md §3):
//    the same bits, one partial round per two rows instead of two. B's poison flag is A's (same
//    token, A's vote covers every block);
//  - the block term's high word built by one shift-add (no separate OR).
// Strip mode (several tokens per group) keeps gemv_kernel.

enum : int { kRoleSingle = 0, kRoleA = 1, kRoleB = 2 };

// Tokens [p0, p1) of a group packed as p0 | p1 << 16 (the launcher takes v2 only for P < 2^16),
// to keep the two row states and the cursor within the 80 registers of 6 blocks per SM.
__device__ __forceinline__ int tok_p0(int tok) {
  return tok & 0xffff;
}
__device__ __forceinline__ int tok_p1(int tok) {
  return int(uint32_t(tok) >> 16);
}

struct Cursor2 {
  int g, on;
  const uint8_t* pk;
  const uint8_t* sc;
  int tok;  // tokens of group g, packed
};

// Row (g, on)'s packed and scale pointers, read from the view each row (no pointer state to keep
// in registers): matrix m (w1, w3, w2 = 0, 1, 2) has its two pointers at words 2m, 2m + 1.
static_assert(sizeof(Mxfp4ExpertView) == 56 && offsetof(Mxfp4ExpertView, w3_packed) == 16 &&
              offsetof(Mxfp4ExpertView, w3_scale) == 24 &&
              offsetof(Mxfp4ExpertView, w2_packed) == 32 &&
              offsetof(Mxfp4ExpertView, w2_scale) == 40 &&
              offsetof(Mxfp4ExpertView, w1_scale) == 8);
__device__ __forceinline__ void row_ptrs(const GemvArgs& a, int g, int on, const uint8_t*& pk,
                                         const uint8_t*& sc) {
  const bool second = on >= a.split;
  const int m = a.split == a.N ? 2 : int(second);
  const int o = second ? on - a.split : on;
  const unsigned long long* f = reinterpret_cast<const unsigned long long*>(a.experts + g) + 2 * m;
  pk = reinterpret_cast<const uint8_t*>(__ldg(f)) + size_t(o) * size_t(a.K / 2);
  sc = reinterpret_cast<const uint8_t*>(__ldg(f + 1)) + size_t(o) * size_t(a.K / c::kBlock);
}

__device__ __forceinline__ void seek2(const GemvArgs& a, Cursor2& cu, int g, int on) {
  cu.g = g, cu.on = on;
  if (g >= a.G) return;  // past the end: never read
  cu.tok =
      int(uint32_t(__ldg(a.group_offsets + g)) | uint32_t(__ldg(a.group_offsets + g + 1)) << 16);
}

__device__ __forceinline__ void advance2(const GemvArgs& a, Cursor2& cu) {
  const int on = cu.on + 1;
  if (on == a.N) {
    seek2(a, cu, cu.g + 1, 0);
  } else {
    cu.on = on;
  }
}

// block_term_bits with the high word as one shift-add: ((e_x + s_w) << 20) + (947 << 20 | 2^19)
// equals ((e_x + s_w + 947) << 20) | 2^19 (the shifted value has 20 zero low bits), same bits.
__device__ __forceinline__ double block_term_bits2(uint32_t biased_dot, int e_x, int s_w) {
  const uint32_t hi = ((uint32_t(e_x) + uint32_t(s_w)) << 20) + ((947u << 20) | 0x80000u);
  return __dsub_rn(__hiloint2double(int(hi), int(biased_dot)),
                   __hiloint2double(int(hi), int(0x80000000u)));
}

// What the compute of a loaded row needs: output row | role << 30 (N < 2^30), packed tokens.
struct Row2 {
  int onr, tok;
};

template <int MAXI>
__global__ void __launch_bounds__(kWarps * 32, MAXI <= 4 ? 6 : 3) gemv2_kernel(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int nb = a.K / c::kBlock;
  const int rem = nb - 32 * (MAXI - 1);  // blocks of the last lane round, 1..32
  const bool pair_ok = rem <= 16;
  const bool upper = lane >= 16;
  asm volatile("griddepcontrol.launch_dependents;");
  long long v0, v1;
  warp_range(a, v0, v1);
  if (v0 >= v1) return;
  const int count = int(v1 - v0);
  Cursor2 lc;  // the next row to load
  seek2(a, lc, int(v0 / a.N), int(v0 % a.N));
  bool prev_a = false;

  // Loads row k (at lc) into (w, s, r) and moves lc on.
  auto load = [&](uint4* w, int* s, Row2& r, int left) {  // left: rows from this one on
    const bool next_same = lc.on + 1 < a.N && left > 1;
    const int role = prev_a                                                         ? kRoleB
                     : pair_ok && next_same && tok_p1(lc.tok) - tok_p0(lc.tok) == 1 ? kRoleA
                                                                                    : kRoleSingle;
    r.onr = int(uint32_t(lc.on) | uint32_t(role) << 30), r.tok = lc.tok;
    prev_a = role == kRoleA;
    const uint8_t* cpk;
    const uint8_t* csc;
    row_ptrs(a, lc.g, lc.on, cpk, csc);
    const uint4* wp = reinterpret_cast<const uint4*>(cpk) + lane;
    const uint8_t* sp = csc + lane;
#pragma unroll
    for (int i = 0; i < MAXI - 1; i++) w[i] = __ldcs(wp + 32 * i), s[i] = __ldcs(sp + 32 * i);
    // Last round: own blocks on lanes < rem (not for B: A computed them), the next row's on
    // lanes 16.. of an A row.
    const uint8_t* lpk = cpk;
    const uint8_t* lsc = csc;
    int lb = lane;
    bool act = lane < rem && role != kRoleB;
    if (role == kRoleA && upper) {
      if (lc.on + 1 == a.split) {
        row_ptrs(a, lc.g, lc.on + 1, lpk, lsc);
      } else {
        lpk += a.K / 2, lsc += a.K / c::kBlock;
      }
      lb = lane - 16;
      act = lb < rem;
    }
    if (act) {
      const int b = lb + 32 * (MAXI - 1);
      w[MAXI - 1] = __ldcs(reinterpret_cast<const uint4*>(lpk) + b);
      s[MAXI - 1] = __ldcs(lsc + b);
    }
    advance2(a, lc);
  };

  // An A row's upper lanes leave the B row's last-round term in the B buffer's last weight slot
  // (.x, .y: low and high word), which a B row never loads.
  bool carry_poison = false;
  auto compute = [&](const uint4* w, const int* s, const Row2& r, uint4& carry_slot) {
    const int role = int(uint32_t(r.onr) >> 30), on = r.onr & 0x3fffffff;
    const int p1 = tok_p1(r.tok);
    for (int p = tok_p0(r.tok); p < p1; p++) {
      const int row = a.row_map ? __ldg(a.row_map + p) : p;
      const int8_t* qrow = a.in.q + size_t(row) * a.K;
      const int32_t* erow = a.in.e + size_t(row) * nb;
      double L = 0.0;
      int emin = 0;
#pragma unroll
      for (int i = 0; i < MAXI - 1; i++) {
        const int b = lane + 32 * i;
        const uint4* qb = reinterpret_cast<const uint4*>(qrow + b * c::kBlock);
        const uint4 q0 = __ldg(qb), q1 = __ldg(qb + 1);
        const int ex = __ldg(erow + b);
        emin = min(emin, ex);  // kPoisonedBlock is INT32_MIN: the minimum names a poison
        L = c::dadd(L, block_term_bits2(dot_block_biased(w[i], q0, q1), ex, s[i]));
      }
      if (role != kRoleB) {
        const bool pair_lane = role == kRoleA && upper;
        const int lb = pair_lane ? lane - 16 : lane;
        if (lb < rem) {
          const int b = lb + 32 * (MAXI - 1);
          const uint4* qb = reinterpret_cast<const uint4*>(qrow + b * c::kBlock);
          const uint4 q0 = __ldg(qb), q1 = __ldg(qb + 1);
          const int ex = __ldg(erow + b);
          emin = min(emin, ex);
          const double t = block_term_bits2(dot_block_biased(w[MAXI - 1], q0, q1), ex, s[MAXI - 1]);
          if (pair_lane) {
            carry_slot.x = uint32_t(__double2loint(t)), carry_slot.y = uint32_t(__double2hiint(t));
          } else {
            L = c::dadd(L, t);
          }
        }
      }
      bool poisoned;
      if (role == kRoleB) {
        poisoned = carry_poison;
        const double t = __shfl_down_sync(
            0xffffffffu, __hiloint2double(int(w[MAXI - 1].y), int(w[MAXI - 1].x)), 16);
        if (lane < rem) L = c::dadd(L, t);
      } else {
        poisoned = __any_sync(0xffffffffu, emin == kPoisonedBlock);
        carry_poison = poisoned;
      }
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) L = c::dadd(L, __shfl_down_sync(0xffffffffu, L, off));
      if (lane == 0) a.out[size_t(p) * a.N + on] = poisoned ? c::canonical_nan() : float(L);
    }
  };

  uint4 w0[MAXI], w1[MAXI];
  int s0[MAXI], s1[MAXI];
  Row2 r0, r1;
  load(w0, s0, r0, count);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int left = count; left > 0; left -= 2) {  // rows not yet computed
    if (left > 1) load(w1, s1, r1, left - 1);
    compute(w0, s0, r0, w1[MAXI - 1]);
    if (left == 1) break;
    if (left > 2) load(w0, s0, r0, left - 2);
    compute(w1, s1, r1, w0[MAXI - 1]);
  }
}

template <int MAXI>
Status launch2_t(GemvArgs a, int P, void* stream) {
  static_assert(MAXI >= 1 && MAXI <= 8);
  namespace kd = kernels::detail;
  // Strip mode, and token counts beyond the packed form: the measured kernel.
  if (P > a.G || P >= (1 << 16)) return launch_t<MAXI>(a, P, stream);
  int dev = 0, sms = 0, per_sm = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return kd::status_of(e);
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      e != cudaSuccess)
    return kd::status_of(e);
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv2_kernel<MAXI>,
                                                                    kWarps * 32, 0);
      e != cudaSuccess)
    return kd::status_of(e);
  const long long R = (long long)a.G * a.N;
  const long long warps = (long long)std::max(1, sms * std::max(1, per_sm)) * kWarps;
  a.rows_per_warp = int((R + warps - 1) / warps);
  const long long used_warps = (R + a.rows_per_warp - 1) / a.rows_per_warp;

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned((used_warps + kWarps - 1) / kWarps));
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = kd::as_stream(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return kd::status_of(cudaLaunchKernelEx(&cfg, gemv2_kernel<MAXI>, a));
}

Status launch2(const GemvArgs& a, int P, void* stream) {
  if (a.G <= 0 || P <= 0) return {};
  switch ((a.K / c::kBlock + 31) / 32) {
    case 1:
      return launch2_t<1>(a, P, stream);
    case 2:
      return launch2_t<2>(a, P, stream);
    case 3:
      return launch2_t<3>(a, P, stream);
    case 4:
      return launch2_t<4>(a, P, stream);
    case 5:
      return launch2_t<5>(a, P, stream);
    case 6:
      return launch2_t<6>(a, P, stream);
    case 7:
      return launch2_t<7>(a, P, stream);
    case 8:
      return launch2_t<8>(a, P, stream);
    default:
      return kernels::detail::invalid("grouped_experts: input width above 8192");
  }
}

}  // namespace

Status gemv_gate_up(const ExpertBatch& b, const Workspace& ws, GemvKernel kernel, void* stream) {
  GemvArgs a{b.experts, b.group_offsets, b.pair_token, ws.x, b.H, 2 * b.I, b.I, ws.gu, b.G, 0};
  return kernel == GemvKernel::v2 ? launch2(a, b.P, stream) : launch(a, b.P, stream);
}

Status gemv_down(const ExpertBatch& b, const Workspace& ws, GemvKernel kernel, void* stream) {
  GemvArgs a{b.experts, b.group_offsets, nullptr, ws.h_q, b.I, b.H, b.H, b.y, b.G, 0};
  return kernel == GemvKernel::v2 ? launch2(a, b.P, stream) : launch(a, b.P, stream);
}

}  // namespace strata::kernels::moe::detail
