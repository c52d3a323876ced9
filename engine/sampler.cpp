// Sampler implementation: softmax with temperature over the top-k / top-p candidate set, drawn
// with a splitmix64 stream so a seed reproduces the same tokens on every machine.
#include "engine/sampler.h"

#include <tbb/parallel_for.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>

#include "engine/backend.h"
#include "engine/finite_check.h"
#include "storage/error.h"

namespace strata::engine {

int argmax(std::span<const float> logits) {
  STRATA_ASSERT(!logits.empty());
  // Two passes over SSE lanes, for the 163,840-wide vocabulary of every decoded token: the
  // maximum of the non-NaN values (maxps(x, m) = x > m ? x : m, so a NaN x leaves m), then the
  // first index holding it — the same index as keeping the first strict improvement (the first
  // element equal to the maximum; ±0 compare equal in both), 0 when every value is NaN. The
  // one-pass scan (a compare against the running best's value per element) took 0.49–0.69 ms a
  // row against 0.05–0.13 ms for this on the dev VM under load; on a k3-mini B = 8 step its eight
  // rows were most of the step's untimed rest (docs/planner.md, "Earlier rounds", (2)).
  const float* x = logits.data();
  const size_t n = logits.size();
  size_t i = 0;
  float m = -INFINITY;
#if defined(__SSE2__)
  __m128 a = _mm_set1_ps(-INFINITY), b = a, c = a, d = a;
  for (; i + 16 <= n; i += 16) {
    a = _mm_max_ps(_mm_loadu_ps(x + i), a);
    b = _mm_max_ps(_mm_loadu_ps(x + i + 4), b);
    c = _mm_max_ps(_mm_loadu_ps(x + i + 8), c);
    d = _mm_max_ps(_mm_loadu_ps(x + i + 12), d);
  }
  alignas(16) float lanes[16];
  _mm_store_ps(lanes, a), _mm_store_ps(lanes + 4, b), _mm_store_ps(lanes + 8, c),
      _mm_store_ps(lanes + 12, d);
  for (float v : lanes) m = v > m ? v : m;
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  i = 0;
#if defined(__SSE2__)
  const __m128 mm = _mm_set1_ps(m);
  for (; i + 4 <= n; i += 4)
    if (const int hit = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(x + i), mm)))
      return int(i) + __builtin_ctz(unsigned(hit));
#endif
  for (; i < n; ++i)
    if (x[i] == m) return int(i);
  return 0;  // every value NaN
}

Sampler::Sampler(const SamplerConfig& config) : config_(config), state_(config.seed) {
  if (!(config.temperature >= 0.0f) || !std::isfinite(config.temperature))
    throw Error("sampler: temperature must be a finite number >= 0, got " +
                std::to_string(config.temperature));
  if (config.top_k < 0)
    throw Error("sampler: top-k must be >= 0, got " + std::to_string(config.top_k));
  if (!(config.top_p > 0.0f && config.top_p <= 1.0f))
    throw Error("sampler: top-p must be in (0, 1], got " + std::to_string(config.top_p));
}

double Sampler::next_uniform() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

TokenDraw Sampler::next_draw() {
  TokenDraw d;
  d.temperature = config_.temperature;
  d.top_k = config_.top_k;
  d.top_p = config_.top_p;
  if (!d.greedy()) d.u = next_uniform();
  return d;
}

int Sampler::sample(std::span<const float> logits) {
  return pick_token(logits, next_draw(), candidates_);
}

int pick_token(std::span<const float> logits, const TokenDraw& d,
               std::vector<std::pair<float, int>>& candidates) {
  if (d.greedy()) return argmax(logits);
  candidates.clear();
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isnan(logits[i])) candidates.emplace_back(logits[i], int(i));
  if (candidates.empty()) return 0;
  // Order by logit descending, ties → lower id, so the candidate set is well defined.
  auto better = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t n = candidates.size();
  if (d.top_k > 0 && size_t(d.top_k) < n) {
    std::partial_sort(candidates.begin(), candidates.begin() + d.top_k, candidates.end(), better);
    n = size_t(d.top_k);
  } else {
    std::sort(candidates.begin(), candidates.end(), better);
  }
  // Softmax over the kept candidates in double (the max first so exp never overflows).
  const double inv_t = 1.0 / double(d.temperature);
  const double top = double(candidates[0].first);
  std::vector<double> p(n);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::exp((double(candidates[i].first) - top) * inv_t);
    sum += p[i];
  }
  // Nucleus: the smallest prefix whose probability mass reaches top_p (at least one token).
  if (d.top_p < 1.0f) {
    double mass = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      mass += p[i] / sum;
      if (mass >= double(d.top_p)) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
    sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += p[i];
  }
  double r = d.u * sum;
  for (size_t i = 0; i < n; ++i) {
    r -= p[i];
    if (r < 0.0) return candidates[i].second;
  }
  return candidates[n - 1].second;
}

void Backend::sample(Act h, std::span<const int64_t> rows, std::span<const TokenDraw> draws,
                     int64_t V, int32_t* ids) {
  STRATA_ASSERT(rows.size() == draws.size());
  if (rows.empty()) return;
  const int64_t n = int64_t(rows.size());
  thread_local std::vector<float> logits_buf;  // grown once, never zero-filled
  thread_local std::vector<std::pair<float, int>> scratch;
  if (logits_buf.size() < size_t(n * V)) logits_buf.resize(size_t(n * V));
  logits(h, rows, logits_buf.data());
  engine::check_finite(logits_buf.data(), n, V, -1, "logits", 0, "logits row ");
  // Rows in parallel (a batch's draws are independent; each row's pick is a function of its
  // logits and its draw alone). The workers read this thread's buffer through a plain pointer: a
  // thread_local named inside the loop would be the worker's own (empty) one.
  const float* const all = logits_buf.data();
  auto pick = [all, V, draws, ids](int64_t i, std::vector<std::pair<float, int>>& cand) {
    ids[i] = pick_token(std::span<const float>(all + i * V, size_t(V)), draws[size_t(i)], cand);
  };
  if (n == 1) return pick(0, scratch);
  tbb::parallel_for(int64_t(0), n, [&](int64_t i) {
    thread_local std::vector<std::pair<float, int>> cand;
    pick(i, cand);
  });
}

bool StopRules::is_eos(int id) const {
  return std::find(eos_ids.begin(), eos_ids.end(), id) != eos_ids.end();
}

size_t StopRules::stop_position(const std::string& text) const {
  size_t best = std::string::npos;
  for (const auto& s : stop_strings) {
    if (s.empty()) continue;
    size_t at = text.find(s);
    if (at != std::string::npos && (best == std::string::npos || at < best)) best = at;
  }
  return best;
}

}  // namespace strata::engine
