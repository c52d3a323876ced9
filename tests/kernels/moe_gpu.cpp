// Op-check of the grouped MXFP4 experts on the GPU (kernels/moe/experts.h) against the scalar
// contract strata::cpu::expert_ffn_contract, bit for bit (docs/numerics.md; DESIGN decision 7),
// at K3 shapes (3584 → 3072 → 3584, SiTU) and odd small ones (SiLU, SiTU without β2, partial
// lane rounds, empty groups, a poisoned token), on every path (GEMV, IMMA and the grouped GEMM of
// intgemm.cu in its mma.sync and wgmma forms, whose own cases sit at its tile edges and window
// edges), plus the expert-id-order merge. Experts sit in a device "cache" of slots in the released
// layout; free slots and the bytes around each output are poisoned (0xFF) so a misread or stray
// write shows.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cpu/expert_contract.h"
#include "gpu_test.h"
#include "kernels/moe/experts.h"
#include "kernels/moe/paths.h"
#include "kernels/ops/device_memory.h"
#include "kernels/runtime.h"
#include "storage/bf16.h"
#include "test_data.h"

namespace {

using strata::GluParams;
using strata::Mxfp4ExpertView;
using strata::kernels::DeviceBuffer;
namespace moe = strata::kernels::moe;

using strata::test::Rng;

size_t align256(size_t n) {
  return (n + 255) & ~size_t(255);
}

// Byte layout of one slot: [w1p | w1s | w3p | w3s | w2p | w2s], each part 256-aligned.
struct SlotLayout {
  size_t off[6], bytes;
  SlotLayout(int H, int I) {
    const size_t sz[6] = {size_t(I) * H / 2,  size_t(I) * H / 32, size_t(I) * H / 2,
                          size_t(I) * H / 32, size_t(H) * I / 2,  size_t(H) * I / 32};
    size_t o = 0;
    for (int i = 0; i < 6; i++) off[i] = o, o += align256(sz[i]);
    bytes = o;
  }
  Mxfp4ExpertView view(const uint8_t* base, int H, int I) const {
    Mxfp4ExpertView v;
    v.w1_packed = base + off[0], v.w1_scale = base + off[1];
    v.w3_packed = base + off[2], v.w3_scale = base + off[3];
    v.w2_packed = base + off[4], v.w2_scale = base + off[5];
    v.hidden = H, v.inter = I;
    return v;
  }
};

// Random packed codes; scale codes scale_base + 0..(scale_span − 1) + e % 3 (default 117 + 0..6:
// around 2^-7, so g, u land in the GLU's interesting range; the shift by the expert id gives
// expert e's outputs e's signature). A span of 4 keeps every row inside the GEMM path's weight
// window (3 codes), 5 puts nearly every row outside it.
void fill_slot(std::vector<uint8_t>& cache, size_t base, const SlotLayout& L, int H, int I, int e,
               int scale_base, int scale_span) {
  Rng r{0x5eed0000ull + uint64_t(e) * 7919};
  const size_t sz[6] = {size_t(I) * H / 2,  size_t(I) * H / 32, size_t(I) * H / 2,
                        size_t(I) * H / 32, size_t(H) * I / 2,  size_t(H) * I / 32};
  for (int part = 0; part < 6; part++) {
    uint8_t* p = cache.data() + base + L.off[part];
    const bool scale = part % 2 == 1;
    for (size_t i = 0; i < sz[part]; i++) {
      uint64_t v = r.next();
      p[i] = scale ? uint8_t(scale_base + int(v % uint64_t(scale_span)) + e % 3) : uint8_t(v);
    }
  }
}

struct Case {
  int H = 0, I = 0, T = 0, slots = 0;
  GluParams glu;
  std::vector<int> group_slot;                 // expert slot of each group (distinct, any order)
  std::vector<std::vector<int>> group_tokens;  // tokens routed to each group
  int poisoned_token = -1;                     // gets an Inf in x
  float x_scale = 1.0f;
  int scale_base = 117;  // weight scale codes scale_base + 0..(scale_span − 1) + 0..2 (≤ 254)
  int scale_span = 5;
  int wide_token = -1;  // its 32-blocks scaled by 2^(3·(b mod 5)): nonzero blocks span > 7
  std::vector<int> zero_blocks_token;  // tokens whose every third block is zero
  bool wide_rows = false;  // a few rows of every matrix get one scale code 4 above their base
};

struct Reference {
  std::vector<float> y;  // [P, H]
};

struct Prepared {
  Case c;
  std::vector<uint8_t> cache;
  SlotLayout L{32, 32};
  std::vector<float> x;
  std::vector<int32_t> offsets, pair_token;
  std::vector<int> pair_group;
  int P = 0;
  std::vector<float> y_ref;
};

Prepared prepare(const Case& c) {
  Prepared p;
  p.c = c;
  p.L = SlotLayout(c.H, c.I);
  p.cache.assign(p.L.bytes * size_t(c.slots), 0xFF);  // free slots stay 0xFF (NaN scales)
  for (int g = 0; g < int(c.group_slot.size()); g++)
    fill_slot(p.cache, p.L.bytes * size_t(c.group_slot[g]), p.L, c.H, c.I, c.group_slot[g],
              c.scale_base, c.scale_span);
  if (c.wide_rows) {
    // Rows 0, 5, 130 (past the first 128-row tile) and the last of each matrix: one block's code
    // raised by 4 (a span of at least 4: the GEMM path's strict fallback for those rows).
    for (int s : c.group_slot) {
      uint8_t* base = p.cache.data() + p.L.bytes * size_t(s);
      const int rows[3] = {c.I, c.I, c.H}, nbs[3] = {c.H / 32, c.H / 32, c.I / 32};
      for (int m = 0; m < 3; m++)
        for (int o : {0, 5, 130, rows[m] - 1})
          if (o < rows[m]) {
            uint8_t& sc = base[p.L.off[2 * m + 1] + size_t(o) * nbs[m] + size_t(o % nbs[m])];
            sc = uint8_t(std::min(254, c.scale_base + 4 + c.scale_span));
          }
    }
  }
  Rng r{42};
  p.x.resize(size_t(c.T) * c.H);
  for (float& v : p.x) v = r.normal() * c.x_scale;
  if (c.poisoned_token >= 0) p.x[size_t(c.poisoned_token) * c.H + 5] = INFINITY;
  if (c.wide_token >= 0)
    for (int i = 0; i < c.H; i++)
      p.x[size_t(c.wide_token) * c.H + size_t(i)] *= float(1 << (3 * ((i / 32) % 5)));
  for (int t : c.zero_blocks_token)
    for (int i = 0; i < c.H; i++)
      if ((i / 32) % 3 == 0) p.x[size_t(t) * c.H + size_t(i)] = 0.0f;
  p.offsets.push_back(0);
  for (int g = 0; g < int(c.group_tokens.size()); g++) {
    for (int t : c.group_tokens[g]) p.pair_token.push_back(t), p.pair_group.push_back(g);
    p.offsets.push_back(int32_t(p.pair_token.size()));
  }
  p.P = int(p.pair_token.size());
  // The scalar contract for every pair, spread over the host's cores.
  p.y_ref.assign(size_t(p.P) * c.H, 0.0f);
  const int nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (int k = 0; k < nt; k++)
    th.emplace_back([&, k] {
      for (int q = k; q < p.P; q += nt) {
        const int g = p.pair_group[size_t(q)];
        Mxfp4ExpertView v =
            p.L.view(p.cache.data() + p.L.bytes * size_t(c.group_slot[size_t(g)]), c.H, c.I);
        strata::cpu::expert_ffn_contract(v, p.x.data() + size_t(p.pair_token[size_t(q)]) * c.H,
                                         p.y_ref.data() + size_t(q) * c.H, c.glu);
      }
    });
  for (auto& t : th) t.join();
  return p;
}

// Runs the GPU experts on `path` and checks every output bit against the contract, and that the
// sentinel rows after y are untouched. Returns the GEMM path's window counts (zeros otherwise).
moe::GemmWindowCounts check_gpu(const Prepared& p, moe::ExpertPath path) {
  const Case& c = p.c;
  INFO("path " << (path == moe::ExpertPath::gemv    ? "gemv"
                   : path == moe::ExpertPath::imma  ? "imma"
                   : path == moe::ExpertPath::gemm  ? "gemm"
                   : path == moe::ExpertPath::wgmma ? "wgmma"
                                                    : "automatic"));
  DeviceBuffer cache = DeviceBuffer::from(p.cache);
  std::vector<Mxfp4ExpertView> views;
  for (int s : c.group_slot)
    views.push_back(p.L.view(cache.as<uint8_t>() + p.L.bytes * size_t(s), c.H, c.I));
  DeviceBuffer d_views = DeviceBuffer::from(views);
  DeviceBuffer d_off = DeviceBuffer::from(p.offsets);
  DeviceBuffer d_tok = DeviceBuffer::from(p.pair_token);
  DeviceBuffer d_x = DeviceBuffer::from(p.x);
  const size_t y_elems = size_t(p.P) * c.H, sentinel = 4096;
  DeviceBuffer d_y((y_elems + sentinel) * 4);
  d_y.fill(0xFF);
  const size_t ws_bytes = moe::experts_workspace_bytes(c.T, p.P, c.H, c.I);
  DeviceBuffer ws(ws_bytes);
  ws.fill(0xFF);

  moe::ExpertBatch b;
  b.experts = d_views.as<Mxfp4ExpertView>();
  b.group_offsets = d_off.as<int32_t>();
  b.pair_token = d_tok.as<int32_t>();
  b.x = d_x.as<float>();
  b.y = d_y.as<float>();
  b.G = int(c.group_slot.size()), b.P = p.P, b.T = c.T, b.H = c.H, b.I = c.I;
  b.glu = c.glu;
  // A first launch on other inputs, so the checked one runs on a used workspace (as every layer
  // after the first does): nothing it leaves there (partial sums, counters) may leak into the next.
  std::vector<float> x_other(p.x.rbegin(), p.x.rend());
  DeviceBuffer d_x_other = DeviceBuffer::from(x_other);
  b.x = d_x_other.as<float>();
  strata::kernels::Status s = moe::grouped_experts(b, ws.get(), ws_bytes, path, nullptr);
  INFO("launch status (first launch): " << s.message);
  REQUIRE(s.ok());
  b.x = d_x.as<float>();
  s = moe::grouped_experts(b, ws.get(), ws_bytes, path, nullptr);
  INFO("launch status: " << s.message);
  REQUIRE(s.ok());
  strata::kernels::device_sync("grouped_experts");

  std::vector<uint32_t> got = d_y.to_vector<uint32_t>(y_elems + sentinel);
  size_t mismatches = 0, first = size_t(-1), nans = 0;
  for (size_t i = 0; i < y_elems; i++) {
    uint32_t want;
    std::memcpy(&want, &p.y_ref[i], 4);
    if (got[i] != want) {
      if (first == size_t(-1)) first = i;
      mismatches++;
    }
    if (std::isnan(p.y_ref[i])) nans++;
  }
  if (first != size_t(-1)) {
    float g;
    std::memcpy(&g, &got[first], 4);
    INFO("first mismatch: pair " << first / c.H << " element " << first % c.H << ": gpu " << g
                                 << " contract " << p.y_ref[first]);
    CHECK(mismatches == 0);
  }
  CHECK(mismatches == 0);
  if (c.poisoned_token >= 0) CHECK(nans > 0);  // the poison reached the outputs it must
  size_t stray = 0;
  for (size_t i = y_elems; i < y_elems + sentinel; i++) stray += got[i] != 0xFFFFFFFFu;
  CHECK(stray == 0);
  moe::GemmWindowCounts wc;
  if (path == moe::ExpertPath::gemm || path == moe::ExpertPath::wgmma)
    REQUIRE(moe::gemm_window_counts(ws.get(), c.T, p.P, c.H, c.I, &wc).ok());
  return wc;
}

GluParams situ(double b1 = 4.0, double b2 = 25.0) {
  GluParams g;
  g.situ = true, g.beta1 = b1, g.beta2 = b2;
  return g;
}
GluParams silu() {
  GluParams g;
  g.situ = false;
  return g;
}

}  // namespace

