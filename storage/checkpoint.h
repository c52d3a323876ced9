// Checkpoint: a model directory as released (config.json + model.safetensors, or
// model.safetensors.index.json + shards), every shard mmapped and validated, a name → tensor index,
// claim tracking so the loader proves it used every tensor (STYLE §8), and the expert index:
// (layer, expert) → the byte spans of its tensors, merged where adjacent — the unit the expert
// streamer reads. Also model_tensor_specs(): every tensor name, dtype and shape a config implies.
// Not here: reading expert bytes asynchronously (io_uring reader), any weight math.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "storage/config.h"
#include "storage/safetensors.h"

namespace strata {

struct FileSpan {
  int file = 0;  // shard index (Checkpoint::file)
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// One routed expert's tensors. MXFP4: weight = weight_packed [out, in/2] U8, scale = weight_scale
// [out, in/32] U8. bf16 experts (Kimi-Linear): weight = weight [out, in] BF16, scale = nullptr.
struct ExpertTensors {
  struct Proj {
    const TensorInfo* weight = nullptr;
    const TensorInfo* scale = nullptr;
  };
  Proj w1, w3, w2;              // gate [I, in], up [I, in], down [in, I] (logical shapes)
  std::vector<FileSpan> spans;  // all its bytes, sorted by (file, offset), adjacent ones merged
  uint64_t nbytes = 0;          // sum of the tensors' bytes
};

// A tensor the config implies: name, dtype and shape as released.
struct TensorSpec {
  std::string name;
  DType dtype = DType::BF16;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

// Every tensor of the text model, in a stable order (top level, then layer by layer; within a MoE
// layer the routed experts last, expert by expert, each expert's tensors together). A_log is F32
// [max(128, H)] zero-padded for the bounded (K3) gate form and F32 [1, 1, H, 1] for the softplus
// (Kimi-Linear) form, as in the released checkpoints and golden models.
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c);

// Name of routed expert e's tensor in layer l, part one of "w1.weight_packed", "w1.weight_scale",
// "w1.weight" (bf16), ... e.g.
// "language_model.model.layers.3.block_sparse_moe.experts.7.w2.weight".
std::string expert_tensor_name(const ModelConfig& c, int layer, int expert, std::string_view part);

// model.safetensors.index.json → {tensor: shard file name}. Throws strata::Error naming `where`
// for invalid JSON, a missing or empty weight_map, a shard name that is not a string.
std::map<std::string, std::string> parse_shard_index(const std::string& text,
                                                     const std::string& where);
// DIR/name for a shard name from `index`, which must stay inside DIR: relative, no "..", and
// (after resolving symlinks) still under DIR; throws strata::Error naming the index otherwise, or
// when the file cannot be found.
std::filesystem::path checked_shard_path(const std::filesystem::path& dir,
                                         const std::filesystem::path& index,
                                         const std::string& name);

struct CheckpointOptions {
  // Check every MXFP4 scale byte of every expert for 0xFF (NaN) on open: a linear scan over the
  // scale planes, ~1/17 of the expert bytes (1 MB per K3 expert). Fine for synthetic and test
  // checkpoints; for the full K3 release (82,432 experts, ~85 GB of scales) turn it off and call
  // validate_expert_scales(layer, e) when an expert is first read.
  bool validate_expert_scales = true;
  // Check every tensor the config implies exists with its dtype and shape (on open).
  bool validate_shapes = true;
};

class Checkpoint {
 public:
  // Opens DIR (or, if given a config.json path, its directory). Throws strata::Error naming the
  // file for a missing config/weights, bad index JSON, shard names escaping the directory
  // (absolute, "..", symlinks pointing out), a tensor in two shards, a tensor whose shard
  // disagrees with the index, and every header problem SafetensorsFile detects.
  explicit Checkpoint(const std::filesystem::path& dir, CheckpointOptions opt = {});
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }

  int num_files() const { return int(files_.size()); }
  const SafetensorsFile& file(int i) const { return *files_[i]; }
  const std::filesystem::path& file_path(int i) const { return files_[i]->path(); }
  int file_fd(int i) const { return files_[i]->fd(); }
  uint64_t total_file_bytes() const;  // sum of shard sizes
  // Throws strata::Error naming the shard when one changed on disk since it was opened
  // (SafetensorsFile::check_unchanged): truncated, written or replaced while in use.
  void check_unchanged() const;

  size_t num_tensors() const { return tensors_.size(); }
  const std::vector<const TensorInfo*>& tensors() const { return tensors_; }  // name order
  const TensorInfo* find(std::string_view name) const;
  // Throws "checkpoint DIR: missing tensor NAME".
  const TensorInfo& get(std::string_view name) const;
  // get() plus a dtype and shape check: "checkpoint DIR: tensor NAME: expected BF16 [a, b], got
  // ...".
  const TensorInfo& get(std::string_view name, DType dtype,
                        const std::vector<int64_t>& shape) const;
  std::span<const uint8_t> bytes(const TensorInfo& t) const { return files_[t.file]->bytes(t); }
  // Widen a BF16 / F16 / F32 tensor to fp32 (exact), checking its shape (element count and dims).
  std::vector<float> load_f32(std::string_view name,
                              const std::vector<int64_t>& expected_shape) const;

  // Claim tracking: the loader claims each tensor it uses; check_all_claimed() throws
  // "checkpoint DIR: expected N tensors, got M; unclaimed: a, b, …" (first few names).
  const TensorInfo& claim(std::string_view name);
  const TensorInfo& claim(std::string_view name, DType dtype, const std::vector<int64_t>& shape);
  void claim_all_specs();  // claim every tensor of model_tensor_specs(config()) (shape-checked)
  size_t num_claimed() const { return num_claimed_; }
  void check_all_claimed() const;

  // Expert index (MoE layers only; empty for dense layers).
  bool has_experts(int layer) const;
  const ExpertTensors& expert(int layer, int e) const;
  std::span<const FileSpan> expert_spans(int layer, int e) const { return expert(layer, e).spans; }
  // Throws "checkpoint DIR: tensor NAME: scale byte 0xFF (NaN) at row r, block b" for MXFP4.
  void validate_expert_scales(int layer, int e) const;

  // Check every tensor of model_tensor_specs(config()) exists with its dtype and shape; throws
  // naming the first bad tensor.
  void validate_shapes() const;

 private:
  void open_shards();
  void build_expert_index();
  std::filesystem::path dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<const TensorInfo*> tensors_;
  std::unordered_map<std::string_view, size_t> by_name_;  // → index in tensors_
  std::vector<char> claimed_;                             // per tensors_ entry
  size_t num_claimed_ = 0;
  std::vector<std::vector<ExpertTensors>> experts_;  // [layer][expert]
};

}  // namespace strata
