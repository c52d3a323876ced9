// Checkpoint directory: shards, tensor index, claims, expert index; model_tensor_specs.
#include "storage/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "storage/bf16.h"
#include "storage/error.h"
#include "storage/files.h"
#include "storage/mxfp4.h"

namespace strata {

namespace fs = std::filesystem;

uint64_t TensorSpec::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

std::string expert_tensor_name(const ModelConfig& c, int layer, int expert, std::string_view part) {
  std::string s =
      c.layer_prefix(layer) + "block_sparse_moe.experts." + std::to_string(expert) + ".";
  s += part;
  return s;
}

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c) {
  std::vector<TensorSpec> v;
  const int64_t D = c.hidden_size;
  auto add = [&](std::string name, std::vector<int64_t> shape, DType dt = DType::BF16) {
    v.push_back({std::move(name), dt, std::move(shape)});
  };
  const std::string& tp = c.tensor_prefix;
  add(tp + "embed_tokens.weight", {c.vocab_size, D});
  if (c.has_attn_res()) {
    add(tp + "output_attn_res_norm.weight", {D});
    add(tp + "output_attn_res_proj.weight", {1, D});
  }
  add(tp + "norm.weight", {D});
  add(c.lm_head_name, {c.vocab_size, D});

  const KdaConfig& k = c.kda;
  const MlaConfig& m = c.mla;
  const MoeConfig& e = c.moe;
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = c.layer_prefix(l);
    add(p + "input_layernorm.weight", {D});
    add(p + "post_attention_layernorm.weight", {D});
    if (c.has_attn_res()) {
      // Layer 0's attention-side pair is present in the release although unused (spec §2.2).
      add(p + "self_attention_res_norm.weight", {D});
      add(p + "self_attention_res_proj.weight", {1, D});
      add(p + "mlp_res_norm.weight", {D});
      add(p + "mlp_res_proj.weight", {1, D});
    }
    const std::string a = p + "self_attn.";
    if (c.is_kda(l)) {
      const int64_t P = k.proj_dim(), H = k.num_heads, r = k.gate_rank;
      for (const char* x : {"q", "k", "v"}) add(a + x + "_proj.weight", {P, D});
      for (const char* x : {"q", "k", "v"})
        add(a + x + "_conv1d.weight", {P, 1, k.conv_kernel}, DType::F32);
      add(a + "f_a_proj.weight", {r, D});
      add(a + "f_b_proj.weight", {P, r});
      if (k.gate == KdaGateKind::bounded_sigmoid)
        add(a + "A_log", {std::max<int64_t>(128, H)}, DType::F32);  // per head, zero-padded
      else
        add(a + "A_log", {1, 1, H, 1}, DType::F32);
      add(a + "dt_bias", {P}, DType::F32);
      add(a + "b_proj.weight", {H, D});
      if (k.full_rank_output_gate) {
        add(a + "g_proj.weight", {P, D});
      } else {
        add(a + "g_a_proj.weight", {r, D});
        add(a + "g_b_proj.weight", {P, r});
      }
      add(a + "o_norm.weight", {k.head_dim}, DType::F32);
      add(a + "o_proj.weight", {D, P});
    } else {
      const int64_t H = m.num_heads;
      if (m.q_lora_rank > 0) {
        add(a + "q_a_proj.weight", {m.q_lora_rank, D});
        add(a + "q_a_layernorm.weight", {m.q_lora_rank});
        add(a + "q_b_proj.weight", {H * m.q_head_dim(), m.q_lora_rank});
      } else {
        add(a + "q_proj.weight", {H * m.q_head_dim(), D});
      }
      add(a + "kv_a_proj_with_mqa.weight", {m.kv_lora_rank + m.qk_rope_head_dim, D});
      add(a + "kv_a_layernorm.weight", {m.kv_lora_rank});
      add(a + "kv_b_proj.weight", {H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
      if (m.output_gate) add(a + "g_proj.weight", {H * m.v_head_dim, D});
      add(a + "o_proj.weight", {D, H * m.v_head_dim});
    }
    if (c.is_dense(l)) {
      const int64_t I = c.dense_intermediate_size;
      add(p + "mlp.gate_proj.weight", {I, D});
      add(p + "mlp.up_proj.weight", {I, D});
      add(p + "mlp.down_proj.weight", {D, I});
      continue;
    }
    const std::string b = p + "block_sparse_moe.";
    add(b + "gate.weight", {e.num_experts, D});
    add(b + "gate.e_score_correction_bias", {e.num_experts}, DType::F32);
    if (e.latent_size > 0) {
      add(b + "routed_expert_down_proj.weight", {e.latent_size, D});
      if (e.latent_norm) add(b + "routed_expert_norm.weight", {e.latent_size});
      add(b + "routed_expert_up_proj.weight", {D, e.latent_size});
    }
    if (e.num_shared_experts > 0) {
      const int64_t S = e.shared_intermediate();
      add(b + "shared_experts.gate_proj.weight", {S, D});
      add(b + "shared_experts.up_proj.weight", {S, D});
      add(b + "shared_experts.down_proj.weight", {D, S});
    }
    const int64_t in = c.expert_in_dim(), I = e.intermediate_size;
    for (int x = 0; x < e.num_experts; ++x) {
      // Name order (w1, w2, w3): how safetensors writers sort them, so one expert is contiguous.
      if (e.mxfp4) {
        add(expert_tensor_name(c, l, x, "w1.weight_packed"), {I, in / 2}, DType::U8);
        add(expert_tensor_name(c, l, x, "w1.weight_scale"), {I, in / 32}, DType::U8);
        add(expert_tensor_name(c, l, x, "w2.weight_packed"), {in, I / 2}, DType::U8);
        add(expert_tensor_name(c, l, x, "w2.weight_scale"), {in, I / 32}, DType::U8);
        add(expert_tensor_name(c, l, x, "w3.weight_packed"), {I, in / 2}, DType::U8);
        add(expert_tensor_name(c, l, x, "w3.weight_scale"), {I, in / 32}, DType::U8);
      } else {
        add(expert_tensor_name(c, l, x, "w1.weight"), {I, in});
        add(expert_tensor_name(c, l, x, "w2.weight"), {in, I});
        add(expert_tensor_name(c, l, x, "w3.weight"), {I, in});
      }
    }
  }
  return v;
}

// ------------------------------------------------------------------------------------------

namespace {

std::string read_file(const fs::path& p) {
  return read_small_file(p, p.string());
}

}  // namespace

std::map<std::string, std::string> parse_shard_index(const std::string& text,
                                                     const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number beyond double
    throw Error(where + ": invalid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(where + ": missing \"weight_map\" object");
  std::map<std::string, std::string> weight_map;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      throw Error(where + ": weight_map." + it.key() + ": expected a shard file name");
    weight_map[it.key()] = it.value().get<std::string>();
  }
  if (weight_map.empty()) throw Error(where + ": weight_map is empty");
  return weight_map;
}

