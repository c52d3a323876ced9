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
  using T = TierTelemetry;
  for (uint64_t T::*m :
       {&T::gpu_hits, &T::host_hits, &T::prefetch_hits, &T::late_prefetch, &T::disk_misses,
        &T::bytes_read, &T::prefetch_bytes, &T::read_retries, &T::read_errors, &T::fill_bytes,
        &T::evictions, &T::stream_reads, &T::prefetch_issued, &T::prefetch_rejected,
        &T::prefetch_wasted, &T::predictions_late})
    d.*m = sub(this->*m, b.*m);
  for (double T::*m : {&T::read_busy_s, &T::fill_s, &T::blocked_s})
    d.*m = std::max(0.0, this->*m - b.*m);
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
                "host cache %.1f/%.1f MiB peak, %llu evictions, %llu streaming reads",
                100.0 * double(gpu_hits) / n, 100.0 * double(host_hits) / n,
                100.0 * double(prefetch_hits) / n, 100.0 * double(disk_misses) / n,
                (unsigned long long)demand(), double(bytes_read) / 1e9, read_gbps(),
                io_backend.c_str(), (unsigned long long)read_retries,
                (unsigned long long)read_errors, blocked_s, double(host_peak_bytes) / 1048576.0,
                double(host_budget_bytes) / 1048576.0, (unsigned long long)evictions,
                (unsigned long long)stream_reads);
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
               {"stream_reads", stream_reads},
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
