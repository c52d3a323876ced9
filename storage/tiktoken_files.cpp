// Reading and writing the Kimi tokenizer files (tiktoken.model, tokenizer_config.json) and the
// deterministic stand-in tokenizer for synthetic checkpoints. See storage/tiktoken_files.h.
#include "storage/tiktoken_files.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "storage/error.h"
#include "storage/files.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kB64Alphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict standard base64 with '=' padding. Returns false on any malformed input.
bool b64_decode(std::string_view s, std::string& out) {
  out.clear();
  if (s.empty() || s.size() % 4 != 0) return false;
  for (size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i + k];
      if (c == '=' && last && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return false;  // data after padding
      v[k] = b64_value(c);
      if (v[k] < 0) return false;
    }
    const uint32_t w =
        (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out.push_back(char((w >> 16) & 0xFF));
    if (pad < 2) out.push_back(char((w >> 8) & 0xFF));
    if (pad < 1) out.push_back(char(w & 0xFF));
  }
  return true;
}

std::string b64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t w = uint32_t(uint8_t(bytes[i])) << 16;
    if (n > 1) w |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (n > 2) w |= uint32_t(uint8_t(bytes[i + 2]));
    out.push_back(kB64Alphabet[(w >> 18) & 63]);
    out.push_back(kB64Alphabet[(w >> 12) & 63]);
    out.push_back(n > 1 ? kB64Alphabet[(w >> 6) & 63] : '=');
    out.push_back(n > 2 ? kB64Alphabet[w & 63] : '=');
  }
  return out;
}

std::string read_file(const fs::path& p) {
  if (!fs::exists(p))
    throw Error(p.string() + ": cannot open (a Kimi tokenizer directory needs it)");
  return read_small_file(p, p.string());
}

void write_file(const fs::path& p, std::string_view data) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(p.string() + ": cannot create");
  f.write(data.data(), std::streamsize(data.size()));
  f.close();
  if (!f) throw Error(p.string() + ": write failed");
}

std::string reserved_name(int id) {
  return "<|reserved_token_" + std::to_string(id) + "|>";
}

void parse_tiktoken_model(const std::string& data, const std::string& where, TokenizerFiles& out) {
  // Ranks must be 0..N-1 with N <= the number of lines, so a line index per rank fits in a vector.
  const size_t max_lines = size_t(std::count(data.begin(), data.end(), '\n')) + 1;
  std::unordered_map<std::string, int> seen_token;  // bytes -> line
  seen_token.reserve(max_lines);
  std::vector<int> rank_line(max_lines, 0);  // rank -> line (0 = not seen)
  out.ranks.reserve(max_lines);
  std::string bytes;
  size_t pos = 0;
  int line_no = 0;
  while (pos < data.size()) {
    size_t end = data.find('\n', pos);
    if (end == std::string::npos) end = data.size();
    std::string_view line(data.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::string at = where + ":" + std::to_string(line_no) + ": ";
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos)
      throw Error(at + "expected '<base64 token> <rank>', found no space");
    const std::string_view b64 = line.substr(0, sp);
    const std::string_view rank_text = line.substr(sp + 1);
    if (!b64_decode(b64, bytes))
      throw Error(at + "bad base64 token '" + std::string(b64.substr(0, 64)) + "'");
    int rank = -1;
    auto [p, ec] = std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (ec != std::errc() || p != rank_text.data() + rank_text.size() || rank < 0)
      throw Error(at + "bad rank '" + std::string(rank_text.substr(0, 32)) +
                  "' (expected a non-negative integer)");
    if (size_t(rank) >= max_lines)
      throw Error(at + "rank " + std::to_string(rank) + " out of range: the file has only " +
                  std::to_string(max_lines) + " lines, so ranks must be below that");
    if (rank_line[size_t(rank)] != 0)
      throw Error(at + "duplicate rank " + std::to_string(rank) + " (first on line " +
                  std::to_string(rank_line[size_t(rank)]) + ")");
    if (auto it = seen_token.find(bytes); it != seen_token.end())
      throw Error(at + "duplicate token '" + std::string(b64) + "' (first on line " +
                  std::to_string(it->second) + ")");
    rank_line[size_t(rank)] = line_no;
    seen_token.emplace(bytes, line_no);
    out.ranks.emplace_back(bytes, rank);
  }
  if (out.ranks.empty()) throw Error(where + ": no tokens (expected '<base64> <rank>' lines)");
  const int n = int(out.ranks.size());
  for (size_t r = size_t(n); r < max_lines; ++r)
    if (rank_line[r] != 0)
      throw Error(where + ":" + std::to_string(rank_line[r]) + ": rank " + std::to_string(r) +
                  " out of range: " + std::to_string(n) + " tokens must have ranks 0.." +
                  std::to_string(n - 1));
  out.num_mergeable = n;
}

