// Op-check of the CUDA MLA kernels (kernels/mla/mla.h) against the fp32 reference ops
// (cpu/ref/ops.h): latent-cache rows, expanded causal prefill (fresh and chunked against an
// existing cache, in one pass and in bounded-workspace cache tiles) and absorbed split decode, at
// K3 shapes (96 heads, latent 512 + 64, q head 192, v 128), odd small shapes and long caches
// (128K positions at 96 heads, 256K and 1M with fewer heads).
//
// Tolerances: outputs are bf16 after fp32 softmax attention; GPU and reference round at the same
// points (kv expansion / q_lat GEMM outputs, the output), so differences come from summation order
// and exp2 vs exp, plus the bf16 rounding flips they cause (≤ 2^-8 relative per flipped
// element): rel L2 ≤ 1e-2, cosine ≥ 0.9999. Latent rows differ only by the RMS reduction order
// (a flip of one bf16 ulp in rare elements): rel L2 ≤ 2e-3 and ≤ 1% of elements differing.
// Tiled prefill against the one-pass GPU result: the same bf16 keys and the same 64-key softmax
// steps, only the row sums are added in another order across the tile boundaries: rel L2 ≤ 1e-3,
// cosine ≥ 0.99999 (in practice a rare one-ulp bf16 flip). Every prefill attention kernel (P·V on
// mma.sync or on wgmma, Q from registers or shared memory) must give the same bits in every case.
// Decode caches hold NaN past each sequence's end: a read out of range poisons the output.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "attn_gpu_util.h"
#include "cpu/ref/ops.h"
#include "gpu_test.h"
#include "kernels/mla/mla.h"
#include "kernels/runtime.h"

