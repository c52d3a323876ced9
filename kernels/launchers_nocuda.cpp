// Fallbacks for builds without CUDA (-DSTRATA_CUDA=OFF, e.g. a fresh machine without nvcc): every
// launcher of kernels/{gemm,kda,mla,moe,ops,sample} exists and returns "no CUDA in this build"
// (workspace sizes are 0), so host code that reaches the kernels through their CUDA-free launchers
// (engine/cuda_backend.cpp) links without CUDA and refuses at run time, where
// kernels::cuda_device_count() is 0 anyway. A launcher added to one of those headers needs its
// stub here, or the CPU build (scripts/check-fresh.sh, CI) fails to link. Not here: the runtime
// wrappers (kernels/runtime_nocuda.cpp).
#ifndef STRATA_HAVE_CUDA
#include "kernels/gemm/gemm.h"
#include "kernels/kda/kda.h"
#include "kernels/mla/mla.h"
#include "kernels/moe/experts.h"
#include "kernels/ops/ops.h"
#include "kernels/sample/sample.h"

namespace strata::kernels {
namespace {
Status none() {
  return {-1, "no CUDA in this build"};
}
}  // namespace

namespace gemm {
struct Gemm::Impl {};
Gemm::Gemm(size_t) {}
Gemm::~Gemm() = default;
Status Gemm::linear(const uint16_t*, const uint16_t*, void*, OutType, int64_t, int64_t, int64_t,
                    void*) {
  return none();
}
size_t Gemm::plans() const {
  return 0;
}
}  // namespace gemm

namespace kda {
size_t prefill_workspace_bytes(int, int, int64_t, int64_t) {
  return 0;
}
Status prefill(const Params&, const Inputs&, const int32_t*, int, State, uint16_t*, void*, size_t,
               void*) {
  return none();
}
Status decode(const Params&, const Inputs&, int, State, uint16_t*, uint16_t*, void*, int) {
  return none();
}
int decode_split_for(int) {
  return 1;
}
}  // namespace kda

namespace mla {
Status write_latent(const uint16_t*, const float*, float, uint16_t*, int64_t, int64_t, void*) {
  return none();
}
size_t prefill_workspace_bytes(int, int64_t) {
  return 0;
}
size_t prefill_workspace_bytes_bounded(int, int64_t, int64_t) {
  return 0;
}
int64_t prefill_tile_positions(int, int64_t, int64_t, size_t) {
  return 0;
}
Status prefill(int, const uint16_t*, const uint16_t*, int64_t, const uint16_t*, uint16_t*, int64_t,
               void*, size_t, void*) {
  return none();
}
size_t decode_workspace_bytes(int, int, int64_t) {
  return 0;
}
Status decode(int, const uint16_t*, const uint16_t*, int64_t, const int32_t*, int, const uint16_t*,
              uint16_t*, void*, size_t, void*) {
  return none();
}
}  // namespace mla

namespace moe {
size_t experts_workspace_bytes(int, int, int, int) {
  return 0;
}
Status grouped_experts(const ExpertBatch&, void*, size_t, ExpertPath, void*) {
  return none();
}
Status merge_weighted(const float*, const int32_t*, const int32_t*, const float*, float*, int, int,
                      void*) {
  return none();
}
}  // namespace moe

namespace ops {
Status kimi_rms_norm(const float*, const float*, float*, int64_t, int64_t, float, bool, void*) {
  return none();
}
Status l2_norm(const float*, float*, int64_t, int64_t, float, bool, void*) {
  return none();
}
Status gated_rms_norm(const float*, const float*, const float*, float*, int64_t, int64_t, float,
                      bool, void*) {
  return none();
}
Status attn_res_mix(const AttnResSources&, const float*, const float*, float*, int64_t, int64_t,
                    float, bool, void*) {
  return none();
}
Status glu(const GluParams&, const float*, const float*, float*, int64_t, bool, void*) {
  return none();
}
Status glu_fused(const GluParams&, const float*, float*, int64_t, int64_t, bool, void*) {
  return none();
}
Status route(const float*, const RouterParams&, int32_t*, float*, int64_t, void*) {
  return none();
}
Status embedding_gather(const uint16_t*, int64_t, int64_t, const int32_t*, int64_t, float*, void*) {
  return none();
}
Status f32_to_bf16(const float*, uint16_t*, int64_t, void*) {
  return none();
}
Status bf16_to_f32(const uint16_t*, float*, int64_t, void*) {
  return none();
}
Status add_inplace(float*, const float*, int64_t, bool, void*) {
  return none();
}
Status round_bf16_inplace(float*, int64_t, void*) {
  return none();
}
Status sigmoid_gate_bf16(uint16_t*, const uint16_t*, int64_t, void*) {
  return none();
}
}  // namespace ops

namespace sample {
size_t sample_workspace_bytes(int, int) {
  return 0;
}
Status sample(const float*, int, int, const SamplingParams&, const float*, int32_t*, void*, size_t,
              void*) {
  return none();
}
}  // namespace sample

}  // namespace strata::kernels
#endif