TEST_CASE("moe gpu: K3 decode shape, 16 experts per token, bit-identical to the contract",
          "[gpu]") {
  strata::test::skip_without_gpu();
  // Two tokens, 16 experts each out of 24 used slots of a 28-slot cache (overlapping: groups of
  // one and two tokens). 3584 → 3072 → 3584, SiTU β1 = 4, β2 = 25.
  Case c;
  c.H = 3584, c.I = 3072, c.T = 2, c.slots = 28, c.glu = situ();
  for (int e = 0; e < 24; e++) {
    std::vector<int> toks;
    if (e < 16) toks.push_back(0);
    if (e >= 8) toks.push_back(1);
    c.group_slot.push_back((e * 7) % 28);  // groups in an order unrelated to slot order
    c.group_tokens.push_back(toks);
  }
  Prepared p = prepare(c);
  check_gpu(p, moe::ExpertPath::gemv);
  check_gpu(p, moe::ExpertPath::imma);
  check_gpu(p, moe::ExpertPath::gemm);  // scale spans of 4-6 codes: the strict rows
  check_gpu(p, moe::ExpertPath::wgmma);
}

TEST_CASE("moe gpu: one token per expert (persistent GEMV ranges), K3 and odd shapes", "[gpu]") {
  strata::test::skip_without_gpu();
  // With at most one pair per group on average the GEMV walks equal contiguous ranges of (group,
  // row) pairs, crossing from w1 to w3 and from group to group inside one warp's range; empty
  // groups sit in between.
  SECTION("K3 3584 -> 3072, one token, 16 experts among 18 groups") {
    Case c;
    c.H = 3584, c.I = 3072, c.T = 1, c.slots = 20, c.glu = situ();
    for (int e = 0; e < 18; e++) {
      c.group_slot.push_back((e * 11) % 20);
      c.group_tokens.push_back(e == 5 || e == 12 ? std::vector<int>{} : std::vector<int>{0});
    }
    Prepared p = prepare(c);
    check_gpu(p, moe::ExpertPath::gemv);
  }
  SECTION("K3 3584 -> 3072, one token, 33 groups (3 empty), a group of three tokens") {
    // Group ends, empty groups and a several-token group inside the persistent warp ranges
    // (P = 32 ≤ G = 33).
    Case c;
    c.H = 3584, c.I = 3072, c.T = 3, c.slots = 33, c.glu = situ();
    for (int e = 0; e < 33; e++) {
      c.group_slot.push_back((e * 5) % 33);
      std::vector<int> toks;
      if (e == 7)
        toks = {0, 1, 2};
      else if (e % 11 != 3)
        toks = {e % 3};
      c.group_tokens.push_back(toks);
    }
    Prepared p = prepare(c);
    check_gpu(p, moe::ExpertPath::gemv);
  }
  SECTION("small shapes, one token per group (pairs of whole rows, partial rounds)") {
    // nb = 3 and 5 (one partial lane round), 65 (1 block in the last round), 129.
    struct Shape {
      int H, I;
    };
    for (const Shape sh : {Shape{96, 160}, Shape{64, 2080}, Shape{4128, 96}, Shape{2080, 64}}) {
      Case c;
      c.H = sh.H, c.I = sh.I, c.T = 4, c.slots = 9, c.glu = situ();
      c.poisoned_token = 2;
      c.group_slot = {8, 1, 2, 0, 3, 5, 4};
      c.group_tokens = {{0}, {1}, {}, {2}, {3}, {0, 3}, {1}};
      Prepared p = prepare(c);
      INFO("H=" << sh.H << " I=" << sh.I);
      check_gpu(p, moe::ExpertPath::gemv);
    }
  }
  SECTION("H=4128 I=96, poisoned token") {
    Case c;
    c.H = 4128, c.I = 96, c.T = 3, c.slots = 6, c.glu = situ();
    c.poisoned_token = 1;
    c.group_slot = {5, 1, 2, 0, 3};
    c.group_tokens = {{0}, {1}, {}, {2}, {0}};
    Prepared p = prepare(c);
    check_gpu(p, moe::ExpertPath::gemv);
  }
}

