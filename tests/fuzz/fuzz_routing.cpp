// Fuzz target: a routing-replay file (strata-routing-v1 JSON) → RoutingLog::parse, then the
// checks a replay runs against a model (the synthetic k3-tiny's config) and every forced row.
// Seeds: recordings of k3-tiny runs (fuzz_seeds).
#include "engine/trace.h"
#include "fuzz_target.h"
#include "storage/synth.h"

namespace {
const strata::ModelConfig& tiny() {
  static const strata::ModelConfig c = [] {
    strata::SynthOptions o;
    o.preset = "k3-tiny";
    return strata::parse_config(strata::synth_config_json(o), "k3-tiny");
  }();
  return c;
}
}  // namespace

STRATA_FUZZ_TARGET(routing) {
  const strata::engine::RoutingLog log =
      strata::engine::RoutingLog::parse(strata::fuzz::as_string(data, size), "fuzz: ");
  log.check_against(tiny(), "fuzz", 1, 64);
  for (const auto& [layer, rows] : log.layers)
    for (size_t p = 0; p < rows.size(); ++p) {
      const std::vector<int>* ids = log.forced(layer, int(p));
      if (!ids || int(ids->size()) != log.top_k) __builtin_trap();
      for (int e : *ids)
        if (e < 0 || e >= tiny().moe.num_experts) __builtin_trap();
    }
}
