// Routing record and replay shared by every backend (DESIGN "Comparing numerics paths"): a forced
// selection replaces the router's top-k for the tokens a RoutingLog covers, with the weights the
// router gives the forced experts (the formula of cpu::ref::route applied to another selection:
// score, optional in-place bias, renormalise, scale), so only arithmetic differs between runs.
// Not here: the router itself (cpu/ref/ops.h route, kernels/ops route), the log's file format
// (engine/trace.h).
#pragma once
#include <cstdint>

#include "engine/expert_executor.h"
#include "engine/trace.h"

namespace strata::engine {

// For rows t of r whose position pos0 + t the log covers in `layer`: ids and weights forced.
// logits: [r.T, E] fp32 router logits; bias: [E] (e_score_correction_bias). Throws strata::Error
// naming the layer and position when a forced list has the wrong length or an expert id outside
// [0, E).
void apply_replay(const RoutingLog& log, int layer, int64_t pos0, const float* logits,
                  const ModelConfig& c, const float* bias, MoeRouting& r);

// Appends the selections of rows 0 … r.T−1 at positions pos0 … to the log.
void record_routing(RoutingLog& log, int layer, int64_t pos0, const MoeRouting& r);

}  // namespace strata::engine