namespace {

using namespace strata;
using namespace strata::test;
namespace km = strata::kernels::mla;
namespace ref = strata::cpu::ref;

ref::MlaDims dims(int H) {
  ref::MlaDims d;
  d.H = H;
  d.nope = km::kNope;
  d.rope = km::kRope;
  d.v = km::kV;
  d.kv_lora = km::kLatent;
  return d;
}

constexpr int R = km::kCacheDim;

void check_out(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  const Diff d = compare(got, want);
  INFO(what << ": " << d.str());
  CHECK(d.nonfinite_mismatch == 0);
  CHECK(d.rel_l2 <= 1e-2);
  CHECK(d.cosine >= 0.9999);
}

// tile > 0: the workspace is prefill_workspace_bytes_bounded(H, T, tile), which must make
// prefill() work in tiles of exactly `tile` positions; one_pass also runs the one-pass form (full
// expansion) on the same data and compares the two outputs tightly.
void run_prefill_case(int H, int64_t S_prev, int64_t T, uint32_t seed, int64_t tile = 0,
                      bool one_pass = false) {
  skip_without_gpu();
  std::mt19937 rng(seed);
  const int64_t S = S_prev + T;
  auto ckv = random_bf16(S * R, rng, 1.f);
  auto nw = random_uniform(km::kLatent, rng, 0.8f, 1.2f);
  auto kvb = random_bf16(int64_t(H) * 256 * km::kLatent, rng, 1.f / std::sqrt(512.f));
  auto q = random_bf16(T * H * km::kQDim, rng, 1.f);
  DevBuf<uint16_t> d_ckv(ckv.bits), d_kvb(kvb.bits), d_q(q.bits), d_cache(S * R);
  DevBuf<float> d_nw(nw);
  d_cache.fill_bytes(0xff);
  // Earlier chunk's rows first, then this call's rows, then attention for this call's queries.
  if (S_prev > 0)
    REQUIRE(km::write_latent(d_ckv.p, d_nw.p, 1e-6f, d_cache.p, 0, S_prev, nullptr).ok());
  REQUIRE(
      km::write_latent(d_ckv.p + S_prev * R, d_nw.p, 1e-6f, d_cache.p, S_prev, T, nullptr).ok());
  const size_t wsb = tile > 0 ? km::prefill_workspace_bytes_bounded(H, T, tile)
                              : km::prefill_workspace_bytes(H, S);
  if (tile > 0) {
    INFO("bounded workspace " << wsb << " bytes, one pass " << km::prefill_workspace_bytes(H, S));
    REQUIRE(km::prefill_tile_positions(H, S, T, wsb) == tile);  // really tiles, as asked
  }
  // One prefill into a fresh NaN-filled output and workspace (state read before it is written
  // poisons the output); returns the output's bits.
  auto run = [&](km::PrefillKernel kernel, size_t bytes) {
    INFO(km::prefill_kernel_name(kernel) << " kernel, workspace " << bytes << " bytes");
    DevBuf<uint8_t> ws(bytes);
    REQUIRE(ws.p != nullptr);
    ws.fill_bytes(0xff);
    DevBuf<uint16_t> d_out(T * H * km::kV);
    d_out.fill_bytes(0xff);
    auto s = km::prefill(H, d_q.p, d_cache.p, S, d_kvb.p, d_out.p, T, ws.p, bytes, nullptr, kernel);
    INFO(s.message);
    REQUIRE(s.ok());
    CUDA_REQUIRE(cudaDeviceSynchronize());
    return d_out.download();
  };
  // Every attention kernel does the same arithmetic in the same order: the same bits (P·V on
  // wgmma included: its fp32 sums round as mma.sync's, checked on the H100).
  const std::vector<uint16_t> bits = run(km::PrefillKernel::tma, wsb);
  for (km::PrefillKernel k : km::kPrefillKernels) {
    if (k == km::PrefillKernel::tma) continue;
    INFO(km::prefill_kernel_name(k) << " against tma");
    CHECK(bits == run(k, wsb));
  }
  const std::vector<float> got = widen(bits);
  if (one_pass) {
    const size_t full = km::prefill_workspace_bytes(H, S);
    const std::vector<uint16_t> bits1 = run(km::PrefillKernel::tma, full);
    CHECK(bits1 == run(km::PrefillKernel::cp_async, full));
    const Diff d1 = compare(got, widen(bits1));
    INFO("tiled vs one pass: " << d1.str());
    CHECK(d1.nonfinite_mismatch == 0);
    CHECK(d1.rel_l2 <= 1e-3);
    CHECK(d1.cosine >= 0.99999);
  }

  const auto d = dims(H);
  std::vector<float> rows(S * R);
  ref::mla_latent_rows(ckv.f32.data(), nw.data(), rows.data(), S, d, 1e-6f, ref::Precision::bf16);
  auto cache = widen(d_cache.download());
  const Diff dc = compare(cache, rows);
  size_t differ = 0;
  for (size_t i = 0; i < rows.size(); i++) differ += cache[i] != rows[i];
  INFO("latent rows: " << dc.str() << ", differing " << differ);
  CHECK(dc.nonfinite_mismatch == 0);
  CHECK(dc.rel_l2 <= 2e-3);
  CHECK(differ <= rows.size() / 100);

  // Attention against the GPU's own cache rows, so only the attention is compared.
  std::vector<float> out_ref(T * H * km::kV);
  ref::mla_attention_expanded(q.f32.data(), cache.data(), S,
                              ref::WeightView::bf16(kvb.bits.data(), int64_t(H) * 256, km::kLatent),
                              d, out_ref.data(), T, ref::Precision::bf16);
  check_out(got, out_ref, tile > 0 ? "tiled prefill out" : "prefill out");
}

// cap > 0: decode_device, the positions (lens − 1, or `pos` when given) in device memory and the
// plan for cap positions; with cap equal to the longest length the result must also be bitwise
// the host-length decode's (the same plan). Every case runs both attention kernels (tma, the
// default, and mma): each against the reference, and the two against each other.
void run_decode_case(int H, const std::vector<int32_t>& lens, uint32_t seed, int64_t cap = 0,
                     std::vector<int32_t> pos = {}) {
  skip_without_gpu();
  std::mt19937 rng(seed);
  const int B = int(lens.size());
  const int64_t Lmax = *std::max_element(lens.begin(), lens.end());
  const int64_t stride = Lmax * R;
  auto kvb = random_bf16(int64_t(H) * 256 * km::kLatent, rng, 1.f / std::sqrt(512.f));
  auto q = random_bf16(int64_t(B) * H * km::kQDim, rng, 1.f);
  auto rows = random_bf16(size_t(B) * stride, rng, 1.f);
  for (int b = 0; b < B; b++)  // poison past the end
    for (int64_t i = int64_t(lens[b]) * R; i < stride; i++) {
      rows.bits[b * stride + i] = 0x7fc0;
      rows.f32[b * stride + i] = NAN;
    }
  DevBuf<uint16_t> d_kvb(kvb.bits), d_q(q.bits), d_cache(rows.bits);
  const size_t wsb = km::decode_workspace_bytes(H, B, Lmax);
  if (cap > 0 && pos.empty())
    for (int32_t L : lens) pos.push_back(L - 1);
  auto run = [&](km::DecodeKernel kernel) {
    INFO(km::decode_kernel_name(kernel) << " kernel");
    DevBuf<uint16_t> d_out(int64_t(B) * H * km::kV);
    d_out.fill_bytes(0xff);
    DevBuf<uint8_t> ws(wsb);
    ws.fill_bytes(0xff);
    kernels::Status s;
    // A created stream, as the engine's: the chain's programmatic dependent launches run there
    // (the legacy stream below, for the bitwise comparison, runs the kernels plainly). It does
    // not wait for the legacy stream's fills: the device is synchronized first.
    void* stream = kernels::rt::stream_create();
    REQUIRE(stream != nullptr);
    if (cap > 0) {
      DevBuf<int32_t> d_pos(pos);
      const size_t wsd = km::decode_workspace_bytes(H, B, cap);
      DevBuf<uint8_t> wsc(wsd);
      wsc.fill_bytes(0xff);
      CUDA_REQUIRE(cudaDeviceSynchronize());
      s = km::decode_device(H, d_q.p, d_cache.p, stride, d_pos.p, B, cap, d_kvb.p, d_out.p, wsc.p,
                            wsd, stream, kernel);
      INFO(s.message);
      REQUIRE(s.ok());
      CUDA_REQUIRE(cudaDeviceSynchronize());
      if (cap == Lmax) {
        DevBuf<uint16_t> d_host(int64_t(B) * H * km::kV);
        s = km::decode(H, d_q.p, d_cache.p, stride, lens.data(), B, d_kvb.p, d_host.p, ws.p, wsb,
                       nullptr, kernel);
        REQUIRE(s.ok());
        CUDA_REQUIRE(cudaDeviceSynchronize());
        CHECK(d_host.download() == d_out.download());  // bit for bit
      }
    } else {
      CUDA_REQUIRE(cudaDeviceSynchronize());
      s = km::decode(H, d_q.p, d_cache.p, stride, lens.data(), B, d_kvb.p, d_out.p, ws.p, wsb,
                     stream, kernel);
      INFO(s.message);
      REQUIRE(s.ok());
      CUDA_REQUIRE(cudaDeviceSynchronize());
    }
    kernels::rt::stream_destroy(stream);
    return widen(d_out.download());
  };
  const std::vector<float> got_mma = run(km::DecodeKernel::mma);
  const std::vector<float> got_tma = run(km::DecodeKernel::tma);
  const std::vector<float> got_ss = run(km::DecodeKernel::ss);
  const auto d = dims(H);
  std::vector<float> out_ref(int64_t(B) * H * km::kV);
  const auto kv_view = ref::WeightView::bf16(kvb.bits.data(), int64_t(H) * 256, km::kLatent);
  for (int b = 0; b < B; b++)
    ref::mla_attention_absorbed(&q.f32[int64_t(b) * H * km::kQDim], &rows.f32[b * stride], lens[b],
                                kv_view, d, &out_ref[int64_t(b) * H * km::kV], 1,
                                ref::Precision::bf16);
  check_out(got_mma, out_ref, "decode out, mma kernel");
  check_out(got_tma, out_ref, "decode out, tma kernel");
  // The kernels differ in the fp32 summation order of the scores and ctx and in exp2 (ex2.approx
  // against exp2f), which flips a rare bf16 P or output ulp (2^-8 relative): rel L2 ≤ 2e-3 holds
  // even if every output flipped one ulp; a layout or masking mistake gives O(1).
  const Diff ab = compare(got_tma, got_mma);
  INFO("tma against mma: " << ab.str());
  CHECK(ab.nonfinite_mismatch == 0);
  CHECK(ab.rel_l2 <= 2e-3);
  CHECK(ab.cosine >= 0.99999);
  check_out(got_ss, out_ref, "decode out, ss kernel");
  const Diff as = compare(got_ss, got_mma);
  INFO("ss against mma: " << as.str());
  CHECK(as.nonfinite_mismatch == 0);
  CHECK(as.rel_l2 <= 2e-3);
  CHECK(as.cosine >= 0.99999);
}

}  // namespace

