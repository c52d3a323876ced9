// GEMV path of the grouped MXFP4 experts (few tokens per expert; decode). The work is the list of
// "virtual rows" v = g·N + o over the groups g and the N output rows of one projection (gate|up:
// the I rows of w1, then the I rows of w3, so the output [P, 2, I] is row-contiguous the same way;
// down: the H rows of w2). The grid is persistent (as many blocks as fit on the device) and every
// warp walks one contiguous range of virtual rows — equal shares, so no tail wave, and a warp's
// weights are one contiguous stream.
//
// Per row, lane j holds blocks j, j+32, … (16 packed bytes + 1 scale byte each: the warp reads 512
// contiguous bytes per step) in registers; the next row's loads are in flight while it computes,
// and the rows kL2Ahead further are prefetched into L2, so HBM sees enough bytes in flight without
// spending registers on them. Per token the lane forms exact int32 block dots (E2M1 decoded by
// PRMT sign-mode lookups, dp4a), turns them into exact fp64 block terms by bits and sums them in
// increasing block order; the warp butterfly (off 16, 8, 4, 2, 1) finishes — exactly the
// reduction order of numerics.md §3, so the result is the contract's bit for bit.
//
// The kernels take part in programmatic dependent launch: a GEMV is launched while its producer
// (the activation quantization) still runs, issues its first weight loads, and only then waits
// for the producer's results (griddepcontrol.wait); launched plainly, the wait is a no-op.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/moe/contract_device.cuh"
#include "kernels/moe/paths.h"
#include "kernels/ops/launch.cuh"
#include "storage/expert_contract.h"

namespace strata::kernels::moe::detail {
namespace {

namespace c = strata::contract;

constexpr int kWarps = 4;           // warps per block
constexpr int kMinBlocksPerSm = 6;  // register cap (K ≤ 4096): 65536 / (6 · 128) → ≤ 80 registers

struct GemvArgs {
  const Mxfp4ExpertView* experts;
  const int32_t* group_offsets;
  const int32_t* row_map;  // pair → input row (nullptr: the pair itself)
  QuantRows in;            // quantized inputs [rows, K]
  int K, N;                // input width, output rows per expert (2·I for gate|up)
  int split;               // rows ≥ split come from the second matrix (gate|up: I; down: N)
  float* out;              // [P, N]
  int G;                   // groups
  int rows_per_warp;       // contiguous virtual rows per warp
  int l2_ahead;            // rows prefetched into L2 ahead of the current one (0: none)
};

__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Where the weights of virtual row (g, on) start: packed row and scale row.
struct RowPtr {
  const uint8_t* pk;
  const uint8_t* sc;
};

__device__ __forceinline__ RowPtr row_ptr(const GemvArgs& a, int g, int on) {
  const Mxfp4ExpertView* ev = a.experts + g;
  const bool second = on >= a.split;
  const int o = second ? on - a.split : on;
  const uint8_t* pk = a.split == a.N ? ev->w2_packed : second ? ev->w3_packed : ev->w1_packed;
  const uint8_t* sc = a.split == a.N ? ev->w2_scale : second ? ev->w3_scale : ev->w1_scale;
  const int nb = a.K / c::kBlock;
  return {pk + size_t(o) * size_t(a.K / 2), sc + size_t(o) * size_t(nb)};
}

template <int MAXI>
struct RowRegs {
  uint4 w[MAXI];
  int s[MAXI];
};

// MAXI = ceil(nb / 32): blocks per lane; every lane has blocks i < MAXI − 1, only the last round
// is partial.
template <int MAXI>
__device__ __forceinline__ void load_row(RowRegs<MAXI>& r, RowPtr p, int nb, int lane) {
#pragma unroll
  for (int i = 0; i < MAXI; i++) {
    const int b = lane + 32 * i;
    if (i < MAXI - 1 || b < nb) {
      r.w[i] = load_stream(p.pk + size_t(b) * 16);
      r.s[i] = __ldcs(p.sc + b);
    }
  }
}

template <int MAXI>
__device__ __forceinline__ void prefetch_row(RowPtr p, int nb, int lane) {
#pragma unroll
  for (int i = 0; i < MAXI; i++) {
    const int b = lane + 32 * i;
    if (i < MAXI - 1 || b < nb) prefetch_l2(p.pk + size_t(b) * 16);
  }
  // The scale row (nb ≤ 256 bytes): one prefetch per 128-byte step plus its last byte.
  if (lane * 128 < nb)
    prefetch_l2(p.sc + lane * 128);
  else if (lane == 31)
    prefetch_l2(p.sc + nb - 1);
}

template <int MAXI>
__global__ void __launch_bounds__(kWarps * 32, MAXI <= 4 ? kMinBlocksPerSm : 3)
    gemv_kernel(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int warp = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int nb = a.K / c::kBlock;
  const long long R = (long long)a.G * a.N;
  const long long v0 = (long long)warp * a.rows_per_warp;
  const long long v1 = min(R, v0 + a.rows_per_warp);
  // Let the next kernel of the chain launch now: it waits for this grid's completion itself.
  asm volatile("griddepcontrol.launch_dependents;");
  if (v0 >= v1) return;

  // The cursor (g, on) of the current row and its weights; the weights do not depend on the
  // producer kernel, so the first row's loads go out before the dependency wait.
  int g = int(v0 / a.N), on = int(v0 - (long long)g * a.N);
  RowPtr cur_p = row_ptr(a, g, on);
  RowRegs<MAXI> cur, nxt;
  load_row<MAXI>(cur, cur_p, nb, lane);
  // L2 prefetch runs l2_ahead rows in front, while those rows stay in the current matrix (the
  // matrix's rows are contiguous); at a matrix boundary it skips until the cursor crosses.
  const int row_bytes = a.K / 2;
  auto seg_end = [&](int on_) { return on_ < a.split ? a.split : a.N; };
  for (int d = 1; d < a.l2_ahead; d++)
    if (v0 + d < v1 && on + d < seg_end(on))
      prefetch_row<MAXI>({cur_p.pk + size_t(d) * row_bytes, cur_p.sc + size_t(d) * nb}, nb, lane);

  asm volatile("griddepcontrol.wait;" ::: "memory");
  int p0 = a.group_offsets[g], p1 = a.group_offsets[g + 1];

  for (long long v = v0; v < v1; v++) {
    // Advance a copy of the cursor to the next row and put its loads in flight.
    int gn = g, onn = on + 1;
    RowPtr nxt_p;
    if (onn == a.N) {
      gn = g + 1, onn = 0;
      nxt_p = gn < a.G ? row_ptr(a, gn, 0) : cur_p;
    } else if (onn == a.split) {
      nxt_p = row_ptr(a, g, onn);
    } else {
      nxt_p = {cur_p.pk + row_bytes, cur_p.sc + nb};
    }
    const bool more = v + 1 < v1;
    if (more) load_row<MAXI>(nxt, nxt_p, nb, lane);
    if (a.l2_ahead > 0 && v + a.l2_ahead < v1 && on + a.l2_ahead < seg_end(on))
      prefetch_row<MAXI>(
          {cur_p.pk + size_t(a.l2_ahead) * row_bytes, cur_p.sc + size_t(a.l2_ahead) * nb}, nb,
          lane);

    for (int p = p0; p < p1; p++) {
      const int row = a.row_map ? a.row_map[p] : p;
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
          L = c::dadd(L, block_term_bits(dot_block_biased(cur.w[i], q0, q1), ex, cur.s[i]));
        }
      }
      const bool poisoned = __any_sync(0xffffffffu, emin == kPoisonedBlock);
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) L = c::dadd(L, __shfl_down_sync(0xffffffffu, L, off));
      if (lane == 0) a.out[size_t(p) * a.N + on] = poisoned ? c::canonical_nan() : float(L);
    }
    if (!more) break;
    cur = nxt, cur_p = nxt_p;
    if (gn != g) p0 = p1, p1 = a.group_offsets[gn + 1];
    g = gn, on = onn;
  }
}

