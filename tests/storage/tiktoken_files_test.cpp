// Tests for storage/tiktoken_files: loading the golden Kimi-format files, write/load round trip,
// the stand-in tokenizer for synthetic checkpoints, and clear errors on malformed files.
#include "storage/tiktoken_files.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <set>

#include "storage/error.h"
#include "test_util.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using strata::TokenizerFiles;

namespace {

fs::path golden_tok() {
  return strata::test::golden_dir() / "tokenizer";
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A minimal valid tokenizer: 256 byte tokens + "ab" (rank 256), 2 specials via the override.
const char* kMinimalConfig = R"({
  "added_tokens_decoder": {"257": {"content": "[BOS]"}, "258": {"content": "[EOS]"}},
  "bos_token": "[BOS]", "eos_token": {"content": "[EOS]"}, "num_reserved_special_tokens": 2
})";

std::string minimal_model() {
  TokenizerFiles f;
  for (int b = 0; b < 256; ++b) f.ranks.emplace_back(std::string(1, char(b)), b);
  f.ranks.emplace_back("ab", 256);
  f.num_mergeable = 257;
  auto dir = strata::test::scratch_dir("tiktoken_minimal_src");
  f.num_specials = 2;
  f.specials = {{257, "[BOS]"}, {258, "[EOS]"}};
  f.bos_id = 257;
  f.eos_id = 258;
  strata::write_tokenizer_files(dir, f);
  return read_text(dir / "tiktoken.model");
}

}  // namespace

TEST_CASE("tiktoken_files: loads the golden Kimi-format tokenizer", "[tokenizer]") {
  strata::test::need_shared(golden_tok() / "tiktoken.model");
  const TokenizerFiles f = strata::load_tokenizer_files(golden_tok());
  REQUIRE(f.num_mergeable == 3840);
  REQUIRE(f.ranks.size() == 3840);
  REQUIRE(f.num_specials == 256);
  REQUIRE(f.vocab_size() == 4096);
  std::set<int> ranks;
  for (const auto& [bytes, rank] : f.ranks) {
    ranks.insert(rank);
    if (rank < 256) {
      REQUIRE(bytes.size() == 1);
      REQUIRE(int(uint8_t(bytes[0])) == rank);
    }
  }
  REQUIRE(ranks.size() == 3840);
  REQUIRE(*ranks.rbegin() == 3839);
  REQUIRE(f.specials.size() == 256);
  REQUIRE(f.specials.begin()->first == 3840);
  REQUIRE(f.specials.rbegin()->first == 4095);
  CHECK(f.specials.at(3840) == "[BOS]");
  CHECK(f.specials.at(3842) == "<|im_end|>");
  CHECK(f.specials.at(3845) == "<|reserved_token_3845|>");
  CHECK(f.specials.at(3863) == "</think>");
  CHECK(f.specials.at(4094) == "[UNK]");
  CHECK(f.bos_id == 3840);
  CHECK(f.eos_id == 3841);
  CHECK(f.unk_id == 4094);
  CHECK(f.pad_id == 4095);
}

TEST_CASE("tiktoken_files: write then load gives the same tokenizer", "[tokenizer]") {
  strata::test::need_shared(golden_tok() / "tiktoken.model");
  const TokenizerFiles a = strata::load_tokenizer_files(golden_tok());
  const auto dir = strata::test::scratch_dir("tiktoken_roundtrip");
  strata::write_tokenizer_files(dir, a);
  // tiktoken.model is written in the canonical layout, so it is byte-identical.
  CHECK(read_text(dir / "tiktoken.model") == read_text(golden_tok() / "tiktoken.model"));
  const TokenizerFiles b = strata::load_tokenizer_files(dir);
  CHECK(b.ranks == a.ranks);
  CHECK(b.specials == a.specials);
  CHECK(b.num_specials == a.num_specials);
  CHECK(b.bos_id == a.bos_id);
  CHECK(b.eos_id == a.eos_id);
  CHECK(b.pad_id == a.pad_id);
  CHECK(b.unk_id == a.unk_id);
}

TEST_CASE("tiktoken_files: stand-in tokenizer fills exactly vocab_size ids", "[tokenizer]") {
  for (int v : {288, 1024, 4096, 32000, 163840}) {
    INFO("vocab_size " << v);
    const auto dir = strata::test::scratch_dir("tiktoken_standin_" + std::to_string(v));
    strata::write_standin_tokenizer(dir, v);
    const TokenizerFiles f = strata::load_tokenizer_files(dir);  // validates ranks 0..N-1, unique
    REQUIRE(f.vocab_size() == v);
    REQUIRE(f.num_specials == (v >= 4096 ? 256 : std::min(std::max(32, v / 8), v - 256)));
    REQUIRE(f.specials.size() == size_t(f.num_specials));
    REQUIRE(f.specials.rbegin()->first == v - 1);
    CHECK(f.specials.at(f.bos_id) == "[BOS]");
    CHECK(f.bos_id == f.num_mergeable);
    CHECK(f.specials.at(f.eos_id) == "[EOS]");
    CHECK(f.specials.at(f.num_mergeable + 2) == "<|im_end|>");
    CHECK(f.unk_id == v - 2);
    CHECK(f.pad_id == v - 1);
    std::set<std::string> tokens;
    bool has_the = false;
    for (const auto& [bytes, rank] : f.ranks) {
      tokens.insert(bytes);
      if (rank < 256) REQUIRE((bytes.size() == 1 && int(uint8_t(bytes[0])) == rank));
      if (bytes == " the") has_the = true;
    }
    REQUIRE(tokens.size() == f.ranks.size());
    if (v >= 1024) CHECK(has_the);  // learnt from the built-in English text
    if (v > 32000) continue;        // (keeps the test short; the check below is size-independent)
    // Deterministic: a second write is byte-identical.
    const auto dir2 = strata::test::scratch_dir("tiktoken_standin_again");
    strata::write_standin_tokenizer(dir2, v);
    CHECK(read_text(dir2 / "tiktoken.model") == read_text(dir / "tiktoken.model"));
    CHECK(read_text(dir2 / "tokenizer_config.json") == read_text(dir / "tokenizer_config.json"));
  }
  REQUIRE_THROWS_WITH(strata::write_standin_tokenizer(strata::test::scratch_dir("x"), 287),
                      Contains("too small"));
}

