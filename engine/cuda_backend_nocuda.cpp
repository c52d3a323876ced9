// CudaBackend in a build without CUDA (-DSTRATA_CUDA=OFF): the class exists so the CLI links and
// --device gpu fails with one line; nothing else is reachable (the constructor always throws).
#ifndef STRATA_HAVE_CUDA
#include "engine/cuda_backend.h"
#include "storage/error.h"

namespace strata::engine {

struct CudaBackend::Impl {};
struct CudaBackend::Graphs {};
struct CudaBackend::Profile {};

CudaBackend::CudaBackend(const Model& model, BackendOptions options, CudaBackendOptions cuda)
    : model_(model), c_(model.config()), opt_(std::move(options)), cuda_(cuda) {
  throw Error("--device gpu: this strata was built without CUDA (configure with STRATA_CUDA=ON)");
}
CudaBackend::~CudaBackend() = default;

// Unreachable: no object is ever constructed.
void CudaBackend::reset_slot(int) {
  STRATA_ASSERT(false);
}
uint64_t CudaBackend::state_bytes(int) const {
  STRATA_ASSERT(false);
  return 0;
}
void CudaBackend::begin_step(const StepShape&) {
  STRATA_ASSERT(false);
}
Act CudaBackend::alloc(int64_t, int64_t) {
  STRATA_ASSERT(false);
  return {};
}
void CudaBackend::commit_step(const StepShape&) {
  STRATA_ASSERT(false);
}
void CudaBackend::embed(std::span<const int32_t>, Act) {
  STRATA_ASSERT(false);
}
void CudaBackend::mix(int, MixSite, std::span<const Act>, Act) {
  STRATA_ASSERT(false);
}
void CudaBackend::copy(Act, Act) {
  STRATA_ASSERT(false);
}
void CudaBackend::norm(int, NormSite, Act, Act) {
  STRATA_ASSERT(false);
}
void CudaBackend::token_mixer(int, const StepShape&, Act, Act) {
  STRATA_ASSERT(false);
}
void CudaBackend::ffn(int, const StepShape&, Act, Act) {
  STRATA_ASSERT(false);
}
void CudaBackend::add(Act, Act) {
  STRATA_ASSERT(false);
}
void CudaBackend::logits(Act, std::span<const int64_t>, float*) {
  STRATA_ASSERT(false);
}
void CudaBackend::sample(Act, std::span<const int64_t>, std::span<const TokenDraw>, int64_t,
                         int32_t*) {
  STRATA_ASSERT(false);
}
std::vector<std::pair<std::string, double>> CudaBackend::telemetry_values() const {
  STRATA_ASSERT(false);
  return {};
}
void CudaBackend::reset_telemetry() {
  STRATA_ASSERT(false);
}
void CudaBackend::check_finite(Act, const StepShape&, int, const char*) {
  STRATA_ASSERT(false);
}
void CudaBackend::to_host(Act, float*) {
  STRATA_ASSERT(false);
}
void CudaBackend::from_host(const float*, Act) {
  STRATA_ASSERT(false);
}
int64_t CudaBackend::gpu_resident_experts() const {
  STRATA_ASSERT(false);
  return 0;
}
int64_t CudaBackend::routed_experts() const {
  STRATA_ASSERT(false);
  return 0;
}
std::string CudaBackend::telemetry_line() const {
  STRATA_ASSERT(false);
  return {};
}

}  // namespace strata::engine
#endif  // !STRATA_HAVE_CUDA
