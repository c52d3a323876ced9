// Tests for engine/tokenizer: every case of golden/tokenizer/cases.jsonl (ids, decode, pieces),
// BPE against a plain quadratic reference, the stand-in tokenizer of synthetic checkpoints, and
// the error paths.
#include "engine/tokenizer.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "storage/error.h"
#include "storage/tiktoken_files.h"
#include "test_util.h"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using strata::Tokenizer;

namespace {

fs::path golden_tok() {
  return strata::test::golden_dir() / "tokenizer";
}

// Skips (or fails under STRATA_REQUIRE_SHARED=1) without the golden tokenizer cases.
void need_golden() {
  strata::test::need_shared(golden_tok() / "cases.jsonl");
}

// tiktoken's byte_pair_merge, written the plain quadratic way: the oracle for Tokenizer's heap.
std::vector<int> reference_bpe(const std::map<std::string, int>& ranks, const std::string& piece) {
  if (auto it = ranks.find(piece); it != ranks.end()) return {it->second};
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  for (;;) {
    int best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && (best < 0 || it->second < best)) best = it->second, at = i;
    }
    if (best < 0) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + long(at) + 1);
  }
  std::vector<int> ids;
  for (auto& p : parts) ids.push_back(ranks.at(p));
  return ids;
}

std::string show(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size() && i < 40; ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + (v.size() > 40 ? ",...]" : "]");
}

}  // namespace

TEST_CASE("tokenizer: every golden case (ids, decode, pieces)", "[tokenizer]") {
  need_golden();
  const Tokenizer tok = Tokenizer::load(golden_tok());
  REQUIRE(tok.vocab_size() == 4096);
  REQUIRE(tok.bos_id() == 3840);
  REQUIRE(tok.eos_id() == 3841);
  REQUIRE(tok.jit());

  std::ifstream f(golden_tok() / "cases.jsonl");
  REQUIRE(f);
  int cases = 0, ids_ok = 0, decode_ok = 0, pieces_checked = 0, pieces_ok = 0;
  std::map<std::string, int> per_category;
  double long_400k_ms = -1;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty()) continue;
    const auto c = nlohmann::json::parse(line);
    const std::string name = c.at("name"), text = c.at("text");
    const std::vector<int> want = c.at("ids");
    ++cases;
    ++per_category[c.at("category")];
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int> got = tok.encode(text);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (name == "long_400k_chunk") long_400k_ms = ms;
    if (got == want) {
      ++ids_ok;
    } else {
      FAIL_CHECK(name << ": encode gave " << got.size() << " ids " << show(got) << ", expected "
                      << want.size() << " " << show(want));
    }
    const std::string back = tok.decode(want);
    if (back == text && tok.decode_text(want) == text) {
      ++decode_ok;
    } else {
      FAIL_CHECK(name << ": decode(ids) differs from text");
    }
    if (!c.at("pieces").is_null()) {
      ++pieces_checked;
      const std::vector<std::string> want_pieces = c.at("pieces");
      if (tok.pretokenize(text) == want_pieces) {
        ++pieces_ok;
      } else {
        FAIL_CHECK(name << ": pretokenize differs from the golden pieces");
      }
    }
  }
  std::printf(
      "tokenizer golden: %d cases (%zu categories): encode ok %d/%d, decode ok %d/%d, pieces ok "
      "%d/%d; encode(long_400k_chunk, 400,020 code points) %.1f ms\n",
      cases, per_category.size(), ids_ok, cases, decode_ok, cases, pieces_ok, pieces_checked,
      long_400k_ms);
  CHECK(cases == 598);
  CHECK(per_category.size() == 18);
  CHECK(ids_ok == cases);
  CHECK(decode_ok == cases);
  CHECK(pieces_ok == pieces_checked);
  CHECK(pieces_checked == cases - per_category["long"]);
  // Generous bound (measured 60–400 ms, 2.4 s under ASan on a loaded machine): guards against a
  // quadratic BPE or regex scan, which takes minutes on this input, not against a slow CI machine.
  CHECK(long_400k_ms >= 0);
  CHECK(long_400k_ms < 30000);
}

