// IMMA path of the grouped MXFP4 experts (many tokens per expert; prefill): int8 tensor cores,
// one mma.m16n8k32 k-step per 32-element block, bit-identical to the contract (numerics.md §3).
//
// Exactness: the block dot of one (row, token) is the same int32 whichever order its 32 products
// are summed in, so each lane feeds the mma its own permutation of the block — lane (group g,
// thread t) puts elements 8t..8t+3 in k-slots 4t..4t+3 and 8t+4..8t+7 in 16+4t..16+4t+3, for A
// (weights: one 32-bit word of packed nibbles per row, decoded to int8 in registers) and B
// (activations: 8 consecutive int8) alike. The fp64 part follows the contract's lane order without
// a warp of lanes: blocks are visited lane class by lane class, j in bit-reversed order
// (0, 16, 8, 24, …), each class summing its blocks j, j+32, … in increasing order, and the 32 class
// sums are combined as they arrive by a 5-level pairwise tree — exactly the butterfly
// (off 16, 8, 4, 2, 1), whose tree has the classes in bit-reversed order as its leaves.
//
// Tiling: a CTA of 4 warps owns 16 output rows of one expert; warp w walks token tiles w, w+4, …
// of the group (8 tokens each), so the rows' weights come from HBM once and from L1/L2 after.
#include <cuda_runtime.h>

#include "kernels/moe/contract_device.cuh"
#include "kernels/moe/paths.h"
#include "kernels/ops/launch.cuh"
#include "storage/expert_contract.h"