// A shard name from the index must stay inside the checkpoint directory: relative, no "..", and
// (after resolving symlinks) still under dir.
fs::path checked_shard_path(const fs::path& dir, const fs::path& index, const std::string& name) {
  const fs::path rel(name);
  auto bad = [&](const std::string& why) {
    return Error(index.string() + ": shard \"" + name + "\" " + why +
                 " (shards must be files inside the checkpoint directory)");
  };
  if (name.empty()) throw bad("is empty");
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory())
    throw bad("is an absolute path");
  for (const auto& part : rel)
    if (part == "..") throw bad("contains \"..\"");
  const fs::path full = dir / rel;
  std::error_code ec;
  const fs::path real = fs::canonical(full, ec);
  if (ec)
    throw Error(index.string() + ": shard \"" + name + "\": cannot open " + full.string() + ": " +
                ec.message());
  const fs::path real_dir = fs::canonical(dir);
  auto [a, b] = std::mismatch(real_dir.begin(), real_dir.end(), real.begin(), real.end());
  if (a != real_dir.end())
    throw bad("resolves (through a symlink) to " + real.string() + ", outside the directory");
  return full;
}

namespace {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while (!(man & 0x400));
      bits = sign | (uint32_t(127 - 15 - e) << 23) | ((man & 0x3FF) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

Checkpoint::Checkpoint(const fs::path& path, CheckpointOptions opt) {
  dir_ = path;
  if (fs::is_regular_file(path) && path.filename() == "config.json") dir_ = path.parent_path();
  if (dir_.empty()) dir_ = ".";
  if (!fs::is_directory(dir_))
    throw Error("checkpoint " + dir_.string() + ": not a directory (expected a model directory)");
  const fs::path cfg = dir_ / "config.json";
  if (!fs::exists(cfg)) throw Error("checkpoint " + dir_.string() + ": missing config.json");
  config_ = load_config(cfg);
  open_shards();
  if (opt.validate_shapes) validate_shapes();
  build_expert_index();
  if (opt.validate_expert_scales && config_.moe.mxfp4)
    for (int l = 0; l < config_.num_layers; ++l)
      if (has_experts(l))
        for (int e = 0; e < config_.moe.num_experts; ++e) validate_expert_scales(l, e);
}

Checkpoint::~Checkpoint() = default;

void Checkpoint::open_shards() {
  const std::string where = "checkpoint " + dir_.string();
  const fs::path index = dir_ / "model.safetensors.index.json";
  const fs::path single = dir_ / "model.safetensors";
  std::map<std::string, std::string> weight_map;  // tensor → shard name
  if (fs::exists(index)) {
    weight_map = parse_shard_index(read_file(index), index.string());
    std::vector<std::string> shard_names;
    for (const auto& [tensor, shard] : weight_map) shard_names.push_back(shard);
    std::sort(shard_names.begin(), shard_names.end());
    shard_names.erase(std::unique(shard_names.begin(), shard_names.end()), shard_names.end());
    for (const std::string& s : shard_names) {
      const fs::path p = checked_shard_path(dir_, index, s);
      files_.push_back(std::make_unique<SafetensorsFile>(p, int(files_.size())));
    }
    std::map<std::string, int> shard_index;
    for (size_t i = 0; i < shard_names.size(); ++i) shard_index[shard_names[i]] = int(i);
    for (const auto& [name, shard] : weight_map)
      if (!files_[shard_index[shard]]->find(name))
        throw Error(index.string() + ": tensor " + name + " is mapped to " + shard +
                    ", which has no such tensor");
    for (const auto& f : files_)
      for (const TensorInfo& t : f->tensors()) {
        auto it = weight_map.find(t.name);
        if (it == weight_map.end())
          throw Error(f->path().string() + ": tensor " + t.name +
                      " is not listed in model.safetensors.index.json");
        if (files_[shard_index.at(it->second)].get() != f.get())
          throw Error(f->path().string() + ": tensor " + t.name + " also appears in " + it->second +
                      " (a tensor must be in exactly one shard)");
      }
  } else if (fs::exists(single)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single, 0));
  } else {
    throw Error(where + ": no model.safetensors or model.safetensors.index.json");
  }
  for (const auto& f : files_)
    for (const TensorInfo& t : f->tensors()) tensors_.push_back(&t);
  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->name < b->name; });
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (i > 0 && tensors_[i]->name == tensors_[i - 1]->name)
      throw Error(where + ": tensor " + tensors_[i]->name + " appears in two shards (" +
                  file_path(tensors_[i - 1]->file).filename().string() + ", " +
                  file_path(tensors_[i]->file).filename().string() + ")");
    by_name_.emplace(tensors_[i]->name, i);
  }
  claimed_.assign(tensors_.size(), 0);
}

