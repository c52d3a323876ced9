// The bf16 expert executor (ExpertNumerics::bf16; engine/expert_executor.h): Kimi-Linear's bf16
// routed experts on the fast CPU GEMMs of the trunk. Per expert, its tokens' rows are gathered,
// gate and up run in one pass of cpu::Bf16Linear (GEMV up to kGemvMaxTokens rows, oneDNN above),
// the GLU rounds h to bf16, down runs, and the rows are scattered to their slots — the rounding
// points of the bf16 model (spec/model.md §12.2) and of the exact executor in bf16, with fp32 sums
// in the kernels' order instead of the oracle's. So results are within the bf16 noise of the
// exact executor and do not depend on the thread count; they may depend on the ISA and on how many
// tokens an expert has (the kernel choice). Kimi-Linear's experts are 2304 → 1024 → 2304: 14.2 MB
// of bf16 weights each.
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <vector>

#include "cpu/bf16_linear.h"
#include "cpu/row_ops.h"
#include "engine/expert_executor.h"
#include "storage/error.h"

namespace strata::engine {
namespace {

class Bf16Executor final : public ExpertExecutor {
 public:
  const char* name() const override { return "bf16"; }
  void run(const ExpertLayer& layer, std::span<const ExpertTask> tasks, const float* x, float* y,
           Precision p) override {
    STRATA_ASSERT(p == Precision::bf16 && !layer.config->moe.mxfp4);
    // Experts in parallel, each linear parallel over its output rows inside (TBB nests them):
    // a decode step's 8 experts of 1 token each keep every core streaming weights. Each expert
    // is isolated: a thread waiting for its rows must not pick up another expert meanwhile, whose
    // linear would reuse the thread's bf16 activation buffer while these rows still read it.
    tbb::parallel_for(size_t(0), tasks.size(), [&](size_t k) {
      tbb::this_task_arena::isolate([&] { run_one(layer, tasks[k], x, y); });
    });
  }

 private:
  void run_one(const ExpertLayer& layer, const ExpertTask& task, const float* x, float* y) {
    const int64_t H = layer.in_dim, I = layer.intermediate;
    const ExpertWeights& w = layer.weights->experts[size_t(task.expert)];
    STRATA_ASSERT(w.w1.rows == I && w.w1.cols == H && w.w2.rows == H && w.w2.cols == I);
    const int64_t n = int64_t(task.tokens.size());
    std::vector<float> xin(size_t(n * H)), g(size_t(n * I)), u(size_t(n * I)), yout(size_t(n * H));
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(x + int64_t(task.tokens[size_t(r)]) * H, H, xin.data() + r * H);
    const cpu::Bf16Linear::Out gu[2] = {{&w.w1, g.data(), true}, {&w.w3, u.data(), true}};
    lin_.multi(xin.data(), n, H, gu);
    cpu::glu_fast(layer.glu, g.data(), u.data(), g.data(), n * I);  // rounds h to bf16
    lin_(g.data(), n, w.w2, yout.data(), true);
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(yout.data() + r * H, H, y + int64_t(task.slots[size_t(r)]) * H);
  }

  cpu::Bf16Linear lin_;  // stateless kernels and a oneDNN cache safe for concurrent calls
};

}  // namespace

std::unique_ptr<ExpertExecutor> make_bf16_executor() {
  return std::make_unique<Bf16Executor>();
}

}  // namespace strata::engine
