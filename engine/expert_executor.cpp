// Expert executors of the reference engine: exact (fp32 oracle ops; TBB, one task per expert) and
// contract (the integer contract of docs/numerics.md on the fast CPU kernels,
// engine/contract_executor.cpp). Each output slot is written by exactly one task, so results do
// not depend on the thread count.
#include "engine/expert_executor.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>

#include "cpu/expert_kernels.h"
#include "cpu/topology.h"
#include "storage/error.h"

namespace strata::engine {

namespace ref = cpu::ref;

const char* expert_numerics_name(ExpertNumerics n) {
  return n == ExpertNumerics::exact ? "exact" : n == ExpertNumerics::bf16 ? "bf16" : "contract";
}

ExpertNumerics parse_expert_numerics(const std::string& s) {
  if (s == "exact") return ExpertNumerics::exact;
  if (s == "contract") return ExpertNumerics::contract;
  if (s == "bf16") return ExpertNumerics::bf16;
  throw Error("--experts-numerics: expected exact, contract or bf16, got '" + s + "'");
}

std::vector<ExpertTask> group_by_expert(const MoeRouting& r) {
  std::vector<int32_t> count;
  for (int32_t e : r.ids) {
    STRATA_ASSERT(e >= 0);
    if (size_t(e) >= count.size()) count.resize(size_t(e) + 1, 0);
    ++count[size_t(e)];
  }
  std::vector<int32_t> task_of(count.size(), -1);
  std::vector<ExpertTask> tasks;
  for (size_t e = 0; e < count.size(); ++e) {
    if (count[e] == 0) continue;
    task_of[e] = int32_t(tasks.size());
    ExpertTask t;
    t.expert = int32_t(e);
    t.tokens.reserve(static_cast<size_t>(count[e]));
    t.slots.reserve(static_cast<size_t>(count[e]));
    tasks.push_back(std::move(t));
  }
  for (int64_t t = 0; t < r.T; ++t)
    for (int64_t j = 0; j < r.top_k; ++j) {
      const int32_t slot = int32_t(t * r.top_k + j);
      ExpertTask& task = tasks[size_t(task_of[size_t(r.ids[size_t(slot)])])];
      task.tokens.push_back(int32_t(t));
      task.slots.push_back(slot);
    }
  return tasks;
}

namespace {

// Gathers a task's token rows, runs `ffn` over them as one batch, scatters to the slots.
template <class Ffn>
void run_tasks(std::span<const ExpertTask> tasks, const float* x, float* y, int64_t in_dim,
               Ffn&& ffn) {
  tbb::parallel_for(size_t(0), tasks.size(), [&](size_t i) {
    // Isolated, as the bf16 executor's experts: a thread waiting inside one expert's parallel ops
    // takes no other expert meanwhile (per-thread buffers stay the waiting expert's).
    tbb::this_task_arena::isolate([&] {
      const ExpertTask& task = tasks[i];
      const int64_t n = int64_t(task.tokens.size());
      std::vector<float> xin(static_cast<size_t>(n * in_dim)),
          yout(static_cast<size_t>(n * in_dim));
      for (int64_t r = 0; r < n; ++r)
        std::copy_n(x + int64_t(task.tokens[size_t(r)]) * in_dim, in_dim, xin.data() + r * in_dim);
      ffn(task.expert, xin.data(), yout.data(), n);
      for (int64_t r = 0; r < n; ++r)
        std::copy_n(yout.data() + r * in_dim, in_dim, y + int64_t(task.slots[size_t(r)]) * in_dim);
    });
  });
}

class ExactExecutor final : public ExpertExecutor {
 public:
  const char* name() const override { return "exact"; }
  void run(const ExpertLayer& layer, std::span<const ExpertTask> tasks, const float* x, float* y,
           Precision p) override {
    const bool mxfp4 = layer.config->moe.mxfp4;
    run_tasks(tasks, x, y, layer.in_dim, [&](int e, const float* xin, float* yout, int64_t n) {
      const ExpertWeights& w = layer.weights->experts[size_t(e)];
      if (mxfp4)
        ref::expert_ffn_mxfp4(xin, ref::Mxfp4Expert{w.w1, w.w3, w.w2}, layer.glu, yout, n, p);
      else
        ref::expert_ffn_dense(xin, ref::GluMlp{w.w1, w.w3, w.w2}, layer.glu, yout, n, p);
    });
  }
};

}  // namespace

std::unique_ptr<ExpertExecutor> make_expert_executor(ExpertNumerics n, const ModelConfig& c) {
  if (n == ExpertNumerics::exact) return std::make_unique<ExactExecutor>();
  if (n == ExpertNumerics::bf16) {
    if (c.moe.mxfp4)
      throw Error("--experts-numerics bf16 is for bf16 routed experts; " + c.source +
                  " has MXFP4 experts (use contract or exact)");
    return make_bf16_executor();
  }
  if (!c.moe.mxfp4)
    throw Error(
        "--experts-numerics contract: the contract (docs/numerics.md) is defined for "
        "MXFP4 routed experts; " +
        c.source + " has bf16 experts (use bf16 or exact)");
  return make_contract_executor(c, cpu::ExpertIsa::automatic, cpu::pin_expert_threads(),
                                cpu::keep_expert_threads_warm());
}

}  // namespace strata::engine
