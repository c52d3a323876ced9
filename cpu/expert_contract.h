// The contract mode of the routed-expert FFN (docs/numerics.md): the scalar reference every fast
// expert kernel (AVX-512, AVX2, AMX, CUDA) is tested against bit for bit. One token × one expert,
// straight from the released MXFP4 bytes, built on storage/expert_contract.h.
//
// What this is not: fast (one element at a time, no SIMD, no threads), and not the exact mode —
// the exact fp32 oracle dequantises the weights and never quantizes activations (cpu/ref).
#pragma once
#include <cstdint>
#include <vector>

#include "storage/expert_contract.h"

namespace strata::cpu {

// An activation vector quantized per 32-block (§2): q [K] int8, e [K/32] block exponents.
// poisoned: some block had an Inf/NaN (every output computed from it is the canonical NaN).
struct QuantizedVector {
  std::vector<int8_t> q;
  std::vector<int> e;
  bool poisoned = false;
};

// §2 for a whole vector; K a multiple of 32.
QuantizedVector quantize_activation(const float* x, int K);

// §3 for `rows` output rows of an MXFP4 matrix (packed [rows, K/2], scale [rows, K/32]) against
// a quantized activation of length K: out [rows] fp32.
void project_contract(const uint8_t* packed, const uint8_t* scale, int rows, int K,
                      const QuantizedVector& xq, float* out);

// §4: y = w2 · glu(w1·x, w3·x) for one token and one expert. x: [H] fp32, y: [H] fp32.
// H = w.hidden, I = w.inter, both multiples of 32 (checked).
void expert_ffn_contract(const Mxfp4ExpertView& w, const float* x, float* y, const GluParams& glu);

}  // namespace strata::cpu