void Checkpoint::check_unchanged() const {
  for (const auto& f : files_) f->check_unchanged();
}

uint64_t Checkpoint::total_file_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f->file_size();
  return n;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : tensors_[it->second];
}

const TensorInfo& Checkpoint::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) throw Error("checkpoint " + dir_.string() + ": missing tensor " + std::string(name));
  return *t;
}

const TensorInfo& Checkpoint::get(std::string_view name, DType dtype,
                                  const std::vector<int64_t>& shape) const {
  const TensorInfo& t = get(name);
  if (t.dtype != dtype || t.shape != shape)
    throw Error("checkpoint " + dir_.string() + ": tensor " + t.name + ": expected " +
                dtype_name(dtype) + " " + shape_str(shape) + ", got " + dtype_name(t.dtype) + " " +
                shape_str(t.shape) + " (in " + file_path(t.file).filename().string() + ")");
  return t;
}

std::vector<float> Checkpoint::load_f32(std::string_view name,
                                        const std::vector<int64_t>& expected_shape) const {
  const TensorInfo& t = get(name);
  if (t.shape != expected_shape)
    throw Error("checkpoint " + dir_.string() + ": tensor " + t.name + ": expected shape " +
                shape_str(expected_shape) + ", got " + shape_str(t.shape));
  const auto b = bytes(t);
  const size_t n = size_t(t.numel());
  std::vector<float> out(n);
  switch (t.dtype) {
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b.data() + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, b.data() + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    case DType::F32:
      std::memcpy(out.data(), b.data(), 4 * n);
      break;
    default:
      throw Error("checkpoint " + dir_.string() + ": tensor " + t.name +
                  ": expected a floating-point tensor (BF16, F16, F32), got " +
                  dtype_name(t.dtype));
  }
  return out;
}

