// GEMV path of the grouped MXFP4 experts (few tokens per expert; decode). One warp per output row
// of one expert: lane j loads blocks j, j+32, … of the row (16 packed bytes + 1 scale byte each:
// a warp reads 512 contiguous bytes per step) into registers once, then walks the group's tokens.
// Per token the lane forms exact int32 block dots (E2M1 decoded to int8 in registers, dp4a),
// turns them into exact fp64 block terms and sums them in increasing block order; the warp
// butterfly (off 16, 8, 4, 2, 1) finishes — exactly the reduction order of numerics.md §3, so the
// result is the contract's bit for bit. Gate and up share the loop and end in the contract GLU.
#include <cuda_runtime.h>

#include "kernels/moe/contract_device.cuh"
#include "kernels/moe/paths.h"
#include "kernels/ops/launch.cuh"
#include "storage/expert_contract.h"

namespace strata::kernels::moe::detail {
namespace {

namespace c = strata::contract;

constexpr int kWarps = 8;  // rows per block

struct GemvArgs {
  const Mxfp4ExpertView* experts;
  const int32_t* group_offsets;
  const int32_t* row_map;  // pair → input row (nullptr: the pair itself)
  QuantRows in;            // quantized inputs [rows, K]
  int K, N;                // input width, output rows per expert
  float* out;              // [P, N]
  GluParams glu;
};

__device__ __forceinline__ uint4 load_stream(const uint8_t* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}

// NMAT = 2: gate (w1) and up (w3) rows, output glu(g, u). NMAT = 1: down (w2) row, output y.
// MAXI: blocks per lane (K ≤ 32·32·MAXI).
template <int NMAT, int MAXI>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int o = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int g = blockIdx.y;
  if (o >= a.N) return;
  const int p0 = a.group_offsets[g], p1 = a.group_offsets[g + 1];
  if (p0 >= p1) return;
  const Mxfp4ExpertView v = a.experts[g];
  const uint8_t* pk[2] = {NMAT == 2 ? v.w1_packed : v.w2_packed, v.w3_packed};
  const uint8_t* sc[2] = {NMAT == 2 ? v.w1_scale : v.w2_scale, v.w3_scale};
  const int nb = a.K / c::kBlock;
  const size_t row_bytes = size_t(o) * size_t(a.K / 2), row_blocks = size_t(o) * size_t(nb);

  uint4 w[NMAT][MAXI];
  int s[NMAT][MAXI];
#pragma unroll
  for (int m = 0; m < NMAT; m++)
#pragma unroll
    for (int i = 0; i < MAXI; i++) {
      const int b = lane + 32 * i;
      if (b < nb) {
        w[m][i] = load_stream(pk[m] + row_bytes + size_t(b) * 16);
        s[m][i] = sc[m][row_blocks + b];
      }
    }

  for (int p = p0; p < p1; p++) {
    const int row = a.row_map ? a.row_map[p] : p;
    const int8_t* qr = a.in.q + size_t(row) * a.K;
    const int32_t* er = a.in.e + size_t(row) * nb;
    double L[NMAT];
#pragma unroll
    for (int m = 0; m < NMAT; m++) L[m] = 0.0;
#pragma unroll
    for (int i = 0; i < MAXI; i++) {
      const int b = lane + 32 * i;
      if (b < nb) {
        const uint4* qb = reinterpret_cast<const uint4*>(qr + size_t(b) * c::kBlock);
        const uint4 q0 = __ldg(qb), q1 = __ldg(qb + 1);
        const int ex = __ldg(er + b);
#pragma unroll
        for (int m = 0; m < NMAT; m++)
          L[m] = c::dadd(L[m], c::block_term(dot_block(w[m][i], q0, q1), ex, s[m][i]));
      }
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1)
#pragma unroll
      for (int m = 0; m < NMAT; m++) L[m] = c::dadd(L[m], __shfl_down_sync(0xffffffffu, L[m], off));
    if (lane == 0) {
      const bool poisoned = a.in.poison[row] != 0;
      float r;
      if (NMAT == 2) {
        const float gv = poisoned ? c::canonical_nan() : float(L[0]);
        const float uv = poisoned ? c::canonical_nan() : float(L[NMAT - 1]);
        r = c::glu(gv, uv, a.glu);
      } else {
        r = poisoned ? c::canonical_nan() : float(L[0]);
      }
      a.out[size_t(p) * a.N + o] = r;
    }
  }
}

template <int NMAT>
Status launch(const GemvArgs& a, int G, void* stream) {
  const int nb = a.K / c::kBlock;
  const dim3 grid(unsigned((a.N + kWarps - 1) / kWarps), unsigned(G));
  cudaStream_t st = kernels::detail::as_stream(stream);
  if (nb <= 32)
    gemv_kernel<NMAT, 1><<<grid, kWarps * 32, 0, st>>>(a);
  else if (nb <= 64)
    gemv_kernel<NMAT, 2><<<grid, kWarps * 32, 0, st>>>(a);
  else if (nb <= 96)
    gemv_kernel<NMAT, 3><<<grid, kWarps * 32, 0, st>>>(a);
  else if (nb <= 128)
    gemv_kernel<NMAT, 4><<<grid, kWarps * 32, 0, st>>>(a);
  else if (nb <= 256)
    gemv_kernel<NMAT, 8><<<grid, kWarps * 32, 0, st>>>(a);
  else
    return kernels::detail::invalid("grouped_experts: input width above 8192");
  return kernels::detail::launch_status();
}

}  // namespace

Status gemv_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream) {
  GemvArgs a{b.experts, b.group_offsets, b.pair_token, ws.x, b.H, b.I, ws.h, b.glu};
  return launch<2>(a, b.G, stream);
}

Status gemv_down(const ExpertBatch& b, const Workspace& ws, void* stream) {
  GemvArgs a{b.experts, b.group_offsets, nullptr, ws.h_q, b.I, b.H, b.y, b.glu};
  return launch<1>(a, b.G, stream);
}

}  // namespace strata::kernels::moe::detail
