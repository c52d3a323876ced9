// MXFP4 routed experts on the GPU, grouped over the experts of one layer and the tokens routed to
// each, following the expert numerics contract (docs/numerics.md; storage/expert_contract.h):
// every expert output is bit-identical to strata::cpu::expert_ffn_contract.
//
// Data, all device memory:
//   experts[g]         the MXFP4 view of group g's expert, straight from its GPU cache slot in the
//                      released layout (no repacking, no widened copy; E2M1 is decoded to int8 in
//                      registers).
//   group_offsets[g]   pairs of group g are [group_offsets[g], group_offsets[g+1]); G+1 entries.
//   pair_token[p]      which row of x pair p reads.
//   x [T, H]           latent inputs (fp32; quantized once per token, numerics.md §2).
//   y [P, H]           the expert output of every pair (fp32), merged afterwards by
//                      merge_weighted in expert-id order (numerics.md §5).
// The launcher picks the path: a warp-per-row GEMV that holds the weight row in registers and walks
// the group's tokens (decode, few tokens per expert), or the grouped GEMM on int8 tensor cores with
// one exact epilogue per output (prefill, many tokens per expert; intgemm.cu) — in its mma.sync
// form, or from a mean of 64 tokens per expert in its warp-specialized wgmma form. The older IMMA
// path (one mma k-step and one fp64 block term per 32-element block) can be forced. All produce the
// same bits. The GEMM path's grids are sized from host counts (G, P): fine for prefill, which is
// not captured in CUDA graphs.
//
// Split plan from run (STYLE.md §9): experts_workspace_bytes() sizes the scratch the caller carves
// once; nothing is allocated per call.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/runtime.h"
#include "storage/expert_contract.h"

namespace strata::kernels::moe {

struct ExpertBatch {
  const Mxfp4ExpertView* experts = nullptr;  // device [G]
  const int32_t* group_offsets = nullptr;    // device [G+1]
  const int32_t* pair_token = nullptr;       // device [P]
  const float* x = nullptr;                  // device [T, H]
  float* y = nullptr;                        // device [P, H]
  int G = 0;                                 // groups (experts) in this launch
  int P = 0;                                 // pairs (token, expert) in this launch
  int T = 0;                                 // rows of x
  int H = 0, I = 0;                          // hidden (latent) and intermediate widths, % 32 == 0
  GluParams glu;                             // SiTU (K3) or SiLU (Kimi-Linear)
};

// wgmma: the GEMM path's integer method with the Hopper warpgroup MMA in a warp-specialized kernel
// (intgemm.cu); `automatic` takes it from kWgmmaMinMeanPairsPerGroup tokens per expert.
// wgmma_wide: the same with 256-row CTAs and token tiles of up to 96 (the planes read once per 256
// rows) where its shared memory fits (input widths ≤ 3584), else wgmma's tiles.
enum class ExpertPath { automatic, gemv, imma, gemm, wgmma, wgmma_wide };

// Scratch for one launch of at most T tokens, P pairs, widths H and I (bytes; 256-aligned parts).
size_t experts_workspace_bytes(int T, int P, int H, int I);

// Mean tokens per expert (P / G) from which the automatic choice took the IMMA path (measured on
// the H200: GEMV wins at a mean of 4.6, IMMA at 18; docs/performance.md). Kept for the record
// and for benches; automatic now picks GEMV or GEMM.
inline constexpr int kImmaMinMeanPairsPerGroup = 12;
// Mean tokens per expert from which the automatic choice takes the GEMM path. Measured on the H200
// with dfdcbb8's GEMM path (`strata bench kernels --filter moe`, 128 experts x M tokens, cold):
// GEMV 0.543 / 1.118 / 1.591 ms at M = 1 / 2 / 3, GEMM 1.002 / 1.025 / 1.041 ms — GEMV time grows
// ≈ 0.5 ms per token, GEMM's stays near the weight stream; and at T = 64 (610 experts, a mean of
// 1.7, most groups of 1 or 2) GEMM 4.58 against GEMV 4.96 ms. They cross between 1 and 1.7: 1.5.
// Since the GEMM path's strip form (below a mean of 8): GEMM 0.700 / 0.730 ms at M = 1 / 2 against
// GEMV 0.544 / 1.121, T = 64 3.14 against 4.99 ms — the crossing stays between 1 and 2.
// Like the grids, the GEMM's tile size is chosen from the host counts P and G (G the capacity when
// the groups are built on the device).
inline constexpr double kGemmMinMeanPairsPerGroup = 1.5;
// Mean tokens per expert from which the automatic choice takes the GEMM path's warp-specialized
// wgmma form (ExpertPath::wgmma, 128-token tiles there). Measured on the H200 (`strata bench
// kernels --filter moe`): T = 4096 (a mean of 73) 28.26 ms against 33.74 for the mma.sync form;
// below, the mma.sync form is faster (T = 1024, a mean of 18: 10.46 against 12.43 ms).
inline constexpr int kWgmmaMinMeanPairsPerGroup = 64;

// y = w2 · glu(w1 · x, w3 · x) for every pair. workspace: experts_workspace_bytes(T, P, H, I)
// bytes of device memory. path: automatic (by P / G), or forced for tests/benches (a forced path
// that does not take the shape returns cudaErrorNotSupported; automatic falls back to GEMV).
Status grouped_experts(const ExpertBatch& b, void* workspace, size_t workspace_bytes,
                       ExpertPath path, void* stream);

// Diagnostics of the GEMM (or wgmma) path's last launch on `workspace` (synchronous: copies the
// per-row metadata back): how many input rows of x (of T) and of h (of P) were inside the integer
// method's window, outside it (their pairs took the strict per-block path) or poisoned.
struct GemmWindowCounts {
  long long x_ok = 0, x_wide = 0, x_poisoned = 0;
  long long h_ok = 0, h_wide = 0, h_poisoned = 0;
};
Status gemm_window_counts(const void* workspace, int T, int P, int H, int I, GemmWindowCounts* out);

// The routed output (numerics.md §5): for token t, acc = +0; for q in [token_offsets[t],
// token_offsets[t+1]) (the token's experts in increasing expert id): acc = acc + (weight[q] ·
// y[pair[q], :]) in fp32 without FMA; out[t, :] = acc. token_offsets [T+1], pair/weight [Q].
// y rows may come from any executor (CPU expert outputs copied into the same buffer).
// round_bf16: every y value is read rounded to bf16 (RNE) and out is stored rounded — the bits of
// rounding y and out in passes of their own, as the bf16 engine does, without the two passes.
Status merge_weighted(const float* y, const int32_t* token_offsets, const int32_t* pair,
                      const float* weight, float* out, int T, int H, void* stream,
                      bool round_bf16 = false);

}  // namespace strata::kernels::moe
