// safetensors reader (mmap + full header validation) and streaming writer.
#include "storage/safetensors.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "storage/error.h"
#include "storage/files.h"

namespace strata {

namespace {

struct DTypeRow {
  DType t;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {DType::BF16, "BF16", 2}, {DType::F16, "F16", 2}, {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},   {DType::U8, "U8", 1},   {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},   {DType::I32, "I32", 4}, {DType::I64, "I64", 8},
    {DType::BOOL, "BOOL", 1},
};

// The safetensors reference implementation refuses headers above 100 MB; so do we (a K3 shard's
// header is ~100 KB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string errno_str() {
  return std::strerror(errno);
}

// The mappings the SIGBUS handler knows: fixed slots without heap memory, published with an
// atomic state (the handler may run on any thread at any time and must not lock or allocate).
struct MappedRange {
  std::atomic<int> state{0};  // 0 free, 1 being written, 2 live
  const uint8_t* base = nullptr;
  uint64_t size = 0;
  char path[512] = {};
};
constexpr int kMaxMapped = 4096;
MappedRange g_mapped[kMaxMapped];

int register_mapping(const uint8_t* base, uint64_t size, const std::filesystem::path& path) {
  for (int i = 0; i < kMaxMapped; ++i) {
    int expected = 0;
    if (!g_mapped[i].state.compare_exchange_strong(expected, 1)) continue;
    MappedRange& r = g_mapped[i];
    r.base = base;
    r.size = size;
    std::strncpy(r.path, path.c_str(), sizeof r.path - 1);
    r.path[sizeof r.path - 1] = 0;
    r.state.store(2);
    return i;
  }
  return -1;  // more files than slots: the handler cannot name this one (default action)
}

void unregister_mapping(int slot) {
  if (slot >= 0) g_mapped[slot].state.store(0);
}

void write_str(const char* s) {
  size_t n = 0;
  while (s[n]) ++n;
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  const auto* addr = static_cast<const uint8_t*>(info->si_addr);
  for (int i = 0; i < kMaxMapped; ++i) {
    const MappedRange& r = g_mapped[i];
    if (r.state.load() == 2 && addr >= r.base && addr < r.base + r.size) {
      write_str("strata: error: ");
      write_str(r.path);
      write_str(
          ": the file became shorter while strata had it mapped (truncated or rewritten "
          "in place while in use); its weights cannot be read. Restore the file and run "
          "again.\n");
      ::_exit(1);
    }
  }
  // Not one of ours: the default action (core dump with the real cause).
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void install_sigbus_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
}

size_t dtype_size(DType t) {
  for (const auto& r : kDTypes)
    if (r.t == t) return r.size;
  STRATA_ASSERT(false);
  return 0;
}

const char* dtype_name(DType t) {
  for (const auto& r : kDTypes)
    if (r.t == t) return r.name;
  return "?";
}

std::optional<DType> parse_dtype(std::string_view s) {
  for (const auto& r : kDTypes)
    if (s == r.name) return r.t;
  return std::nullopt;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorDecl::nbytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

// ------------------------------------------------------------------------------------------
// Reader

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path, int file_index)
    : path_(path), file_index_(file_index) {
  const std::string where = path.string();
  // O_NONBLOCK: a FIFO in place of a shard must not block the open (it is refused below).
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) throw Error(where + ": cannot open: " + errno_str());
  try {
    struct stat st;
    if (::fstat(fd_, &st) != 0) throw Error(where + ": cannot stat: " + errno_str());
    if (!S_ISREG(st.st_mode))
      throw Error(where + ": not a regular file (a directory, FIFO or device cannot be a shard)");
    id_ = {uint64_t(st.st_dev), uint64_t(st.st_ino), uint64_t(st.st_size),
           int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    size_ = uint64_t(st.st_size);
    if (size_ < 8)
      throw Error(where + ": truncated: " + std::to_string(size_) +
                  " bytes, a safetensors file starts with an 8-byte header length");
    uint8_t lenbuf[8];
    if (::pread(fd_, lenbuf, 8, 0) != 8) throw Error(where + ": cannot read the header length");
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; --i) hlen = (hlen << 8) | lenbuf[i];  // little-endian
    if (hlen < 2 || hlen > kMaxHeaderBytes)
      throw Error(where + ": header length " + std::to_string(hlen) + " is not sane (expected 2.." +
                  std::to_string(kMaxHeaderBytes) + "; not a safetensors file?)");
    if (8 + hlen > size_)
      throw Error(where + ": truncated: header length " + std::to_string(hlen) +
                  " exceeds the file size " + std::to_string(size_));
    data_start_ = 8 + hlen;
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) throw Error(where + ": mmap failed: " + errno_str());
    base_ = static_cast<const uint8_t*>(m);
    map_slot_ = register_mapping(base_, size_, path_);

