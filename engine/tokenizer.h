// The Kimi tokenizer (spec/model.md §10; exact rules in golden/tokenizer/README.md): tiktoken
// byte-level BPE over the Kimi pre-tokenizer regex (PCRE2 with JIT), the special tokens matched
// anywhere in the text (allowed_special = "all"), and the Kimi long-input splitting (chunks of
// 400,000 code points, then runs of more than 25,000 whitespace / non-whitespace code points).
// Not a chat template: callers put the special-token strings into the text themselves.
#pragma once
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "storage/tiktoken_files.h"

namespace strata::engine {

class Tokenizer {
 public:
  // Reads tiktoken.model + tokenizer_config.json from model_dir (errors name the file/line).
  static Tokenizer load(const std::filesystem::path& model_dir);
  static Tokenizer from_files(const TokenizerFiles& files);

  // Text (UTF-8) -> ids. Special-token strings anywhere in the text become their ids. Throws
  // strata::Error when text is not valid UTF-8 (naming the byte offset).
  std::vector<int> encode(std::string_view text) const;

  // Ids -> the concatenated token bytes (special ids give their name). May end in (or, for odd id
  // sequences, contain) partial UTF-8. Throws strata::Error on an id outside 0..vocab_size()-1.
  std::string decode(const std::vector<int>& ids) const;
  // decode() with invalid UTF-8 replaced by U+FFFD, as Python's bytes.decode(errors="replace").
  std::string decode_text(const std::vector<int>& ids) const;
  // The bytes of one id (for streaming; combine with Utf8Stream to print whole characters).
  const std::string& decode_token(int id) const;

  // The pieces encode() runs BPE on, in order, plus each special-token string as its own piece
  // (after the long-input splitting). For tests and debugging.
  std::vector<std::string> pretokenize(std::string_view text) const;

  int bos_id() const;
  int eos_id() const;
  int pad_id() const;  // -1 when the config names none
  int unk_id() const;  // -1 when the config names none
  int vocab_size() const;
  int num_mergeable() const;  // first special id
  bool is_special(int id) const;
  // Id of a special-token string ("<|im_end|>"), or -1.
  int special_id(std::string_view text) const;
  // True when the regex runs JIT-compiled (false only where PCRE2 has no JIT for this CPU).
  bool jit() const;

 private:
  Tokenizer() = default;  // only load()/from_files() make one (hold std::optional<Tokenizer>)
  struct Impl;
  std::shared_ptr<const Impl> impl_;  // immutable after load: Tokenizer is cheap to copy and
                                      // safe to use from several threads at once
};

// Turns a stream of token bytes into whole UTF-8 characters: push() returns everything up to the
// last complete character and keeps an incomplete tail for the next call; flush() returns the
// rest (an incomplete tail at end of stream becomes U+FFFD).
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);
  std::string flush();

 private:
  std::string pending_;
};

// bytes with every maximal invalid UTF-8 subpart replaced by U+FFFD (Python errors="replace").
std::string utf8_replace_invalid(std::string_view bytes);

}  // namespace strata::engine

namespace strata {
using engine::Tokenizer;  // the name the API uses
}
