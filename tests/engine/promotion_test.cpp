// The promotion decision of the GPU expert cache (engine/promotion.h): which non-resident experts
// take which resident experts' slots, from routing counts. The copies and the switch are the CUDA
// backend's (tests/engine/cuda_backend_gpu.cpp, label gpu).
#include <catch2/catch.hpp>

#include <vector>

#include "engine/promotion.h"

using namespace strata::engine;

namespace {

std::vector<PromotionPick> pick(const std::vector<std::vector<float>>& heat,
                                const std::vector<std::vector<int32_t>>& slot, int max_picks,
                                double margin = 0.5) {
  std::vector<const std::vector<int32_t>*> s;
  for (const auto& v : slot) s.push_back(&v);
  return pick_promotions(heat, s, max_picks, margin);
}

bool same(const PromotionPick& p, int layer, int32_t expert, int32_t victim) {
  return p.layer == layer && p.expert == expert && p.victim == victim;
}

}  // namespace

TEST_CASE("promotions: the hottest missed experts take the coldest residents' slots",
          "[engine][promotion]") {
  // Experts 0-2 resident (slots 0-2), 3-5 not; 5 is hottest, then 4; 3 barely counted.
  const std::vector<std::vector<int32_t>> slot = {{0, 1, 2, -1, -1, -1}};
  const std::vector<std::vector<float>> heat = {{3, 0, 1, 1.5f, 6, 9}};
  const auto p = pick(heat, slot, 4);
  // 9 > 1.5·0 + 1 (victim 1), 6 > 1.5·1 + 1 (victim 2), 1.5 > 1.5·3 + 1 fails: stop.
  REQUIRE(p.size() == 2);
  CHECK(same(p[0], 0, 5, 1));
  CHECK(same(p[1], 0, 4, 2));
  // At most max_picks.
  const auto one = pick(heat, slot, 1);
  REQUIRE(one.size() == 1);
  CHECK(same(one[0], 0, 5, 1));
  CHECK(pick(heat, slot, 0).empty());
}

TEST_CASE("promotions: the margin keeps near-equal counts where they are", "[engine][promotion]") {
  const std::vector<std::vector<int32_t>> slot = {{0, -1}};
  // 4 against 2: beats 1.5·2 + 1 = 4? no (strictly greater needed); 4.5 does.
  CHECK(pick({{2, 4}}, slot, 4).empty());
  CHECK(pick({{2, 4.5f}}, slot, 4).size() == 1);
  // A larger margin asks for more; a single count never beats an unused resident (0 + 1).
  CHECK(pick({{2, 4.5f}}, slot, 4, 2.0).empty());
  CHECK(pick({{0, 1}}, slot, 4).empty());
  CHECK(pick({{0, 1.5f}}, slot, 4).size() == 1);
}

TEST_CASE("promotions: layers left out, gains ordered over layers, ties by id",
          "[engine][promotion]") {
  const std::vector<std::vector<int32_t>> slot = {
      {0, 1, -1, -1}, {0, 1, 2, 3}, {0, 1, -1, -1}, {-1, 0, -1, 1}};
  const std::vector<std::vector<float>> heat = {
      {0, 0, 5, 5},  // layer 0: gains 5 and 5; equal counts go by id (2 before 3)
      {},            // layer 1: every expert resident, left out
      {0, 0, 8, 0},  // layer 2: gain 8
      {}};           // layer 3: no counts kept, left out
  const auto p = pick(heat, slot, 2);
  REQUIRE(p.size() == 2);
  CHECK(same(p[0], 2, 2, 0));
  CHECK(same(p[1], 0, 2, 0));  // the first of layer 0's equal gains
  const auto all = pick(heat, slot, 8);
  REQUIRE(all.size() == 3);
  CHECK(same(all[2], 0, 3, 1));
}
