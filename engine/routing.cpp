// Routing replay and record (engine/routing.h).
#include "engine/routing.h"

#include <string>

#include "cpu/ref/ops.h"
#include "storage/error.h"

namespace strata::engine {

void apply_replay(const RoutingLog& log, int layer, int64_t pos0, const float* logits,
                  const ModelConfig& c, const float* bias, MoeRouting& r) {
  const auto& m = c.moe;
  const int64_t E = m.num_experts, K = r.top_k;
  const bool in_place = m.router_form == RouterWeightForm::bias_in_place;
  for (int64_t t = 0; t < r.T; ++t) {
    const std::vector<int>* forced = log.forced(layer, int(pos0 + t));
    if (!forced)  // never fall back to the router silently: the run would mix both
      throw Error("--replay-routing: no routing for layer " + std::to_string(layer) + " position " +
                  std::to_string(pos0 + t) + " (the file covers positions 0.." +
                  std::to_string(log.rows() - 1) + ")");
    const std::string where = "--replay-routing: layer " + std::to_string(layer) + " position " +
                              std::to_string(pos0 + t);
    if (int64_t(forced->size()) != K)
      throw Error(where + " has " + std::to_string(forced->size()) +
                  " experts, the model routes to " + std::to_string(K));
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int e = (*forced)[size_t(j)];
      if (e < 0 || e >= E)
        throw Error(where + ": expert " + std::to_string(e) + " does not exist (" +
                    std::to_string(E) + " experts)");
      float s = cpu::ref::sigmoid(logits[size_t(t * E + e)]);
      if (in_place) s = s + bias[e];
      r.ids[size_t(t * K + j)] = e;
      r.weights[size_t(t * K + j)] = s;
      sum = sum + s;
    }
    for (int64_t j = 0; j < K; ++j) {
      float& wt = r.weights[size_t(t * K + j)];
      if (m.renormalize) wt = wt / (sum + 1e-20f);
      wt = wt * m.routed_scaling_factor;
    }
  }
}

void record_routing(RoutingLog& log, int layer, int64_t pos0, const MoeRouting& r) {
  log.top_k = int(r.top_k);
  for (int64_t t = 0; t < r.T; ++t)
    log.record(layer, int(pos0 + t),
               std::vector<int>(r.ids.begin() + t * r.top_k, r.ids.begin() + (t + 1) * r.top_k));
}

MoeRouting route_on_host(const ModelConfig& c, const float* logits, const float* bias, int64_t T,
                         const Trace* trace, const StepShape& s, int layer) {
  const auto& m = c.moe;
  cpu::ref::RouterParams rp;
  rp.E = m.num_experts;
  rp.topk = m.top_k;
  rp.form = m.router_form == RouterWeightForm::bias_in_place ? cpu::ref::RouterForm::biased_in_place
                                                             : cpu::ref::RouterForm::unbiased;
  rp.renormalize = m.renormalize;
  rp.scaling = m.routed_scaling_factor;
  rp.bias = bias;
  MoeRouting r;
  r.T = T;
  r.top_k = m.top_k;
  r.ids.resize(size_t(T * m.top_k));
  r.weights.resize(size_t(T * m.top_k));
  cpu::ref::route(logits, rp, r.ids.data(), r.weights.data(), nullptr, T);
  if (trace && s.single()) {
    const int64_t pos0 = s.seqs[0].pos0;
    if (trace->replay_routing)
      apply_replay(*trace->replay_routing, layer, pos0, logits, c, bias, r);
    if (trace->record_routing) record_routing(*trace->record_routing, layer, pos0, r);
  }
  return r;
}

}  // namespace strata::engine
