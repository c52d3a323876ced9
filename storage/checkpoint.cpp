// Checkpoint (stub while the implementation lands).
#include "storage/checkpoint.h"

#include "storage/error.h"

namespace strata {
uint64_t TensorSpec::nbytes() const {
  return 0;
}
std::vector<TensorSpec> model_tensor_specs(const ModelConfig&) {
  return {};
}
std::string expert_tensor_name(const ModelConfig&, int, int, std::string_view) {
  return {};
}
Checkpoint::Checkpoint(const std::filesystem::path& d, CheckpointOptions) {
  throw Error(d.string() + ": not implemented");
}
Checkpoint::~Checkpoint() {}
uint64_t Checkpoint::total_file_bytes() const {
  return 0;
}
const TensorInfo* Checkpoint::find(std::string_view) const {
  return nullptr;
}
const TensorInfo& Checkpoint::get(std::string_view) const {
  throw Error("not implemented");
}
const TensorInfo& Checkpoint::get(std::string_view, DType, const std::vector<int64_t>&) const {
  throw Error("not implemented");
}
std::vector<float> Checkpoint::load_f32(std::string_view, const std::vector<int64_t>&) const {
  return {};
}
const TensorInfo& Checkpoint::claim(std::string_view) {
  throw Error("not implemented");
}
const TensorInfo& Checkpoint::claim(std::string_view, DType, const std::vector<int64_t>&) {
  throw Error("not implemented");
}
void Checkpoint::claim_all_specs() {}
void Checkpoint::check_all_claimed() const {}
bool Checkpoint::has_experts(int) const {
  return false;
}
const ExpertTensors& Checkpoint::expert(int, int) const {
  throw Error("not implemented");
}
void Checkpoint::validate_expert_scales(int, int) const {}
void Checkpoint::validate_shapes() const {}
void Checkpoint::open_shards() {}
void Checkpoint::build_expert_index() {}
}  // namespace strata
