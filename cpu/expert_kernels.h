// Fast CPU routed-expert FFNs on the released MXFP4 layout (docs/numerics.md), layer level: all the
// experts of one layer and the tokens routed to each, as one TBB-parallel job over (expert, row
// tile) work items, weights read where they lie. Every ISA path (scalar, AVX2, AVX-512 VNNI, AMX)
// produces the bits of the contract mode (cpu/expert_contract.h) and is tested for it.
//
// The kernels: activations quantized once per token (shared by all its experts) into int8 blocks;
// E2M1 nibbles decoded by a 16-entry byte table to (doubled value + 12) as u8; u8 × s8 dot products
// (vpdpbusd / maddubs) minus 12·Σq per block give the exact int32 block dots; block terms and the
// fixed 32-lane fp64 reduction of the contract in four zmm (eight ymm) registers of fp64 lanes.
// Several tokens per expert (AVX-512: cpu/expert_gemm_avx512.cpp, AMX: cpu/expert_kernels_amx.cpp):
// register/tile-blocked over 16 rows × up to 16 tokens, each output's block terms summed in one
// fp64 accumulator in block order — exact, hence the same bits, when the exponent span check of
// docs/numerics.md §3.1 passes; (16 rows, token) pairs that fail it take the strict kernel.
// Gate|up and down are one TBB job: the item that completes an expert's h starts its down tiles.
//
// What this is not: the merge of expert outputs (engine/, docs/numerics.md §5) — every (token,
// expert) pair gets its own fp32 row y_e here.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "storage/expert_contract.h"

namespace strata::cpu {

enum class ExpertIsa { automatic, scalar, avx2, avx512, amx };

const char* isa_name(ExpertIsa isa);
// "auto", "scalar", "avx2", "avx512", "amx"; throws strata::Error naming `what` otherwise.
ExpertIsa parse_isa(const std::string& s, const std::string& what = "--isa");
// Whether this CPU (CPUID + OS state) runs the path; automatic and scalar are always supported.
bool isa_supported(ExpertIsa isa);
// The fastest supported path (detected once).
ExpertIsa best_isa();
// automatic → best_isa(); an unsupported explicit choice throws strata::Error (no silent fallback).
ExpertIsa resolve_isa(ExpertIsa isa);

// Activations of T tokens quantized per 32-block (contract §2), in the kernels' layout: per
// group of 4 blocks (a "quad"), the 64 even-column bytes then the 64 odd-column bytes, 16 per
// block (the order the nibble table decode emits); blocks zero padded to a multiple of 16. Plus
// block exponents and 12·Σq per block (the dot of the +12 weight offset). Quantize once per
// token; every expert of the token uses it.
class QuantizedActivations {
 public:
  // x: [T, K] fp32, K a multiple of 32.
  void quantize(const float* x, int T, int K);
  int tokens() const { return T_; }
  int width() const { return K_; }
  int blocks() const { return nb_; }
  int padded_blocks() const { return nbp_; }  // nb rounded up to a multiple of 16
  const int8_t* q(int t) const { return q_.data() + size_t(t) * size_t(nbp_) * 32; }
  const int32_t* exponents(int t) const { return e_.data() + size_t(t) * size_t(nbp_); }
  const int32_t* block_bias(int t) const { return s_.data() + size_t(t) * size_t(nbp_); }
  // −12·Σq per block and 2^e_x per block (fp64), for the register-tiled kernel.
  const int32_t* neg_block_bias(int t) const { return ns_.data() + size_t(t) * size_t(nbp_); }
  const double* block_scale(int t) const { return px_.data() + size_t(t) * size_t(nbp_); }
  // max e_x − min e_x over the token's nonzero blocks (0 if it has none).
  int exponent_span(int t) const { return span_[size_t(t)]; }
  bool poisoned(int t) const { return poisoned_[size_t(t)] != 0; }