TEST_CASE("tokenizer: heap BPE equals the quadratic reference on long pieces", "[tokenizer]") {
  need_golden();
  const Tokenizer tok = Tokenizer::load(golden_tok());
  const auto files = strata::load_tokenizer_files(golden_tok());
  const std::map<std::string, int> ranks(files.ranks.begin(), files.ranks.end());
  std::mt19937 rng(1234);
  // Each text is one regex piece: a lowercase word, or a punctuation run, or a Han run.
  const std::vector<std::vector<std::string>> alphabets = {
      {"a", "b", "e", "t", "h", "n", "s"},
      {"=", "-", "~", "*", "#", "/"},
      {"\xE7\x9A\x84", "\xE6\x98\xAF", "\xE4\xB8\x80", "\xE5\x91\xBD", "\xE4\xBB\xA4"}};
  int checked = 0;
  for (const auto& alpha : alphabets) {
    for (int len : {2, 3, 5, 17, 64, 300, 800}) {
      std::string text;
      for (int i = 0; i < len; ++i) text += alpha[rng() % alpha.size()];
      const auto pieces = tok.pretokenize(text);
      REQUIRE(pieces.size() == 1);
      INFO("text of " << len << " characters from alphabet starting " << alpha[0]);
      CHECK(tok.encode(text) == reference_bpe(ranks, text));
      ++checked;
    }
  }
  CHECK(checked == 21);
}

TEST_CASE("tokenizer: BPE tie-break and the whole-piece shortcut", "[tokenizer]") {
  // A hand-made vocabulary: bytes, then "aa" (256) and "abc" (257, not reachable by merges
  // because neither "ab" nor "bc" is a token).
  strata::TokenizerFiles files;
  for (int b = 0; b < 256; ++b) files.ranks.emplace_back(std::string(1, char(b)), b);
  files.ranks.emplace_back("aa", 256);
  files.ranks.emplace_back("abc", 257);
  files.num_mergeable = 258;
  files.num_specials = 2;
  files.specials = {{258, "[BOS]"}, {259, "[EOS]"}};
  files.bos_id = 258;
  files.eos_id = 259;
  const Tokenizer tok = Tokenizer::from_files(files);
  CHECK(tok.encode("aaa") == std::vector<int>{256, 'a'});  // leftmost pair merges first
  CHECK(tok.encode("aaaaa") == std::vector<int>{256, 256, 'a'});
  CHECK(tok.encode("abc") == std::vector<int>{257});                  // whole piece is a token
  CHECK(tok.encode("xabc") == std::vector<int>{'x', 'a', 'b', 'c'});  // not reachable by merges
  CHECK(tok.encode("[BOS]abc[EOS]") == std::vector<int>{258, 257, 259});
  CHECK(tok.pretokenize("[BOS]abc def[EOS]") ==
        std::vector<std::string>{"[BOS]", "abc", " def", "[EOS]"});
  CHECK(tok.is_special(258));
  CHECK_FALSE(tok.is_special(257));
  CHECK(tok.special_id("[EOS]") == 259);
  CHECK(tok.special_id("[EOS") == -1);
  CHECK(tok.encode("").empty());
}