TEST_CASE("tiktoken_files: malformed files give errors naming file and line", "[tokenizer]") {
  const auto dir = strata::test::scratch_dir("tiktoken_bad");
  const std::string good = minimal_model();
  write_text(dir / "tokenizer_config.json", kMinimalConfig);
  write_text(dir / "tiktoken.model", good);
  {
    const TokenizerFiles f = strata::load_tokenizer_files(dir);
    REQUIRE(f.vocab_size() == 259);
    REQUIRE(f.bos_id == 257);
    REQUIRE(f.eos_id == 258);
    REQUIRE(f.pad_id == -1);
  }
  auto model_error = [&](const std::string& text, const std::string& expect) {
    write_text(dir / "tiktoken.model", text);
    REQUIRE_THROWS_AS(strata::load_tokenizer_files(dir), strata::Error);
    REQUIRE_THROWS_WITH(strata::load_tokenizer_files(dir), Contains("tiktoken.model:"));
    REQUIRE_THROWS_WITH(strata::load_tokenizer_files(dir), Contains(expect));
  };
  // Line 258 is "YWI= 256" ("ab"); line numbers count from 1.
  const size_t last = good.rfind("YWI= 256");
  REQUIRE(last != std::string::npos);
  const std::string head = good.substr(0, last);
  model_error(head + "YW!= 256\n", "tiktoken.model:257: bad base64");
  model_error(head + "YWI 256\n", "tiktoken.model:257: bad base64");
  model_error(head + "YWI= 255\n", "tiktoken.model:257: duplicate rank 255 (first on line 256)");
  model_error(head + "YQ== 256\n", "tiktoken.model:257: duplicate token");
  model_error(head + "YWI=256\n", "tiktoken.model:257: expected '<base64 token> <rank>'");
  model_error(head + "YWI= 2x\n", "tiktoken.model:257: bad rank '2x'");
  model_error(head + "YWI= 300\n", "tiktoken.model:257: rank 300 out of range");
  model_error(head + "\n\nYWI= -1\n", "tiktoken.model:259: bad rank '-1'");
  model_error(head + "\n\n\nYWI= 258\n",
              "tiktoken.model:260: rank 258 out of range: 257 tokens must have ranks 0..256");

  write_text(dir / "tiktoken.model", good);
  auto config_error = [&](const std::string& text, const std::string& expect) {
    write_text(dir / "tokenizer_config.json", text);
    REQUIRE_THROWS_AS(strata::load_tokenizer_files(dir), strata::Error);
    REQUIRE_THROWS_WITH(strata::load_tokenizer_files(dir), Contains("tokenizer_config.json"));
    REQUIRE_THROWS_WITH(strata::load_tokenizer_files(dir), Contains(expect));
  };
  config_error(R"({"bos_token": "[BOS]", "eos_token": "[EOS]"})",
               "missing field 'added_tokens_decoder'");
  config_error(R"({"added_tokens_decoder": {"257": {"content": "[BOS]"}}, "bos_token": "[BOS]",
                   "num_reserved_special_tokens": 2})",
               "missing field 'eos_token'");
  config_error(R"({"added_tokens_decoder": {"300": {"content": "[BOS]"}}, "bos_token": "[BOS]",
                   "eos_token": "[BOS]", "num_reserved_special_tokens": 2})",
               "added_tokens_decoder[\"300\"]: id outside the special range 257..258");
  config_error(R"({"added_tokens_decoder": {"257": {"text": "[BOS]"}}, "bos_token": "[BOS]",
                   "eos_token": "[BOS]", "num_reserved_special_tokens": 2})",
               "missing or empty string field 'content'");
  config_error(R"({"added_tokens_decoder": {"257": {"content": "[BOS]"}}, "bos_token": "[X]",
                   "eos_token": "[BOS]", "num_reserved_special_tokens": 2})",
               "bos_token '[X]' is not one of the special tokens");
  config_error(R"({"added_tokens_decoder": {"257": {"content": "A"}, "258": {"content": "A"}},
                   "bos_token": "A", "eos_token": "A", "num_reserved_special_tokens": 2})",
               "special token 'A' is given to both id 257 and id 258");
  config_error(R"({"added_tokens_decoder": {)", "invalid JSON");
  fs::remove(dir / "tokenizer_config.json");
  REQUIRE_THROWS_WITH(strata::load_tokenizer_files(dir),
                      Contains("tokenizer_config.json: cannot open"));
}
