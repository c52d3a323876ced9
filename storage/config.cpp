// config.json parsing (stub while the implementation lands).
#include "storage/config.h"

#include "storage/error.h"

namespace strata {
const char* layer_kind_name(LayerKind k) {
  return k == LayerKind::kda ? "kda" : "mla";
}
const char* activation_name(Activation a) {
  return a == Activation::situ ? "situ" : "silu";
}
const char* gate_kind_name(KdaGateKind g) {
  return g == KdaGateKind::bounded_sigmoid ? "bounded_sigmoid" : "softplus";
}
const char* router_form_name(RouterWeightForm f) {
  return f == RouterWeightForm::unbiased ? "unbiased" : "bias_in_place";
}
int ModelConfig::num_kda_layers() const {
  return 0;
}
int ModelConfig::num_mla_layers() const {
  return 0;
}
int ModelConfig::num_moe_layers() const {
  return 0;
}
ModelConfig load_config(const std::filesystem::path& p) {
  throw Error(p.string() + ": not implemented");
}
ModelConfig parse_config(const std::string&, const std::string& s) {
  throw Error(s + ": not implemented");
}
std::string describe_config(const ModelConfig&) {
  return {};
}
ModelCosts compute_costs(const ModelConfig&) {
  return {};
}
}  // namespace strata
