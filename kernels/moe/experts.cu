// Grouped MXFP4 experts: workspace layout, activation quantization (numerics.md §2), path
// dispatch and the expert-id-order merge (§5) — see kernels/moe/experts.h. The projection
// kernels live in gemv.cu and imma.cu.
#include <cuda_runtime.h>

#include "kernels/moe/paths.h"
#include "kernels/ops/launch.cuh"
#include "storage/expert_contract.h"

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
  r.poison = take<int32_t>(base, off, size_t(rows) * 4);
  return r;
}

// One thread per 32-block: the block is loaded into registers, quantized by the contract's own
// routine, and stored as two 16-byte words.
__global__ void quantize_kernel(const float* x, int K, QuantRows out) {
  const int nb = K / c::kBlock;
  const size_t row = blockIdx.x;
  int bad = 0;
  for (int b = threadIdx.x; b < nb; b += blockDim.x) {
    float xs[c::kBlock];
    const float4* src = reinterpret_cast<const float4*>(x + row * K + size_t(b) * c::kBlock);
#pragma unroll
    for (int i = 0; i < c::kBlock / 4; i++) {
      float4 v = src[i];
      xs[4 * i] = v.x, xs[4 * i + 1] = v.y, xs[4 * i + 2] = v.z, xs[4 * i + 3] = v.w;
    }
    alignas(16) int8_t qs[c::kBlock];
    int e = 0;
    if (!c::quantize_block(xs, qs, &e)) bad = 1;
    uint4* dst = reinterpret_cast<uint4*>(out.q + row * K + size_t(b) * c::kBlock);
    dst[0] = reinterpret_cast<const uint4*>(qs)[0];
    dst[1] = reinterpret_cast<const uint4*>(qs)[1];
    out.e[row * nb + b] = e;
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) out.poison[row] = bad;
}

__global__ void merge_kernel(const float* y, const int32_t* token_offsets, const int32_t* pair,
                             const float* weight, float* out, int H) {
  const size_t t = blockIdx.x;
  const int q0 = token_offsets[t], q1 = token_offsets[t + 1];
  for (int d = threadIdx.x; d < H; d += blockDim.x) {
    float acc = 0.0f;
    for (int q = q0; q < q1; q++)
      acc = __fadd_rn(acc, __fmul_rn(weight[q], y[size_t(pair[q]) * H + d]));
    out[t * H + d] = acc;
  }
}

}  // namespace

Workspace carve(void* base, int T, int P, int H, int I) {
  char* b = static_cast<char*>(base);
  size_t off = 0;
  Workspace w;
  w.x = carve_rows(b, off, T, H);
  w.h = take<float>(b, off, size_t(P) * size_t(I) * 4);
  w.h_q = carve_rows(b, off, P, I);
  w.bytes = off;
  return w;
}

Status quantize_rows(const float* x, int rows, int K, const QuantRows& out, void* stream) {
  if (rows == 0) return {};
  quantize_kernel<<<unsigned(rows), 128, 0, kernels::detail::as_stream(stream)>>>(x, K, out);
  return kernels::detail::launch_status();
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
  // automatic: IMMA for many tokens per expert, falling back to the GEMV path (same bits) for
  // shapes the IMMA kernel does not take. A forced path never falls back: "not supported" is
  // reported as such.
  const bool automatic = path == ExpertPath::automatic;
  if (automatic)
    path = b.max_pairs_per_group >= kImmaMinPairsPerGroup ? ExpertPath::imma : ExpertPath::gemv;
  const auto not_supported = [](const Status& s) { return s.code == int(cudaErrorNotSupported); };

  if (Status s = detail::quantize_rows(b.x, b.T, b.H, ws.x, stream); !s.ok()) return s;
  Status s;
  if (path == ExpertPath::imma) {
    s = detail::imma_gate_up(b, ws, stream);
    if (not_supported(s) && automatic) path = ExpertPath::gemv;
  }
  if (path == ExpertPath::gemv) s = detail::gemv_gate_up(b, ws, stream);
  if (!s.ok()) return s;
  if (s = detail::quantize_rows(ws.h, b.P, b.I, ws.h_q, stream); !s.ok()) return s;
  if (path == ExpertPath::imma) {
    s = detail::imma_down(b, ws, stream);
    if (not_supported(s) && automatic) path = ExpertPath::gemv;
  }
  if (path == ExpertPath::gemv) s = detail::gemv_down(b, ws, stream);
  return s;
}

Status merge_weighted(const float* y, const int32_t* token_offsets, const int32_t* pair,
                      const float* weight, float* out, int T, int H, void* stream) {
  if (T < 0 || H <= 0) return kernels::detail::invalid("merge_weighted: bad T or H");
  if (T == 0) return {};
  detail::merge_kernel<<<unsigned(T), 256, 0, kernels::detail::as_stream(stream)>>>(
      y, token_offsets, pair, weight, out, H);
  return kernels::detail::launch_status();
}

}  // namespace strata::kernels::moe
