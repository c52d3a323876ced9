// The contract-mode expert executor: every (token, expert) pair through the scalar integer
// contract of docs/numerics.md (strata::cpu::expert_ffn_contract), experts in parallel (TBB), each
// output slot written by one task. In bf16 mode the fp32 contract output is rounded to bf16 like
// every other GEMM output of that mode (a deterministic function of the contract's bits).
#include <tbb/parallel_for.h>

#include "cpu/expert_contract.h"
#include "engine/expert_executor.h"
#include "storage/error.h"

namespace strata::engine {

namespace {

class ContractExecutor final : public ExpertExecutor {
 public:
  const char* name() const override { return "contract"; }
  void run(const ExpertLayer& layer, std::span<const ExpertTask> tasks, const float* x, float* y,
           Precision p) override {
    strata::GluParams glu;
    glu.situ = layer.glu.kind == cpu::ref::GluKind::situ;
    glu.beta1 = layer.glu.beta1;
    glu.beta2 = layer.glu.beta2;
    const int64_t Din = layer.in_dim;
    tbb::parallel_for(size_t(0), tasks.size(), [&](size_t i) {
      const ExpertTask& task = tasks[i];
      const ExpertWeights& w = layer.weights->experts[size_t(task.expert)];
      strata::Mxfp4ExpertView v;
      v.w1_packed = static_cast<const uint8_t*>(w.w1.data);
      v.w1_scale = w.w1.scale;
      v.w3_packed = static_cast<const uint8_t*>(w.w3.data);
      v.w3_scale = w.w3.scale;
      v.w2_packed = static_cast<const uint8_t*>(w.w2.data);
      v.w2_scale = w.w2.scale;
      v.hidden = int(Din);
      v.inter = int(layer.intermediate);
      for (size_t r = 0; r < task.tokens.size(); ++r) {
        float* out = y + int64_t(task.slots[r]) * Din;
        cpu::expert_ffn_contract(v, x + int64_t(task.tokens[r]) * Din, out, glu);
        cpu::ref::round_if(p, out, Din);
      }
    });
  }
};

}  // namespace

std::unique_ptr<ExpertExecutor> make_contract_executor(const ModelConfig& c) {
  STRATA_ASSERT(c.moe.mxfp4);
  return std::make_unique<ContractExecutor>();
}

}  // namespace strata::engine
