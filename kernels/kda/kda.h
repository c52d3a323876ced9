// KDA (Kimi Delta Attention, spec/model.md §4) on sm_90a: launchers for chunked prefill and the
// batched decode step. Thin wrappers: device pointers, sizes and a stream (a cudaStream_t passed
// as void*); each returns a Status and never synchronises. No CUDA types are exposed.
//
// What the kernels do, per layer, from the projection outputs to the input of o_proj:
//   short conv (W = 4) + SiLU on q̂, k̂, v̂ with the conv state  →  bf16
//   q ← L2(q)·K^-1/2, k ← L2(k) (eps 1e-6; prefill rounds them to bf16 like FLA's chunk path,
//   decode keeps fp32 like FLA's fused_recurrent), gate g (bounded or softplus form), β = σ(b),
//   the delta-rule recurrence on the fp32 state [H, V, K] (FLA state_v_first), o rounded to bf16,
//   y = RMSNorm(o; o_norm_w, eps)·σ(G) (FLA FusedRMSNormGated), one bf16 rounding.
// Prefill uses the chunked WY/UT form (§4.5, chunk 32) in two phases: a chunk-parallel kernel
// (intra-chunk matrices) and a state-carrying kernel — by default on tensor cores (tf32, fp32
// accumulation) with one block per head holding the state in registers; STRATA_KDA_PREFILL=fp32
// (read once) selects the fp32 CUDA-core kernels, split over V. The tensor-core prep is
// chunk_prep_tc2 (streamed conv/gate, (I + L)^-1 blockwise); STRATA_KDA_PREP=tc (read once)
// selects the form before it, for A/B runs. Decode does everything for one
// (sequence, head) in one block, reading and writing its 64 KiB of state once.
//
// Supported: K = V = 128, conv width 4 (K3 and Kimi-Linear); anything else returns an error
// Status (cudaErrorInvalidValue) with a message saying what is supported.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/runtime.h"

namespace strata::kernels::kda {

enum class GateForm {
  bounded,   // K3: g = lower_bound · sigmoid(exp(A_log[h]) · (z + dt_bias))
  softplus,  // Kimi-Linear: g = −exp(A_log[h]) · softplus(z + dt_bias)
};

// Per-layer parameters (device pointers, fp32 as stored in the checkpoint).
struct Params {
  int H = 0, K = 128, V = 128;
  const float* conv_q = nullptr;  // [H·K, 4] (checkpoint q_conv1d.weight [H·K, 1, 4])
  const float* conv_k = nullptr;  // [H·K, 4]
  const float* conv_v = nullptr;  // [H·V, 4]
  GateForm gate_form = GateForm::bounded;
  const float* A_log = nullptr;     // [H] (K3: the first H of the stored 128)
  const float* dt_bias = nullptr;   // [H·K]
  float lower_bound = -5.0f;        // bounded form only
  const float* o_norm_w = nullptr;  // [V]
  float o_norm_eps = 1e-5f;
  float l2_eps = 1e-6f;
};

// Projection outputs for the tokens of one call (device pointers, bf16 bits). Rows are tokens;
// in prefill the sequences are packed one after the other (see cu_seqlens), in decode row b is
// sequence b.
struct Inputs {
  const uint16_t* q = nullptr;     // [rows, qkv_stride], columns 0 .. H·K−1 (pre-conv q̂)
  const uint16_t* k = nullptr;     // same layout
  const uint16_t* v = nullptr;     // same layout, H·V columns
  int64_t qkv_stride = 0;          // elements between consecutive rows of q, k and v
  const uint16_t* z = nullptr;     // [rows, H·K] decay logits (f_b_proj output)
  const uint16_t* b = nullptr;     // [rows, H] beta logits
  const uint16_t* gate = nullptr;  // [rows, H·V] output-gate logits (g_proj output)
};

// Per-sequence state, device memory, sequence n at offset n.
//   recurrent: [N, H, V, K] fp32 — S'[v][k] = S[k][v]; zero for a fresh sequence.
//   conv:      [N, 2·H·K + H·V, 3] bf16 — per channel (q channels, then k, then v) the last 3
//              pre-conv inputs, oldest first; zero for a fresh sequence.
struct State {
  float* recurrent = nullptr;
  uint16_t* conv = nullptr;
};

constexpr int kChunk = 32;     // prefill chunk length
constexpr int kMaxSeqs = 256;  // sequences per prefill call

// Workspace for a prefill call of N sequences whose longest holds max_len tokens, processing at
// most `max_chunks` chunks of every sequence per pass (a pass = the two kernels over a window of
// chunks; passes carry the state). max_chunks <= 0 picks ceil(max_len / 32), i.e. one pass.
// prefill() derives the pass length from the workspace it is given, so a smaller workspace means
// more passes, never a wrong result.
size_t prefill_workspace_bytes(int H, int N, int64_t max_len, int64_t max_chunks = 0);

// Chunked prefill of N sequences packed in `in` (cu_seqlens_host: N+1 HOST int32 offsets,
// cu_seqlens_host[0] = 0, sequence n = rows cu[n] .. cu[n+1]−1; lengths may be 0). Continues each
// sequence from `st` and leaves the state after its last token there (so a long document can be
// prefilled in several calls). y: [rows, H·V] bf16, the gated-normed output (input of o_proj).
// The workspace must be at least prefill_workspace_bytes(H, N, max_len, 1).
Status prefill(const Params& p, const Inputs& in, const int32_t* cu_seqlens_host, int N, State st,
               uint16_t* y, void* workspace, size_t workspace_bytes, void* stream);

// One decode step for a batch of B sequences (row b of `in` is sequence b's new token; state
// entry b is its state). y: [B, H·V] bf16; o_raw (optional, may be nullptr): [B, H·V] bf16, the
// recurrence output before the gated norm. `split`: CTAs per (head, sequence), each updating
// 128/split state rows (1, 2, 4 or 8; a thread-block cluster when > 1); 0 picks
// decode_split_for(B). Every split gives the same state and conv state; y may differ in the
// summation order of the norms' sums of squares only. The recurrent state must be 16-byte
// aligned (cudaMalloc'd buffers are). On a created stream the step is a programmatic dependent
// launch (sm_90): it may start while the stream's previous kernel finishes and waits for that
// kernel's writes before its first read.
Status decode(const Params& p, const Inputs& in, int B, State st, uint16_t* y, uint16_t* o_raw,
              void* stream, int split = 0);

// The split decode() uses for B sequences (measured: 1 for every B on the H200; see the .cu).
int decode_split_for(int B);

// FLOPs of the KDA core for T tokens (issue 7's effective-rate formula): T·H·(10·64·d + 6·d²).
inline double effective_flops(int64_t T, int H, int d = 128) {
  return double(T) * H * (10.0 * 64 * d + 6.0 * d * d);
}

}  // namespace strata::kernels::kda
