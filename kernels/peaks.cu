// Copy-bandwidth and bf16-GEMM peaks (see peaks.h).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/gpu_timer.h"
#include "kernels/ops/launch.cuh"
#include "kernels/peaks.h"

namespace strata::kernels {
namespace {

Status cublas_status(cublasStatus_t e, const char* what) {
  Status s;
  if (e == CUBLAS_STATUS_SUCCESS) return s;
  s.code = 1000 + int(e);
  s.message = what;
  return s;
}

__global__ void fill_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16((float(h & 0xffff) / 65536.0f - 0.5f) * 0.25f);
  }
}

}  // namespace

PeakMeasurement measure_copy_bandwidth(int64_t bytes, int repeats) {
  PeakMeasurement m;
  char what[96];
  std::snprintf(what, sizeof what, "cudaMemcpyAsync D2D %.2f GiB, read+write counted",
                bytes / 1073741824.0);
  m.what = what;
  void *a = nullptr, *b = nullptr;
  cudaError_t e = cudaMalloc(&a, bytes);
  if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
  if (e == cudaSuccess) e = cudaMemset(a, 1, bytes);
  if (e != cudaSuccess) {
    m.status = detail::status_of(e);
    cudaFree(a);
    cudaFree(b);
    return m;
  }
  GpuTimes t = gpu_time([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, nullptr); },
                        nullptr, repeats, 2);
  m.status = detail::status_of(cudaError_t(t.code));
  m.median_s = t.median_s;
  m.value = t.median_s > 0 ? 2.0 * double(bytes) / t.median_s / 1e9 : 0;
  cudaFree(a);
  cudaFree(b);
  return m;
}

PeakMeasurement measure_host_copy(bool to_device, int64_t bytes, int repeats) {
  PeakMeasurement m;
  char what[96];
  std::snprintf(what, sizeof what, "cudaMemcpyAsync %s %.0f MiB, pinned host memory",
                to_device ? "H2D" : "D2H", bytes / 1048576.0);
  m.what = what;
  void* h = nullptr;
  void* d = nullptr;
  cudaError_t e = cudaMallocHost(&h, bytes);
  if (e == cudaSuccess) e = cudaMalloc(&d, bytes);
  if (e == cudaSuccess) e = cudaMemset(d, 1, bytes);
  if (e == cudaSuccess) {
    // Touch every host page so the copies do not time first-touch faults.
    for (int64_t i = 0; i < bytes; i += 4096) static_cast<char*>(h)[i] = char(i);
  }
  if (e != cudaSuccess) {
    m.status = detail::status_of(e);
    cudaFreeHost(h);
    cudaFree(d);
    return m;
  }
  GpuTimes t = gpu_time(
      [&] {
        if (to_device)
          cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, nullptr);
        else
          cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, nullptr);
      },
      nullptr, repeats, 2);
  m.status = detail::status_of(cudaError_t(t.code));
  m.median_s = t.median_s;
  m.value = t.median_s > 0 ? double(bytes) / t.median_s / 1e9 : 0;
  cudaFreeHost(h);
  cudaFree(d);
  return m;
}

PeakMeasurement measure_bf16_gemm(int64_t M, int64_t N, int64_t K, int repeats) {
  PeakMeasurement m;
  char what[96];
  std::snprintf(what, sizeof what, "cuBLASLt bf16 %lldx%lldx%lld, fp32 accumulate", (long long)M,
                (long long)N, (long long)K);
  m.what = what;
  __nv_bfloat16 *A = nullptr, *B = nullptr, *D = nullptr;
  void* ws = nullptr;
  const size_t ws_bytes = size_t(64) << 20;
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto cleanup = [&] {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
    cudaFree(A);
    cudaFree(B);
    cudaFree(D);
    cudaFree(ws);
  };
  cudaError_t e = cudaMalloc(&A, M * K * 2);
  if (e == cudaSuccess) e = cudaMalloc(&B, K * N * 2);
  if (e == cudaSuccess) e = cudaMalloc(&D, M * N * 2);
  if (e == cudaSuccess) e = cudaMalloc(&ws, ws_bytes);
  if (e != cudaSuccess) {
    m.status = detail::status_of(e);
    cleanup();
    return m;
  }
  fill_bf16<<<1024, 256>>>(A, M * K, 1);
  fill_bf16<<<1024, 256>>>(B, K * N, 2);
  // Column-major cuBLAS view: D^T[N,M] = B^T[N,K] · A^T[K,M]; row-major A, B, D as stored.
  cublasStatus_t c = cublasLtCreate(&lt);
  if (c == CUBLAS_STATUS_SUCCESS) c = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (c == CUBLAS_STATUS_SUCCESS) c = cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, N, K, N);
  if (c == CUBLAS_STATUS_SUCCESS) c = cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, M, K);
  if (c == CUBLAS_STATUS_SUCCESS) c = cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, N, M, N);
  if (c == CUBLAS_STATUS_SUCCESS) c = cublasLtMatmulPreferenceCreate(&pref);
  if (c == CUBLAS_STATUS_SUCCESS)
    c = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &ws_bytes, sizeof ws_bytes);
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  if (c == CUBLAS_STATUS_SUCCESS)
    c = cublasLtMatmulAlgoGetHeuristic(lt, op, lb, la, ld, ld, pref, 1, &heur, &found);
  if (c != CUBLAS_STATUS_SUCCESS || found == 0) {
    m.status = cublas_status(c == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : c,
                             "cuBLASLt: no bf16 GEMM algorithm");
    cleanup();
    return m;
  }
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t run = CUBLAS_STATUS_SUCCESS;
  GpuTimes t = gpu_time(
      [&] {
        cublasStatus_t r = cublasLtMatmul(lt, op, &alpha, B, lb, A, la, &beta, D, ld, D, ld,
                                          &heur.algo, ws, ws_bytes, nullptr);
        if (r != CUBLAS_STATUS_SUCCESS) run = r;
      },
      nullptr, repeats, 2);
  if (run != CUBLAS_STATUS_SUCCESS)
    m.status = cublas_status(run, "cuBLASLt: bf16 GEMM failed");
  else
    m.status = detail::status_of(cudaError_t(t.code));
  m.median_s = t.median_s;
  m.value = t.median_s > 0 ? 2.0 * double(M) * double(N) * double(K) / t.median_s / 1e12 : 0;
  cleanup();
  return m;
}

}  // namespace strata::kernels
