// Gated MLA without RoPE (spec/model.md §5) on sm_90a: the latent-cache write, prefill attention
// (expanded keys/values, flash-style online softmax, causal, chunked against an existing cache of
// up to 1M positions in a bounded workspace: the cache is expanded tile by tile)
// and absorbed decode attention over the latent cache, split along the sequence and merged.
// Thin launchers: device pointers, sizes, a stream (cudaStream_t as void*); each returns a Status
// and never synchronises. No CUDA types are exposed.
//
// Layouts (bf16 bits unless stated):
//   latent cache row (one per position): [ĉ (kv_lora = 512, post kv_a_layernorm) | k_pe (64)]
//   q: [tokens, H, 192] = [q_nope (128) | q_pe (64)] per head (q_b_proj output)
//   kv_b: [H·256, 512] (kv_b_proj.weight), head h rows h·256 .. = [W_UK_h (128 rows) | W_UV_h]
//   out: [tokens, H, 128], the attention output before the output gate and o_proj.
// Supported dims: nope 128, rope 64, v 128, kv_lora 512 (K3 and Kimi-Linear); any H.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/runtime.h"

namespace strata::kernels::mla {

constexpr int kNope = 128, kRope = 64, kV = 128, kLatent = 512;
constexpr int kQDim = kNope + kRope;        // 192
constexpr int kCacheDim = kLatent + kRope;  // 576
constexpr int kMaxSeqs = 256;               // sequences per decode call

// Latent-cache rows for T new tokens: cache[pos0 + t] = [bf16(w ⊙ bf16(c·rsqrt(mean c² + eps))) |
// k_pe] from ckv = kv_a_proj_with_mqa output [T, 576] (KimiRMSNorm, spec §3.1; eps 1e-6).
// norm_w: [512] fp32. cache: [≥ pos0 + T, 576].
Status write_latent(const uint16_t* ckv, const float* norm_w, float eps, uint16_t* cache,
                    int64_t pos0, int64_t T, void* stream);

// write_latent for decode steps under CUDA graphs: one new row for each of B sequences whose
// caches of `capacity` positions start cache_stride elements apart (≥ capacity · 576 when B > 1),
// sequence b's row at its position pos_dev[b] (device memory, read when the kernel runs: a
// replayed graph writes where the step's positions say). A position outside [0, capacity) writes
// nothing (it would land in another sequence's cache or past the buffer).
Status write_latent_decode(const uint16_t* ckv, const float* norm_w, float eps, uint16_t* cache,
                           int64_t cache_stride, int64_t capacity, const int32_t* pos_dev, int B,
                           void* stream);

// Workspace of prefill() in one pass: the expanded keys/values of all S positions ([S, H, 256]
// bf16, 49 KB per position at H = 96) plus the GEMM's scratch. Grows with S: 51 GB at 1M.
size_t prefill_workspace_bytes(int H, int64_t S);

// Cached positions per tile (a multiple of 64) and the default tile of the bounded form.
constexpr int64_t kPrefillTileAlign = 64;
constexpr int64_t kPrefillTile = 16384;

// Workspace of prefill() for chunks of up to T queries against caches of any length, in tiles of
// at least max_tile cached positions (rounded up to 64): one tile's expanded keys/values
// (max_tile·H·512 bytes), the GEMM's scratch (32 MB) and the fp32 softmax state carried across
// tiles (T·H·520 bytes). Independent of S: 1.04 GB at H = 96, T = 4096, the default tile.
size_t prefill_workspace_bytes_bounded(int H, int64_t T, int64_t max_tile = kPrefillTile);

// The cache tile prefill() uses with this workspace: S (one pass) when workspace_bytes >=
// prefill_workspace_bytes(H, S), else the most positions (a multiple of 64) that fit next to the
// state; 0 when not even 64 fit (prefill() refuses).
int64_t prefill_tile_positions(int H, int64_t S, int64_t T, size_t workspace_bytes);

// Causal attention of the last T of S cached positions (queries at positions S−T .. S−1) over all
// S, expanded form (spec §5.2): [k_nope | v] = ĉ·kv_bᵀ by cuBLASLt (bf16 out, as HF's GEMM), keys
// [k_nope | k_pe], softmax scale 192^-1/2, fp32 online softmax, bf16 out. The cache must already
// hold the T new rows (write_latent). q: [T, H, 192]; out: [T, H, 128].
// The cache is expanded tile by tile (prefill_tile_positions) and the attention runs over each
// tile in turn, the fp32 softmax state (row max, row sum, unnormalised O) carried across tiles in
// the workspace; the result equals the one-pass form up to fp32 summation order.
// q, cache and workspace must be 16-byte aligned.
//
// The attention kernels give the same bits (asserted by the op-checks). tma_fa3_pp (the default)
// and tma_fa3: the two query blocks of a thread-block cluster share each key tile, loaded once by
// TMA and multicast to both; S = QKᵀ and P·V on wgmma with Q and P from registers, the next tile's
// S issued with this tile's P·V so that the softmax runs under both (FlashAttention-3's intra-
// warpgroup overlap); tma_fa3_pp also has the two warpgroups issue their products in turns
// (ping-pong). tma_pipe: P·V on mma.sync, Q read by wgmma from shared memory, the next tile's S
// issued before this tile's softmax (the default until tma_fa3_pp). tma: no overlap. tma_solo: tma
// with each block loading its own tiles (what the sharing gains). cpasync: each block loads its
// own tiles by cp.async; also what runs when the driver lacks cuTensorMapEncodeTiled. Measured in
// docs/performance.md, MLA. The process default is read once from the environment:
// STRATA_MLA_PREFILL=cpasync, tma, tma_pipe, tma_solo or tma_fa3 selects those, anything else (or
// unset) tma_fa3_pp.
enum class PrefillKernel { cp_async, tma, tma_pipe, tma_solo, tma_fa3, tma_fa3_pp };
// Every prefill kernel, the default first (the op-checks and `strata bench kernels` walk this
// list).
inline constexpr PrefillKernel kPrefillKernels[] = {
    PrefillKernel::tma_fa3_pp, PrefillKernel::tma_fa3, PrefillKernel::tma_pipe,
    PrefillKernel::cp_async,   PrefillKernel::tma,     PrefillKernel::tma_solo};
PrefillKernel default_prefill_kernel();
const char* prefill_kernel_name(PrefillKernel k);
Status prefill(int H, const uint16_t* q, const uint16_t* cache, int64_t S, const uint16_t* kv_b,
               uint16_t* out, int64_t T, void* workspace, size_t workspace_bytes, void* stream,
               PrefillKernel kernel = default_prefill_kernel());

// The split-attention kernel of decode() and decode_device(): tma (the default: head groups of
// ≤ 64 heads as one wgmma M tile, cache tiles by TMA multicast to the two head groups of a
// cluster, S and P·V on wgmma; it needs cuTensorMapEncodeTiled, a 16-byte aligned cache and, for
// B > 1, cache_stride ≥ max_len rows — otherwise mma runs) or mma (48 heads per block on
// mma.sync). Both give the same result up to fp32 summation order and the bf16 rounding flips it
// causes; each is deterministic for a given (H, B, max_len) and lengths. The process default is
// read once from the environment: STRATA_MLA_DECODE=mma selects mma, =ss the experimental ss
// (attn_tma's tiles with the two warpgroups on alternate tiles), anything else (or unset) tma.
enum class DecodeKernel { mma, tma, ss };
DecodeKernel default_decode_kernel();
const char* decode_kernel_name(DecodeKernel k);

// Workspace of decode() for B sequences whose longest cache holds max_len positions (either
// kernel's plan).
size_t decode_workspace_bytes(int H, int B, int64_t max_len);

// One decode token for each of B sequences, absorbed form (spec §5.3): q_lat = bf16(W_UKᵀ q_nope),
// scores over sequence b's cache rows 0 .. lens_host[b]−1 (the new token's row included), split
// along the sequence into blocks whose partial softmax states are merged, then o = W_UV·ctx.
// q: [B, H, 192]; caches: sequence b's rows start at cache + b·cache_stride (elements);
// lens_host: B HOST int32 lengths (>= 1); out: [B, H, 128].
Status decode(int H, const uint16_t* q, const uint16_t* cache, int64_t cache_stride,
              const int32_t* lens_host, int B, const uint16_t* kv_b, uint16_t* out, void* workspace,
              size_t workspace_bytes, void* stream, DecodeKernel kernel = default_decode_kernel());

// decode() for CUDA graphs: sequence b's new token is at position pos_dev[b] (device memory, read
// when the kernels run), so it attends to cache rows 0 .. pos_dev[b]; the split plan and the grids
// are sized for a capacity of max_len positions (every length must be ≤ max_len; a longer one is
// cut to max_len, a negative position taken as 0 — never a read outside the cache). Splits past a
// sequence's length are empty (m = −inf, l = 0) and merged with weight 0. The result depends on
// (H, B, max_len) and the lengths, not on how the positions reached the device: callers that
// always pass the same capacity for the same lengths get the same bits eagerly and from a graph.
// Workspace: decode_workspace_bytes(H, B, max_len).
Status decode_device(int H, const uint16_t* q, const uint16_t* cache, int64_t cache_stride,
                     const int32_t* pos_dev, int B, int64_t max_len, const uint16_t* kv_b,
                     uint16_t* out, void* workspace, size_t workspace_bytes, void* stream,
                     DecodeKernel kernel = default_decode_kernel());

// FLOPs of causal prefill attention (QKᵀ and PV, 2 per multiply-add) for T queries over S
// positions; the kv expansion adds 2·S·512·H·256.
inline double prefill_attention_flops(int H, int64_t T, int64_t S) {
  const double pairs = double(T) * double(S) - double(T) * double(T - 1) / 2.0;
  return 2.0 * H * pairs * (kQDim + kV);
}

}  // namespace strata::kernels::mla