TEST_CASE("moe gpu: K3 prefill shape, many tokens per expert, both paths", "[gpu]") {
  strata::test::skip_without_gpu();
  Case c;
  c.H = 3584, c.I = 3072, c.T = 40, c.slots = 5, c.glu = situ();
  c.group_slot = {3, 0, 4};
  c.group_tokens.resize(3);
  for (int t = 0; t < c.T; t++) {
    if (t % 2 == 0) c.group_tokens[0].push_back(t);
    if (t % 3 != 0) c.group_tokens[1].push_back(t);
    if (t < 3) c.group_tokens[2].push_back(t);
  }
  Prepared p = prepare(c);
  // One reference, every path (sections would recompute the reference per path).
  check_gpu(p, moe::ExpertPath::gemv);
  check_gpu(p, moe::ExpertPath::imma);
  check_gpu(p, moe::ExpertPath::automatic);
  check_gpu(p, moe::ExpertPath::gemm);
  check_gpu(p, moe::ExpertPath::wgmma);
}

TEST_CASE("moe gpu: odd small shapes, SiLU and SiTU without beta2, empty groups, poison", "[gpu]") {
  strata::test::skip_without_gpu();
  struct Shape {
    int H, I;
    GluParams glu;
  };
  // nb = 3/5 (one partial lane round), 65 (second round of one lane), 129 (five rounds).
  const Shape shapes[] = {{96, 160, silu()}, {64, 2080, situ(4.0, 0.0)}, {4128, 96, situ()}};
  for (const Shape& sh : shapes) {
    DYNAMIC_SECTION("H=" << sh.H << " I=" << sh.I) {
      Case c;
      c.H = sh.H, c.I = sh.I, c.T = 13, c.slots = 6, c.glu = sh.glu;
      c.poisoned_token = 4;
      c.x_scale = 3.0f;
      c.group_slot = {5, 1, 2, 0};
      c.group_tokens = {{0, 4, 7, 12}, {}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {6}};
      Prepared p = prepare(c);
      check_gpu(p, moe::ExpertPath::gemv);
      check_gpu(p, moe::ExpertPath::imma);
      if (sh.H <= 4096 && sh.I <= 4096) check_gpu(p, moe::ExpertPath::gemm);
      if (sh.H <= 4096 && sh.I <= 4096) check_gpu(p, moe::ExpertPath::wgmma);
    }
  }
}