// bos_token & co. are either a string or an AddedToken object {"content": ...}; null/absent
// means "none".
std::string token_content(const nlohmann::json& cfg, const char* key, const std::string& where,
                          bool required) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) {
    if (required) throw Error(where + ": missing field '" + key + "'");
    return {};
  }
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  throw Error(where + ": field '" + key + "' must be a string or {\"content\": string}");
}

void parse_tokenizer_config(const std::string& text, const std::string& where,
                            TokenizerFiles& out) {
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // also out_of_range: a number beyond double
    throw Error(where + ": invalid JSON: " + e.what());
  }
  if (!cfg.is_object()) throw Error(where + ": expected a JSON object at top level");

  out.num_specials = kKimiNumSpecialTokens;
  if (auto it = cfg.find("num_reserved_special_tokens"); it != cfg.end()) {
    if (!it->is_number_integer() || it->get<long long>() < 1 ||
        it->get<long long>() > kKimiNumSpecialTokens)
      throw Error(where + ": 'num_reserved_special_tokens' must be an integer in 1.." +
                  std::to_string(kKimiNumSpecialTokens));
    out.num_specials = it->get<int>();
  }
  const int n = out.num_mergeable;
  for (int i = 0; i < out.num_specials; ++i) out.specials[n + i] = reserved_name(n + i);

  auto atd = cfg.find("added_tokens_decoder");
  if (atd == cfg.end()) throw Error(where + ": missing field 'added_tokens_decoder'");
  if (!atd->is_object())
    throw Error(where +
                ": 'added_tokens_decoder' must be an object {\"<id>\": {\"content\": ...}}");
  for (const auto& [key, val] : atd->items()) {
    const std::string at = where + ": added_tokens_decoder[\"" + key + "\"]";
    int id = -1;
    auto [p, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || p != key.data() + key.size())
      throw Error(at + ": key is not an integer id");
    if (id < n || id >= n + out.num_specials)
      throw Error(at + ": id outside the special range " + std::to_string(n) + ".." +
                  std::to_string(n + out.num_specials - 1) + " (tiktoken.model has " +
                  std::to_string(n) + " ranks)");
    if (!val.is_object()) throw Error(at + ": expected an object with 'content'");
    auto c = val.find("content");
    if (c == val.end() || !c->is_string() || c->get<std::string>().empty())
      throw Error(at + ": missing or empty string field 'content'");
    out.specials[id] = c->get<std::string>();
  }
  std::unordered_map<std::string, int> by_text;
  for (const auto& [id, text] : out.specials) {
    auto [it, fresh] = by_text.emplace(text, id);
    if (!fresh)
      throw Error(where + ": special token '" + text + "' is given to both id " +
                  std::to_string(it->second) + " and id " + std::to_string(id));
  }
  auto id_of = [&](const char* key, bool required) {
    const std::string text = token_content(cfg, key, where, required);
    if (text.empty()) return -1;
    auto it = by_text.find(text);
    if (it == by_text.end())
      throw Error(where + ": " + key + " '" + text + "' is not one of the special tokens");
    return it->second;
  };
  out.bos_id = id_of("bos_token", true);
  out.eos_id = id_of("eos_token", true);
  out.pad_id = id_of("pad_token", false);
  out.unk_id = id_of("unk_token", false);
}

