// The online-softmax step of one 64-key tile shared by the MLA prefill and decode kernels (sm_90a):
// scores in the m16n8 C layout of a 64-row wgmma or mma.sync tile (two rows per thread), P out as
// bf16 A fragments. Device-only; included by kernels/mla/*.cu.
#pragma once
#include <cstdint>

#include "kernels/mla/mla.h"
#include "kernels/mla/wgmma.cuh"

namespace strata::kernels::mla {

constexpr int kKeyTile = 64;  // keys per tile

// One 64-key tile of the online softmax for this thread's two rows (pos_lo, pos_hi): masks the
// scores on the diagonal tile (or at and past `end`, the end of the cache tile), updates the
// running max m (scaled, log2 domain) and the per-thread partial sums l, and returns P as bf16 A
// fragments. It leaves O alone and returns the factors a_lo, a_hi that rescale it (scale_o), so a
// kernel whose P·V of the previous tile is still in flight can apply them once it has landed.
__device__ __forceinline__ void softmax_tile(float (&sc)[kKeyTile / 8][4],
                                             uint32_t (&pa)[kKeyTile / 16][4], float& m_lo,
                                             float& m_hi, float& l_lo, float& l_hi, float& a_lo,
                                             float& a_hi, int64_t s0, int64_t wpos0, int64_t pos_lo,
                                             int64_t pos_hi, int64_t end, int t, float qscale) {
  if (s0 + kKeyTile - 1 > wpos0 || s0 + kKeyTile > end) {  // the diagonal (or the end of the tile)
#pragma unroll
    for (int nt = 0; nt < kKeyTile / 8; nt++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int64_t sp = s0 + nt * 8 + 2 * t + e;
        if (sp > pos_lo || sp >= end) sc[nt][e] = -INFINITY;
        if (sp > pos_hi || sp >= end) sc[nt][2 + e] = -INFINITY;
      }
    }
  }
  float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < kKeyTile / 8; nt++) {
    mx_lo = fmaxf(mx_lo, fmaxf(sc[nt][0], sc[nt][1]));
    mx_hi = fmaxf(mx_hi, fmaxf(sc[nt][2], sc[nt][3]));
  }
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o2));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o2));
  }
  // New running max in the scaled domain (qscale > 0 commutes with max). A row with no valid key
  // so far keeps -inf; subtracting 0 then gives p = 0 and a = 0 instead of NaN.
  const float mn_lo = fmaxf(m_lo, mx_lo * qscale), mn_hi = fmaxf(m_hi, mx_hi * qscale);
  const float sub_lo = mn_lo == -INFINITY ? 0.f : mn_lo, sub_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
  a_lo = fast_exp2(m_lo - sub_lo), a_hi = fast_exp2(m_hi - sub_hi);
  m_lo = mn_lo, m_hi = mn_hi;
  float ps_lo = 0.f, ps_hi = 0.f;
#pragma unroll
  for (int nt = 0; nt < kKeyTile / 8; nt++) {
    const float p0 = fast_exp2(fmaf(sc[nt][0], qscale, -sub_lo));
    const float p1 = fast_exp2(fmaf(sc[nt][1], qscale, -sub_lo));
    const float p2 = fast_exp2(fmaf(sc[nt][2], qscale, -sub_hi));
    const float p3 = fast_exp2(fmaf(sc[nt][3], qscale, -sub_hi));
    ps_lo += p0 + p1;
    ps_hi += p2 + p3;
    pa[nt / 2][(nt % 2) * 2 + 0] = pack_bf2(p0, p1);
    pa[nt / 2][(nt % 2) * 2 + 1] = pack_bf2(p2, p3);
  }
  l_lo = l_lo * a_lo + ps_lo;  // per-thread partial row sums, reduced over the quad at the end
  l_hi = l_hi * a_hi + ps_hi;
}
__device__ __forceinline__ void scale_o(float (&o)[kV / 8][4], float a_lo, float a_hi) {
#pragma unroll
  for (int nt = 0; nt < kV / 8; nt++) {
    o[nt][0] *= a_lo;
    o[nt][1] *= a_lo;
    o[nt][2] *= a_hi;
    o[nt][3] *= a_hi;
  }
}

}  // namespace strata::kernels::mla