TEST_CASE("mla gpu prefill: odd small shape, chunk against an existing cache", "[gpu][mla]") {
  run_prefill_case(3, 45, 37, 21);
}

TEST_CASE("mla gpu prefill: fresh prompt, 5 heads, 100 tokens", "[gpu][mla]") {
  run_prefill_case(5, 0, 100, 22);
}

TEST_CASE("mla gpu prefill: K3 shape (96 heads), 333 tokens after 200 cached", "[gpu][mla]") {
  run_prefill_case(96, 200, 333, 23);
}

TEST_CASE("mla gpu prefill: an even number of query tiles (512 tokens after 70 cached, 4 heads)",
          "[gpu][mla]") {
  // Four query tiles: two full clusters in the TMA kernel, no padding CTA (the other cases have
  // an odd count).
  run_prefill_case(4, 70, 512, 25);
}

TEST_CASE("mla gpu prefill: long prompt (4099 tokens, 2 heads)", "[gpu][mla]") {
  run_prefill_case(2, 0, 4099, 24);
}

TEST_CASE(
    "mla gpu prefill, tiled: tile edges (S = 1000 in tiles of 256, 300 queries across two "
    "tiles and the diagonal inside both)",
    "[gpu][mla]") {
  // Queries at 700 .. 999: tile [512, 768) holds the diagonal of the first 68, tile [768, 1000)
  // is partial (not a multiple of 64 either) and holds the diagonal of the rest.
  run_prefill_case(3, 700, 300, 41, 256, true);
}

