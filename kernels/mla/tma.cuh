// Tensor-memory-accelerator loads and the mbarriers that hand them over (sm_90a), for the TMA
// forms of the MLA prefill and decode kernels: a CTA of a two-CTA cluster issues half of a tile's
// boxes and multicasts them into the same shared-memory offset of both CTAs, each of whose `full`
// mbarrier counts the bytes of the whole tile. Addresses are shared-memory (shared::cta)
// addresses of the executing CTA; a multicast writes, and completes bytes on the mbarrier, at the
// same offsets in every CTA of the mask. Included by kernels/mla/mla_prefill.cu and
// mla_decode.cu (the host declarations below are defined in mla_prefill.cu).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "kernels/mla/mla.h"

namespace strata::kernels::mla {

// Host side (kernels/mla/mla_prefill.cu): cuTensorMapEncodeTiled from the driver, found once
// through the runtime (no link to libcuda); null when the driver lacks it.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled();
// A bf16 tensor map of `rank` dims (dim[0] contiguous; stride[i] in bytes for dim i + 1) read in
// boxes of `box` with the 128-byte swizzle; out-of-range elements read as zero. `what`: the
// message of the Status when the driver refuses it.
Status encode_map(EncodeTiled encode, CUtensorMap* map, unsigned rank, const void* base,
                  const cuuint64_t* dim, const cuuint64_t* stride, const cuuint32_t* box,
                  const char* what);

__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialised mbarriers visible to the cluster (then a cluster barrier).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also expects `bytes` more transaction bytes in the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
// One arrival on the mbarrier at the same offset in CTA `rank` of the cluster (this one included).
// Release at CTA scope, not cluster scope: the arrival says "this warp is done reading the stage",
// its reads (wgmma's, waited for, or ldmatrix results already in registers) are complete, and the
// peer's TMA that then overwrites the stage waits on the barrier with acquire at cluster scope.
// `.release.cluster` compiles to MEMBAR.ALL.GPU + ERRBAR before every arrival, which waited for
// every memory operation of the warp in flight: 27 % of tma_fa3_pp's stall samples (ncu source
// counters, H100, T = 2048). CUTLASS's TMA pipelines release their stages with the same form.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, unsigned rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];\n" ::"r"(remote)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive_local(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// A consumer warp is done with a ring slot: its lane 0 arrives on the slot's `empty` barrier in
// every CTA of the cluster (this CTA, rank `rank` of `cl`, locally; the others remotely).
__device__ __forceinline__ void release_slot_in_cluster(uint32_t empty_bar, unsigned rank,
                                                        unsigned cl, int lane) {
  __syncwarp();
  if (lane == 0)
    for (unsigned rr = 0; rr < cl; rr++) {
      if (rr == rank)
        mbar_arrive_local(empty_bar);
      else
        mbar_arrive_cluster(empty_bar, rr);
    }
}
// Waits until the phase of the given parity has completed; `cluster`: acquire at cluster scope
// (the arrivals came from both CTAs and the waiter then writes into both).
template <bool kCluster>
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity) {
  // The retry loop is inside the asm: to the compiler the wait is one straight-line statement.
  if constexpr (kCluster) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
  } else {
    asm volatile(
        "{\n.reg .pred p;\nWAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
  }
}

// A box of the tensor map at (x, y[, z]) into dst of every CTA in `mask`, its bytes completed on
// the mbarrier `bar` at the same offset in each.
__device__ __forceinline__ void tma_load_mc(uint32_t dst, const CUtensorMap* map, int x, int y,
                                            int z, uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar), "h"(mask)
      : "memory");
}
// The same box into this CTA only (no cluster needed).
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int x, int y, int z,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
}
// `bytes` (a multiple of 16) from a 16-byte aligned global address into L2 only.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
// The same box into L2 only (a prefetch: no shared memory, no barrier).
__device__ __forceinline__ void tma_prefetch_l2(const CUtensorMap* map, int x, int y, int z) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(x), "r"(y), "r"(z)
               : "memory");
}
__device__ __forceinline__ void tma_load_mc(uint32_t dst, const CUtensorMap* map, int x, int y,
                                            uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "h"(mask)
      : "memory");
}

// Descriptor of a K-major wgmma operand in the 128-byte-swizzled layout that a TMA box of 64 bf16
// columns writes with CU_TENSOR_MAP_SWIZZLE_128B: rows of 128 bytes, 8-row atoms of 1024 bytes
// (1024-aligned), the 16-byte chunk c of row r at r·128 + ((c ^ r % 8) · 16). A k-step of 16
// columns inside the row starts 32 bytes further; the stride (N-direction) offset is one atom, the
// leading offset is unused in this mode.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

// Descriptor of an MN-major operand (imm-trans-b = 1: V of O = P·V) in the same 128-byte swizzle:
// rows of 128 bytes along K (a key each) hold 64 N-values; `lead` is the byte offset between such
// 64-wide N blocks and `stride` the offset between 8-row K groups (one 1024-byte atom when the rows
// are contiguous). The start address is a whole atom, so the base-offset field stays 0.
__device__ __forceinline__ uint64_t wgmma_desc_sw128_mn(uint32_t addr, uint32_t lead,
                                                        uint32_t stride) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lead >> 4) << 16) |
         (uint64_t(stride >> 4) << 32) | (uint64_t(1) << 62);
}

}  // namespace strata::kernels::mla