TEST_CASE("moe gpu: extreme block exponents (tiny and huge activations and scales)", "[gpu]") {
  strata::test::skip_without_gpu();
  // The GEMV builds each block term d · 2^(e_x + s_w − 128) from its bits: these cases push e_x
  // and s_w to the ends of their ranges (subnormal and near-overflow activations, scale codes 0..6
  // and 248..254), where outputs round to 0, to subnormals or overflow to ±Inf.
  struct Extreme {
    float x_scale;
    int scale_base;
  };
  const Extreme cases[] = {{1e-38f, 0}, {1e-38f, 248}, {1e30f, 0}, {1e30f, 248}, {3.0f, 0}};
  for (const Extreme& ex : cases) {
    DYNAMIC_SECTION("x_scale=" << ex.x_scale << " scale_base=" << ex.scale_base) {
      Case c;
      c.H = 96, c.I = 4128, c.T = 3, c.slots = 3, c.glu = situ();
      c.x_scale = ex.x_scale, c.scale_base = ex.scale_base;
      c.group_slot = {2, 0};
      c.group_tokens = {{0, 1, 2}, {1}};
      Prepared p = prepare(c);
      check_gpu(p, moe::ExpertPath::gemv);
      check_gpu(p, moe::ExpertPath::imma);
      // One token per group (P ≤ G): the persistent decode kernels at the same extremes.
      c.group_slot = {2, 0, 1};
      c.group_tokens = {{2}, {0}, {1}};
      Prepared pd = prepare(c);
      check_gpu(pd, moe::ExpertPath::gemv);
      // The GEMM path's forms (widths ≤ 4096; 65 blocks: a partial last stage) at the same
      // extremes: the window shifts are relative, the epilogue's exponent reaches the ends of its
      // range.
      c.I = 2080;
      c.group_slot = {2, 0};
      c.group_tokens = {{0, 1, 2}, {1}};
      Prepared pg = prepare(c);
      check_gpu(pg, moe::ExpertPath::gemm);
      check_gpu(pg, moe::ExpertPath::wgmma);
    }
  }
}