    nlohmann::json h;
    try {
      h = nlohmann::json::parse(base_ + 8, base_ + 8 + hlen);
    } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number beyond double
      throw Error(where + ": header is not valid JSON: " + e.what());
    }
    if (!h.is_object()) throw Error(where + ": header is not a JSON object");
    const uint64_t data_len = size_ - data_start_;
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      const auto& v = it.value();
      if (name == "__metadata__") {
        if (!v.is_object()) throw Error(where + ": __metadata__ is not an object");
        for (auto m2 = v.begin(); m2 != v.end(); ++m2) {
          if (!m2.value().is_string())
            throw Error(where + ": __metadata__." + m2.key() + " is not a string");
          metadata_[m2.key()] = m2.value().get<std::string>();
        }
        continue;
      }
      const std::string tw = where + ": tensor " + name;
      if (!v.is_object()) throw Error(tw + ": entry is not an object");
      if (!v.contains("dtype") || !v["dtype"].is_string())
        throw Error(tw + ": missing or non-string dtype");
      auto dt = parse_dtype(v["dtype"].get<std::string>());
      if (!dt) throw Error(tw + ": unknown dtype \"" + v["dtype"].get<std::string>() + "\"");
      if (!v.contains("shape") || !v["shape"].is_array())
        throw Error(tw + ": missing or non-array shape");
      TensorInfo t;
      t.name = name;
      t.dtype = *dt;
      t.file = file_index;
      unsigned __int128 bytes = dtype_size(*dt);
      bool too_big = false;  // more bytes than the whole data buffer (also guards overflow)
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
          throw Error(tw + ": shape " + v["shape"].dump() + " has a non-integer or negative dim");
        t.shape.push_back(d.get<int64_t>());
        if (!too_big) {
          bytes *= uint64_t(t.shape.back());
          too_big = bytes > data_len;
        }
      }
      if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
          v["data_offsets"].size() != 2 || !v["data_offsets"][0].is_number_unsigned() ||
          !v["data_offsets"][1].is_number_unsigned())
        throw Error(tw + ": data_offsets must be [begin, end] (non-negative integers)");
      const uint64_t b = v["data_offsets"][0].get<uint64_t>();
      const uint64_t e = v["data_offsets"][1].get<uint64_t>();
      if (b > e)
        throw Error(tw + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                    "] end before begin");
      if (e > data_len)
        throw Error(tw + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                    "] run past the data buffer (" + std::to_string(data_len) +
                    " bytes; file truncated?)");
      if (too_big)
        throw Error(tw + ": " + dtype_name(*dt) + " " + shape_str(t.shape) +
                    " needs more bytes than the file's whole data buffer (" +
                    std::to_string(data_len) + ")");
      if (uint64_t(bytes) != e - b)
        throw Error(tw + ": " + dtype_name(*dt) + " " + shape_str(t.shape) + " needs " +
                    std::to_string(uint64_t(bytes)) + " bytes but data_offsets span " +
                    std::to_string(e - b));
      t.offset = data_start_ + b;
      t.nbytes = e - b;
      tensors_.push_back(std::move(t));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
    });
    uint64_t pos = data_start_;
    const TensorInfo* prev = nullptr;
    for (const TensorInfo& t : tensors_) {
      if (t.nbytes == 0) continue;
      if (t.offset < pos)
        throw Error(where + ": tensors " + prev->name + " and " + t.name +
                    " overlap (data_offsets intersect)");
      if (t.offset > pos)
        throw Error(where + ": " + std::to_string(t.offset - pos) + " unused bytes before tensor " +
                    t.name + " (the data buffer must be covered without holes)");
      pos = t.offset + t.nbytes;
      prev = &t;
    }
    if (pos != size_)
      throw Error(where + ": " + std::to_string(size_ - pos) +
                  " bytes after the last tensor are not described by the header");
    for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
  } catch (...) {
    close();
    throw;
  }
}

void SafetensorsFile::check_unchanged() const {
  if (fd_ < 0) return;
  struct stat st {};
  if (::fstat(fd_, &st) != 0)
    throw Error(path_.string() + ": cannot stat an open shard: " + errno_str());
  const int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  const std::string tail = " while the model was loaded; restart strata to load it again";
  if (uint64_t(st.st_size) != id_.size)
    throw Error(path_.string() + ": changed size on disk (" + std::to_string(id_.size) + " -> " +
                std::to_string(st.st_size) + " bytes)" + tail);
  if (mtime != id_.mtime_ns) throw Error(path_.string() + ": was modified on disk" + tail);
  struct stat now {};
  if (::stat(path_.c_str(), &now) != 0)
    throw Error(path_.string() + ": was removed or renamed" + tail);
  if (uint64_t(now.st_dev) != id_.dev || uint64_t(now.st_ino) != id_.ino)
    throw Error(path_.string() + ": was replaced by another file" + tail);
}

