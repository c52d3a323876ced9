// printf-style formatting of a few numbers into a std::string, for offload's reports, rate
// sources and notes (one helper for cost_model, plan, hardware and the bench hw probes).
#pragma once
#include <cstdio>
#include <string>

namespace strata::offload {

inline std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[400];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

}  // namespace strata::offload