TEST_CASE("moe gpu: GEMM path at K3 shape, tile edges and window edges", "[gpu]") {
  strata::test::skip_without_gpu();
  // Groups of 1, 7, 8, 9, 64 (one token tile), 65 and 130 tokens (tiles + a ragged rest), an empty
  // group, in an order unrelated to slot order; 284 pairs over 8 groups: the 64-token tile. Weight
  // rows inside the 3-code window (scale_span 4), so the integer method carries the outputs; token
  // 3 spans > 7 binades (strict for its pairs), token 11 is poisoned (NaN), tokens 20 and 21 have
  // zero blocks (left out of e_min).
  Case c;
  c.H = 3584, c.I = 3072, c.T = 140, c.slots = 10, c.glu = situ();
  c.scale_span = 4;
  c.wide_token = 3;
  c.poisoned_token = 11;
  c.zero_blocks_token = {20, 21};
  auto range = [](int from, int n) {
    std::vector<int> v;
    for (int k = 0; k < n; k++) v.push_back(from + k);
    return v;
  };
  c.group_tokens = {{50},
                    {3, 11, 20, 21, 30, 31, 32},
                    {},
                    range(100, 8),
                    {1, 13, 25, 37, 49, 61, 73, 85, 97},
                    range(0, 64),    // one full tile, with the wide, poisoned, zero-block tokens
                    range(75, 65),   // a tile and one
                    range(5, 130)};  // two tiles and two
  for (int g = 0; g < int(c.group_tokens.size()); g++) c.group_slot.push_back((g * 3 + 1) % 10);
  Prepared p = prepare(c);
  const moe::GemmWindowCounts wc = check_gpu(p, moe::ExpertPath::gemm);
  // The integer method carried every token but the wide and the poisoned one (zero blocks do not
  // widen a token), and the poison reached h in all three of token 11's pairs.
  CHECK(wc.x_ok == c.T - 2);
  CHECK(wc.x_wide == 1);
  CHECK(wc.x_poisoned == 1);
  CHECK(wc.h_poisoned == 3);
  CHECK(wc.h_ok + wc.h_wide + wc.h_poisoned == p.P);
  // The wgmma form of the path on the same case (the same planes, so the same counts).
  const moe::GemmWindowCounts wcw = check_gpu(p, moe::ExpertPath::wgmma);
  CHECK(wcw.x_ok == wc.x_ok);
  CHECK(wcw.h_ok == wc.h_ok);
  CHECK(wcw.h_poisoned == wc.h_poisoned);
  SECTION("rows outside the weight window (strict rows in every tile position)") {
    c.wide_rows = true;
    Prepared pw = prepare(c);
    check_gpu(pw, moe::ExpertPath::gemm);
    check_gpu(pw, moe::ExpertPath::wgmma);
  }
}

