// The Kimi tokenizer files on disk (spec/model.md §10, golden/tokenizer/README.md §1–2):
// `tiktoken.model` (one `<base64 token bytes> <rank>` per line) and `tokenizer_config.json`
// (the `added_tokens_decoder` table of special tokens, `bos_token`/`eos_token`/... by content).
// This file reads and writes them and builds the stand-in tokenizer that `strata synth` ships
// with synthetic checkpoints. It does not encode text: that is engine/tokenizer.h.
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace strata {

// The Kimi tokenizer class reserves this many special ids after the mergeable ranks.
inline constexpr int kKimiNumSpecialTokens = 256;

struct TokenizerFiles {
  // Mergeable tokens: raw bytes (need not be valid UTF-8) and rank (= token id = BPE merge
  // priority, lower merges first). Ranks are 0..num_mergeable-1, each exactly once.
  std::vector<std::pair<std::string, int>> ranks;
  // Every special id num_mergeable .. vocab_size-1 -> its text: the `added_tokens_decoder` content
  // where present, else `<|reserved_token_{id}|>` (absolute id).
  std::map<int, std::string> specials;
  int num_mergeable = 0;  // N = ranks.size() = first special id
  int num_specials = 0;   // kKimiNumSpecialTokens for real checkpoints; fewer for tiny stand-ins
  int bos_id = -1;        // id of `bos_token` (-1 when the config names none)
  int eos_id = -1;        // id of `eos_token`
  int pad_id = -1;        // id of `pad_token`
  int unk_id = -1;        // id of `unk_token`
  int vocab_size() const { return num_mergeable + num_specials; }
};

// Reads `tiktoken.model` and `tokenizer_config.json` from model_dir. Errors (strata::Error) name
// the file and, for tiktoken.model, the line: bad base64, bad or duplicate rank, duplicate token,
// ranks that are not 0..N-1, special ids outside N..N+num_specials-1, missing/ill-typed fields.
// The number of specials is kKimiNumSpecialTokens unless tokenizer_config.json carries
// "num_reserved_special_tokens" (written by write_standin_tokenizer for small vocabularies).
TokenizerFiles load_tokenizer_files(const std::filesystem::path& model_dir);
// The same from the files' contents; the names prefix every message (tests/fuzz feeds this).
TokenizerFiles parse_tokenizer_files(const std::string& tiktoken_model,
                                     const std::string& tokenizer_config,
                                     const std::string& model_name, const std::string& config_name);

// Writes files.ranks to dir/tiktoken.model and files.specials (+ bos/eos/pad/unk by content) to
// dir/tokenizer_config.json in the Kimi release layout. Creates dir if needed.
void write_tokenizer_files(const std::filesystem::path& dir, const TokenizerFiles& files);

// A valid Kimi-format tokenizer for a synthetic model with vocab_size ids: the 256 single bytes,
// BPE merges learnt deterministically from a small built-in English/code text (then extended
// with longer byte strings until the vocabulary is full), and the special tokens at the top
// ([BOS] [EOS] <|im_end|> ... at offsets +0.., K3's chat tokens <|open|> <|sep|> <|close|>
// <|end_of_msg|> at +24..+27, [UNK] [PAD] at the last two ids), so every id the
// tokenizer can produce is < vocab_size and the tokenizer's vocabulary is exactly vocab_size.
// vocab_size >= 4096 gets the real 256 specials; smaller vocabularies get vocab_size/8 (at least
// 32, at most vocab_size-256). Throws strata::Error when vocab_size < 256 + 32.
void write_standin_tokenizer(const std::filesystem::path& dir, int vocab_size);

}  // namespace strata
