// Dumper and RoutingLog (engine/trace.h).
#include "engine/trace.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "storage/error.h"
#include "storage/files.h"
#include "storage/safetensors.h"

namespace strata::engine {

std::string site_name(int layer, const char* site) {
  return "blk." + std::to_string(layer) + "." + site;
}

Dumper::Dumper(const std::string& site_regex) {
  try {
    re_ = std::regex(site_regex, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw Error("--dump-sites: bad regular expression '" + site_regex + "': " + e.what());
  }
}

bool Dumper::wants(const std::string& name) const {
  return std::regex_match(name, re_);
}

void Dumper::add(const std::string& name, const float* data, int64_t rows,
                 const std::vector<int64_t>& row_shape) {
  int64_t row_numel = 1;
  for (int64_t d : row_shape) row_numel *= d;
  Site& s = sites_[name];
  if (s.rows == 0) s.row_shape = row_shape;
  STRATA_ASSERT(s.row_shape == row_shape);
  s.data.insert(s.data.end(), data, data + rows * row_numel);
  s.rows += rows;
}

std::vector<std::string> Dumper::names() const {
  std::vector<std::string> out;
  for (const auto& [n, s] : sites_) out.push_back(n);
  return out;
}

const std::vector<float>* Dumper::find(const std::string& name) const {
  auto it = sites_.find(name);
  return it == sites_.end() ? nullptr : &it->second.data;
}

void Dumper::write(const std::filesystem::path& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("--dump " + dir.string() + ": cannot create directory: " + ec.message());
  std::vector<TensorDecl> decls;
  for (const auto& [name, s] : sites_) {
    std::vector<int64_t> shape{s.rows};
    shape.insert(shape.end(), s.row_shape.begin(), s.row_shape.end());
    decls.push_back({name, DType::F32, shape});
  }
  SafetensorsWriter w(dir / "dump.safetensors", decls);
  for (const auto& [name, s] : sites_)
    w.write_tensor(name, s.data.data(), s.data.size() * sizeof(float));
  w.finish();
}

void RoutingLog::record(int layer, int position, std::vector<int> ids) {
  std::sort(ids.begin(), ids.end());
  auto& rows = layers[layer];
  STRATA_ASSERT(position >= 0);
  if (size_t(position) >= rows.size()) rows.resize(size_t(position) + 1);
  rows[size_t(position)] = std::move(ids);
}

const std::vector<int>* RoutingLog::forced(int layer, int position) const {
  auto it = layers.find(layer);
  if (it == layers.end() || position < 0 || size_t(position) >= it->second.size()) return nullptr;
  const auto& ids = it->second[size_t(position)];
  return ids.empty() ? nullptr : &ids;
}

void RoutingLog::save(const std::filesystem::path& file) const {
  nlohmann::json j;
  j["format"] = "strata-routing-v1";
  j["top_k"] = top_k;
  nlohmann::json jl = nlohmann::json::object();
  for (const auto& [l, rows] : layers) jl[std::to_string(l)] = rows;
  j["layers"] = jl;
  write_file_atomic(file, j.dump() + "\n", "routing log " + file.string());
}

RoutingLog RoutingLog::load(const std::filesystem::path& file) {
  const std::string text = read_small_file(file, "routing log " + file.string(), 4ull << 30);
  return parse(text, "routing log " + file.string() + ": ");
}

RoutingLog RoutingLog::parse(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + "not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
      j["format"].get<std::string>() != "strata-routing-v1")
    throw Error(where + "expected an object with \"format\": \"strata-routing-v1\"");
  RoutingLog log;
  if (!j.contains("top_k") || !j["top_k"].is_number_integer() || j["top_k"].get<int64_t>() <= 0 ||
      j["top_k"].get<int64_t>() > 1024)
    throw Error(where + "field top_k must be a positive integer (at most 1024)");
  log.top_k = j["top_k"].get<int>();
  if (!j.contains("layers") || !j["layers"].is_object())
    throw Error(where + "field layers must be an object {\"layer\": [[ids], ...]}");
  for (const auto& [key, rows] : j["layers"].items()) {
    int layer = -1;
    if (!key.empty() && key.size() <= 6 &&
        std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      layer = std::stoi(key);
    if (layer < 0) throw Error(where + "layer key '" + key + "' is not a layer number");
    if (!rows.is_array()) throw Error(where + "layers." + key + " must be an array of id lists");
    auto& out = log.layers[layer];
    for (size_t p = 0; p < rows.size(); ++p) {
      const auto& r = rows[p];
      std::vector<int> ids;
      if (!r.is_array())
        throw Error(where + "layers." + key + "[" + std::to_string(p) + "] must be a list of ids");
      for (const auto& e : r) {
        // get<int64_t> first: get<int> of 4294967296 would silently give expert 0.
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX)
          throw Error(where + "layers." + key + "[" + std::to_string(p) + "] holds " + e.dump() +
                      ", not an expert id (a non-negative integer)");
        ids.push_back(int(e.get<int64_t>()));
      }
      if (int(ids.size()) != log.top_k)
        throw Error(where + "layers." + key + "[" + std::to_string(p) + "] has " +
                    std::to_string(ids.size()) +
                    " ids, expected top_k = " + std::to_string(log.top_k));
      std::sort(ids.begin(), ids.end());
      if (std::adjacent_find(ids.begin(), ids.end()) != ids.end())
        throw Error(where + "layers." + key + "[" + std::to_string(p) + "] repeats an expert id");
      out.push_back(std::move(ids));
    }
  }
  return log;
}

void RoutingLog::check_against(const ModelConfig& c, const std::string& file, int64_t min_rows,
                               int64_t max_rows, int last_layer) const {
  const std::string where = "--replay-routing " + file + ": ";
  if (top_k != c.moe.top_k)
    throw Error(where + "top_k " + std::to_string(top_k) + " but the model routes to " +
                std::to_string(c.moe.top_k) + " experts");
  for (const auto& [l, rows] : layers)
    if (l >= c.num_layers || !c.is_moe(l))
      throw Error(where + "layer " + std::to_string(l) + " is not a MoE layer of this model (" +
                  std::to_string(c.num_layers) + " layers)");
  for (int l = 0; l < c.num_layers && (last_layer < 0 || l <= last_layer); ++l)
    if (c.is_moe(l) && !layers.count(l))
      throw Error(where + "no routing for MoE layer " + std::to_string(l));
  const int64_t n = rows();
  for (const auto& [l, rows] : layers) {
    if (int64_t(rows.size()) != n)
      throw Error(where + "layer " + std::to_string(l) + " has " + std::to_string(rows.size()) +
                  " rows, layer " + std::to_string(layers.begin()->first) + " has " +
                  std::to_string(n) + " (every layer needs one row per position)");
    for (size_t p = 0; p < rows.size(); ++p)
      for (int e : rows[p])
        if (e >= c.moe.num_experts)
          throw Error(where + "layer " + std::to_string(l) + " position " + std::to_string(p) +
                      ": expert " + std::to_string(e) + " does not exist (the model has " +
                      std::to_string(c.moe.num_experts) + ")");
  }
  if (max_rows > 0 && (n < min_rows || n > max_rows))
    throw Error(where + std::to_string(n) + " positions per layer, but this run uses " +
                (min_rows == max_rows
                     ? std::to_string(min_rows)
                     : std::to_string(min_rows) + ".." + std::to_string(max_rows)) +
                " (missing or extra rows: was it recorded with the same prompt and -n?)");
}

}  // namespace strata::engine
