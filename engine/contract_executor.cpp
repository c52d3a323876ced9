// The contract-mode expert executor: all the routed experts of a layer in one call of the fast
// layer-level CPU kernels (strata::cpu::run_experts_cpu: AVX-512 VNNI / AVX2 / scalar, one TBB job
// over (expert, row tile) items, each token quantized once for all its experts). Every path gives
// the bits of the scalar contract (strata::cpu::expert_ffn_contract, docs/numerics.md), so this
// executor's outputs are those of one expert_ffn_contract call per (token, expert) pair
// (tests/engine/contract_fast_test.cpp checks the logits bit for bit, per ISA).
// The kernels write each expert's rows contiguously into a scratch buffer, then they are copied to
// their output slots (cpu::RoutedExperts, which bench hw's expert probe runs too). In bf16 mode the
// fp32 contract output is rounded to bf16 like every other GEMM output of that mode (a
// deterministic function of the contract's bits). Not reentrant: one run() at a time per executor
// (the scratch buffers are reused across calls).
#include <immintrin.h>
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

    // Tokens x[0 .. T) are quantized once.
    int T = 0;
    for (const ExpertTask& task : tasks) {
      STRATA_ASSERT(task.tokens.size() == task.slots.size());
      for (int32_t t : task.tokens) {
        STRATA_ASSERT(t >= 0);
        T = std::max(T, t + 1);
      }
    }
    jobs_.clear();
    jobs_.reserve(tasks.size());
    slots_.clear();
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
      jobs_.push_back(j);
      slots_.push_back(task.slots.data());
    }
    routed_.run(jobs_, slots_, x, T, glu, opt_, y, p == Precision::bf16, &times_);
  }

  std::vector<std::pair<std::string, double>> telemetry_values() const override {
    return {{"quantize_s", times_.quantize_s},
            {"kernels_s", times_.kernels_s},
            {"copy_s", times_.copy_s}};
  }
  void reset_telemetry() override { times_ = {}; }

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
  cpu::RoutedExperts routed_;          // the layer's kernels, copies to slots and their buffers
  std::vector<cpu::ExpertTask> jobs_;  // reused
  std::vector<const int32_t*> slots_;  // reused: each job's slots
  cpu::RoutedExperts::Times times_;    // run()'s parts since reset_telemetry()
};

}  // namespace

std::unique_ptr<ExpertExecutor> make_contract_executor(const ModelConfig& c, cpu::ExpertIsa isa,
                                                       bool pin_threads, bool keep_warm) {
  STRATA_ASSERT(c.moe.mxfp4);
  return std::make_unique<ContractExecutor>(isa, pin_threads, keep_warm);
}

}  // namespace strata::engine
