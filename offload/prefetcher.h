// Prefetcher: router lookahead (spec/offload.md rule 5). Once layer l's MoE input x is known, the
// routers of layers l+1 … l+depth are applied to the same x (sigmoid scores, top-k with the
// selection bias, per token; the union over the step's tokens, weighted by the highest score), and
// the predicted experts go to the ExpertStore as prefetches, highest weight first. The store reads
// predicted misses at prefetch priority, behind every real miss, and admits them only into free or
// colder slots. With async (the default) predictions run on their own thread from the latest input
// (an older unprocessed input is dropped): nothing on the critical path waits for a prediction.
// Recall per lookahead distance d is measured when each layer's real routing arrives:
// |predicted ∩ actual| / |actual|, over the predictions that were ready in time.
// Not here: the routing itself (engine), residency and reads (offload/expert_store.h).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/ref/ops.h"
#include "offload/telemetry.h"

namespace strata::offload {

class ExpertStore;

// One layer's router: weight [E, D] (any WeightView format) and the selection bias [E]; a layer
// without routed experts has weight == nullptr.
struct LayerRouter {
  const cpu::ref::WeightView* weight = nullptr;
  const float* bias = nullptr;  // nullptr: no bias
};

struct PrefetcherConfig {
  int depth = 2;        // lookahead distance in layers
  int top_k = 0;        // experts per token (the model's top_k)
  bool async = true;    // predict on a worker thread
  int max_tokens = 32;  // a long prefill chunk predicts from its last max_tokens tokens only
};

class Prefetcher {
 public:
  // routers[l] for every layer; `store` may be null (predict and measure recall only).
  Prefetcher(std::vector<LayerRouter> routers, int num_experts, const PrefetcherConfig& config,
             ExpertStore* store);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Layer `layer`'s MoE input x [T, D] is known: predict (and prefetch) the next layers.
  void on_layer_input(int layer, const float* x, int64_t T);
  // Layer `layer`'s real routing (its distinct experts): recall bookkeeping.
  void on_routing(int layer, std::span<const int> experts);
  // Waits until the worker has handled every input given so far (tests, end of run).
  void flush();

  // The prediction for `target` from x [T, D]: (expert, weight) by decreasing weight (ties: lower
  // id first). Pure; used by the worker and by tests.
  std::vector<std::pair<int, float>> predict(int target, const float* x, int64_t T) const;

  // Recall per distance and late predictions, into t.
  void fill(TierTelemetry& t) const;
  int depth() const { return config_.depth; }

 private:
  void handle(int layer, const float* x, int64_t T);
  void worker();

  std::vector<LayerRouter> routers_;
  int E_;
  PrefetcherConfig config_;
  ExpertStore* store_;
  int64_t D_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  // Predictions per target layer and distance (index d-1), ready or only requested.
  struct Pred {
    bool requested = false, ready = false;
    std::vector<int> ids;  // sorted
  };
  std::vector<std::vector<Pred>> pred_;  // [layer][d-1]
  std::vector<uint64_t> hits_, total_;
  uint64_t late_ = 0, dropped_ = 0;
  // The pending input of the async worker (latest wins).
  bool pending_ = false, busy_ = false, stop_ = false;
  int pending_layer_ = 0;
  int64_t pending_T_ = 0;
  std::vector<float> pending_x_, work_x_;
  std::thread thread_;
};

}  // namespace strata::offload