TEST_CASE("moe gpu: GEMM path's strip form at K3 shape (few tokens per expert)", "[gpu]") {
  strata::test::skip_without_gpu();
  // Below a mean of 8 pairs per group the GEMM path runs strip_kernel: token tiles of 8, the
  // weights streamed into registers two stages ahead, the p/n decode. Groups of 1, 2, 3, 5 and 8
  // tokens (one tile), 9 and 17 (a tile and one, two tiles and one), an empty group; 45 pairs over
  // 8 groups. Token 3 spans > 7 binades (strict for its pairs), token 11 is poisoned, tokens 20
  // and 21 have zero blocks; rows inside the window (scale_span 4), then with strict rows.
  Case c;
  c.H = 3584, c.I = 3072, c.T = 40, c.slots = 9, c.glu = situ();
  c.scale_span = 4;
  c.wide_token = 3;
  c.poisoned_token = 11;
  c.zero_blocks_token = {20, 21};
  c.group_tokens = {{7},
                    {3, 11},
                    {20, 21, 22},
                    {},
                    {0, 1, 2, 3, 4},
                    {11, 12, 13, 14, 15, 16, 17, 18},
                    {20, 21, 22, 23, 24, 25, 26, 27, 28},
                    {3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35}};
  for (int g = 0; g < int(c.group_tokens.size()); g++) c.group_slot.push_back((g * 4 + 2) % 9);
  Prepared p = prepare(c);
  const moe::GemmWindowCounts wc = check_gpu(p, moe::ExpertPath::gemm);
  CHECK(wc.x_wide == 1);
  CHECK(wc.x_poisoned == 1);
  CHECK(wc.h_poisoned == 3);  // token 11's pairs
  // automatic takes the GEMM path from a mean of 1.5 pairs per group: the same kernel.
  check_gpu(p, moe::ExpertPath::automatic);
  SECTION("rows outside the weight window (strict rows in every tile position)") {
    c.wide_rows = true;
    Prepared pw = prepare(c);
    check_gpu(pw, moe::ExpertPath::gemm);
  }
}

TEST_CASE("moe gpu: GEMM path, small and odd shapes, extreme scale codes", "[gpu]") {
  strata::test::skip_without_gpu();
  struct Shape {
    int H, I;
    GluParams glu;
  };
  // nb = 2, 3, 5 (a partial pipeline stage), 65 and 128 (the largest K the path takes); rows past
  // N in the last 128-row tile; gate|up tiles straddling w1 and w3 (I not a multiple of 128);
  // 75 pairs over 4 groups: the 32-token tile, a group of 70 over three tiles.
  const Shape shapes[] = {
      {64, 96, situ()}, {96, 160, silu()}, {4096, 2080, situ(4.0, 0.0)}, {160, 4096, situ()}};
  for (const Shape& sh : shapes) {
    DYNAMIC_SECTION("H=" << sh.H << " I=" << sh.I) {
      Case c;
      c.H = sh.H, c.I = sh.I, c.T = 70, c.slots = 5, c.glu = sh.glu;
      c.scale_span = 4;
      c.poisoned_token = 4;
      c.x_scale = 3.0f;
      c.group_slot = {4, 1, 2, 0};
      std::vector<int> all;
      for (int t = 0; t < c.T; t++) all.push_back(t);
      c.group_tokens = {{0, 4, 7, 12}, {}, all, {6}};
      Prepared p = prepare(c);
      check_gpu(p, moe::ExpertPath::gemm);
      check_gpu(p, moe::ExpertPath::wgmma);
    }
  }
  const struct {
    float x_scale;
    int scale_base;
  } extremes[] = {{1e-38f, 0}, {1e-38f, 249}, {1e30f, 0}, {1e30f, 249}, {3.0f, 249}};
  for (const auto& ex : extremes) {
    DYNAMIC_SECTION("extreme x_scale=" << ex.x_scale << " codes from " << ex.scale_base) {
      Case c;
      // 22 pairs over 4 groups (two empty): a mean below 8, so the mma.sync form's strip kernel
      // (token tiles of 8: a group of 20 spans three) and the wgmma form's 16-token tile (two).
      c.H = 256, c.I = 192, c.T = 20, c.slots = 4, c.glu = situ();
      c.x_scale = ex.x_scale, c.scale_base = ex.scale_base, c.scale_span = 4;
      c.group_slot = {2, 0, 1, 3};
      std::vector<int> all;
      for (int t = 0; t < c.T; t++) all.push_back(t);
      c.group_tokens = {all, {1, 8}, {}, {}};
      Prepared p = prepare(c);
      check_gpu(p, moe::ExpertPath::gemm);
      check_gpu(p, moe::ExpertPath::wgmma);
      // automatic: the mma.sync form below a mean of kWgmmaMinMeanPairsPerGroup tokens per
      // expert, the wgmma form from it (the 128-token layouts: a mean of 73 and 100).
      check_gpu(p, moe::ExpertPath::automatic);
    }
  }
}

