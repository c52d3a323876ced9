// Which experts to promote into the GPU expert cache (issue 18 item 5): the decision of the CUDA
// backend's promotions (engine/cuda_backend.cpp promote_poll), a pure function so that CPU tests
// pin it. Not here: the counting, the copies, when the switch happens (the backend).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace strata::engine {

struct PromotionPick {
  int layer;
  int32_t expert;  // not resident now, promoted into …
  int32_t victim;  // … the slot of this resident expert
};

// heat[l]: routing counts of layer l's experts (empty: the layer is left out); slot[l]: its cache
// slot per expert (−1: not resident). Per layer the non-resident experts by count, hottest first,
// are paired with the resident ones, coldest first (ties: the lower id first), while the hot one's
// count exceeds (1 + margin) · the victim's + 1; over all layers the pairs with the largest gains
// (count difference; ties: the earlier layer, then the earlier pair) are kept, at most max_picks.
std::vector<PromotionPick> pick_promotions(std::span<const std::vector<float>> heat,
                                           std::span<const std::vector<int32_t>* const> slot,
                                           int max_picks, double margin);

}  // namespace strata::engine
