// Token sampling on the GPU: greedy, temperature, top-k, top-p (nucleus), one draw per row of
// logits. The random numbers are inputs (one uniform in [0, 1) per row, drawn by the engine's
// seeded generator), so a run is reproducible from its seed and the GPU picks the token the host's
// pick_token (engine/sampler.h) picks from the same logits and uniform: both sum the probabilities
// in double, in other orders, so they can differ only where u falls within ~1e-16 of the mass of
// an edge between two candidates.
//
// Semantics (the usual llama.cpp / HF order): candidates = all tokens sorted by decreasing logit
// (ties → lower id); top_k > 0 keeps the first top_k; probabilities softmax(logit / temperature)
// over the kept candidates; top_p < 1 keeps the shortest prefix whose probability reaches top_p;
// the draw picks the first candidate whose cumulative (renormalised) probability exceeds u.
// temperature <= 0 is greedy (arg-max, ties → lower id; top_k/top_p ignored).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/runtime.h"

namespace strata::kernels::sample {

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;       // 0 = off
  float top_p = 1.0f;  // 1 = off
};

// Scratch for B rows of V logits.
size_t sample_workspace_bytes(int B, int V);

// logits: device [B, V] fp32; uniform: device [B] in [0, 1); ids: device [B] int32 out.
Status sample(const float* logits, int B, int V, const SamplingParams& p, const double* uniform,
              int32_t* ids, void* workspace, size_t workspace_bytes, void* stream);

}  // namespace strata::kernels::sample
