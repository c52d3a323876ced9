// Fast bf16 linear layers of the dense trunk on the CPU (the fast CPU backend's GEMMs): y = x·Wᵀ
// with W a bf16 [N, K] matrix read where it lies (the mmapped checkpoint, row-major as stored),
// x fp32 holding bf16 values, fp32 accumulation, fp32 output (optionally rounded to bf16: the GEMM
// output rounding point of spec/model.md §12.2, fused into the kernels' stores).
//
// Two kernels, chosen by the number of tokens T:
// * gemv_bf16 (T ≤ kGemvMaxTokens; decode): streams the weight rows once at memory speed. AMX-BF16
//   (TDPBF16PS: 16 rows × 16 tokens × 32 columns per instruction, W's rows loaded in place as the
//   A tile), AVX-512 BF16 (vdpbf16ps: 32 bf16 products per instruction into 16 fp32 lanes), AVX2
//   (bf16 widened by a shift, FMA), or scalar, dispatched by CPUID (AMX where the OS grants it,
//   for calls of 5 tokens or more; fewer take the AVX-512 kernel, memory-bound there). The
//   tokens of a call share each loaded weight vector (AVX-512: up to 8 per pass); TBB threads
//   split the output rows.
// * OnednnBf16Gemm (larger T; prefill): oneDNN 2.6 matmul primitives (AMX-BF16 / AVX-512 BF16
//   brgemm), created once per shape and cached. The columns of y are split into one slice per
//   TBB thread and each slice runs a single-threaded primitive on its rows of W (weights [K, n]
//   in oneDNN's `ba` layout: W's rows as they are, no packed copy), so the only thread pool is
//   TBB's — oneDNN's OpenMP team is held at one thread inside our tasks (the OpenMP-inside-TBB
//   trap of spec/building-blocks.md §3.3).
//
// Numerics: x is rounded to bf16 on entry (exact for the bf16-valued activations of the bf16
// model; the contract of this file). Products of bf16 values are exact in fp32, so the only
// difference from the fp32 oracle's linear (cpu/ref/linear.cpp) is the summation order, which here
// depends on the ISA and the kernel (not on threads): tests bound it relative to Σ|x·w|.
// vdpbf16ps treats bf16 subnormal inputs as zero and flushes subnormal sums (|v| < 2^-126), far
// below the bf16 output rounding.
//
// Not here: MXFP4 routed experts (cpu/expert_kernels.h: the integer contract, bit-identical on
// every executor), fp32 or MXFP4 trunk weights (the reference linear handles those).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cpu/ref/ops.h"

namespace strata::cpu {

enum class GemvIsa { automatic, scalar, avx2, avx512bf16, amx };

const char* gemv_isa_name(GemvIsa isa);
// "auto", "scalar", "avx2", "avx512bf16", "amx"; throws strata::Error naming `what` otherwise.
GemvIsa parse_gemv_isa(const std::string& s, const std::string& what = "--gemv-isa");
bool gemv_isa_supported(GemvIsa isa);  // automatic and scalar: always
GemvIsa best_gemv_isa();               // detected once
// automatic → best; an unsupported explicit choice throws strata::Error (no silent fallback).
GemvIsa resolve_gemv_isa(GemvIsa isa);

// Tokens up to which the GEMV kernel is used (from kGemvMaxTokens + 1 on: oneDNN).
inline constexpr int64_t kGemvMaxTokens = 8;

// fp32 → bf16 (round to nearest even), n values; vectorised where the CPU allows.
void to_bf16(const float* x, uint16_t* out, int64_t n);

// y[t, n] = Σ_k x[t, k]·W[n, k] for t < T, n < N. W: bf16 [N, K] rows (row stride ldw ≥ K);
// x: [T, K] fp32 (rounded to bf16 on entry); y: [T, ldy] (ldy ≥ N), rounded to bf16 when round_out.
// Parallel over rows of W in the caller's TBB arena. Any T works (tokens in groups of 4).
void gemv_bf16(const float* x, int64_t T, const uint16_t* W, int64_t N, int64_t K, int64_t ldw,
               float* y, int64_t ldy, bool round_out, GemvIsa isa = GemvIsa::automatic);

// Several products of the same x [T, K] in one parallel pass over all their weight rows (the q, k,
// v, gate projections of a layer; gate and up of an MLP): one thread fork/join and one bf16
// conversion of x instead of one per matrix.
struct GemvOut {
  const uint16_t* W = nullptr;  // bf16 [N, K] rows (row stride K)
  int64_t N = 0;
  float* y = nullptr;  // [T, N]
  bool round_out = false;
};
void gemv_bf16_multi(const float* x, int64_t T, int64_t K, std::span<const GemvOut> outs,
                     GemvIsa isa = GemvIsa::automatic);

// The same product through oneDNN (any T; meant for T > kGemvMaxTokens). One object caches the
// primitives of every shape it has seen (creating one JIT-compiles kernels: milliseconds) and the
// per-thread buffers; it may be called from several threads at once.
class OnednnBf16Gemm {
 public:
  OnednnBf16Gemm();
  ~OnednnBf16Gemm();
  OnednnBf16Gemm(const OnednnBf16Gemm&) = delete;
  OnednnBf16Gemm& operator=(const OnednnBf16Gemm&) = delete;