// --- the stand-in tokenizer -------------------------------------------------------------------

// A little English prose and code: the merges learnt from it make ordinary text encode to
// plausible multi-byte tokens, so synthetic-model demos and benchmarks see realistic id counts.
constexpr std::string_view kStandinCorpus = R"(The quick brown fox jumps over the lazy dog.
It is a truth universally acknowledged, that a single man in possession of a good fortune, must
be in want of a wife. However little known the feelings or views of such a man may be on his
first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding
families, that he is considered the rightful property of some one or other of their daughters.
Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my
purse, and nothing particular to interest me on shore, I thought I would sail about a little and
see the watery part of the world. It was the best of times, it was the worst of times, it was the
age of wisdom, it was the age of foolishness, it was the epoch of belief, it was the epoch of
incredulity, it was the season of Light, it was the season of Darkness, it was the spring of hope,
it was the winter of despair. In the beginning there was the word, and the word was with them.
The model reads the prompt, computes the hidden state of every token through each layer, and then
predicts the next token. Experts that are not resident on the GPU are computed on the CPU, where
their weights live in host memory. We measure the bandwidth of every tier before we plan.
What would you like to know? I'm not sure that's right; they'll see what we've done, and you'd
agree that it's the best answer we can give. Thank you for your question! Here is a summary:
1. Read the configuration file. 2. Load the weights. 3. Run the model on 128 tokens at a time.
def main(argv):
    parser = argparse.ArgumentParser(description="Run the model")
    parser.add_argument("--model", type=str, required=True)
    args = parser.parse_args(argv)
    for i in range(len(args.inputs)):
        if args.inputs[i] is None:
            return None
        print(f"input {i}: {args.inputs[i]}")
    return 0

int main(int argc, char** argv) {
  std::vector<int> ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) return 1;
    std::printf("%d\n", ids[i]);
  }
  return 0;
}
{"name": "strata", "version": "0.1.0", "layers": [1, 2, 3], "hidden_size": 7168, "enabled": true}
)";

std::vector<std::string> standin_words() {
  // A simplified ASCII version of the Kimi pre-tokenizer: letters with an optional leading
  // non-letter, up to three digits, punctuation runs with an optional leading space, whitespace.
  auto is_alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  auto is_ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  std::vector<std::string> words;
  const std::string_view s = kStandinCorpus;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!is_alpha(s[j]) && !is_digit(s[j]) && s[j] != '\n' && j + 1 < s.size() &&
        is_alpha(s[j + 1])) {
      ++j;
      while (j < s.size() && is_alpha(s[j])) ++j;
    } else if (is_alpha(s[j])) {
      while (j < s.size() && is_alpha(s[j])) ++j;
    } else if (is_digit(s[j])) {
      while (j < s.size() && j - i < 3 && is_digit(s[j])) ++j;
    } else if (is_ws(s[j])) {
      while (j < s.size() && is_ws(s[j])) ++j;
    } else {
      while (j < s.size() && !is_ws(s[j]) && !is_alpha(s[j]) && !is_digit(s[j])) ++j;
    }
    words.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return words;
}