TEST_CASE("tokenizer: stand-in tokenizer of synthetic checkpoints round-trips", "[tokenizer]") {
  for (int v : {1024, 163840}) {
    INFO("vocab_size " << v);
    const auto dir = strata::test::scratch_dir("tokenizer_standin_" + std::to_string(v));
    strata::write_standin_tokenizer(dir, v);
    const Tokenizer tok = Tokenizer::load(dir);
    REQUIRE(tok.vocab_size() == v);
    const std::string text =
        "[BOS]The quick brown fox jumps over the lazy dog. It's 2026!\n"
        "def main(argv):\n    return 0\n<|im_end|>"
        "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80 "
        "caf\xC3\xA9 \xCE\xB1\xCE\xB2\xCE\xB3";
    const std::vector<int> ids = tok.encode(text);
    REQUIRE(!ids.empty());
    for (int id : ids) REQUIRE((id >= 0 && id < v));
    CHECK(ids.front() == tok.bos_id());
    CHECK(std::count(ids.begin(), ids.end(), tok.special_id("<|im_end|>")) == 1);
    CHECK(tok.decode(ids) == text);
    // The learnt merges compress English: far fewer ids than bytes.
    const std::string sentence = "The quick brown fox jumps over the lazy dog.";
    const std::vector<int> english = tok.encode(sentence);
    CHECK(english.size() * 3 < sentence.size() * 2);
  }
}

TEST_CASE("tokenizer: bad input and UTF-8 helpers", "[tokenizer]") {
  const auto dir = strata::test::scratch_dir("tokenizer_errors");
  strata::write_standin_tokenizer(dir, 1024);
  const Tokenizer tok = Tokenizer::load(dir);
  REQUIRE_THROWS_AS(tok.encode("ok \xFF bad"), strata::Error);
  REQUIRE_THROWS_WITH(tok.encode("ok \xFF bad"), Contains("not valid UTF-8 at byte offset 3"));
  REQUIRE_THROWS_WITH(tok.encode("ab\xE4\xBD"), Contains("byte offset 2"));    // truncated
  REQUIRE_THROWS_WITH(tok.encode("\xED\xA0\x80"), Contains("byte offset 0"));  // surrogate
  REQUIRE_THROWS_WITH(tok.decode({1, 1024}), Contains("token id 1024 is outside"));
  REQUIRE_THROWS_WITH(tok.decode_token(-1), Contains("token id -1 is outside"));

  // U+4F60 = E4 BD A0 split across tokens: decode() keeps bytes, decode_text() replaces.
  CHECK(tok.decode({0xE4, 0xBD}) == "\xE4\xBD");
  CHECK(tok.decode_text({0xE4, 0xBD}) == "\xEF\xBF\xBD");
  CHECK(strata::engine::utf8_replace_invalid("a\xFF\xE4\xBDz\xC0\xAF") ==
        "a\xEF\xBF\xBD\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD");
  strata::engine::Utf8Stream stream;
  CHECK(stream.push("x\xE4") == "x");
  CHECK(stream.push("\xBD") == "");
  CHECK(stream.push("\xA0y") == "\xE4\xBD\xA0y");
  CHECK(stream.push("\xF0\x9F") == "");
  CHECK(stream.flush() == "\xEF\xBF\xBD");
  CHECK(stream.flush() == "");

  REQUIRE_THROWS_WITH(Tokenizer::load(dir / "missing"), Contains("tiktoken.model: cannot open"));
}

TEST_CASE("tokenizer: one Tokenizer encodes from several threads at once", "[tokenizer]") {
  need_golden();
  const Tokenizer tok = Tokenizer::load(golden_tok());
  std::ifstream f(golden_tok() / "cases.jsonl");
  std::vector<std::string> texts;
  std::vector<std::vector<int>> want;
  std::string line;
  while (std::getline(f, line)) {
    const auto c = nlohmann::json::parse(line);
    if (c.at("category") == "long") continue;
    texts.push_back(c.at("text"));
    want.push_back(c.at("ids"));
  }
  REQUIRE(texts.size() > 500);
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 2; ++rep)
        for (size_t i = size_t(t); i < texts.size() + size_t(t); ++i) {
          const size_t k = i % texts.size();  // each thread starts at a different case
          if (tok.encode(texts[k]) != want[k]) ++mismatches[size_t(t)];
        }
    });
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}