  // xb: [M, K] bf16 (row stride K); W: bf16 [N, K] rows (row stride ldw ≥ K); y: [M, ldy].
  void run(const uint16_t* xb, int64_t M, const uint16_t* W, int64_t N, int64_t K, int64_t ldw,
           float* y, int64_t ldy, bool round_out);
  // The same from fp32 activations (converted into an internal buffer).
  void run(const float* x, int64_t M, const uint16_t* W, int64_t N, int64_t K, int64_t ldw,
           float* y, int64_t ldy, bool round_out);
  // oneDNN's implementation name for a slice of the given shape ("brg:avx512_core_amx_bf16").
  std::string impl_info(int64_t M, int64_t N, int64_t K);
  size_t cached_primitives() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The trunk's linear: gemv_bf16 for T ≤ gemv_max_tokens, OnednnBf16Gemm above. W must be a bf16
// view (asserted; the caller routes other formats to cpu::ref::linear).
class Bf16Linear {
 public:
  explicit Bf16Linear(GemvIsa isa = GemvIsa::automatic, int64_t gemv_max_tokens = kGemvMaxTokens);
  ~Bf16Linear();
  // x: [T, W.cols]; y: [T, W.rows].
  void operator()(const float* x, int64_t T, const ref::WeightView& W, float* y, bool round_out);
  // Several weights of the same x (all bf16 with W.cols == K): one gemv_bf16_multi pass for
  // T ≤ gemv_max_tokens, one oneDNN call each above.
  struct Out {
    const ref::WeightView* W = nullptr;
    float* y = nullptr;
    bool round_out = false;
  };
  void multi(const float* x, int64_t T, int64_t K, std::span<const Out> outs);
  int64_t gemv_max_tokens() const { return gemv_max_tokens_; }
  GemvIsa isa() const { return isa_; }
  OnednnBf16Gemm& gemm() { return gemm_; }

 private:
  GemvIsa isa_;
  int64_t gemv_max_tokens_;
  OnednnBf16Gemm gemm_;
};

namespace detail {
// Per-ISA row kernels (cpu/bf16_gemv_{avx512,avx2}.cpp): rows [r0, r1) of W for tokens [0, T),
// x already bf16 (xb [T, ldx], zero padded to ldx ≥ K rounded up to 32).
struct GemvArgs {
  const uint16_t* xb = nullptr;
  int64_t ldx = 0, T = 0, K = 0;
  const uint16_t* W = nullptr;
  int64_t ldw = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  bool round_out = false;
  const uint16_t* xp = nullptr;  // AMX: x packed by pack_amx_activations
};
void gemv_rows_avx512bf16(const GemvArgs& a, int64_t r0, int64_t r1);
// AMX-BF16 (cpu/bf16_gemv_amx.cpp): a.xp holds x as B tiles — per group of 16 tokens and step of
// 32 columns, 16 column pairs × 16 tokens × 2 (zeros past T and K).
void gemv_rows_amx(const GemvArgs& a, int64_t r0, int64_t r1);
void pack_amx_activations(const uint16_t* xb, int64_t ldx, int64_t T, int64_t K,
                          std::vector<uint16_t>& out);
void gemv_rows_avx2(const GemvArgs& a, int64_t r0, int64_t r1);
void to_bf16_avx512bf16(const float* x, uint16_t* out, int64_t n);
}  // namespace detail

}  // namespace strata::cpu
