// The contract-mode expert executor: all the routed experts of a layer in one call of the fast
// layer-level CPU kernels (strata::cpu::run_experts_cpu: AVX-512 VNNI / AVX2 / scalar, one TBB job
// over (expert, row tile) items, each token quantized once for all its experts). Every path gives
// the bits of the scalar contract (strata::cpu::expert_ffn_contract, docs/numerics.md), so this
// executor's outputs are those of one expert_ffn_contract call per (token, expert) pair
// (tests/engine/contract_fast_test.cpp checks the logits bit for bit, per ISA).
// The kernels write each expert's rows contiguously into a scratch buffer held here; they are
// then copied to their output slots. In bf16 mode the fp32 contract output is rounded to bf16 like
// every other GEMM output of that mode (a deterministic function of the contract's bits).
// Not reentrant: one run() at a time per executor (the scratch buffers are reused across calls).
#include <immintrin.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <type_traits>

#include "cpu/expert_kernels.h"
#include "cpu/topology.h"
#include "engine/expert_executor.h"
#include "storage/error.h"

namespace strata::engine {

namespace {

static_assert(std::is_same_v<int32_t, int>,
              "ExpertTask::tokens is passed as the kernels' int rows");

class ContractExecutor final : public ExpertExecutor {
 public:
  // An explicit ISA this CPU cannot run throws here (strata::Error; no silent fallback).
  ContractExecutor(cpu::ExpertIsa isa, bool pin_threads, bool keep_warm) : keep_warm_(keep_warm) {
    opt_.isa = cpu::resolve_isa(isa);
    opt_.workspace = &ws_;  // the kernels' per-call buffers, kept between layers and tokens
    if (pin_threads) {
      topo_ = std::make_unique<cpu::Topology>();
      pinned_ = std::make_unique<cpu::PinnedArena>(*topo_, topo_->cores());
      opt_.arena = &pinned_->arena();
    } else if (keep_warm) {
      plain_ = std::make_unique<tbb::task_arena>();  // the default size, not pinned
      opt_.arena = plain_.get();
    }
  }