// Byte-level BPE training (most frequent adjacent pair; ties to the pair of smaller ids) on the
// built-in corpus, then deterministic extension (existing token + a common letter) until
// num_merges new tokens exist. Returns the tokens in rank order, starting with the 256 bytes.
std::vector<std::string> standin_vocab(int num_merges) {
  std::vector<std::string> vocab;
  std::unordered_map<std::string, int> index;
  for (int b = 0; b < 256; ++b) {
    vocab.emplace_back(1, char(b));
    index.emplace(vocab.back(), b);
  }
  const size_t target = 256 + size_t(num_merges);

  std::map<std::string, int> word_count;
  for (auto& w : standin_words()) ++word_count[w];
  std::vector<std::pair<std::vector<int>, int>> words;  // token ids, count
  for (auto& [w, c] : word_count) {
    std::vector<int> ids;
    for (char ch : w) ids.push_back(uint8_t(ch));
    words.emplace_back(std::move(ids), c);
  }
  while (vocab.size() < target) {
    std::map<std::pair<int, int>, int> pair_count;
    for (auto& [ids, c] : words)
      for (size_t k = 0; k + 1 < ids.size(); ++k) pair_count[{ids[k], ids[k + 1]}] += c;
    std::pair<int, int> best{-1, -1};
    int best_count = 0;
    for (auto& [pr, c] : pair_count)
      if (c > best_count) best = pr, best_count = c;  // std::map order = smaller ids first on ties
    if (best_count < 2) break;
    const std::string merged = vocab[best.first] + vocab[best.second];
    int new_id;
    if (auto it = index.find(merged); it != index.end()) {
      new_id = it->second;
    } else {
      new_id = int(vocab.size());
      vocab.push_back(merged);
      index.emplace(merged, new_id);
    }
    for (auto& [ids, c] : words) {
      std::vector<int> next;
      next.reserve(ids.size());
      for (size_t k = 0; k < ids.size(); ++k) {
        if (k + 1 < ids.size() && ids[k] == best.first && ids[k + 1] == best.second) {
          next.push_back(new_id);
          ++k;
        } else {
          next.push_back(ids[k]);
        }
      }
      ids = std::move(next);
    }
  }
  constexpr std::string_view kExtend = "etaoinsrhldcumfpgwybvkxjqz";
  const size_t first_base = vocab.size() > 256 ? 256 : 0;
  for (size_t base = first_base; vocab.size() < target; ++base) {
    for (char ch : kExtend) {
      if (vocab.size() >= target) break;
      std::string cand = vocab[base] + ch;
      if (index.count(cand)) continue;
      index.emplace(cand, int(vocab.size()));
      vocab.push_back(std::move(cand));
    }
  }
  return vocab;
}

// K3's four chat tokens (spec/chat-format.md); the stand-in tokenizer puts them after the Kimi
// names.
const std::vector<std::pair<int, std::string>>& k3_chat_offsets() {
  static const std::vector<std::pair<int, std::string>> v = {
      {24, "<|open|>"}, {25, "<|sep|>"}, {26, "<|close|>"}, {27, "<|end_of_msg|>"}};
  return v;
}

// Names at the Kimi offsets (golden/tokenizer/README.md §2); other offsets are reserved names.
const std::vector<std::pair<int, std::string>>& kimi_named_offsets() {
  static const std::vector<std::pair<int, std::string>> v = {
      {0, "[BOS]"},
      {1, "[EOS]"},
      {2, "<|im_end|>"},
      {3, "<|im_user|>"},
      {4, "<|im_assistant|>"},
      {6, "<|start_header_id|>"},
      {7, "<|end_header_id|>"},
      {9, "[EOT]"},
      {10, "<|im_system|>"},
      {11, "<|tool_calls_section_begin|>"},
      {12, "<|tool_calls_section_end|>"},
      {13, "<|tool_call_begin|>"},
      {14, "<|tool_call_argument_begin|>"},
      {15, "<|tool_call_end|>"},
      {17, "<|im_middle|>"},
      {18, "<|media_begin|>"},
      {19, "<|media_content|>"},
      {20, "<|media_end|>"},
      {21, "<|media_pad|>"},
      {22, "<think>"},
      {23, "</think>"},
  };
  return v;
}

}  // namespace

TokenizerFiles load_tokenizer_files(const fs::path& model_dir) {
  const fs::path model = model_dir / "tiktoken.model", config = model_dir / "tokenizer_config.json";
  const std::string model_text = read_file(model);
  return parse_tokenizer_files(model_text, read_file(config), model.string(), config.string());
}

TokenizerFiles parse_tokenizer_files(const std::string& tiktoken_model,
                                     const std::string& tokenizer_config,
                                     const std::string& model_name,
                                     const std::string& config_name) {
  TokenizerFiles out;
  parse_tiktoken_model(tiktoken_model, model_name, out);
  parse_tokenizer_config(tokenizer_config, config_name, out);
  return out;
}