int g_l2_ahead = 3;  // exploration knob (bench only); see set_gemv_l2_ahead

template <int MAXI>
Status launch_t(GemvArgs a, void* stream) {
  static_assert(MAXI >= 1 && MAXI <= 8);
  int dev = 0, sms = 0, per_sm = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return kernels::detail::status_of(e);
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
      e != cudaSuccess)
    return kernels::detail::status_of(e);
  if (cudaError_t e =
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<MAXI>, kWarps * 32, 0);
      e != cudaSuccess)
    return kernels::detail::status_of(e);
  const long long R = (long long)a.G * a.N;
  const long long warps = (long long)std::max(1, sms * std::max(1, per_sm)) * kWarps;
  a.rows_per_warp = int((R + warps - 1) / warps);
  const long long used_warps = (R + a.rows_per_warp - 1) / a.rows_per_warp;
  a.l2_ahead = g_l2_ahead;

  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned((used_warps + kWarps - 1) / kWarps));
  cfg.blockDim = dim3(kWarps * 32);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = kernels::detail::as_stream(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return kernels::detail::status_of(cudaLaunchKernelEx(&cfg, gemv_kernel<MAXI>, a));
}

Status launch(const GemvArgs& a, void* stream) {
  if (a.G <= 0) return {};
  switch ((a.K / c::kBlock + 31) / 32) {
    case 1:
      return launch_t<1>(a, stream);
    case 2:
      return launch_t<2>(a, stream);
    case 3:
      return launch_t<3>(a, stream);
    case 4:
      return launch_t<4>(a, stream);
    case 5:
      return launch_t<5>(a, stream);
    case 6:
      return launch_t<6>(a, stream);
    case 7:
      return launch_t<7>(a, stream);
    case 8:
      return launch_t<8>(a, stream);
    default:
      return kernels::detail::invalid("grouped_experts: input width above 8192");
  }
}

}  // namespace

void set_gemv_l2_ahead(int rows) {
  g_l2_ahead = rows < 0 ? 0 : rows;
}

Status gemv_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream) {
  GemvArgs a{b.experts, b.group_offsets, b.pair_token, ws.x, b.H, 2 * b.I, b.I, ws.gu, b.G, 0, 0};
  return launch(a, stream);
}

Status gemv_down(const ExpertBatch& b, const Workspace& ws, void* stream) {
  GemvArgs a{b.experts, b.group_offsets, nullptr, ws.h_q, b.I, b.H, b.H, b.y, b.G, 0, 0};
  return launch(a, stream);
}

}  // namespace strata::kernels::moe::detail
