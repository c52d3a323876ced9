// safetensors: writer → reader round trip, and every malformed-file class the reader must reject
// with a message naming the file and the problem.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <numeric>

#include "storage/error.h"
#include "storage/safetensors.h"
#include "test_util.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// Write a raw safetensors file: header JSON text as given, then `data_len` bytes.
fs::path raw_file(const fs::path& dir, const std::string& name, const std::string& header,
                  size_t data_len, int64_t header_len_override = -1) {
  const fs::path p = dir / name;
  std::ofstream out(p, std::ios::binary);
  uint64_t n = header_len_override >= 0 ? uint64_t(header_len_override) : header.size();
  for (int i = 0; i < 8; ++i) out.put(char(n >> (8 * i)));
  out << header;
  for (size_t i = 0; i < data_len; ++i) out.put(char(i));
  return p;
}

std::string open_error(const fs::path& p) {
  try {
    SafetensorsFile f(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("dtype table", "[safetensors]") {
  CHECK(dtype_size(DType::BF16) == 2);
  CHECK(dtype_size(DType::F32) == 4);
  CHECK(dtype_size(DType::I64) == 8);
  CHECK(std::string(dtype_name(DType::U8)) == "U8");
  CHECK(parse_dtype("BF16") == DType::BF16);
  CHECK_FALSE(parse_dtype("bf16").has_value());
  CHECK(shape_str({3, 4}) == "[3, 4]");
}

TEST_CASE("writer streams tensors in chunks, and the reader maps them back", "[safetensors]") {
  const fs::path dir = test::scratch_dir("st_roundtrip");
  const fs::path p = dir / "a.safetensors";
  std::vector<float> a(1000);
  std::iota(a.begin(), a.end(), 0.5f);
  std::vector<uint8_t> b(7 * 3);
  std::iota(b.begin(), b.end(), uint8_t(1));
  {
    SafetensorsWriter w(
        p, {{"a", DType::F32, {10, 100}}, {"empty", DType::BF16, {0, 4}}, {"b", DType::U8, {7, 3}}},
        {{"format", "pt"}, {"who", "test"}});
    CHECK(w.next_tensor() == "a");
    // Chunks that do not follow tensor boundaries: 3 pieces crossing into b.
    std::vector<uint8_t> all(4000 + 21);
    std::memcpy(all.data(), a.data(), 4000);
    std::memcpy(all.data() + 4000, b.data(), 21);
    w.write(all.data(), 1234);
    CHECK(w.next_tensor() == "a");
    CHECK(w.bytes_left_in_tensor() == 4000 - 1234);
    w.write(all.data() + 1234, 4000 - 1234 + 5);
    CHECK(w.next_tensor() == "b");
    CHECK_FALSE(fs::exists(p));  // only the .partial exists until finish()
    w.write(all.data() + 4005, 16);
    CHECK(w.next_tensor().empty());
    w.finish();
  }
  REQUIRE(fs::exists(p));
  CHECK_FALSE(fs::exists(dir / "a.safetensors.partial"));
  SafetensorsFile f(p, 3);
  CHECK(f.tensors().size() == 3);
  CHECK(f.metadata().at("who") == "test");
  CHECK(f.data_start() % 8 == 0);
  const TensorInfo* ta = f.find("a");
  REQUIRE(ta);
  CHECK(ta->dtype == DType::F32);
  CHECK(ta->shape == std::vector<int64_t>{10, 100});
  CHECK(ta->numel() == 1000);
  CHECK(ta->file == 3);
  CHECK(ta->offset == f.data_start());
  CHECK(std::memcmp(f.bytes(*ta).data(), a.data(), 4000) == 0);
  const TensorInfo* tb = f.find("b");
  REQUIRE(tb);
  CHECK(tb->offset == f.data_start() + 4000);
  CHECK(std::memcmp(f.bytes(*tb).data(), b.data(), 21) == 0);
  CHECK(f.find("empty")->nbytes == 0);
  CHECK(f.find("nope") == nullptr);
  CHECK(f.file_size() == fs::file_size(p));
}

TEST_CASE("writer rejects misuse and leaves no file behind", "[safetensors][errors]") {
  const fs::path dir = test::scratch_dir("st_writer_errors");
  const fs::path p = dir / "w.safetensors";
  CHECK_THROWS_WITH(SafetensorsWriter(p, {{"x", DType::U8, {1}}, {"x", DType::U8, {2}}}),
                    Catch::Contains("tensor x declared twice"));
  {
    SafetensorsWriter w(p, {{"x", DType::U8, {4}}, {"y", DType::U8, {2}}});
    uint8_t buf[8] = {};
    CHECK_THROWS_WITH(w.write_tensor("y", buf, 2),
                      Catch::Contains("expected tensor x next, got y"));
    CHECK_THROWS_WITH(w.write_tensor("x", buf, 3), Catch::Contains("3 bytes given, 4 declared"));
    w.write_tensor("x", buf, 4);
    CHECK_THROWS_WITH(w.write(buf, 3), Catch::Contains("past the last tensor"));
    CHECK_THROWS_WITH(w.finish(),
                      Catch::Contains("finished after 4 of 6 data bytes (next tensor y)"));
  }
  CHECK_FALSE(fs::exists(p));
  CHECK_FALSE(fs::exists(dir / "w.safetensors.partial"));
}

TEST_CASE("malformed safetensors files are rejected naming file and problem",
          "[safetensors][errors]") {
  const fs::path dir = test::scratch_dir("st_malformed");
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  REQUIRE(open_error(raw_file(dir, "ok.safetensors", ok, 16)).empty());

  SECTION("corrupt header JSON") {
    const auto p = raw_file(dir, "bad.safetensors", R"({"t":{"dtype":"F32",)", 16);
    CHECK_THAT(open_error(p), Catch::StartsWith(p.string() + ": header is not valid JSON"));
  }
  SECTION("header that is not an object") {
    const auto p = raw_file(dir, "arr.safetensors", "[1,2]", 0);
    CHECK_THAT(open_error(p), Catch::Contains("header is not a JSON object"));
  }
  SECTION("offsets out of range") {
    const auto p = raw_file(dir, "oor.safetensors",
                            R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[16,32]}})", 16);
    CHECK_THAT(open_error(p), Catch::Contains(p.string() + ": tensor t: data_offsets [16, 32] run "
                                                           "past the data buffer (16 bytes"));
  }
  SECTION("overlapping tensors") {
    const auto p = raw_file(dir, "ovl.safetensors",
                            R"({"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},)"
                            R"("b":{"dtype":"U8","shape":[10],"data_offsets":[6,16]}})",
                            16);
    CHECK_THAT(open_error(p), Catch::Contains("tensors a and b overlap"));
  }
  SECTION("hole between tensors and trailing bytes") {
    const auto p = raw_file(dir, "hole.safetensors",
                            R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
                            12);
    CHECK_THAT(open_error(p), Catch::Contains("4 unused bytes before tensor b"));
    const auto q = raw_file(dir, "trail.safetensors", ok, 20);
    CHECK_THAT(open_error(q), Catch::Contains("4 bytes after the last tensor"));
  }
  SECTION("truncated file") {
    const auto p = raw_file(dir, "trunc.safetensors", ok, 16);
    fs::resize_file(p, fs::file_size(p) - 5);
    CHECK_THAT(open_error(p),
               Catch::Contains("run past the data buffer (11 bytes; file truncated?)"));
    const auto q = raw_file(dir, "tiny.safetensors", "", 0);
    fs::resize_file(q, 5);
    CHECK_THAT(open_error(q), Catch::Contains(q.string() + ": truncated: 5 bytes"));
    const auto r = raw_file(dir, "hdr.safetensors", ok, 0, 5000);
    CHECK_THAT(open_error(r),
               Catch::Contains("truncated: header length 5000 exceeds the file size"));
  }
  SECTION("insane header length") {
    const auto p = raw_file(dir, "huge.safetensors", ok, 16, int64_t(1) << 40);
    CHECK_THAT(open_error(p), Catch::Contains("header length 1099511627776 is not sane"));
  }
  SECTION("dtype × shape disagreeing with the byte count; unknown dtype; bad shape") {
    const auto p = raw_file(dir, "sz.safetensors",
                            R"({"t":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,16]}})", 16);
    CHECK_THAT(open_error(p),
               Catch::Contains("tensor t: BF16 [2, 2] needs 8 bytes but data_offsets span 16"));
    const auto q = raw_file(dir, "dt.safetensors",
                            R"({"t":{"dtype":"Q4","shape":[2,2],"data_offsets":[0,16]}})", 16);
    CHECK_THAT(open_error(q), Catch::Contains("tensor t: unknown dtype \"Q4\""));
    const auto r = raw_file(dir, "neg.safetensors",
                            R"({"t":{"dtype":"U8","shape":[-2,2],"data_offsets":[0,16]}})", 16);
    CHECK_THAT(open_error(r),
               Catch::Contains("tensor t: shape [-2,2] has a non-integer or negative dim"));
    const auto s = raw_file(dir, "big.safetensors",
                            R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],)"
                            R"("data_offsets":[0,16]}})",
                            16);
    CHECK_THAT(open_error(s),
               Catch::Contains("needs more bytes than the file's whole data buffer"));
  }
  SECTION("missing file") {
    CHECK_THAT(open_error(dir / "none.safetensors"),
               Catch::Contains("none.safetensors: cannot open"));
  }
}
