// Routing record and replay shared by every backend (DESIGN "Comparing numerics paths"): a forced
// selection replaces the router's top-k for the tokens a RoutingLog covers, with the weights the
// router gives the forced experts (the formula of cpu::ref::route applied to another selection:
// score, optional in-place bias, renormalise, scale), so only arithmetic differs between runs.
// Also the CPU backends' router step after the logits: top-k by cpu::ref::route with the model's
// router form, then the trace's replay and record. Not here: the router logits, the GPU top-k
// (kernels/ops route), the log's file format (engine/trace.h).
#pragma once
#include <cstdint>

#include "engine/backend.h"
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

// The routing of T rows from their fp32 router logits [T, E] on the host (cpu::ref::route with
// c.moe's form, renormalisation and scaling; bias: [E]), then, for a single-sequence step under a
// trace, the forced selections replayed and the result recorded.
MoeRouting route_on_host(const ModelConfig& c, const float* logits, const float* bias, int64_t T,
                         const Trace* trace, const StepShape& s, int layer);

}  // namespace strata::engine