TEST_CASE(
    "mla gpu prefill, tiled: 333 queries after 2000 cached, tiles of 64 (query blocks "
    "with no keys in a tile)",
    "[gpu][mla]") {
  // (A fresh prompt never tiles: its state, T·H·520 bytes, is as large as its full expansion.)
  run_prefill_case(5, 2000, 333, 42, 64, true);
}

TEST_CASE("mla gpu prefill, tiled: K3 shape (96 heads), 16 queries after 128K cached, 17 tiles",
          "[gpu][mla]") {
  // S = 131093 + 16 = 131109 positions in tiles of 8192 (the last one 37 positions).
  run_prefill_case(96, 131093, 16, 43, 8192, true);
}

TEST_CASE("mla gpu prefill, tiled: 1M cached positions (8 heads), 12 queries, 33 tiles",
          "[gpu][mla]") {
  // S = 1048676: 32 tiles of 32768 and one of 100 positions.
  run_prefill_case(8, 1048664, 12, 44, 32768, true);
}

TEST_CASE("mla gpu decode: odd small shapes, 3 sequences of 1, 300, 5000", "[gpu][mla]") {
  run_decode_case(3, {1, 300, 5000}, 31);
}

TEST_CASE("mla gpu decode: K3 shape (96 heads), 2 sequences", "[gpu][mla]") {
  run_decode_case(96, {4097, 20000}, 32);
}

