#include "offload/telemetry.h"

#include <algorithm>
#include <cstdio>

namespace strata::offload {

double TierTelemetry::recall(int d) const {
  if (d < 1 || size_t(d) > recall_total.size() || recall_total[size_t(d - 1)] == 0) return 0;
  return double(recall_hits[size_t(d - 1)]) / double(recall_total[size_t(d - 1)]);
}

TierTelemetry TierTelemetry::since(const TierTelemetry& b) const {
  TierTelemetry d = *this;
  auto sub = [](uint64_t now, uint64_t then) { return now >= then ? now - then : 0; };
  d.gpu_hits = sub(gpu_hits, b.gpu_hits);
  d.host_hits = sub(host_hits, b.host_hits);
  d.prefetch_hits = sub(prefetch_hits, b.prefetch_hits);
  d.late_prefetch = sub(late_prefetch, b.late_prefetch);
  d.disk_misses = sub(disk_misses, b.disk_misses);
  d.bytes_read = sub(bytes_read, b.bytes_read);
  d.prefetch_bytes = sub(prefetch_bytes, b.prefetch_bytes);
  d.read_busy_s = std::max(0.0, read_busy_s - b.read_busy_s);
  d.read_retries = sub(read_retries, b.read_retries);
  d.read_errors = sub(read_errors, b.read_errors);
  d.fill_bytes = sub(fill_bytes, b.fill_bytes);
  d.fill_s = std::max(0.0, fill_s - b.fill_s);
  d.evictions = sub(evictions, b.evictions);
  d.prefetch_issued = sub(prefetch_issued, b.prefetch_issued);
  d.prefetch_rejected = sub(prefetch_rejected, b.prefetch_rejected);
  d.prefetch_wasted = sub(prefetch_wasted, b.prefetch_wasted);
  d.blocked_s = std::max(0.0, blocked_s - b.blocked_s);
  d.predictions_late = sub(predictions_late, b.predictions_late);
  for (size_t i = 0; i < d.recall_total.size(); i++) {
    const bool had = i < b.recall_total.size() && i < b.recall_hits.size();
    d.recall_total[i] = sub(recall_total[i], had ? b.recall_total[i] : 0);
    if (i < d.recall_hits.size())
      d.recall_hits[i] = sub(recall_hits[i], had ? b.recall_hits[i] : 0);
  }
  return d;
}

std::string TierTelemetry::line() const {
  const double n = double(std::max<uint64_t>(1, demand()));
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "experts: gpu %.1f%% host %.1f%% (prefetched %.1f%%) disk %.1f%% of %llu | "
                "read %.3f GB at %.2f GB/s (%s, %llu retries, %llu errors), blocked %.3f s | "
                "host cache %.1f/%.1f MiB peak, %llu evictions",
                100.0 * double(gpu_hits) / n, 100.0 * double(host_hits) / n,
                100.0 * double(prefetch_hits) / n, 100.0 * double(disk_misses) / n,
                (unsigned long long)demand(), double(bytes_read) / 1e9, read_gbps(),
                io_backend.c_str(), (unsigned long long)read_retries,
                (unsigned long long)read_errors, blocked_s, double(host_peak_bytes) / 1048576.0,
                double(host_budget_bytes) / 1048576.0, (unsigned long long)evictions);
  std::string s = buf;
  if (fill_bytes > 0) {
    std::snprintf(buf, sizeof buf, " | filled at start %.3f GB in %.1f s", double(fill_bytes) / 1e9,
                  fill_s);
    s += buf;
  }
  if (!recall_total.empty()) {
    s += " | recall";
    for (size_t d = 1; d <= recall_total.size(); d++) {
      std::snprintf(buf, sizeof buf, " d%zu %.1f%%", d, 100.0 * recall(int(d)));
      s += buf;
    }
  }
  return s;
}

nlohmann::json TierTelemetry::json() const {
  nlohmann::json j;
  j["demand"] = demand();
  j["gpu"] = {{"hits", gpu_hits}};
  j["host"] = {{"hits", host_hits},
               {"prefetch_hits", prefetch_hits},
               {"late_prefetch", late_prefetch},
               {"budget_bytes", host_budget_bytes},
               {"peak_bytes", host_peak_bytes},
               {"used_bytes", host_used_bytes},
               {"slots", slots},
               {"evictions", evictions},
               {"fill_bytes", fill_bytes},
               {"fill_s", fill_s}};
  j["disk"] = {
      {"misses", disk_misses},      {"bytes_read", bytes_read}, {"prefetch_bytes", prefetch_bytes},
      {"read_busy_s", read_busy_s}, {"read_gbps", read_gbps()}, {"retries", read_retries},
      {"errors", read_errors},      {"backend", io_backend}};
  j["prefetch"] = {{"issued", prefetch_issued},
                   {"rejected", prefetch_rejected},
                   {"wasted", prefetch_wasted},
                   {"late_predictions", predictions_late}};
  nlohmann::json rec = nlohmann::json::array();
  for (size_t d = 1; d <= recall_total.size(); d++)
    rec.push_back({{"distance", d},
                   {"hits", recall_hits[d - 1]},
                   {"total", recall_total[d - 1]},
                   {"recall", recall(int(d))}});
  j["prediction_recall"] = rec;
  j["blocked_on_io_s"] = blocked_s;
  return j;
}

}  // namespace strata::offload