void write_tokenizer_files(const fs::path& dir, const TokenizerFiles& files) {
  STRATA_ASSERT(int(files.ranks.size()) == files.num_mergeable);
  fs::create_directories(dir);
  std::vector<std::pair<std::string, int>> sorted = files.ranks;
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  std::string model;
  for (const auto& [bytes, rank] : sorted) {
    model += b64_encode(bytes);
    model += ' ';
    model += std::to_string(rank);
    model += '\n';
  }
  write_file(dir / "tiktoken.model", model);

  ordered_json atd = ordered_json::object();
  ordered_json additional = ordered_json::array();
  auto text_of = [&](int id) -> ordered_json {
    auto it = files.specials.find(id);
    return id >= 0 && it != files.specials.end() ? ordered_json(it->second) : ordered_json();
  };
  for (const auto& [id, text] : files.specials) {
    if (text == reserved_name(id)) continue;  // implicit: the loader names missing ids so
    atd[std::to_string(id)] = {{"content", text}, {"lstrip", false},      {"normalized", false},
                               {"rstrip", false}, {"single_word", false}, {"special", true}};
    if (id != files.bos_id && id != files.eos_id && id != files.pad_id && id != files.unk_id)
      additional.push_back(text);
  }
  ordered_json cfg;
  cfg["added_tokens_decoder"] = atd;
  cfg["additional_special_tokens"] = additional;
  cfg["auto_map"] = {{"AutoTokenizer", {"tokenization_kimi.TikTokenTokenizer", nullptr}}};
  cfg["bos_token"] = text_of(files.bos_id);
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["eos_token"] = text_of(files.eos_id);
  cfg["model_max_length"] = 1000000;
  if (files.num_specials != kKimiNumSpecialTokens)
    cfg["num_reserved_special_tokens"] = files.num_specials;
  cfg["pad_token"] = text_of(files.pad_id);
  cfg["tokenizer_class"] = "TikTokenTokenizer";
  cfg["unk_token"] = text_of(files.unk_id);
  write_file(dir / "tokenizer_config.json", cfg.dump(2) + "\n");
}

void write_standin_tokenizer(const fs::path& dir, int vocab_size) {
  constexpr int kMinSpecials = 32;
  if (vocab_size < 256 + kMinSpecials)
    throw Error("stand-in tokenizer: vocab_size " + std::to_string(vocab_size) +
                " is too small (need at least " + std::to_string(256 + kMinSpecials) +
                ": 256 byte tokens + " + std::to_string(kMinSpecials) + " special tokens)");
  const int num_specials = vocab_size >= 4096
                               ? kKimiNumSpecialTokens
                               : std::min(std::max(kMinSpecials, vocab_size / 8), vocab_size - 256);
  const int num_mergeable = vocab_size - num_specials;

  TokenizerFiles files;
  const std::vector<std::string> vocab = standin_vocab(num_mergeable - 256);
  STRATA_ASSERT(int(vocab.size()) == num_mergeable);
  for (int i = 0; i < num_mergeable; ++i) files.ranks.emplace_back(vocab[i], i);
  files.num_mergeable = num_mergeable;
  files.num_specials = num_specials;
  const int n = num_mergeable;
  for (int i = 0; i < num_specials; ++i) files.specials[n + i] = reserved_name(n + i);
  for (const auto& [off, name] : kimi_named_offsets()) files.specials[n + off] = name;
  // K3's chat framing tokens (spec/chat-format.md), at offsets the Kimi list leaves free, so the
  // chat path (`run --chat`, `batch` chat requests) runs end to end on synthetic checkpoints.
  for (const auto& [off, name] : k3_chat_offsets()) files.specials[n + off] = name;
  files.specials[n + num_specials - 2] = "[UNK]";
  files.specials[n + num_specials - 1] = "[PAD]";
  files.bos_id = n + 0;
  files.eos_id = n + 1;
  files.unk_id = n + num_specials - 2;
  files.pad_id = n + num_specials - 1;
  write_tokenizer_files(dir, files);
}

}  // namespace strata