TEST_CASE("mla gpu decode: K3 shape, 5 sequences: one row, tile edges, empty splits",
          "[gpu][mla]") {
  // Splits are planned from the longest sequence, so the short ones leave most splits empty.
  run_decode_case(96, {1, 63, 64, 65, 70001}, 35);
}

TEST_CASE("mla gpu decode: K3 shape, B = 16 ragged lengths around the 64-row tiles", "[gpu][mla]") {
  // One row, a tile minus / plus one, a half tile (a last tile with keys only in its first half:
  // with the two-CTA cluster, only in the first CTA's part), and longer ragged caches.
  run_decode_case(96, {1, 17, 31, 32, 33, 63, 64, 65, 127, 129, 1000, 2047, 2049, 4097, 6001, 9001},
                  45);
}

TEST_CASE("mla gpu decode: K3 shape, one sequence of 128K positions (+37)", "[gpu][mla]") {
  run_decode_case(96, {131072 + 37}, 46);
}

TEST_CASE("mla gpu decode: 64 heads (one full wgmma block), one tile of 64 rows", "[gpu][mla]") {
  // The smallest case that fills every row and key of the wgmma tiles: a layout mistake shows
  // here first.
  run_decode_case(64, {64}, 47);
  run_decode_case(64, {40}, 48);
}

TEST_CASE(
    "mla gpu decode: head count not a multiple of the head block (100 heads: mma's blocks of "
    "48, tma's two groups of 50)",
    "[gpu][mla]") {
  run_decode_case(100, {3000, 17}, 36);
}

TEST_CASE("mla gpu decode: long caches (256K with 8 heads, 1M with 2 heads)", "[gpu][mla]") {
  run_decode_case(8, {262147}, 33);
  run_decode_case(2, {1048576}, 34);
}

TEST_CASE("mla gpu decode, device positions: the plan of the longest is the host form's bits",
          "[gpu][mla]") {
  run_decode_case(96, {1, 63, 64, 65, 7001}, 37, 7001);
}

TEST_CASE("mla gpu decode, device positions: K3 shape, capacity far above the lengths",
          "[gpu][mla]") {
  // The engine's buckets: the plan for 8192 or 131072 positions, most splits empty.
  run_decode_case(96, {257, 4000, 1, 8000}, 38, 8192);
  run_decode_case(96, {300, 129}, 39, 131072);
}

TEST_CASE("mla gpu decode, device positions: a position past the capacity reads only the capacity",
          "[gpu][mla]") {
  // Positions 5000 and −7 are cut to the capacity (100) and to one row: never past the cache
  // (its rows past 100 are NaN, which would poison the output).
  run_decode_case(8, {100, 1}, 40, 100, {5000, -7});
}

