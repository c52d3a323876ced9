// Tier telemetry of the expert store and prefetcher (DESIGN decision 5, spec/offload.md §4): per
// tier hits and misses, bytes read, achieved read GB/s, prediction recall per lookahead distance,
// time blocked on I/O. One line for the run's stats line, the same numbers as JSON for
// --stats-json. Plain data: the store and the prefetcher fill it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::offload {

struct TierTelemetry {
  // Demand accesses (each expert a step requires) by where it was when the step asked for it.
  uint64_t gpu_hits = 0;       // resident on a GPU (no GPU expert cache yet: always 0)
  uint64_t host_hits = 0;      // resident in the host cache
  uint64_t prefetch_hits = 0;  // host hits brought in by a prediction (subset of host_hits)
  uint64_t late_prefetch = 0;  // predicted, read still in flight (counted in disk_misses)
  uint64_t disk_misses = 0;    // not resident: read from disk (or still being read)
  // Disk tier.
  uint64_t bytes_read = 0;  // from the shards (demand + prefetch)
  uint64_t prefetch_bytes = 0;
  double read_busy_s = 0;  // wall time with reads in flight
  uint64_t read_retries = 0, read_errors = 0;
  std::string io_backend;
  uint64_t fill_bytes = 0;  // read at start-up to fill the host cache (not in bytes_read)
  double fill_s = 0;
  // Host tier.
  uint64_t host_budget_bytes = 0, host_peak_bytes = 0, host_used_bytes = 0;
  uint64_t slots = 0, evictions = 0;
  uint64_t stream_reads = 0;  // misses of scanning steps, cached as streaming (expert_store.h)
  uint64_t prefetch_issued = 0, prefetch_rejected = 0, prefetch_wasted = 0;
  double blocked_s = 0;  // time acquire() waited for reads
  // Prediction recall per lookahead distance d = 1, 2, … (index d-1).
  std::vector<uint64_t> recall_hits, recall_total;
  uint64_t predictions_late = 0;  // a layer's routing arrived before its prediction was made

  uint64_t demand() const { return gpu_hits + host_hits + disk_misses; }
  // What happened since `before` (an earlier snapshot of the same tiers): counters and times
  // subtracted; the host tier's budget, peak, use and slots and the I/O backend as they are now.
  TierTelemetry since(const TierTelemetry& before) const;
  double read_gbps() const { return read_busy_s > 0 ? double(bytes_read) / read_busy_s / 1e9 : 0; }
  double recall(int d) const;  // d ≥ 1; 0 when nothing was measured
  // "experts: gpu 0.0% host 71.2% (prefetch 30.1%) disk 28.8% | read 1.23 GB at 1.05 GB/s, …"
  std::string line() const;
  nlohmann::json json() const;
};

}  // namespace strata::offload
