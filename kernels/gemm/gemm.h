// Dense bf16 GEMMs of the trunk through cuBLASLt: KDA q/k/v/g/f/b/o projections, MLA projections,
// shared experts, dense layer 0, the latent down/up projections, the router and lm_head.
//
//   y[T, N] = x[T, K] · W[N, K]ᵀ      x, W bf16 (row-major, the checkpoint's [out, in] layout),
//                                     fp32 accumulation, y fp32 or bf16 (RNE).
//
// One Gemm object owns the cuBLASLt handle and one workspace, both made at start-up. The matmul
// descriptor, layouts and the algorithm are chosen once per (T, N, K, output type) by cuBLASLt's
// heuristic and cached; later calls of that shape only launch (STYLE.md §9). Not thread-safe: one
// Gemm per stream/thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/runtime.h"

namespace strata::kernels::gemm {

enum class OutType { f32, bf16 };

class Gemm {
 public:
  // Throws strata::Error if cuBLASLt cannot be initialised or the workspace cannot be allocated.
  explicit Gemm(size_t workspace_bytes = size_t(32) << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y = x · Wᵀ (see above). Pointers are device memory, 16-byte aligned; K and N multiples of 8.
  // Returns a non-ok Status (code = cuBLAS status + 1000) when cuBLASLt has no algorithm for the
  // shape or the launch fails.
  Status linear(const uint16_t* x, const uint16_t* W, void* y, OutType out, int64_t T, int64_t N,
                int64_t K, void* stream);

  // Number of distinct shapes planned so far (for tests and logs).
  size_t plans() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::kernels::gemm
