// Fuzz target: config.json text → parse_config, then what inspect derives from it (summary,
// costs, tensor list). Seeds: the real K3 and Kimi-Linear configs, the golden and synthetic ones.
#include "fuzz_target.h"
#include "storage/checkpoint.h"
#include "storage/config.h"

STRATA_FUZZ_TARGET(config) {
  const strata::ModelConfig c = strata::parse_config(strata::fuzz::as_string(data, size), "fuzz");
  (void)strata::describe_config(c);
  // The cost walk lists every tensor: bounded by the config limits, but keep executions fast.
  if (int64_t(c.moe.num_experts) * c.num_moe_layers() <= 4096 && c.num_layers <= 128) {
    const strata::ModelCosts k = strata::compute_costs(c);
    if (k.total_bytes == 0) __builtin_trap();  // every model has an embedding
  }
}