TEST_CASE("mla gpu write_latent_decode: one row per sequence at its device position, none outside",
          "[gpu][mla]") {
  skip_without_gpu();
  std::mt19937 rng(41);
  const int B = 3;
  const int64_t stride = 50 * R;
  const std::vector<int32_t> pos = {0, 17, 49};
  auto ckv = random_bf16(B * R, rng, 1.f);
  auto nw = random_uniform(km::kLatent, rng, 0.8f, 1.2f);
  DevBuf<uint16_t> d_ckv(ckv.bits), d_a(B * stride), d_b(B * stride);
  DevBuf<float> d_nw(nw);
  DevBuf<int32_t> d_pos(pos);
  d_a.fill_bytes(0xff);
  d_b.fill_bytes(0xff);
  REQUIRE(
      km::write_latent_decode(d_ckv.p, d_nw.p, 1e-6f, d_a.p, stride, 50, d_pos.p, B, nullptr).ok());
  for (int b = 0; b < B; b++)  // the host-position form, one sequence at a time
    REQUIRE(km::write_latent(d_ckv.p + b * R, d_nw.p, 1e-6f, d_b.p + b * stride, pos[size_t(b)], 1,
                             nullptr)
                .ok());
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const auto a = d_a.download(), want = d_b.download();
  CHECK(a == want);
  size_t written = 0;  // exactly B rows changed
  for (uint16_t v : a) written += v != 0xffff;
  CHECK(written >= size_t(B) * (R - 8));

  // Positions outside [0, capacity) write nothing: not the next sequence's cache, not past the
  // buffer (capacity 50 rows, the stride's whole length here).
  const std::vector<int32_t> bad = {-3, 50, 1 << 30};
  DevBuf<int32_t> d_bad(bad);
  d_a.fill_bytes(0xff);
  REQUIRE(
      km::write_latent_decode(d_ckv.p, d_nw.p, 1e-6f, d_a.p, stride, 50, d_bad.p, B, nullptr).ok());
  CUDA_REQUIRE(cudaDeviceSynchronize());
  const auto untouched = d_a.download();
  CHECK(std::all_of(untouched.begin(), untouched.end(), [](uint16_t v) { return v == 0xffff; }));
  // A stride shorter than the capacity's rows, or no capacity, is refused.
  REQUIRE_FALSE(
      km::write_latent_decode(d_ckv.p, d_nw.p, 1e-6f, d_a.p, stride, 51, d_pos.p, B, nullptr).ok());
  REQUIRE_FALSE(
      km::write_latent_decode(d_ckv.p, d_nw.p, 1e-6f, d_a.p, stride, 0, d_pos.p, 1, nullptr).ok());
}

TEST_CASE("mla gpu: bad arguments are refused with a reason", "[gpu][mla]") {
  const int32_t lens[1] = {0};
  alignas(16) static uint16_t buf[16] = {};
  uint16_t& dummy = buf[0];
  auto s = km::decode(4, &dummy, &dummy, 576, lens, 1, &dummy, &dummy, &dummy, 1, nullptr);
  REQUIRE_FALSE(s.ok());
  REQUIRE(std::string(s.message).find(">= 1") != std::string::npos);
  // A prefill workspace below one 64-position tile next to the state is refused, not overrun.
  const size_t least = km::prefill_workspace_bytes_bounded(4, 8, 64);
  REQUIRE(km::prefill_tile_positions(4, 100000, 8, least) == 64);
  REQUIRE(km::prefill_tile_positions(4, 100000, 8, least - 1) == 0);
  s = km::prefill(4, &dummy, &dummy, 100000, &dummy, &dummy, 8, &dummy, least - 1, nullptr);
  REQUIRE_FALSE(s.ok());
  REQUIRE(std::string(s.message).find("prefill_workspace_bytes_bounded") != std::string::npos);
  // The copies move 16-byte pieces: a cache (or q, or workspace) off that alignment is refused.
  s = km::prefill(4, &dummy, buf + 1, 100000, &dummy, &dummy, 8, &dummy, least, nullptr);
  REQUIRE_FALSE(s.ok());
  REQUIRE(std::string(s.message).find("16-byte aligned") != std::string::npos);
  // decode_device: no positions, or no capacity.
  s = km::decode_device(4, &dummy, &dummy, 576, nullptr, 1, 64, &dummy, &dummy, &dummy, 1 << 20,
                        nullptr);
  REQUIRE_FALSE(s.ok());
  REQUIRE(std::string(s.message).find("null pointer") != std::string::npos);
  s = km::decode_device(4, &dummy, &dummy, 576, lens, 1, 0, &dummy, &dummy, &dummy, 1 << 20,
                        nullptr);
  REQUIRE_FALSE(s.ok());
  REQUIRE(std::string(s.message).find("max_len") != std::string::npos);
}
