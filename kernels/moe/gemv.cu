// GEMV path of the grouped MXFP4 experts (few tokens per expert; decode). One warp walks a strip
// of kRows output rows of one expert. Lane j holds blocks j, j+32, … of the current row (16 packed
// bytes + 1 scale byte each: the warp reads 512 contiguous bytes per step) in registers and, while
// it computes, the next row's loads are already in flight (software pipelining keeps HBM busy).
// Per token the lane forms exact int32 block dots (E2M1 decoded to int8 in registers, dp4a),
// turns them into exact fp64 block terms and sums them in increasing block order; the warp
// butterfly (off 16, 8, 4, 2, 1) finishes — exactly the reduction order of numerics.md §3, so the
// result is the contract's bit for bit. Gate and up are one launch over 2·I virtual rows (w1 rows,
// then w3 rows; the output [P, 2, I] is row-contiguous the same way); the GLU runs, one lane per
// element, in the kernel that quantizes h.
#include <cuda_runtime.h>

#include "kernels/moe/contract_device.cuh"
#include "kernels/moe/paths.h"
#include "kernels/ops/launch.cuh"
#include "storage/expert_contract.h"

namespace strata::kernels::moe::detail {
namespace {

namespace c = strata::contract;

constexpr int kWarps = 4;  // warps per block
constexpr int kRows = 8;   // rows per warp

struct GemvArgs {
  const Mxfp4ExpertView* experts;
  const int32_t* group_offsets;
  const int32_t* row_map;  // pair → input row (nullptr: the pair itself)
  QuantRows in;            // quantized inputs [rows, K]
  int K, N;                // input width, output rows per expert (2·I for gate|up)
  int split;               // rows ≥ split come from the second matrix (gate|up: I; down: N)
  float* out;              // [P, N]
};

__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}

template <int MAXI>
struct RowRegs {
  uint4 w[MAXI];
  int s[MAXI];
};

template <int MAXI>
__device__ __forceinline__ void load_row(RowRegs<MAXI>& r, const uint8_t* pk, const uint8_t* sc,
                                         int o, int K, int lane) {
  const int nb = K / c::kBlock;
  const size_t row_bytes = size_t(o) * size_t(K / 2), row_blocks = size_t(o) * size_t(nb);
#pragma unroll
  for (int i = 0; i < MAXI; i++) {
    const int b = lane + 32 * i;
    if (b < nb) {
      r.w[i] = load_stream(pk + row_bytes + size_t(b) * 16);
      r.s[i] = __ldcs(sc + row_blocks + b);
    }
  }
}

// MAXI: blocks per lane (K ≤ 32·32·MAXI).
template <int MAXI>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int v0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * kRows;
  const int g = blockIdx.y;
  if (v0 >= a.N) return;
  const int p0 = a.group_offsets[g], p1 = a.group_offsets[g + 1];
  if (p0 >= p1) return;
  const Mxfp4ExpertView ev = a.experts[g];
  // A strip never straddles the split (split is a multiple of 32, kRows divides 32).
  const bool second = v0 >= a.split;
  const uint8_t* pk = a.split == a.N ? ev.w2_packed : second ? ev.w3_packed : ev.w1_packed;
  const uint8_t* sc = a.split == a.N ? ev.w2_scale : second ? ev.w3_scale : ev.w1_scale;
  const int o0 = second ? v0 - a.split : v0;  // row within the matrix
  const int nb = a.K / c::kBlock;
  const int rows = min(kRows, (second ? a.N : a.split) - v0);

  RowRegs<MAXI> cur, nxt;
  load_row<MAXI>(cur, pk, sc, o0, a.K, lane);
  for (int r = 0; r < rows; r++) {
    if (r + 1 < rows) load_row<MAXI>(nxt, pk, sc, o0 + r + 1, a.K, lane);
    for (int p = p0; p < p1; p++) {
      const int row = a.row_map ? a.row_map[p] : p;
      const int8_t* qr = a.in.q + size_t(row) * a.K;
      const int32_t* er = a.in.e + size_t(row) * nb;
      double L = 0.0;
      bool bad = false;
#pragma unroll
      for (int i = 0; i < MAXI; i++) {
        const int b = lane + 32 * i;
        if (b < nb) {
          const uint4* qb = reinterpret_cast<const uint4*>(qr + size_t(b) * c::kBlock);
          const uint4 q0 = __ldg(qb), q1 = __ldg(qb + 1);
          int ex = __ldg(er + b);
          if (ex == kPoisonedBlock) bad = true, ex = 0;  // the output is NaN; keep the term finite
          L = c::dadd(L, block_term_fast(dot_block(cur.w[i], q0, q1), ex, cur.s[i]));
        }
      }
      const bool poisoned = __any_sync(0xffffffffu, bad);
#pragma unroll
      for (int off = 16; off >= 1; off >>= 1) L = c::dadd(L, __shfl_down_sync(0xffffffffu, L, off));
      if (lane == 0) a.out[size_t(p) * a.N + v0 + r] = poisoned ? c::canonical_nan() : float(L);
    }
    if (r + 1 < rows) cur = nxt;
  }
}

Status launch(const GemvArgs& a, int G, void* stream) {
  const int nb = a.K / c::kBlock;
  const int rows_per_block = kWarps * kRows;
  const dim3 grid(unsigned((a.N + rows_per_block - 1) / rows_per_block), unsigned(G));
  cudaStream_t st = kernels::detail::as_stream(stream);
  if (nb <= 32)
    gemv_kernel<1><<<grid, kWarps * 32, 0, st>>>(a);
  else if (nb <= 64)
    gemv_kernel<2><<<grid, kWarps * 32, 0, st>>>(a);
  else if (nb <= 96)
    gemv_kernel<3><<<grid, kWarps * 32, 0, st>>>(a);
  else if (nb <= 128)
    gemv_kernel<4><<<grid, kWarps * 32, 0, st>>>(a);
  else if (nb <= 256)
    gemv_kernel<8><<<grid, kWarps * 32, 0, st>>>(a);
  else
    return kernels::detail::invalid("grouped_experts: input width above 8192");
  return kernels::detail::launch_status();
}

}  // namespace

Status gemv_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream) {
  GemvArgs a{b.experts, b.group_offsets, b.pair_token, ws.x, b.H, 2 * b.I, b.I, ws.gu};
  return launch(a, b.G, stream);
}

Status gemv_down(const ExpertBatch& b, const Workspace& ws, void* stream) {
  GemvArgs a{b.experts, b.group_offsets, nullptr, ws.h_q, b.I, b.H, b.H, b.y};
  return launch(a, b.G, stream);
}

}  // namespace strata::kernels::moe::detail