const TensorInfo& Checkpoint::claim(std::string_view name) {
  const TensorInfo& t = get(name);
  char& c = claimed_[by_name_.find(name)->second];
  if (!c) ++num_claimed_;
  c = 1;
  return t;
}

const TensorInfo& Checkpoint::claim(std::string_view name, DType dtype,
                                    const std::vector<int64_t>& shape) {
  get(name, dtype, shape);
  return claim(name);
}

void Checkpoint::claim_all_specs() {
  for (const TensorSpec& s : model_tensor_specs(config_)) claim(s.name, s.dtype, s.shape);
}

void Checkpoint::check_all_claimed() const {
  if (num_claimed_ == tensors_.size()) return;
  std::string list;
  size_t shown = 0;
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (!claimed_[i]) {
      if (shown == 5) {
        list += ", …";
        break;
      }
      list += (shown ? ", " : "") + tensors_[i]->name;
      ++shown;
    }
  throw Error("checkpoint " + dir_.string() + ": expected " + std::to_string(num_claimed_) +
              " tensors, got " + std::to_string(tensors_.size()) + "; unclaimed: " + list);
}

void Checkpoint::validate_shapes() const {
  for (const TensorSpec& s : model_tensor_specs(config_)) get(s.name, s.dtype, s.shape);
}

void Checkpoint::build_expert_index() {
  const ModelConfig& c = config_;
  experts_.assign(c.num_layers, {});
  const bool q = c.moe.mxfp4;
  for (int l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe(l)) continue;
    experts_[l].resize(c.moe.num_experts);
    for (int e = 0; e < c.moe.num_experts; ++e) {
      ExpertTensors& x = experts_[l][e];
      auto proj = [&](const char* w) {
        ExpertTensors::Proj p;
        const std::string base = std::string(w) + (q ? ".weight_packed" : ".weight");
        p.weight = &get(expert_tensor_name(c, l, e, base));
        if (q) p.scale = &get(expert_tensor_name(c, l, e, std::string(w) + ".weight_scale"));
        return p;
      };
      x.w1 = proj("w1");
      x.w3 = proj("w3");
      x.w2 = proj("w2");
      std::vector<FileSpan> spans;
      for (const ExpertTensors::Proj* p : {&x.w1, &x.w3, &x.w2})
        for (const TensorInfo* t : {p->weight, p->scale})
          if (t) {
            spans.push_back({t->file, t->offset, t->nbytes});
            x.nbytes += t->nbytes;
          }
      std::sort(spans.begin(), spans.end(), [](const FileSpan& a, const FileSpan& b) {
        return a.file != b.file ? a.file < b.file : a.offset < b.offset;
      });
      for (const FileSpan& s : spans) {
        if (!x.spans.empty() && x.spans.back().file == s.file &&
            x.spans.back().offset + x.spans.back().nbytes == s.offset)
          x.spans.back().nbytes += s.nbytes;
        else
          x.spans.push_back(s);
      }
    }
  }
}

bool Checkpoint::has_experts(int layer) const {
  return layer >= 0 && layer < int(experts_.size()) && !experts_[layer].empty();
}

const ExpertTensors& Checkpoint::expert(int layer, int e) const {
  STRATA_ASSERT(has_experts(layer) && e >= 0 && e < int(experts_[layer].size()));
  return experts_[layer][e];
}

void Checkpoint::validate_expert_scales(int layer, int e) const {
  const ExpertTensors& x = expert(layer, e);
  for (const ExpertTensors::Proj* p : {&x.w1, &x.w3, &x.w2}) {
    if (!p->scale) continue;
    const auto b = bytes(*p->scale);
    const int64_t i = mxfp4::find_nan_scale(b.data(), int64_t(b.size()));
    if (i >= 0) {
      const int64_t cols = p->scale->shape.size() == 2 ? p->scale->shape[1] : 1;
      throw Error("checkpoint " + dir_.string() + ": tensor " + p->scale->name +
                  ": scale byte 0xFF (NaN) at row " + std::to_string(i / cols) + ", block " +
                  std::to_string(i % cols) + " (E8M0 0xFF is not a valid weight scale)");
    }
  }
}

}  // namespace strata
