// Grouped MXFP4 experts: workspace layout, activation quantization (numerics.md §2), path
// dispatch and the expert-id-order merge (§5) — see kernels/moe/experts.h. The projection
// kernels live in gemv.cu and imma.cu.
#include <cuda_runtime.h>

#include <vector>

#include "kernels/moe/paths.h"
#include "kernels/ops/launch.cuh"
#include "storage/bf16.h"
#include "storage/expert_contract.h"
#include "storage/expert_contract_int.h"

namespace strata::kernels::moe {
namespace detail {

namespace c = strata::contract;

namespace {

size_t align256(size_t n) {
  return (n + 255) & ~size_t(255);
}

template <typename P>
P* take(char* base, size_t& off, size_t n) {
  P* p = base ? reinterpret_cast<P*>(base + off) : nullptr;
  off += align256(n);
  return p;
}

QuantRows carve_rows(char* base, size_t& off, int rows, int K) {
  QuantRows r;
  r.q = take<int8_t>(base, off, size_t(rows) * size_t(K));
  r.e = take<int32_t>(base, off, size_t(rows) * size_t(K / c::kBlock) * 4);
  return r;
}

Planes carve_planes(char* base, size_t& off, int rows, int K) {
  Planes p;
  p.hi = take<int8_t>(base, off, size_t(rows) * size_t(K));
  p.lo = take<int8_t>(base, off, size_t(rows) * size_t(K));
  p.meta = take<int32_t>(base, off, size_t(rows) * 8);
  return p;
}

// One warp per 32-element block, lane i holding element i: the block maximum and the poison test
// are warp reductions (order-free: max and "any" are exact), then every lane quantizes its own
// element with the contract's rule — the same bits as contract::quantize_block.
__device__ __forceinline__ void quantize_block_warp(float x, int lane, int8_t* q, int32_t* e) {
  const bool bad = __any_sync(0xffffffffu, !c::is_finite_f(x));
  float amax = x < 0.0f ? -x : x;
  for (int off = 16; off > 0; off >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  int ex = 0, qv = 0;
  if (!bad && amax > 0.0f) {
    ex = c::block_exponent(amax);
    qv = c::quantize_value(x, ex);
  }
  q[lane] = int8_t(qv);
  if (lane == 0) *e = bad ? kPoisonedBlock : ex;
}

constexpr int kQuantWarps = 8;

__global__ void quantize_kernel(const float* x, int rows, int K, QuantRows out) {
  // The GEMV launched after this one may start (and load its weights) now; it waits for this
  // grid's results itself.
  kernels::detail::grid_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int nb = K / c::kBlock;
  const size_t blk = size_t(blockIdx.x) * kQuantWarps + (threadIdx.x >> 5);
  if (blk >= size_t(rows) * nb) return;
  quantize_block_warp(x[blk * c::kBlock + lane], lane, out.q + blk * c::kBlock, out.e + blk);
}

// h = glu(g, u), quantized. The GLU's cost is latency: three independent chains of fp64
// operations per element (tanh(g/β1), sigmoid(g), tanh(u/β2); contract::glu_part). So each runs on
// its own thread: a block takes 64 elements, thread k·64 + e evaluates part k of element e into
// shared memory, then warps 0 and 1 combine (contract::glu_combine) and quantize the two 32-element
// blocks — contract::glu and quantize_block bit for bit. Measured on the H200 against one thread
// per element: decode line 89.7 against 91.0 µs (docs/performance.md).
constexpr int kGluElems = 64;
__global__ void __launch_bounds__(3 * kGluElems)
    glu_quantize_kernel(const float* gu, int rows, int K, GluParams glu, QuantRows out) {
  // Launched as a programmatic dependent (GEMV path): gu is complete only after the wait.
  kernels::detail::grid_launch_dependents();
  kernels::detail::grid_dependency_wait();
  __shared__ double part[3][kGluElems];
  const int t = threadIdx.x, k = t / kGluElems, e = t % kGluElems;
  const size_t n = size_t(rows) * K, i = size_t(blockIdx.x) * kGluElems + e;
  const size_t row = i / K, col = i % K;
  float g = 0.0f, u = 0.0f;
  if (i < n) g = gu[row * 2 * K + col], u = gu[row * 2 * K + K + col];
  if (i < n) part[k][e] = c::glu_has_part(k, glu) ? c::glu_part(k, g, u, glu) : 0.0;
  __syncthreads();
  if (k > 0 || i >= n) return;  // whole warps: K is a multiple of 32
  const float h = c::glu_combine(g, u, part[0][e], part[1][e], part[2][e], glu);
  quantize_block_warp(h, t & 31, out.q + (i & ~size_t(31)), out.e + i / c::kBlock);
}

unsigned quant_grid(int rows, int K) {
  return unsigned((size_t(rows) * (K / c::kBlock) + kQuantWarps - 1) / kQuantWarps);
}

// One thread per output column (blocks of kMergeThreads columns, T·chunks blocks): a decode step's
// single token spreads over the SMs instead of one block walking its row. round: the y values are
// read rounded to bf16 and the sum is stored rounded (RNE) — the same bits as rounding y and out
// in passes of their own (rounding is idempotent, so rows already rounded read unchanged).
constexpr int kMergeThreads = 128;
template <bool kRound>
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const float* y, const int32_t* token_offsets, const int32_t* pair,
                 const float* weight, float* out, int H, int chunks) {
  const size_t t = blockIdx.x / unsigned(chunks);
  const int d = int(blockIdx.x % unsigned(chunks)) * kMergeThreads + int(threadIdx.x);
  if (d >= H) return;
  const int q0 = token_offsets[t], q1 = token_offsets[t + 1];
  float acc = 0.0f;
  for (int q = q0; q < q1; q++) {
    float v = y[size_t(pair[q]) * H + d];
    if (kRound) v = ::strata::round_bf16(v);
    acc = __fadd_rn(acc, __fmul_rn(weight[q], v));
  }
  out[t * H + d] = kRound ? ::strata::round_bf16(acc) : acc;
}

}  // namespace

Workspace carve(void* base, int T, int P, int H, int I) {
  char* b = static_cast<char*>(base);
  size_t off = 0;
  Workspace w;
  w.x = carve_rows(b, off, T, H);
  w.gu = take<float>(b, off, size_t(P) * size_t(I) * 8);
  w.h_q = carve_rows(b, off, P, I);
  w.xp = carve_planes(b, off, T, H);
  w.hp = carve_planes(b, off, P, I);
  w.bytes = off;
  return w;
}

Status quantize_rows(const float* x, int rows, int K, const QuantRows& out, void* stream) {
  if (rows == 0) return {};
  quantize_kernel<<<quant_grid(rows, K), kQuantWarps * 32, 0, kernels::detail::as_stream(stream)>>>(
      x, rows, K, out);
  return kernels::detail::launch_status();
}

Status glu_quantize_rows(const float* gu, int rows, int K, const GluParams& glu,
                         const QuantRows& out, bool dependent, void* stream) {
  if (rows == 0) return {};
  return kernels::detail::launch_pdl(glu_quantize_kernel,
                                     dim3(unsigned((size_t(rows) * K + kGluElems - 1) / kGluElems)),
                                     dim3(3 * kGluElems), stream, dependent, gu, rows, K, glu, out);
}

}  // namespace detail

size_t experts_workspace_bytes(int T, int P, int H, int I) {
  return detail::carve(nullptr, T, P, H, I).bytes;
}

Status grouped_experts(const ExpertBatch& b, void* workspace, size_t workspace_bytes,
                       ExpertPath path, void* stream) {
  namespace kd = kernels::detail;
  if (b.H <= 0 || b.I <= 0 || b.H % contract::kBlock || b.I % contract::kBlock)
    return kd::invalid("grouped_experts: H and I must be positive multiples of 32");
  if (b.G < 0 || b.P < 0 || b.T < 0) return kd::invalid("grouped_experts: negative count");
  if (b.G == 0 || b.P == 0) return {};
  const detail::Workspace ws = detail::carve(workspace, b.T, b.P, b.H, b.I);
  if (workspace == nullptr || workspace_bytes < ws.bytes)
    return kd::invalid("grouped_experts: workspace smaller than experts_workspace_bytes()");
  // automatic: GEMM for many tokens per expert, falling back to the GEMV path (same bits) for
  // shapes the GEMM path does not take. A forced path never falls back: "not supported" is
  // reported as such.
  const bool automatic = path == ExpertPath::automatic;
  if (automatic) {
    const bool gemm = detail::gemm_supports(b.H) && detail::gemm_supports(b.I);
    path = !gemm || double(b.P) < kGemmMinMeanPairsPerGroup * b.G ? ExpertPath::gemv
           : b.P >= (long long)kWgmmaMinMeanPairsPerGroup * b.G   ? ExpertPath::wgmma
                                                                  : ExpertPath::gemm;
  }

  if (Status s = detail::quantize_rows(b.x, b.T, b.H, ws.x, stream); !s.ok()) return s;
  Status s;
  if (path == ExpertPath::imma) s = detail::imma_gate_up(b, ws, stream);
  if (path == ExpertPath::gemm) s = detail::gemm_gate_up(b, ws, stream);
  if (path == ExpertPath::wgmma) s = detail::wgmma_gate_up(b, ws, stream);
  if (path == ExpertPath::gemv) s = detail::gemv_gate_up(b, ws, stream);
  if (!s.ok()) return s;
  if (s = detail::glu_quantize_rows(ws.gu, b.P, b.I, b.glu, ws.h_q, path == ExpertPath::gemv,
                                    stream);
      !s.ok())
    return s;
  if (path == ExpertPath::imma) s = detail::imma_down(b, ws, stream);
  if (path == ExpertPath::gemm) s = detail::gemm_down(b, ws, stream);
  if (path == ExpertPath::wgmma) s = detail::wgmma_down(b, ws, stream);
  if (path == ExpertPath::gemv) s = detail::gemv_down(b, ws, stream);
  return s;
}

Status gemm_window_counts(const void* workspace, int T, int P, int H, int I,
                          GemmWindowCounts* out) {
  namespace kd = kernels::detail;
  if (workspace == nullptr || out == nullptr || T < 0 || P < 0)
    return kd::invalid("gemm_window_counts: bad arguments");
  const detail::Workspace ws = detail::carve(const_cast<void*>(workspace), T, P, H, I);
  *out = GemmWindowCounts{};
  const auto count = [](const int32_t* meta, int rows, long long& ok, long long& wide,
                        long long& poisoned) -> Status {
    if (rows == 0) return {};
    std::vector<int32_t> m(size_t(rows) * 2);
    if (cudaError_t e = cudaMemcpy(m.data(), meta, m.size() * 4, cudaMemcpyDeviceToHost);
        e != cudaSuccess)
      return kd::status_of(e);
    for (int r = 0; r < rows; r++) {
      const int32_t st = m[size_t(r) * 2 + 1];
      ok += st == contract::intsum::kTokenOk;
      wide += st == contract::intsum::kTokenSpan;
      poisoned += st == contract::intsum::kTokenPoisoned;
    }
    return {};
  };
  if (Status s = count(ws.xp.meta, T, out->x_ok, out->x_wide, out->x_poisoned); !s.ok()) return s;
  return count(ws.hp.meta, P, out->h_ok, out->h_wide, out->h_poisoned);
}

Status merge_weighted(const float* y, const int32_t* token_offsets, const int32_t* pair,
                      const float* weight, float* out, int T, int H, void* stream,
                      bool round_bf16) {
  if (T < 0 || H <= 0) return kernels::detail::invalid("merge_weighted: bad T or H");
  if (T == 0) return {};
  const int chunks = (H + detail::kMergeThreads - 1) / detail::kMergeThreads;
  if (size_t(T) * size_t(chunks) > 0x7fffffffu)
    return kernels::detail::invalid("merge_weighted: T too large");
  auto* k = round_bf16 ? detail::merge_kernel<true> : detail::merge_kernel<false>;
  k<<<unsigned(size_t(T) * size_t(chunks)), detail::kMergeThreads, 0,
      kernels::detail::as_stream(stream)>>>(y, token_offsets, pair, weight, out, H, chunks);
  return kernels::detail::launch_status();
}

}  // namespace strata::kernels::moe