namespace strata::kernels::moe::detail {
namespace {

namespace c = strata::contract;

constexpr int kWarps = 4;

struct ImmaArgs {
  const Mxfp4ExpertView* experts;
  const int32_t* group_offsets;
  const int32_t* row_map;  // pair → input row (nullptr: the pair itself)
  QuantRows in;
  int K, N;
  float* out;  // NMAT = 2: [P, 2, N] (gate, up); NMAT = 1: [P, N]
};

constexpr int rev5(int i) {
  return ((i & 1) << 4) | ((i & 2) << 2) | (i & 4) | ((i & 8) >> 2) | ((i & 16) >> 4);
}

__device__ __forceinline__ void mma_s8(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

template <int NMAT>
__global__ void __launch_bounds__(kWarps * 32) imma_kernel(ImmaArgs a) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int g = blockIdx.y;
  const int row0 = blockIdx.x * 16;
  const int p0 = a.group_offsets[g], p1 = a.group_offsets[g + 1];
  if (p1 <= p0 || row0 >= a.N) return;
  const Mxfp4ExpertView v = a.experts[g];
  const uint8_t* pk[2] = {NMAT == 2 ? v.w1_packed : v.w2_packed, v.w3_packed};
  const uint8_t* sc[2] = {NMAT == 2 ? v.w1_scale : v.w2_scale, v.w3_scale};
  const int K = a.K, nb = K / c::kBlock;
  // This lane's two A rows (gid, gid + 8); rows past N (odd shapes) read the last row, never
  // stored.
  const int rlo = min(row0 + gid, a.N - 1), rhi = min(row0 + gid + 8, a.N - 1);
  const uint8_t* wlo[NMAT];
  const uint8_t* whi[NMAT];
  const uint8_t* slo[NMAT];
  const uint8_t* shi[NMAT];
#pragma unroll
  for (int m = 0; m < NMAT; m++) {
    wlo[m] = pk[m] + size_t(rlo) * (K / 2) + tig * 4;
    whi[m] = pk[m] + size_t(rhi) * (K / 2) + tig * 4;
    slo[m] = sc[m] + size_t(rlo) * nb;
    shi[m] = sc[m] + size_t(rhi) * nb;
  }

  for (int tile = warp; p0 + tile * 8 < p1; tile += kWarps) {
    const int pt = p0 + tile * 8;
    // B operand: token column gid of the tile.
    const int pb = pt + gid;
    const bool bvalid = pb < p1;
    const int8_t* qb = a.in.q + size_t(bvalid ? (a.row_map ? a.row_map[pb] : pb) : 0) * K + tig * 8;
    // Accumulator columns: tokens 2·tig and 2·tig + 1 of the tile.
    int crow[2];
    bool cvalid[2];
#pragma unroll
    for (int cc = 0; cc < 2; cc++) {
      const int pc = pt + 2 * tig + cc;
      cvalid[cc] = pc < p1;
      crow[cc] = cvalid[cc] ? (a.row_map ? a.row_map[pc] : pc) : 0;
    }
    const int32_t* e0 = a.in.e + size_t(crow[0]) * nb;
    const int32_t* e1 = a.in.e + size_t(crow[1]) * nb;

    // Pending left operands of the pairwise tree, per level; fragment element r of matrix m:
    // r = 0: (row gid, col 2tig), 1: (gid, 2tig+1), 2: (gid+8, 2tig), 3: (gid+8, 2tig+1).
    double S[NMAT][4][5];
    double F[NMAT][4];
    bool bad0 = false, bad1 = false;  // a poisoned block in column 0 / 1 (every block is visited)
#pragma unroll
    for (int i = 0; i < 32; i++) {
      const int j = rev5(i);
      double L[NMAT][4];
#pragma unroll
      for (int m = 0; m < NMAT; m++)
#pragma unroll
        for (int r = 0; r < 4; r++) L[m][r] = 0.0;
      for (int b = j; b < nb; b += 32) {
        uint2 bq = make_uint2(0u, 0u);
        if (bvalid) bq = __ldg(reinterpret_cast<const uint2*>(qb + size_t(b) * c::kBlock));
        int ex0 = __ldg(e0 + b), ex1 = __ldg(e1 + b);
        if (ex0 == kPoisonedBlock) bad0 = true, ex0 = 0;  // output NaN; keep the terms finite
        if (ex1 == kPoisonedBlock) bad1 = true, ex1 = 0;
#pragma unroll
        for (int m = 0; m < NMAT; m++) {
          const uint32_t wl = __ldg(reinterpret_cast<const uint32_t*>(wlo[m] + size_t(b) * 16));
          const uint32_t wh = __ldg(reinterpret_cast<const uint32_t*>(whi[m] + size_t(b) * 16));
          int d[4];
          mma_s8(d, decode4(wl), decode4(wh), decode4(wl >> 16), decode4(wh >> 16), bq.x, bq.y);
          const int sl = __ldg(slo[m] + b), sh = __ldg(shi[m] + b);
          L[m][0] = c::dadd(L[m][0], block_term_fast(d[0], ex0, sl));
          L[m][1] = c::dadd(L[m][1], block_term_fast(d[1], ex1, sl));
          L[m][2] = c::dadd(L[m][2], block_term_fast(d[2], ex0, sh));
          L[m][3] = c::dadd(L[m][3], block_term_fast(d[3], ex1, sh));
        }
      }
      // Push leaf i into the tree: combine with pending left operands while i's low bits are 1.
#pragma unroll
      for (int m = 0; m < NMAT; m++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
          double val = L[m][r];
          int lvl = 0;
#pragma unroll
          for (; lvl < 5 && ((i >> lvl) & 1); lvl++) val = c::dadd(S[m][r][lvl], val);
          if (lvl < 5)
            S[m][r][lvl] = val;
          else
            F[m][r] = val;
        }
    }

#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int row = row0 + gid + (r >= 2 ? 8 : 0);
      const int cc = r & 1;
      if (row >= a.N || !cvalid[cc]) continue;
      const int pc = pt + 2 * tig + cc;
      const bool poisoned = cc ? bad1 : bad0;
#pragma unroll
      for (int m = 0; m < NMAT; m++)
        a.out[(size_t(pc) * NMAT + m) * a.N + row] = poisoned ? c::canonical_nan() : float(F[m][r]);
    }
  }
}

template <int NMAT>
Status launch(const ImmaArgs& a, int G, void* stream) {
  const dim3 grid(unsigned((a.N + 15) / 16), unsigned(G));
  imma_kernel<NMAT><<<grid, kWarps * 32, 0, kernels::detail::as_stream(stream)>>>(a);
  return kernels::detail::launch_status();
}

}  // namespace

Status imma_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream) {
  ImmaArgs a{b.experts, b.group_offsets, b.pair_token, ws.x, b.H, b.I, ws.gu};
  return launch<2>(a, b.G, stream);
}

Status imma_down(const ExpertBatch& b, const Workspace& ws, void* stream) {
  ImmaArgs a{b.experts, b.group_offsets, nullptr, ws.h_q, b.I, b.H, b.y};
  return launch<1>(a, b.G, stream);
}

}  // namespace strata::kernels::moe::detail
