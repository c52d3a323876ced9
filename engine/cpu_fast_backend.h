// The fast CPU backend of the layer schedule (issue 23): the bf16 model of spec §12.2 with the
// dense trunk at memory / matrix-unit speed. Every linear layer of the trunk (KDA and MLA
// projections, dense MLP, shared experts, latent down/up, router, lm_head) goes through
// cpu/bf16_linear.h (the AVX-512 BF16 GEMV for decode-sized steps, oneDNN bf16 matmuls above);
// the row ops (norms, GLUs, gates, the AttnRes mix) and the KDA and MLA cores through the
// reference ops (cpu/ref) while the profile says they do not matter; routed experts through the
// ExpertExecutor of the options (contract numerics: the fast CPU expert kernels, bit-identical on
// every executor).
//
// Numerics: the rounding points are the reference bf16 backend's (engine/cpu_backend.cpp), at the
// same places; what differs is the fp32 summation order inside GEMMs, norms and dot products, so
// results agree with the reference bf16 backend to bf16 rounding noise per layer, not bit for bit
// (tests/engine/cpu_fast_backend_test.cpp states the tolerances). Router logits are fp32 sums of a
// different order too, so a near-tie in the top-k can pick another expert than the reference.
//
// Not here: fp32 (the reference backend is the fp32 oracle; this one refuses fp32), the order of
// the sublayers (engine/schedule.h), placement of experts (offload/).
#pragma once
#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "cpu/bf16_linear.h"
#include "engine/backend.h"
#include "engine/cpu_backend.h"
#include "engine/model.h"

namespace strata::engine {

// Wall time spent per kind of work since construction (or reset), for profiles and benchmarks.
struct FastBackendProfile {
  enum Kind {
    gemv,      // linear layers run by the GEMV kernel (steps of ≤ kGemvMaxTokens rows)
    gemm,      // linear layers run by oneDNN
    kda_core,  // conv, gate, L2 norms, the recurrence and the gated norm
    mla_core,  // latent rows and attention
    experts,   // routed experts (executor) and their merge
    row_ops,   // embed, mixes, norms, GLUs, adds, routing
    kinds
  };
  std::array<double, kinds> seconds{};
  std::array<double, kinds> weight_bytes{};  // gemv/gemm: bf16 weight bytes read
  std::array<double, kinds> flops{};         // gemv/gemm: 2·T·N·K
  // begin_step to commit_step: the kinds above and what none of them times.
  double step_seconds = 0;
  // Inside `experts`: grouping the routing by expert, the executor's run, the merge; and the
  // routing's shape summed over MoE layers: (token, expert) pairs, distinct experts, the largest
  // group's tokens (pairs / experts is the mean tokens per expert; the largest against it, the
  // spread that a flat routing does not have).
  double expert_group_s = 0, expert_run_s = 0, expert_merge_s = 0;
  double expert_pairs = 0, expert_tasks = 0, expert_max_tokens = 0, moe_calls = 0;
  static const char* name(Kind k);
};

class CpuFastBackend final : public CpuHostBackend {
 public:
  // Throws strata::Error for precision fp32 (the reference backend computes fp32) or options the
  // executor cannot run on this model.
  CpuFastBackend(const Model& model, BackendOptions options, int slots = 1,
                 cpu::GemvIsa isa = cpu::GemvIsa::automatic);

  void begin_step(const StepShape& s) override;
  void commit_step(const StepShape& s) override;
  Act alloc(int64_t rows, int64_t cols) override;

  void embed(std::span<const int32_t> ids, Act out) override;
  void mix(int layer, MixSite site, std::span<const Act> sources, Act out) override;
  void norm(int layer, NormSite site, Act x, Act out) override;
  void token_mixer(int layer, const StepShape& s, Act x, Act out) override;
  void ffn(int layer, const StepShape& s, Act x, Act out) override;
  void add(Act acc, Act b) override;
  void logits(Act h, std::span<const int64_t> rows, float* out) override;

  const FastBackendProfile& profile() const { return prof_; }
  void reset_profile() { prof_ = {}; }

  // The profile per step since the last reset: "cpu fast backend: N steps | ms per step: …".
  std::string telemetry_line() const override;
  void reset_telemetry() override {
    prof_ = {}, steps_ = 0;
    executor_->reset_telemetry();
  }
  std::vector<std::pair<std::string, double>> telemetry_values() const override;

 private:
  // y [T, W.rows] = x [T, W.cols] · Wᵀ, rounded to bf16 when `round` (a GEMM output).
  void linear(const float* x, int64_t T, const WeightView& W, float* y, bool round);
  // Several linears of the same x: one fused GEMV pass for decode-sized steps.
  struct Proj {
    const WeightView* W;
    float* y;
    bool round_out;
  };
  void linear_multi(const float* x, int64_t T, std::span<const Proj> outs);
  void glu_mlp(const float* x, const cpu::ref::GluMlp& m, float* y, int64_t T);
  // The token mixers over every sequence of the step: the projections over all s.rows rows at
  // once (each weight read once per step), the per-sequence core (its slot's state or cache)
  // sequence by sequence.
  void kda(int l, const StepShape& s, const float* x, float* out);
  void mla(int l, const StepShape& s, const float* x, float* out);
  void moe(int l, const StepShape& s, const float* x, float* out, int64_t T);

  // An arena of floats carved in order from blocks it keeps: handed back to a mark when a Scope
  // ends (scratch_: the buffers a sublayer needs only while it runs — projections, gates,
  // attention outputs, router logits, expert outputs) or all at once by reset() (acts_: the step's
  // activations, reset at begin_step). Not zero-filled per use (a new block's pages are faulted
  // in once, by all threads): every user writes its buffer before reading it. A warm backend
  // neither allocates nor faults in pages for them (std::vectors per call did both: on the H200
  // machine's 16 cores that was most of the step's untimed time, 56–64 ms of a 1024-token k3-mini
  // prefill).
  class Scratch {
   public:
    struct Buf {  // a float span with the vector calls the sublayers use
      float* p = nullptr;
      size_t n = 0;
      float* data() const { return p; }
      size_t size() const { return n; }
      float* begin() const { return p; }
      float* end() const { return p + n; }
    };
    class Scope {
     public:
      explicit Scope(Scratch& s) : s_(s), block_(s.block_), used_(s.used_) {}
      ~Scope() { s_.block_ = block_, s_.used_ = used_; }
      Scope(const Scope&) = delete;
      Scope& operator=(const Scope&) = delete;

     private:
      Scratch& s_;
      size_t block_, used_;
    };
    Buf take(size_t n);
    void reset() { block_ = used_ = 0; }

   private:
    std::vector<std::unique_ptr<float[]>> blocks_;
    std::vector<size_t> sizes_;
    size_t block_ = 0, used_ = 0;  // the block in use and its floats handed out
  };

  cpu::Bf16Linear lin_;
  FastBackendProfile prof_;
  Scratch scratch_, acts_;
  uint64_t steps_ = 0;  // begin_step calls since the telemetry's reset
  std::chrono::steady_clock::time_point step_t0_;
};

// The CPU backend for the options: the fast one for bf16 with contract experts (the default
// combination) or bf16 experts (ExpertNumerics::bf16), the reference backend (the oracle) for
// fp32 or exact experts.
std::unique_ptr<Backend> make_cpu_backend(const Model& model, BackendOptions options,
                                          int slots = 1);

}  // namespace strata::engine
