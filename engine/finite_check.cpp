// engine/finite_check.h, and the default Backend::first_non_finite.
#include "engine/finite_check.h"

#include <tbb/parallel_for.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/trace.h"
#include "storage/error.h"

namespace strata::engine {

namespace {
// Exponent all ones: Inf or NaN. Integer compares, so the loop vectorises without fast-math.
inline bool bad32(uint32_t b) {
  return (b & 0x7F800000u) == 0x7F800000u;
}
inline bool bad16(uint16_t b) {
  return (b & 0x7F80u) == 0x7F80u;
}

[[noreturn]] void fail(float v, int layer, const char* site, int64_t pos, int64_t col,
                       const std::string& where) {
  const std::string name = layer >= 0 ? site_name(layer, site) : std::string(site);
  throw Error("non-finite activation (" +
              std::string(std::isnan(v) ? "NaN"
                          : v > 0       ? "+Inf"
                                        : "-Inf") +
              ") at " + name + " (" + where + std::to_string(pos) + ", element " +
              std::to_string(col) +
              "): the model's weights or config produce values outside float range; stopping "
              "rather than sampling from garbage (strata run --check-weights scans every weight)");
}
}  // namespace

namespace {
// Index of the first element of x[0..n) whose bits are Inf/NaN, −1 if none: a branch-free OR
// over each block (vectorises), the block searched only when it holds one. Bits are read with
// memcpy (bf16 rows may be unaligned).
template <typename Bits, bool (*Bad)(Bits), int64_t kBlock>
int64_t first_bad(const void* x, int64_t n) {
  const char* p = static_cast<const char*>(x);
  auto bits = [&](int64_t i) {
    Bits b;
    std::memcpy(&b, p + i * int64_t(sizeof(Bits)), sizeof(Bits));
    return b;
  };
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int64_t i1 = std::min(n, i0 + kBlock);
    uint32_t any = 0;
    for (int64_t i = i0; i < i1; ++i) any |= uint32_t(Bad(bits(i)));
    if (any)
      for (int64_t i = i0; i < i1; ++i)
        if (Bad(bits(i))) return i;
  }
  return -1;
}
}  // namespace

int64_t first_non_finite(const float* x, int64_t n) {
  // A batch's logits (8 × 163,840 floats) are scanned on the host every decode step, between the
  // GPU's steps: in pieces of 256 Ki elements on the worker threads above 1 Mi elements (the
  // lowest failing piece wins, so the index is the same as the serial scan's).
  constexpr int64_t kPiece = int64_t(1) << 18;
  if (n < 4 * kPiece) return first_bad<uint32_t, bad32, 1024>(x, n);
  std::atomic<int64_t> first{n};
  tbb::parallel_for(int64_t(0), (n + kPiece - 1) / kPiece, [&](int64_t i) {
    const int64_t i0 = i * kPiece;
    if (i0 >= first.load(std::memory_order_relaxed)) return;
    const int64_t j = first_bad<uint32_t, bad32, 1024>(x + i0, std::min(kPiece, n - i0));
    if (j < 0) return;
    int64_t cur = first.load();
    while (i0 + j < cur && !first.compare_exchange_weak(cur, i0 + j)) {
    }
  });
  return first.load() < n ? first.load() : -1;
}

int64_t first_non_finite_bf16(const uint16_t* x, int64_t n) {
  return first_bad<uint16_t, bad16, 4096>(x, n);
}

void fail_row(float v, int64_t i, int64_t cols, int layer, const char* site, const char* unit) {
  fail(v, layer, site, i / cols, i % cols, unit);
}

void check_finite(const float* x, int64_t T, int64_t D, int layer, const char* site, int64_t pos0,
                  const char* unit) {
  const int64_t i = first_non_finite(x, T * D);
  if (i >= 0) fail(x[i], layer, site, pos0 + i / D, i % D, unit);
}

int64_t Backend::first_non_finite(Act a, const StepShape& s) {
  std::vector<float> host;
  auto scan = [&](int64_t row0, int64_t n) -> int64_t {
    host.resize(size_t(n * a.cols));
    to_host(Act{a.data + row0 * a.cols, n, a.cols}, host.data());
    const int64_t i = engine::first_non_finite(host.data(), int64_t(host.size()));
    return i < 0 ? -1 : row0 * a.cols + i;
  };
  if (a.rows <= kFiniteCheckAllRows) return scan(0, a.rows);
  for (const SeqSpan& q : s.seqs)
    if (q.T > 0)
      if (const int64_t i = scan(q.row0 + q.T - 1, 1); i >= 0) return i;
  return -1;
}

void Backend::check_finite(Act a, const StepShape& s, int layer, const char* site) {
  engine::check_finite(*this, a, s, layer, site);
}

[[noreturn]] void fail_at(float v, int64_t i, int64_t cols, const StepShape& s, int layer,
                          const char* site) {
  const int64_t row = i / cols;
  for (const SeqSpan& q : s.seqs)
    if (row >= q.row0 && row < q.row0 + q.T)
      fail(v, layer, site, q.pos0 + (row - q.row0), i % cols,
           s.single() ? "position " : "slot " + std::to_string(q.slot) + ", position ");
  fail(v, layer, site, row, i % cols, "row ");
}

void check_finite(Backend& b, Act a, const StepShape& s, int layer, const char* site) {
  const int64_t i = b.first_non_finite(a, s);
  if (i < 0) return;
  float v = 0;
  b.to_host(Act{a.data + i, 1, 1}, &v);
  fail_at(v, i, a.cols, s, layer, site);
}

}  // namespace strata::engine
