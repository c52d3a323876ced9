// safetensors reader/writer (stub while the implementation lands).
#include "storage/safetensors.h"

#include "storage/error.h"

namespace strata {
size_t dtype_size(DType) {
  return 0;
}
const char* dtype_name(DType) {
  return "?";
}
std::optional<DType> parse_dtype(std::string_view) {
  return std::nullopt;
}
std::string shape_str(const std::vector<int64_t>&) {
  return {};
}
int64_t TensorInfo::numel() const {
  return 0;
}
SafetensorsFile::SafetensorsFile(const std::filesystem::path& p, int) {
  throw Error(p.string() + ": not implemented");
}
SafetensorsFile::~SafetensorsFile() {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept {}
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept {
  return *this;
}
const TensorInfo* SafetensorsFile::find(std::string_view) const {
  return nullptr;
}
void SafetensorsFile::close() {}
uint64_t TensorDecl::nbytes() const {
  return 0;
}
SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& p, std::vector<TensorDecl>,
                                     std::map<std::string, std::string>) {
  throw Error(p.string() + ": not implemented");
}
SafetensorsWriter::~SafetensorsWriter() {}
void SafetensorsWriter::write(const void*, size_t) {}
void SafetensorsWriter::write_tensor(std::string_view, const void*, size_t) {}
std::string_view SafetensorsWriter::next_tensor() const {
  return {};
}
uint64_t SafetensorsWriter::bytes_left_in_tensor() const {
  return 0;
}
void SafetensorsWriter::finish() {}
void SafetensorsWriter::flush_buffer() {}
}  // namespace strata
