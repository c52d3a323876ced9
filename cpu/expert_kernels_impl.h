// Internal interface between the layer-level driver (cpu/expert_kernels.cpp) and the per-ISA
// projection kernels (cpu/expert_kernels_{avx512,avx2}.cpp and the scalar one in the driver).
// Not for use outside cpu/.
#pragma once
#include <cstdint>

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
};

void project_scalar(const ProjArgs& a);
void project_avx2(const ProjArgs& a);
void project_avx512(const ProjArgs& a);

// h[i] = contract::glu(g[i], u[i], p) for i < n, bit for bit, eight at a time.
void glu_avx512(const float* g, const float* u, float* h, int n, const GluParams& p);

// Streaming read of n bytes (n a multiple of 256) — the memory-bandwidth peak of the benchmark.
// Returns a value that depends on every byte so the reads cannot be elided.
uint64_t stream_read_avx512(const void* p, size_t n);

}  // namespace strata::cpu::detail
