// Inspection of a forward pass (STYLE §4): named intermediates `blk.{layer}.{site}` (and a few
// model-level sites: `embed`, `final_mix`, `final_norm`, `logits`) that a Dumper can capture by
// regex and write as safetensors tensors; and the routing log used to record the experts every
// token chose in every MoE layer and to force them in another run (DESIGN "Comparing numerics
// paths": end to end with routing forced, only arithmetic differs).
// Not here: the forward pass itself (engine/model.h) or how sites are computed.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "storage/config.h"

namespace strata::engine {

// Site name of a per-layer intermediate, e.g. site_name(3, "kda_out") = "blk.3.kda_out".
std::string site_name(int layer, const char* site);

// Captures the sites whose names match a regex (std::regex, ECMAScript, whole-name match). Each
// call appends T rows, so a prefill followed by decode steps yields one tensor [T_total, ...]
// per site (rows in token order). Written as F32 tensors of one safetensors file.
class Dumper {
 public:
  explicit Dumper(const std::string& site_regex);
  bool wants(const std::string& name) const;
  // rows × row_shape floats (row_shape = the per-token shape, e.g. {D} or {H, d}).
  void add(const std::string& name, const float* data, int64_t rows,
           const std::vector<int64_t>& row_shape);
  // Writes DIR/dump.safetensors (created). Throws strata::Error on I/O failure.
  void write(const std::filesystem::path& dir) const;
  std::vector<std::string> names() const;
  const std::vector<float>* find(const std::string& name) const;  // nullptr when absent

 private:
  struct Site {
    std::vector<int64_t> row_shape;
    int64_t rows = 0;
    std::vector<float> data;
  };
  std::regex re_;
  std::map<std::string, Site> sites_;
};

// Routing of every token in every MoE layer: the selected expert ids (ascending) per absolute
// token position. JSON file format:
//   {"format": "strata-routing-v1", "top_k": K, "layers": {"1": [[e, ...], ...], ...}}
// where layers["l"][p] is the id list of the token at position p of the sequence.
class RoutingLog {
 public:
  int top_k = 0;
  std::map<int, std::vector<std::vector<int>>> layers;

  // Records the ids of the token at `position` (positions must arrive in order per layer).
  void record(int layer, int position, std::vector<int> ids);
  // Forced ids of a token, or nullptr when the log has none for (layer, position).
  const std::vector<int>* forced(int layer, int position) const;

  void save(const std::filesystem::path& file) const;
  // Throws strata::Error naming the file and what was wrong (bad JSON, ids not a list, an empty
  // or repeated id list, an id that is negative or does not fit an int, ...).
  static RoutingLog load(const std::filesystem::path& file);
  // The same from the file's text; `where` prefixes every message.
  static RoutingLog parse(const std::string& text, const std::string& where);
  // Checks the log against the model and the run before it is used: top_k equals the model's,
  // every layer is a MoE layer and every MoE layer up to `last_layer` (−1: all) is present, ids are
  // below num_experts, every layer has the same number of rows, and that number lies in
  // [min_rows, max_rows] (the positions the command will run; max_rows 0 skips this check).
  // Throws strata::Error naming the file, layer and row.
  void check_against(const ModelConfig& c, const std::string& file, int64_t min_rows,
                     int64_t max_rows, int last_layer = -1) const;
  int64_t rows() const { return layers.empty() ? 0 : int64_t(layers.begin()->second.size()); }
};

}  // namespace strata::engine