  // One spinning task per worker of the kernels' arena, each until run() starts (or 5 ms). A
  // task left from an earlier warm() sees its generation started and returns at once.
  void warm() override {
    if (!keep_warm_ || !opt_.arena) return;
    const uint64_t g = ++warm_gen_;
    const int n = opt_.arena->max_concurrency() - 1;
    for (int i = 0; i < n; ++i) {
      spinners_.fetch_add(1, std::memory_order_relaxed);
      opt_.arena->enqueue([this, g] {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
        while (started_.load(std::memory_order_acquire) < g &&
               std::chrono::steady_clock::now() < until)
          _mm_pause();
        spinners_.fetch_sub(1, std::memory_order_release);
      });
    }
  }
  // Releases warm()'s spinners and waits until none is left: they read this object.
  ~ContractExecutor() override {
    started_.store(~uint64_t(0), std::memory_order_release);
    while (spinners_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
  }
  ContractExecutor(const ContractExecutor&) = delete;
  ContractExecutor& operator=(const ContractExecutor&) = delete;

  const char* name() const override { return "contract"; }

  void run(const ExpertLayer& layer, std::span<const ExpertTask> tasks, const float* x, float* y,
           Precision p) override {
    started_.store(warm_gen_, std::memory_order_release);  // releases warm()'s spinners
    if (tasks.empty()) return;
    strata::GluParams glu;
    glu.situ = layer.glu.kind == cpu::ref::GluKind::situ;
    glu.beta1 = layer.glu.beta1;
    glu.beta2 = layer.glu.beta2;
    const int64_t Din = layer.in_dim;

    // Rows needed: every (token, slot) pair; tokens x[0 .. T) are quantized once.
    size_t rows = 0;
    int T = 0;
    for (const ExpertTask& task : tasks) {
      STRATA_ASSERT(task.tokens.size() == task.slots.size());
      rows += task.tokens.size();
      for (int32_t t : task.tokens) {
        STRATA_ASSERT(t >= 0);
        T = std::max(T, t + 1);
      }
    }
    ybuf_.resize(rows * size_t(Din));
    jobs_.clear();
    jobs_.reserve(tasks.size());
    size_t row = 0;
    for (const ExpertTask& task : tasks) {
      const ExpertWeights& w = layer.weights->experts[size_t(task.expert)];
      cpu::ExpertTask j;
      j.w.w1_packed = static_cast<const uint8_t*>(w.w1.data);
      j.w.w1_scale = w.w1.scale;
      j.w.w3_packed = static_cast<const uint8_t*>(w.w3.data);
      j.w.w3_scale = w.w3.scale;
      j.w.w2_packed = static_cast<const uint8_t*>(w.w2.data);
      j.w.w2_scale = w.w2.scale;
      j.w.hidden = int(Din);
      j.w.inter = int(layer.intermediate);
      j.token_rows = task.tokens.data();
      j.n_tokens = int(task.tokens.size());
      j.y = ybuf_.data() + row * size_t(Din);
      row += task.tokens.size();
      jobs_.push_back(j);
    }
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    xq_.quantize(x, T, int(Din));
    const auto t1 = clock::now();
    cpu::run_experts_cpu(jobs_, xq_, glu, opt_);
    const auto t2 = clock::now();

    // Each expert's rows to their output slots (slots are distinct across the layer), experts in
    // parallel: a prefill chunk moves T·k rows of Din here, which one thread made a serial share of
    // the step (docs/planner.md, (2) on an H100 host). Each row's bits do not depend on who copies.
    row_start_.resize(tasks.size() + 1);
    row_start_[0] = 0;
    for (size_t e = 0; e < tasks.size(); ++e)
      row_start_[e + 1] = row_start_[e] + tasks[e].slots.size();
    tbb::parallel_for(size_t(0), tasks.size(), [&](size_t e) {
      const ExpertTask& task = tasks[e];
      for (size_t r = 0; r < task.slots.size(); ++r) {
        float* out = y + int64_t(task.slots[r]) * Din;
        std::copy_n(ybuf_.data() + (row_start_[e] + r) * size_t(Din), Din, out);
        cpu::ref::round_if(p, out, Din);
      }
    });
    quantize_s_ += std::chrono::duration<double>(t1 - t0).count();
    kernels_s_ += std::chrono::duration<double>(t2 - t1).count();
    copy_s_ += std::chrono::duration<double>(clock::now() - t2).count();
  }

  std::vector<std::pair<std::string, double>> telemetry_values() const override {
    return {{"quantize_s", quantize_s_}, {"kernels_s", kernels_s_}, {"copy_s", copy_s_}};
  }
  void reset_telemetry() override { quantize_s_ = kernels_s_ = copy_s_ = 0; }

 private:
  // With pinned threads: one worker per core, hwloc-bound (cpu/topology.h), as `bench
  // cpu-experts` runs; the caller joins the arena for each run().
  std::unique_ptr<cpu::Topology> topo_;
  std::unique_ptr<cpu::PinnedArena> pinned_;
  std::unique_ptr<tbb::task_arena> plain_;  // keep_warm without pinning: an arena to enqueue into
  const bool keep_warm_;
  uint64_t warm_gen_ = 0;             // warm() calls (the caller's thread only)
  std::atomic<uint64_t> started_{0};  // the warm() generation the last run() started
  std::atomic<int> spinners_{0};      // enqueued by warm(), not finished
  cpu::CpuExpertWorkspace ws_;  // reused (grow-only) by every run_experts_cpu call of this executor
  cpu::CpuExpertOptions opt_;
  cpu::QuantizedActivations xq_;  // reused: quantized layer input
  std::vector<cpu::ExpertTask> jobs_;
  std::vector<float> ybuf_;        // reused: [Σ tokens, Din] kernel outputs, expert by expert
  std::vector<size_t> row_start_;  // reused: each task's first row in ybuf_
  double quantize_s_ = 0, kernels_s_ = 0, copy_s_ = 0;  // run()'s parts since reset_telemetry()
};

}  // namespace

std::unique_ptr<ExpertExecutor> make_contract_executor(const ModelConfig& c, cpu::ExpertIsa isa,
                                                       bool pin_threads, bool keep_warm) {
  STRATA_ASSERT(c.moe.mxfp4);
  return std::make_unique<ContractExecutor>(isa, pin_threads, keep_warm);
}

}  // namespace strata::engine
