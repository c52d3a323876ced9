// The promotion decision (engine/promotion.h).
#include "engine/promotion.h"

#include <algorithm>

namespace strata::engine {

std::vector<PromotionPick> pick_promotions(std::span<const std::vector<float>> heat,
                                           std::span<const std::vector<int32_t>* const> slot,
                                           int max_picks, double margin) {
  struct Cand {
    float gain;
    PromotionPick p;
  };
  std::vector<Cand> cands;
  std::vector<int32_t> hot, cold;
  const float m = float(1.0 + std::max(0.0, margin));
  const size_t cap = size_t(std::max(0, max_picks));
  for (size_t l = 0; l < heat.size() && l < slot.size(); ++l) {
    const std::vector<float>& h = heat[l];
    if (h.empty() || !slot[l]) continue;
    const std::vector<int32_t>& s = *slot[l];
    hot.clear();
    cold.clear();
    for (int32_t e = 0; e < int32_t(std::min(s.size(), h.size())); ++e)
      (s[size_t(e)] < 0 ? hot : cold).push_back(e);
    const size_t n = std::min({hot.size(), cold.size(), cap});
    auto by = [&h](bool hottest) {
      return [&h, hottest](int32_t a, int32_t b) {
        const float x = h[size_t(a)], y = h[size_t(b)];
        return x != y ? (hottest ? x > y : x < y) : a < b;
      };
    };
    std::partial_sort(hot.begin(), hot.begin() + int64_t(n), hot.end(), by(true));
    std::partial_sort(cold.begin(), cold.begin() + int64_t(n), cold.end(), by(false));
    for (size_t i = 0; i < n; ++i) {
      const float hh = h[size_t(hot[i])], hc = h[size_t(cold[i])];
      if (!(hh > m * hc + 1.0f)) break;
      cands.push_back({hh - hc, {int(l), hot[i], cold[i]}});
    }
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [](const Cand& a, const Cand& b) { return a.gain > b.gain; });
  std::vector<PromotionPick> out;
  for (size_t i = 0; i < cands.size() && i < cap; ++i) out.push_back(cands[i].p);
  return out;
}

}  // namespace strata::engine
