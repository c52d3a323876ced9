// GPU sampling (see kernels/sample/sample.h). Greedy is one block-wide arg-max per row. Otherwise
// each row is sorted by decreasing logit with CUB's segmented radix sort (stable: equal logits keep
// increasing ids), then one block per row walks the sorted candidates in chunks with a block scan
// in double: pass 1 the softmax normaliser, pass 2 the top-p cut, pass 3 the draw.
#include <cuda_runtime.h>
#include <cub/cub.cuh>

#include "kernels/ops/launch.cuh"
#include "kernels/sample/sample.h"

namespace strata::kernels::sample {
namespace {

constexpr int kThreads = 512;

__global__ void argmax_kernel(const float* logits, int V, int32_t* ids) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* row = logits + size_t(blockIdx.x) * V;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    if (row[i] > bv || (row[i] == bv && i < bi)) bv = row[i], bi = i;
  for (int off = 16; off; off >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
  }
  if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = bv, si[threadIdx.x >> 5] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < int(blockDim.x >> 5); w++)
      if (sv[w] > bv || (sv[w] == bv && si[w] < bi)) bv = sv[w], bi = si[w];
    ids[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;  // all-NaN row: token 0
  }
}

__global__ void iota_kernel(int32_t* v, int B, int V) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < size_t(B) * V;
       i += size_t(gridDim.x) * blockDim.x)
    v[i] = int32_t(i % size_t(V));
}

__global__ void offsets_kernel(int32_t* off, int B, int V) {
  for (int i = threadIdx.x; i <= B; i += blockDim.x) off[i] = i * V;
}

__device__ double block_sum_f64(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0.0;
  for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// One block per row over sorted candidates, in double like the host's pick_token
// (engine/sampler.cpp): p_i = exp((l_i − l_0) · (1 / T)), Σ, the top-p cut and the draw, so an
// edge between two candidates moves by ~1e-16 of the mass, not by fp32 sums' ~1e-7 (which over
// 163,840 near-equal tail probabilities shifts the pick by whole candidates).
__global__ void draw_kernel(const float* sorted_logits, const int32_t* sorted_ids, int V,
                            SamplingParams p, const double* uniform, int32_t* ids) {
  using Scan = cub::BlockScan<double, kThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ double scratch[32];
  __shared__ int found;
  const float* lg = sorted_logits + size_t(blockIdx.x) * V;
  const int32_t* id = sorted_ids + size_t(blockIdx.x) * V;
  const int n = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  const double mx = double(lg[0]);
  const double inv_t = 1.0 / double(p.temperature);
  auto prob = [&](int i) { return i < n ? exp((double(lg[i]) - mx) * inv_t) : 0.0; };

  // Pass 1: Z over the kept candidates.
  double z = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) z += prob(i);
  z = block_sum_f64(z, scratch);

  // Pass 2: top-p cut m = first index whose cumulative probability reaches top_p (+1).
  int m = n;
  double zk = z;
  if (p.top_p < 1.0f) {
    const double target = double(p.top_p);
    if (threadIdx.x == 0) found = n;
    __syncthreads();
    double run = 0.0;
    for (int base = 0; base < n; base += blockDim.x) {
      double v = prob(base + threadIdx.x), cum, total;
      Scan(scan_tmp).InclusiveSum(v, cum, total);
      if (base + int(threadIdx.x) < n && (run + cum) / z >= target)
        atomicMin(&found, base + threadIdx.x + 1);
      __syncthreads();
      run += total;
      if (found < n) break;
    }
    m = found;
    // Z of the kept prefix.
    double zz = 0.0;
    for (int i = threadIdx.x; i < m; i += blockDim.x) zz += prob(i);
    zk = block_sum_f64(zz, scratch);
  }

  // Pass 3: the first candidate whose cumulative probability exceeds u·Z_kept.
  const double target = uniform[blockIdx.x] * zk;
  if (threadIdx.x == 0) found = m - 1;  // rounding at the very end: the last kept candidate
  __syncthreads();
  double run = 0.0;
  for (int base = 0; base < m; base += blockDim.x) {
    double v = base + int(threadIdx.x) < m ? prob(base + threadIdx.x) : 0.0, cum, total;
    Scan(scan_tmp).InclusiveSum(v, cum, total);
    if (base + int(threadIdx.x) < m && run + cum > target) atomicMin(&found, base + threadIdx.x);
    __syncthreads();
    run += total;
    if (found < m - 1 || base + int(blockDim.x) >= m) break;
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = id[found];
}

size_t align256(size_t n) {
  return (n + 255) & ~size_t(255);
}

size_t sort_temp_bytes(int B, int V) {
  size_t t = 0;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, t, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), B * V, B,
      static_cast<const int32_t*>(nullptr), static_cast<const int32_t*>(nullptr));
  return t;
}

}  // namespace

size_t sample_workspace_bytes(int B, int V) {
  const size_t n = size_t(B) * V;
  return align256(n * 4) * 3 + align256(size_t(B + 1) * 4) + align256(sort_temp_bytes(B, V));
}

Status sample(const float* logits, int B, int V, const SamplingParams& p, const double* uniform,
              int32_t* ids, void* workspace, size_t workspace_bytes, void* stream) {
  namespace kd = kernels::detail;
  if (B < 0 || V <= 0) return kd::invalid("sample: bad B or V");
  if (B == 0) return {};
  cudaStream_t st = kd::as_stream(stream);
  if (p.temperature <= 0.0f) {
    argmax_kernel<<<unsigned(B), 1024, 0, st>>>(logits, V, ids);
    return kd::launch_status();
  }
  if (!(p.top_p > 0.0f)) return kd::invalid("sample: top_p must be in (0, 1]");
  if (workspace == nullptr || workspace_bytes < sample_workspace_bytes(B, V))
    return kd::invalid("sample: workspace smaller than sample_workspace_bytes()");
  const size_t n = size_t(B) * V;
  char* w = static_cast<char*>(workspace);
  float* keys = reinterpret_cast<float*>(w);
  int32_t* vals_in = reinterpret_cast<int32_t*>(w + align256(n * 4));
  int32_t* vals = reinterpret_cast<int32_t*>(w + 2 * align256(n * 4));
  int32_t* off = reinterpret_cast<int32_t*>(w + 3 * align256(n * 4));
  void* tmp = w + 3 * align256(n * 4) + align256(size_t(B + 1) * 4);
  size_t tmp_bytes = sort_temp_bytes(B, V);
  iota_kernel<<<1024, 256, 0, st>>>(vals_in, B, V);
  offsets_kernel<<<1, 256, 0, st>>>(off, B, V);
  cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairsDescending(
      tmp, tmp_bytes, logits, keys, vals_in, vals, int(n), B, off, off + 1, 0, 32, st);
  if (e != cudaSuccess) return kd::status_of(e);
  draw_kernel<<<unsigned(B), kThreads, 0, st>>>(keys, vals, V, p, uniform, ids);
  return kd::launch_status();
}

}  // namespace strata::kernels::sample
