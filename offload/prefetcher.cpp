// Prefetcher: router lookahead predictions, prefetch issue, recall per distance.
#include "offload/prefetcher.h"

#include <algorithm>
#include <numeric>

#include "offload/expert_store.h"
#include "storage/error.h"

namespace strata::offload {

Prefetcher::Prefetcher(std::vector<LayerRouter> routers, int num_experts,
                       const PrefetcherConfig& config, ExpertStore* store)
    : routers_(std::move(routers)), E_(num_experts), config_(config), store_(store) {
  STRATA_ASSERT(config_.depth >= 1 && config_.top_k >= 1 && config_.top_k <= E_);
  for (auto& r : routers_) {
    if (!r.weight) continue;
    STRATA_ASSERT(r.weight->rows == E_);
    STRATA_ASSERT(D_ == 0 || D_ == r.weight->cols);
    D_ = r.weight->cols;
  }
  pred_.assign(routers_.size(), std::vector<Pred>(size_t(config_.depth)));
  hits_.assign(size_t(config_.depth), 0);
  total_.assign(size_t(config_.depth), 0);
  if (config_.async) thread_ = std::thread([this] { worker(); });
}

Prefetcher::~Prefetcher() {
  if (thread_.joinable()) {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

std::vector<std::pair<int, float>> Prefetcher::predict(int target, const float* x,
                                                       int64_t T) const {
  std::vector<std::pair<int, float>> out;
  if (target < 0 || size_t(target) >= routers_.size() || !routers_[size_t(target)].weight)
    return out;
  const LayerRouter& r = routers_[size_t(target)];
  const int64_t T0 = std::max<int64_t>(0, T - config_.max_tokens);
  const int64_t n = T - T0;
  std::vector<float> logits(size_t(n * E_));
  cpu::ref::linear(x + T0 * D_, *r.weight, logits.data(), n);
  std::vector<float> best(size_t(E_), -1.0f);  // highest score over tokens, -1: not selected
  std::vector<int> order(static_cast<size_t>(E_));
  std::vector<float> sel(static_cast<size_t>(E_));
  for (int64_t t = 0; t < n; t++) {
    const float* lg = logits.data() + t * E_;
    std::vector<float> s(static_cast<size_t>(E_));
    for (int e = 0; e < E_; e++) {
      s[size_t(e)] = cpu::ref::sigmoid(lg[e]);
      sel[size_t(e)] = s[size_t(e)] + (r.bias ? r.bias[e] : 0.0f);
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + config_.top_k, order.end(), [&](int a, int b) {
      return sel[size_t(a)] > sel[size_t(b)] || (sel[size_t(a)] == sel[size_t(b)] && a < b);
    });
    for (int j = 0; j < config_.top_k; j++) {
      int e = order[size_t(j)];
      best[size_t(e)] = std::max(best[size_t(e)], s[size_t(e)]);
    }
  }
  for (int e = 0; e < E_; e++)
    if (best[size_t(e)] >= 0) out.emplace_back(e, best[size_t(e)]);
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
  return out;
}

void Prefetcher::handle(int layer, const float* x, int64_t T) {
  for (int d = 1; d <= config_.depth; d++) {
    int target = layer + d;
    if (size_t(target) >= routers_.size() || !routers_[size_t(target)].weight) continue;
    auto p = predict(target, x, T);
    {
      std::lock_guard lk(mu_);
      Pred& pr = pred_[size_t(target)][size_t(d - 1)];
      if (pr.requested) {  // not consumed by on_routing yet (else the routing came first: late)
        pr.ids.clear();
        for (auto& [e, w] : p) pr.ids.push_back(e);
        std::sort(pr.ids.begin(), pr.ids.end());
        pr.ready = true;
      }
    }
    if (store_) store_->prefetch(target, p);
  }
}

void Prefetcher::on_layer_input(int layer, const float* x, int64_t T) {
  {
    std::lock_guard lk(mu_);
    for (int d = 1; d <= config_.depth; d++) {
      size_t target = size_t(layer + d);
      if (target < routers_.size() && routers_[target].weight) {
        pred_[target][size_t(d - 1)].requested = true;
        pred_[target][size_t(d - 1)].ready = false;
      }
    }
    if (config_.async) {
      if (pending_) dropped_++;
      pending_ = true;
      pending_layer_ = layer;
      pending_T_ = T;
      pending_x_.assign(x, x + T * D_);
    }
  }
  if (config_.async)
    cv_.notify_one();
  else
    handle(layer, x, T);
}

void Prefetcher::worker() {
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || pending_; });
    if (stop_) return;
    int layer = pending_layer_;
    int64_t T = pending_T_;
    std::swap(work_x_, pending_x_);
    pending_ = false;
    busy_ = true;
    lk.unlock();
    handle(layer, work_x_.data(), T);
    lk.lock();
    busy_ = false;
    idle_cv_.notify_all();
  }
}

void Prefetcher::flush() {
  if (!config_.async) return;
  std::unique_lock lk(mu_);
  idle_cv_.wait(lk, [&] { return !pending_ && !busy_; });
}

void Prefetcher::on_routing(int layer, std::span<const int> experts) {
  if (layer < 0 || size_t(layer) >= pred_.size()) return;
  std::vector<int> actual(experts.begin(), experts.end());
  std::sort(actual.begin(), actual.end());
  actual.erase(std::unique(actual.begin(), actual.end()), actual.end());
  std::lock_guard lk(mu_);
  for (int d = 1; d <= config_.depth; d++) {
    Pred& pr = pred_[size_t(layer)][size_t(d - 1)];
    if (!pr.requested) continue;
    if (pr.ready) {
      std::vector<int> both;
      std::set_intersection(pr.ids.begin(), pr.ids.end(), actual.begin(), actual.end(),
                            std::back_inserter(both));
      hits_[size_t(d - 1)] += both.size();
      total_[size_t(d - 1)] += actual.size();
    } else {
      late_++;
    }
    pr.requested = pr.ready = false;
  }
}

void Prefetcher::fill(TierTelemetry& t) const {
  std::lock_guard lk(mu_);
  t.recall_hits = hits_;
  t.recall_total = total_;
  t.predictions_late = late_;
}

}  // namespace strata::offload
