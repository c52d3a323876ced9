// Internal interface between the layer-level driver (cpu/expert_kernels.cpp) and the per-ISA
// projection kernels (cpu/expert_kernels_{avx512,avx2}.cpp and the scalar one in the driver).
// Not for use outside cpu/.
#pragma once
#include <cstdint>
#include <vector>

#include "cpu/amx.h"
#include "storage/expert_contract.h"

namespace strata::cpu::detail {

// Rows [r0, r1) of one MXFP4 matrix (packed [rows, K/2], scale [rows, K/32]) against n quantized
// tokens (none poisoned): out[t * out_stride + (o − r0)] = contract §3 output of row o, token t.
// Token t's activations: q[t] (quad layout, padded to nbp blocks), e[t] (exponents), bias[t]
// (12·Σq) — see QuantizedActivations.
struct ProjArgs {
  const uint8_t* packed = nullptr;
  const uint8_t* scale = nullptr;
  int K = 0, nb = 0, nbp = 0;  // columns, blocks, padded blocks (multiple of 16)
  int r0 = 0, r1 = 0;
  int n = 0;
  const int8_t* const* q = nullptr;
  const int32_t* const* e = nullptr;
  const int32_t* const* bias = nullptr;
  float* out = nullptr;
  int64_t out_stride = 0;
  // Optional (the AVX-512 register-tiled kernel uses them when all three are set; see
  // QuantizedActivations): per token 2^e_x per block (fp64), −12·Σq per block, and the exponent
  // span over the token's nonzero blocks.
  const double* const* px = nullptr;
  const int32_t* const* nbias = nullptr;
  const int* span = nullptr;
  // Software prefetch distance of the one-token kernel in bytes ahead of the row being read
  // (0: none).
  int prefetch = 0;
  // AVX-512: 2 to 4 tokens take the few-token kernel (the one-token arithmetic per token, each
  // weight piece decoded once) instead of the register-tiled one. Same bits either way.
  bool few = true;
  // AMX only: the token set packed by amx_pack_tokens (B tiles and 2^e_x per token group).
  const int8_t* tb = nullptr;
  const double* tpx = nullptr;
  // AMX only, optional: the packed bytes and scales of the first rows the caller projects next
  // (another matrix or row range), requested into L2 while the last 16 rows of this call compute.
  // A hint; results do not depend on it.
  const uint8_t* next_packed = nullptr;
  const uint8_t* next_scale = nullptr;
  // AMX only: token groups (of 16) per pass over up to 4 decoded row groups (64 rows); 0 = every
  // group per pass over one row group. See CpuExpertOptions::amx_pass_tokens.
  int amx_pass_groups = 0;
};

// Default of CpuExpertOptions::amx_pass_tokens.
inline constexpr int kAmxPassTokens = 64;

// From this many tokens on, the AMX path uses tiles (16 tokens per tile; fewer: AVX-512).
inline constexpr int kAmxMinTokens = 8;

// The n tokens (quad layout q, 2^e_x per block px) as TDPBSSD B operands: per group of 16 tokens
// and block b, 8 rows × 64 bytes, row k, token j: the 4 activation bytes of columns
// π(4k … 4k+3), π(kk) = 2kk for kk < 16 (even columns), 2(kk − 16) + 1 otherwise (odd); tokens
// past n are zero. tpx: per group and block, 16 × 2^e_x (1.0 past n).
void amx_pack_tokens(const int8_t* const* q, const double* const* px, int n, int nb,
                     std::vector<int8_t>& tb, std::vector<double>& tpx);

// AMX-INT8 kernel (needs tb, tpx, span; n < kAmxMinTokens or missing inputs: project_avx512).
void project_amx(const ProjArgs& a);
// The same code with the tile instructions replaced by scalar code of the same semantics (tests
// of the layouts and the epilogue on CPUs without AMX).
void project_amx_emulated(const ProjArgs& a);
void gemm_count_add(uint64_t fast, uint64_t strict);

// The any-order exactness bound (docs/numerics.md §3.1): the largest s ≥ 0 with
// nb · kMaxBlockDot · 2^s ≤ 2^53, or −1 if there is none. If, for one output, the exponents
// e_b = e_x,b + s_w,b − 128 of its nonzero blocks satisfy max e_b − min e_b ≤ s, every partial sum
// of its block terms in any order is exact in fp64, so any summation order gives the contract's
// bits.
int exact_span_limit(int nb);

// The strict-order (contract lane order) result of rows o0 .. o0+rows-1 for token t of `a` alone:
// the fallback of the any-order kernels when a (row group, token) fails the exponent-span check.
void project_strict_pair(const ProjArgs& a, int o0, int rows, int t);

// Register-tiled AVX-512 VNNI kernel for several tokens (needs px, nbias, span). Rows in groups
// of 16 whose (row group, token) pair passes the span check are summed in one fp64 accumulator
// per output (any order: exact); the others go through the strict-order one-token kernel.
void project_gemm_avx512(const ProjArgs& a);

// How many (16-row group, token) pairs project_gemm_avx512 has summed in any order (fast) and in
// the contract's order (strict), since the start of the process. For tests.
struct GemmCounts {
  uint64_t fast = 0, strict = 0;
};
GemmCounts gemm_counts();

void project_scalar(const ProjArgs& a);
void project_avx2(const ProjArgs& a);
void project_avx512(const ProjArgs& a);
// The one-token (n == 1) AVX-512 kernel: strict contract order, rows decoded in registers.
void project_one_avx512(const ProjArgs& a);

// One activation block (contract §2) in the kernels' layout: q into even[0..15] (even columns)
// and even[64..79] (odd), *e = e_x, *sum = Σq. Returns 0 for a zero block, 1 for a nonzero one,
// 2 for a poisoned one (then q = 0, e = 0) — the bits of contract::quantize_block.
int quantize_block_avx512(const float* x, int8_t* even, int* e, int32_t* sum);

// h[i] = contract::glu(g[i], u[i], p) for i < n, bit for bit, 32 at a time (four interleaved
// vectors of 8), then 8, then one.
void glu_avx512(const float* g, const float* u, float* h, int n, const GluParams& p);

// Streaming read of n bytes (n a multiple of 256) — the memory-bandwidth peak of the benchmark.
// Returns a value that depends on every byte so the reads cannot be elided.
uint64_t stream_read_avx512(const void* p, size_t n);

}  // namespace strata::cpu::detail
