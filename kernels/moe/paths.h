// Internal to kernels/moe: the workspace layout shared by the size query and the launch (one
// carve function, so size math and pointers cannot drift), and the per-path launchers that
// experts.cu dispatches to. Host code only (no CUDA types), included by the .cu files of this
// folder (and by tests/kernels/moe_gpu.cpp for wgmma_probe).
#pragma once
#include <climits>
#include <cstddef>
#include <cstdint>

#include "kernels/moe/experts.h"

namespace strata::kernels::moe::detail {

// The quantized form of a set of rows (numerics.md §2): q [rows, K] int8, e [rows, K/32] block
// exponents; a poisoned block (an Inf/NaN in it) has e = kPoisonedBlock, and every output computed
// from its row is the canonical NaN.
inline constexpr int32_t kPoisonedBlock = INT32_MIN;
struct QuantRows {
  int8_t* q = nullptr;
  int32_t* e = nullptr;
};

// The GEMM path's form of quantized rows (storage/expert_contract_int.h): per row its metadata
// meta[2r] = e_min, meta[2r + 1] = contract::intsum::TokenStatus, and for rows inside the window
// a = q · 2^(e_x − e_min) split into a = 128·hi + lo (hi, lo [rows, K] int8).
struct Planes {
  int8_t* hi = nullptr;
  int8_t* lo = nullptr;
  int32_t* meta = nullptr;
};

// Plane rows are allocated at a multiple of this many columns: the register-A wgmma form writes
// them in its own order with zeros up to it (intgemm.cu, rs_stride).
inline constexpr int kPlaneRowAlign = 256;

struct Workspace {
  QuantRows x;          // [T, H]
  float* gu = nullptr;  // [P, 2, I] gate and up projections (fp32, contract §3 results)
  QuantRows h_q;        // [P, I] glu(g, u) quantized
  Planes xp;            // [T, H] planes of x (GEMM path)
  Planes hp;            // [P, I] planes of h (GEMM path)
  size_t bytes = 0;
};

// Lays the workspace out from `base` (nullptr: sizes only).
Workspace carve(void* base, int T, int P, int H, int I);

// Quantize `rows` rows of x [rows, K] (numerics.md §2).
Status quantize_rows(const float* x, int rows, int K, const QuantRows& out, void* stream);
// h = glu(g, u) (numerics.md §4.2) of gu [rows, 2, K], quantized into out [rows, K]. dependent:
// launch it as a programmatic dependent of the kernel before it (that kernel triggers early, this
// one waits for its results; the GEMV path).
Status glu_quantize_rows(const float* gu, int rows, int K, const GluParams& glu,
                         const QuantRows& out, bool dependent, void* stream);

// GEMV path: gu = (w1·x, w3·x) for every pair; y = w2·h_q.
Status gemv_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream);
Status gemv_down(const ExpertBatch& b, const Workspace& ws, void* stream);

// IMMA path: the same two steps on int8 tensor cores. Returns cudaErrorNotSupported status when
// the shapes are outside what it handles (the dispatcher then uses the GEMV path).
Status imma_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream);
Status imma_down(const ExpertBatch& b, const Workspace& ws, void* stream);

// Grouped-GEMM path (intgemm.cu): planes of the inputs, then gate|up / down on int8 tensor cores
// with one exact epilogue per output. Not supported (cudaErrorNotSupported) for input widths above
// contract::intsum::kMaxK.
bool gemm_supports(int K);
Status gemm_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream);
Status gemm_down(const ExpertBatch& b, const Workspace& ws, void* stream);
// The same path with wgmma (sm_90a warpgroup MMA) in the main loop; same planes, same bits.
Status wgmma_gate_up(const ExpertBatch& b, const Workspace& ws, void* stream);
Status wgmma_down(const ExpertBatch& b, const Workspace& ws, void* stream);
// The wgmma forms' operand and result layouts on known values (a test's diagnostic: a wrong map
// shows as a pattern of wrong rows or columns): out [64·16 + 64·24 + 64·16] int32 = D of a 64 × 32
// by 32 × N product for N = 16, then N = 24 (A from shared memory), then N = 16 with A from
// registers (row-major), A(r, k) = (7r + 3k) mod 11 − 5, B(k, t) = (5t + k) mod 13 − 6.
Status wgmma_probe(int32_t* out, void* stream);

}  // namespace strata::kernels::moe::detail
