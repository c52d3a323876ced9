// safetensors files: a read-only mmapped view with full header validation, and a streaming writer.
// Format: 8-byte little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data buffer; offsets are relative to the data buffer, which must be fully covered by the
// tensors without holes or overlaps.
// Not here: sharded checkpoints and the model's tensor names (storage/checkpoint.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata {

enum class DType { BF16, F16, F32, F64, U8, I8, I16, I32, I64, BOOL };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // the safetensors spelling: "BF16", "F32", "U8", ...
std::optional<DType> parse_dtype(std::string_view s);
std::string shape_str(const std::vector<int64_t>& shape);  // "[3072, 1792]"

struct TensorInfo {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  int file = 0;         // index of the file (shard) holding it
  uint64_t offset = 0;  // absolute byte offset in that file (header included)
  uint64_t nbytes = 0;
  int64_t numel() const;
};

// One safetensors file, mmapped read-only. The constructor validates the whole header and throws
// strata::Error naming the file on: truncated file, absurd header length, header JSON that does
// not parse or is not an object, unknown dtype, bad shape, data_offsets out of the file,
// dtype·shape disagreeing with the byte count, overlapping tensors, holes in the data buffer.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path, int file_index = 0);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& o) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  int fd() const { return fd_; }  // open O_RDONLY for the lifetime of the object (pread/io_uring)
  int file_index() const { return file_index_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_start() const { return data_start_; }                  // 8 + header length
  const uint8_t* base() const { return base_; }                        // the whole file, mmapped
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in data-offset order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(std::string_view name) const;
  std::span<const uint8_t> bytes(const TensorInfo& t) const { return {base_ + t.offset, t.nbytes}; }

  // Throws strata::Error naming the file when it changed on disk since it was opened: its size
  // or modification time (written or truncated in place) or the file at its path (replaced by
  // another, e.g. a new download renamed over it). Two syscalls; the engine calls it per step.
  void check_unchanged() const;

 private:
  void close();
  struct Identity {
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_ns = 0;
  } id_;
  std::filesystem::path path_;
  int file_index_ = 0;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
  int map_slot_ = -1;  // in the SIGBUS handler's table
};

// A shard truncated while it is mapped makes the pages past its new end unreadable: touching
// one raises SIGBUS, which would kill the process with no word of why. This handler (installed
// once by the CLI) turns a SIGBUS inside a mapped safetensors file into one line naming the file
// and exit status 1; other SIGBUS signals keep the default action. Async-signal-safe.
void install_sigbus_handler();

struct TensorDecl {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  uint64_t nbytes() const;
};

// Streaming writer. All tensors are declared up front (their data is laid out in declaration
// order); the header is written at once, then each tensor's bytes are appended in order with
// write() (any chunking). Writes to PATH.partial and renames to PATH in finish(), so a crash never
// leaves a file that looks complete. Never holds tensor data beyond the caller's chunk.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorDecl> tensors,
                    std::map<std::string, std::string> metadata = {{"format", "pt"}});
  ~SafetensorsWriter();  // removes the partial file if finish() was not reached
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Append bytes of the current tensor (crossing into the next ones is allowed).
  void write(const void* data, size_t n);
  // Append a whole tensor, checking that `name` is the next one and n is its size.
  void write_tensor(std::string_view name, const void* data, size_t n);
  // Name of the tensor the next byte belongs to ("" when all are written).
  std::string_view next_tensor() const;
  uint64_t bytes_left_in_tensor() const;
  // Check every byte was written, flush, close and rename into place.
  void finish();
  uint64_t file_bytes() const { return data_start_ + data_bytes_; }

 private:
  void flush_buffer();
  std::filesystem::path path_, tmp_path_;
  std::vector<TensorDecl> tensors_;
  std::vector<uint64_t> ends_;  // cumulative end offset of each tensor in the data buffer
  int fd_ = -1;
  uint64_t data_start_ = 0, data_bytes_ = 0, written_ = 0;
  size_t cur_ = 0;
  std::vector<uint8_t> buf_;
  bool finished_ = false;
};

}  // namespace strata
