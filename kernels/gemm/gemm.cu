// cuBLASLt bf16 GEMM with per-shape plans (see kernels/gemm/gemm.h).
//
// Row-major y[T, N] is column-major yᵀ [N, T]; row-major W[N, K] is column-major [K, N] and x[T, K]
// column-major [K, T]. So yᵀ = op(W)ᵀ… in cuBLAS terms: C[N, T] = Aᵀ · B with A = W as [K, N]
// (transa = T), B = x as [K, T] (transb = N) — the "TN" layout cuBLASLt serves best.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <tuple>

#include "kernels/gemm/gemm.h"
#include "kernels/ops/launch.cuh"
#include "storage/error.h"

namespace strata::kernels::gemm {

namespace {

Status blas_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return {};
  return {1000 + int(s), what};
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  void destroy() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    op = nullptr, a = b = c = nullptr;
  }
};

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, Plan> plans;

  Status plan(Plan& p, int64_t T, int64_t N, int64_t K, OutType out) {
    const cudaDataType_t ct = out == OutType::f32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasStatus_t s = cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (s != CUBLAS_STATUS_SUCCESS) return blas_status(s, "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if ((s = cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, uint64_t(K), uint64_t(N), K)) ||
        (s = cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, uint64_t(K), uint64_t(T), K)) ||
        (s = cublasLtMatrixLayoutCreate(&p.c, ct, uint64_t(N), uint64_t(T), N)))
      return blas_status(s, "cublasLtMatrixLayoutCreate");
    cublasLtMatmulPreference_t pref = nullptr;
    if ((s = cublasLtMatmulPreferenceCreate(&pref)))
      return blas_status(s, "cublasLtMatmulPreferenceCreate");
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                         &workspace_bytes, sizeof workspace_bytes);
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    s = cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS) return blas_status(s, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0)
      return {1000 + int(CUBLAS_STATUS_NOT_SUPPORTED), "cuBLASLt: no algorithm for this shape"};
    p.algo = res.algo;
    p.ok = true;
    return {};
  }
};

Gemm::Gemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  if (cublasLtCreate(&impl_->handle) != CUBLAS_STATUS_SUCCESS)
    throw Error("cuBLASLt: cublasLtCreate failed (no GPU or driver?)");
  impl_->workspace_bytes = workspace_bytes;
  if (workspace_bytes && cudaMalloc(&impl_->workspace, workspace_bytes) != cudaSuccess) {
    cublasLtDestroy(impl_->handle);
    throw Error("cuBLASLt: cannot allocate " + std::to_string(workspace_bytes) +
                " bytes of GEMM workspace");
  }
}

Gemm::~Gemm() {
  for (auto& kv : impl_->plans) kv.second.destroy();
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

size_t Gemm::plans() const {
  return impl_->plans.size();
}

Status Gemm::linear(const uint16_t* x, const uint16_t* W, void* y, OutType out, int64_t T,
                    int64_t N, int64_t K, void* stream) {
  if (T < 0 || N <= 0 || K <= 0) return kernels::detail::invalid("gemm: bad T, N or K");
  if (T == 0) return {};
  auto key = std::make_tuple(T, N, K, int(out));
  auto it = impl_->plans.find(key);
  if (it == impl_->plans.end()) {
    Plan p;
    Status s = impl_->plan(p, T, N, K, out);
    if (!s.ok()) {
      p.destroy();
      return s;
    }
    it = impl_->plans.emplace(key, p).first;
  }
  const Plan& p = it->second;
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t s =
      cublasLtMatmul(impl_->handle, p.op, &alpha, W, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo,
                     impl_->workspace, impl_->workspace_bytes, kernels::detail::as_stream(stream));
  return blas_status(s, "cublasLtMatmul");
}

}  // namespace strata::kernels::gemm