TEST_CASE("moe gpu: wgmma operand and result layouts on known values", "[gpu]") {
  strata::test::skip_without_gpu();
  // One m64nNk32 s8 wgmma (N = 16, 24) with A and B in shared memory and D stored by
  // the maps the wgmma path uses. If the op-checks of the path fail, this says which map: a wrong
  // A map shows as wrong rows (or all), a wrong B descriptor or D map as wrong columns.
  DeviceBuffer d_out(size_t(64) * (16 + 24 + 16) * 4);
  d_out.fill(0xFF);
  REQUIRE(moe::detail::wgmma_probe(d_out.as<int32_t>(), nullptr).ok());
  strata::kernels::device_sync("wgmma_probe");
  const std::vector<int32_t> got = d_out.to_vector<int32_t>(size_t(64) * (16 + 24 + 16));
  size_t off = 0, bad = 0;
  for (const int N : {16, 24, 16}) {  // the last: A from registers
    for (int r = 0; r < 64; r++)
      for (int t = 0; t < N; t++) {
        int32_t want = 0;
        for (int k = 0; k < 32; k++) want += ((7 * r + 3 * k) % 11 - 5) * ((5 * t + k) % 13 - 6);
        const int32_t g = got[off + size_t(r) * N + size_t(t)];
        if (g != want && bad++ < 8)
          UNSCOPED_INFO("N=" << N << " D[" << r << "][" << t << "] = " << g << ", want " << want);
      }
    off += size_t(64) * N;
  }
  CHECK(bad == 0);
}

TEST_CASE("moe gpu: GEMM paths with token tiles filled past half (the wgmma full-N form)",
          "[gpu]") {
  strata::test::skip_without_gpu();
  // The wgmma form issues N = the tile's token count rounded up to a quarter of BN (8 or 16 at
  // BN = 16); columns past the count read stale shared memory and must never be stored. Each
  // section picks one tile size by its mean pairs per group (16: below 8, 32: below 32, 64: below
  // 64, 128 from 64 on the wgmma path; the mma.sync path runs its strip kernel below 8 and its
  // 64-token tile from 32) and has a
  // group for every width, each short of it (64: 13, 30, 45 and 100 = 64 + 36 tokens for N = 16,
  // 32, 48, 64). H = 320 (10 blocks: a partial last pipeline stage), I = 256, and K3's shape for
  // the 128-token tile (one CTA per SM, 28 stages).
  struct Layout {
    const char* name;
    std::vector<int> sizes;  // tokens per group (consecutive token ranges, wrapping at T)
    int H = 320, I = 256;
  };
  const Layout layouts[] = {{"16-token tiles", {13, 1, 2, 0, 6}},
                            {"32-token tiles", {27, 5, 11, 19, 40}},
                            {"64-token tiles", {45, 100, 13, 30}},
                            {"128-token tiles", {100, 45, 130, 20, 70}},
                            {"128-token tiles at K3 shape", {70, 130}, 3584, 3072}};
  for (const Layout& l : layouts) {
    DYNAMIC_SECTION(l.name) {
      Case c;
      c.H = l.H, c.I = l.I, c.T = 140, c.slots = 5, c.glu = situ();
      c.scale_span = 4;
      c.poisoned_token = 7;
      c.wide_token = 9;
      int next = 0;
      for (int g = 0; g < int(l.sizes.size()); g++) {
        std::vector<int> toks;
        for (int k = 0; k < l.sizes[size_t(g)]; k++) toks.push_back((next + k) % c.T);
        next += l.sizes[size_t(g)];
        c.group_tokens.push_back(toks);
        c.group_slot.push_back((g * 2 + 1) % c.slots);
      }
      Prepared p = prepare(c);
      check_gpu(p, moe::ExpertPath::gemm);
      check_gpu(p, moe::ExpertPath::wgmma);
      // automatic: the mma.sync form below a mean of kWgmmaMinMeanPairsPerGroup tokens per
      // expert, the wgmma form from it (the 128-token layouts: a mean of 73 and 100).
      check_gpu(p, moe::ExpertPath::automatic);
    }
  }
}

