// The engine's guard against silent garbage (issue 17): a NaN or Inf in an activation — from a
// corrupt weight, MXFP4 scales whose products overflow fp32, or a config that passes validation
// but still blows up — stops the run at the first step where it appears, naming the layer and
// the site (the same `blk.{layer}.{site}` names the dumper uses), instead of sampling token 0
// from NaN logits. The layer schedule (engine/schedule.cpp) calls it on the embedding, each
// sublayer's output and the logits; the scan is one pass over T·D floats (integer compares,
// vectorised), small next to the matmuls that produced them.
// Also the load-time weight scan (bf16/f32 tensors): the small tensors always, all with
// --check-weights.
// Not here: deciding which sites to check (engine/schedule.cpp), weight loading (engine/model.cpp).
#pragma once
#include <cstdint>
#include <string>

#include "engine/backend.h"

namespace strata::engine {

// Index of the first non-finite value of x[0..n), or −1.
int64_t first_non_finite(const float* x, int64_t n);
// Same for n bf16 values (raw bits, any alignment).
int64_t first_non_finite_bf16(const uint16_t* x, int64_t n);

// Throws strata::Error "non-finite activation (NaN) at blk.3.kda_out (position 5, element 17):
// ..." when x [T, D] (rows at positions pos0, pos0+1, ...) holds a NaN or Inf. layer < 0 names a
// model-level site ("embed", "logits").
// `unit` names the row: "position " (default) or e.g. "logits row ".
void check_finite(const float* x, int64_t T, int64_t D, int layer, const char* site, int64_t pos0,
                  const char* unit = "position ");

// The schedule's form: a [s.rows, D] in the backend's memory (Backend::first_non_finite decides
// which rows it scans), the position (and slot, for several sequences) named from the step shape.
void check_finite(Backend& b, Act a, const StepShape& s, int layer, const char* site);
// The error for element i (row · cols + col) of a [rows, cols] array whose rows are named by `unit`
// and their index (check_finite's form with pos0 = 0).
[[noreturn]] void fail_row(float v, int64_t i, int64_t cols, int layer, const char* site,
                           const char* unit);
// The error for element i (row · cols + col) of a [s.rows, cols] activation holding v.
[[noreturn]] void fail_at(float v, int64_t i, int64_t cols, const StepShape& s, int layer,
                          const char* site);

}  // namespace strata::engine