void SafetensorsFile::close() {
  unregister_mapping(map_slot_);
  map_slot_ = -1;
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  base_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

SafetensorsFile::~SafetensorsFile() {
  close();
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept {
  *this = std::move(o);
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    file_index_ = o.file_index_;
    fd_ = std::exchange(o.fd_, -1);
    base_ = std::exchange(o.base_, nullptr);
    map_slot_ = std::exchange(o.map_slot_, -1);
    id_ = o.id_;
    size_ = o.size_;
    data_start_ = o.data_start_;
    tensors_ = std::move(o.tensors_);
    by_name_ = std::move(o.by_name_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

// ------------------------------------------------------------------------------------------
// Writer

namespace {
constexpr size_t kWriteBuffer = 8u << 20;

void write_all(int fd, const uint8_t* p, size_t n, const std::filesystem::path& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw Error(path.string() + ": write failed: " + errno_str());
    }
    p += w;
    n -= size_t(w);
  }
}
}  // namespace

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path,
                                     std::vector<TensorDecl> tensors,
                                     std::map<std::string, std::string> metadata)
    : path_(path), tensors_(std::move(tensors)) {
  tmp_path_ = path_;
  tmp_path_ += ".partial";
  nlohmann::ordered_json h;
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  std::unordered_set<std::string> seen;
  uint64_t off = 0;
  for (const TensorDecl& t : tensors_) {
    if (t.name.empty() || t.name == "__metadata__")
      throw Error(path_.string() + ": invalid tensor name \"" + t.name + "\"");
    if (!seen.insert(t.name).second)
      throw Error(path_.string() + ": tensor " + t.name + " declared twice");
    for (int64_t d : t.shape)
      if (d < 0) throw Error(path_.string() + ": tensor " + t.name + ": negative dim");
    const uint64_t n = t.nbytes();
    h[t.name] = {
        {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
    ends_.push_back(off);
  }
  data_bytes_ = off;
  std::string hs = h.dump();
  while ((8 + hs.size()) % 8 != 0) hs.push_back(' ');  // align the data buffer to 8 bytes
  data_start_ = 8 + hs.size();

  fd_ = open_partial_for_write(tmp_path_, path_.string());
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(hs.size()) >> (8 * i));
  buf_.reserve(kWriteBuffer);
  buf_.insert(buf_.end(), len, len + 8);
  buf_.insert(buf_.end(), hs.begin(), hs.end());
  cur_ = 0;
  while (cur_ < ends_.size() && ends_[cur_] == 0) ++cur_;  // leading empty tensors
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) {
    std::error_code ec;
    std::filesystem::remove(tmp_path_, ec);
  }
}

void SafetensorsWriter::flush_buffer() {
  write_all(fd_, buf_.data(), buf_.size(), tmp_path_);
  buf_.clear();
}

void SafetensorsWriter::write(const void* data, size_t n) {
  STRATA_ASSERT(!finished_);
  if (written_ + n > data_bytes_)
    throw Error(path_.string() + ": writing " + std::to_string(n) + " bytes past the last tensor");
  const uint8_t* p = static_cast<const uint8_t*>(data);
  if (n >= kWriteBuffer) {
    flush_buffer();
    write_all(fd_, p, n, tmp_path_);
  } else {
    if (buf_.size() + n > kWriteBuffer) flush_buffer();
    buf_.insert(buf_.end(), p, p + n);
  }
  written_ += n;
  while (cur_ < ends_.size() && ends_[cur_] <= written_) ++cur_;
}

void SafetensorsWriter::write_tensor(std::string_view name, const void* data, size_t n) {
  if (next_tensor() != name)
    throw Error(path_.string() + ": expected tensor " + std::string(next_tensor()) + " next, got " +
                std::string(name));
  if (n != bytes_left_in_tensor() || n != tensors_[cur_].nbytes())
    throw Error(path_.string() + ": tensor " + std::string(name) + ": " + std::to_string(n) +
                " bytes given, " + std::to_string(tensors_[cur_].nbytes()) + " declared");
  write(data, n);
}

std::string_view SafetensorsWriter::next_tensor() const {
  return cur_ < tensors_.size() ? std::string_view(tensors_[cur_].name) : std::string_view();
}

uint64_t SafetensorsWriter::bytes_left_in_tensor() const {
  return cur_ < ends_.size() ? ends_[cur_] - written_ : 0;
}

void SafetensorsWriter::finish() {
  STRATA_ASSERT(!finished_);
  if (written_ != data_bytes_)
    throw Error(path_.string() + ": finished after " + std::to_string(written_) + " of " +
                std::to_string(data_bytes_) + " data bytes (next tensor " +
                std::string(next_tensor()) + ")");
  flush_buffer();
  // No fsync: the rename protects against a crash of this process leaving a complete-looking
  // file; synthetic checkpoints do not need durability across power loss.
  if (::close(fd_) != 0) {
    fd_ = -1;
    throw Error(tmp_path_.string() + ": close failed: " + errno_str());
  }
  fd_ = -1;
  // Never rename over a directory, device, FIFO or socket (callers check up front with
  // OutputPath; this is the last line of defence).
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw Error(path_.string() + ": exists and is not a regular file; not replacing it");
  std::error_code ec;
  std::filesystem::rename(tmp_path_, path_, ec);
  if (ec)
    throw Error(path_.string() + ": cannot rename from " + tmp_path_.string() + ": " +
                ec.message());
  finished_ = true;
}

}  // namespace strata