 private:
  int T_ = 0, K_ = 0, nb_ = 0, nbp_ = 0;
  std::vector<int8_t> q_;            // [T, nbp/4 quads, 2 (even, odd), 4 blocks, 16]
  std::vector<int32_t> e_, s_, ns_;  // [T, nbp]
  std::vector<double> px_;           // [T, nbp]
  std::vector<int> span_;            // [T]
  std::vector<uint8_t> st_;          // [T, nbp]: 0 zero block, 1 nonzero, 2 poisoned
  std::vector<uint8_t> poisoned_;
};

// One expert's share of a layer: the rows of x routed to it and where its outputs go.
struct ExpertTask {
  Mxfp4ExpertView w;
  const int* token_rows = nullptr;  // [n_tokens] row indices into x (any order, repeats allowed)
  int n_tokens = 0;
  float* y = nullptr;  // [n_tokens, H] fp32: y[i] = expert(x[token_rows[i]])
};

// The buffers of one run_experts_cpu call (each expert's h and its quantized form, the token
// sets, the AMX-packed activations), kept between calls: grow-only, so a warm workspace neither
// allocates nor touches fresh pages (at M = 256 tokens × 16 experts, h alone is 50 MB, whose page
// faults were taken by one thread before the parallel loop). One workspace per concurrent caller.
class CpuExpertWorkspace {
 public:
  CpuExpertWorkspace();
  ~CpuExpertWorkspace();
  CpuExpertWorkspace(const CpuExpertWorkspace&) = delete;
  CpuExpertWorkspace& operator=(const CpuExpertWorkspace&) = delete;
  struct State;  // cpu/expert_kernels.cpp
  State& state() { return *s_; }

 private:
  std::unique_ptr<State> s_;
};

struct CpuExpertOptions {
  ExpertIsa isa = ExpertIsa::automatic;
  // Run inside this arena (e.g. a hwloc-pinned one from cpu/topology.h); null: the caller's.
  tbb::task_arena* arena = nullptr;
  // Software prefetch distance (bytes ahead) of the one-token (decode) kernel; 0 = none, < 0 =
  // the default. A tuning knob for the benchmark; results do not depend on it.
  int prefetch = -1;
  // Reused between calls when set (see CpuExpertWorkspace); null: this call allocates its own.
  CpuExpertWorkspace* workspace = nullptr;
  // 2 to 4 tokens per expert (batched decode) on the few-token kernel (true) or the
  // register-tiled one (false). A knob for the benchmark and the tests; results do not depend on
  // it.
  bool few_token_kernel = true;
  // AMX kernel with more than 16 tokens: tokens per pass over 64 decoded weight rows (rounded up
  // to a multiple of 16), so that the packed activations of a pass stay in L2 next to the decoded
  // weights; 0 = all tokens per pass over 16 rows (the loop order before this option); < 0 = the
  // default. A tuning knob for the benchmark; results do not depend on it.
  int amx_pass_tokens = -1;
};

// All experts of one layer: x [T, H] fp32 (H = every task's w.hidden), quantized here once per
// token. Results are independent of thread count and ISA (bit-identical to expert_ffn_contract).
void run_experts_cpu(std::span<const ExpertTask> tasks, const float* x, int T, const GluParams& glu,
                     const CpuExpertOptions& opt = {});
// The same with activations already quantized (xq.width() == H).
void run_experts_cpu(std::span<const ExpertTask> tasks, const QuantizedActivations& xq,
                     const GluParams& glu, const CpuExpertOptions& opt = {});

// The routed experts of one MoE layer as the engine's contract executor runs them
// (engine/contract_executor.cpp), and as bench hw's model-shape expert probe times them: x [T, H]
// quantized once, every task's kernels into consecutive rows of a scratch buffer (task after
// task; run() sets each task's y), then each task's rows copied to their slot rows of out [·, H],
// tasks in parallel, each row rounded to bf16 when round_bf16 (the bf16 model's GEMM-output
// rounding). slots[e]: tasks[e].n_tokens slot indices, distinct over the layer. The bits are
// run_experts_cpu's. Not reentrant (the buffers are reused, grow-only).
class RoutedExperts {
 public:
  struct Times {  // added to by each run()
    double quantize_s = 0, kernels_s = 0, copy_s = 0;
  };
  void run(std::span<ExpertTask> tasks, std::span<const int32_t* const> slots, const float* x,
           int T, const GluParams& glu, const CpuExpertOptions& opt, float* out, bool round_bf16,
           Times* times = nullptr);

 private:
  QuantizedActivations xq_;
  std::vector<float> ybuf_;        // [Σ tokens, H] kernel outputs, task after task
  std::vector<size_t> row_start_;  // each task's first row in ybuf_
};

}  // namespace strata::cpu
