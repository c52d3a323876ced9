// Small CUDA-side helpers shared by the launchers of kernels/ops, kernels/moe, kernels/gemm and
// kernels/sample: the Status of the last launch, stream casts, block reductions. CUDA headers
// only; included by .cu files, never by host code.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "kernels/runtime.h"

namespace strata::kernels::detail {

inline cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

// Status of the launch just made (cudaGetLastError clears launch-configuration errors).
inline Status launch_status() {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return {static_cast<int>(e), cudaGetErrorString(e)};
}

inline Status status_of(cudaError_t e) {
  if (e == cudaSuccess) return {};
  return {static_cast<int>(e), cudaGetErrorString(e)};
}

// Bad arguments reach the launcher only through programmer error; they are reported as a status
// (cudaErrorInvalidValue) rather than launched.
inline Status invalid(const char* what) {
  return {static_cast<int>(cudaErrorInvalidValue), what};
}

// kernel<<<grid, block, smem, stream>>>(args...), in clusters of `cluster` CTAs along x when
// cluster > 1 (sm_90; grid.x a multiple of cluster, cluster ≤ 8, the portable limit). dependent:
// launched as a programmatic dependent of the kernel before it in the stream — it may start while
// that one still runs, so it must wait (grid_dependency_wait) before reading that kernel's results.
template <typename... Params, typename... Args>
Status launch_ex(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, unsigned cluster,
                 bool dependent, void* stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = as_stream(stream);
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (dependent) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return status_of(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// kernel<<<grid, block, 0, stream>>>(args...), a programmatic dependent if `dependent`.
template <typename... Params, typename... Args>
Status launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, void* stream, bool dependent,
                  Args&&... args) {
  return launch_ex(kernel, grid, block, 0, 1, dependent, stream, std::forward<Args>(args)...);
}

// kernel<<<grid, block, smem, stream>>>(args...) in clusters of `cluster` CTAs along x.
template <typename... Params, typename... Args>
Status launch_clustered_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                             unsigned cluster, void* stream, Args&&... args) {
  return launch_ex(kernel, grid, block, smem, cluster, false, stream, std::forward<Args>(args)...);
}
// The same without dynamic shared memory.
template <typename... Params, typename... Args>
Status launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, unsigned cluster,
                        void* stream, Args&&... args) {
  return launch_clustered_smem(kernel, grid, block, 0, cluster, stream,
                               std::forward<Args>(args)...);
}

// Programmatic dependent launch (sm_90). grid_dependency_wait: wait until the grid before this
// one in the stream has completed and its writes are visible (returns at once in a plain launch).
// grid_launch_dependents: once every CTA of this grid has called it (or exited), the next grid,
// if launched as a dependent, may start.
__device__ __forceinline__ void grid_dependency_wait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void grid_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory. Order is fixed by the launch shape, so results do
// not vary run to run.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace strata::kernels::detail