TEST_CASE("moe gpu: GEMM and wgmma paths report widths above 4096 as not supported", "[gpu]") {
  strata::test::skip_without_gpu();
  moe::ExpertBatch b;
  b.G = 1, b.P = 1, b.T = 1, b.H = 4128, b.I = 96;
  const size_t ws_bytes = moe::experts_workspace_bytes(b.T, b.P, b.H, b.I);
  DeviceBuffer ws(ws_bytes), x(size_t(b.H) * 4), y(size_t(b.H) * 4);
  std::vector<Mxfp4ExpertView> v(1);
  DeviceBuffer dv = DeviceBuffer::from(v);
  DeviceBuffer off = DeviceBuffer::from(std::vector<int32_t>{0, 1});
  DeviceBuffer tok = DeviceBuffer::from(std::vector<int32_t>{0});
  b.experts = dv.as<Mxfp4ExpertView>(), b.group_offsets = off.as<int32_t>();
  b.pair_token = tok.as<int32_t>(), b.x = x.as<float>(), b.y = y.as<float>();
  for (const moe::ExpertPath path : {moe::ExpertPath::gemm, moe::ExpertPath::wgmma}) {
    const strata::kernels::Status s = moe::grouped_experts(b, ws.get(), ws_bytes, path, nullptr);
    CHECK_FALSE(s.ok());
    CHECK(std::string(s.message).find("4096") != std::string::npos);
  }
}

TEST_CASE("moe gpu: weighted merge in expert-id order is bit-identical to the host", "[gpu]") {
  strata::test::skip_without_gpu();
  // Widths: K3's latent, one short of a column block and beyond it; with and without the bf16
  // rounding of y and out (round(y) read, round(out) stored).
  for (const int H : {3584, 127, 200})
    for (const bool round : {false, true}) {
      CAPTURE(H, round);
      const int T = 5, P = 23;
      Rng r{uint64_t(7 + H)};
      std::vector<float> y(size_t(P) * H);
      for (float& v : y) v = r.normal();
      y[size_t(3) * H + 17] = NAN;  // a NaN expert output poisons exactly its token's element
      std::vector<int32_t> offsets = {0}, pair;
      std::vector<float> w;
      for (int t = 0; t < T; t++) {
        const int n = t == 2 ? 0 : 3 + t;  // token 2 routed nowhere (all-GPU-miss): zeros
        for (int k = 0; k < n; k++) {
          pair.push_back(int32_t((t * 5 + k * 3) % P));
          w.push_back(r.uniform() * 0.3f);
        }
        offsets.push_back(int32_t(pair.size()));
      }
      std::vector<float> want(size_t(T) * H);
      for (int t = 0; t < T; t++)
        for (int d = 0; d < H; d++) {
          float acc = 0.0f;
          for (int q = offsets[size_t(t)]; q < offsets[size_t(t) + 1]; q++) {
            float v = y[size_t(pair[size_t(q)]) * H + d];
            if (round) v = strata::round_bf16(v);
            volatile float prod = w[size_t(q)] * v;
            acc = acc + prod;
          }
          want[size_t(t) * H + d] = round ? strata::round_bf16(acc) : acc;
        }
      DeviceBuffer dy = DeviceBuffer::from(y), doff = DeviceBuffer::from(offsets),
                   dp = DeviceBuffer::from(pair), dw = DeviceBuffer::from(w),
                   dout(size_t(T) * H * 4);
      REQUIRE(moe::merge_weighted(dy.as<float>(), doff.as<int32_t>(), dp.as<int32_t>(),
                                  dw.as<float>(), dout.as<float>(), T, H, nullptr, round)
                  .ok());
      std::vector<float> got = dout.to_vector<float>(size_t(T) * H);
      size_t bad = 0, nan = 0;
      for (size_t i = 0; i < got.size(); i++) {
        if (std::isnan(want[i])) {
          ++nan;
          bad += !std::isnan(got[i]);
        } else {
          bad += std::memcmp(&got[i], &want[i], 4) != 0;
        }
      }
      CHECK(nan > 0);
      CHECK(bad == 0);
    }
}
