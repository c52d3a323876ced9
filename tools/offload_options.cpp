// The tiered expert store's command-line options, shared by `strata run` and `strata logits`.
#include "engine/offload_executor.h"
#include "tools/command.h"

namespace strata::tools {

void add_offload_options(CLI::App& app, engine::OffloadOptions& o) {
  app.add_option("--host-mem", o.host_mem,
                 "serve routed experts from a host expert cache of this size, streamed from the "
                 "checkpoint (e.g. 64GiB, 512MiB, or 30% of the model's experts); default: "
                 "experts stay in the mmapped checkpoint");
  app.add_flag("--host-fill", o.host_fill,
               "with --host-mem: read experts into the host cache at start, in layer order, until "
               "it is full (a progress line), instead of on first use");
  app.add_option("--io", o.io, "expert reads: auto, io_uring or pread")->capture_default_str();
  app.add_option("--io-depth", o.queue_depth, "expert reads in flight")->capture_default_str();
  app.add_option("--prefetch-depth", o.prefetch_depth,
                 "router lookahead in layers (0 = no prefetch)")
      ->capture_default_str();
  app.add_option("--io-timeout", o.io_timeout_s,
                 "seconds to wait for one expert read before stopping with an error (0 = no limit)")
      ->capture_default_str();
  app.add_option("--stats-json", o.stats_json, "write the tier telemetry as JSON to FILE");
}

}  // namespace strata::tools
