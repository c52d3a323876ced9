// Fuzz target: the tokenizer files and text. Input: tiktoken.model bytes, a 0 byte,
// tokenizer_config.json bytes, a 0 byte, text. The files are parsed (parse_tokenizer_files); if
// they load, the text is encoded and the ids decoded back (every id must be in the vocabulary).
// Seeds: the golden Kimi tokenizer files and the synthetic stand-in, with sample text.
#include <cstring>

#include "engine/tokenizer.h"
#include "fuzz_target.h"

STRATA_FUZZ_TARGET(tokenizer) {
  const std::string in = strata::fuzz::as_string(data, size);
  const size_t a = in.find('\0');
  if (a == std::string::npos) return;
  const size_t b = in.find('\0', a + 1);
  const std::string model = in.substr(0, a);
  const std::string config =
      in.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
  const std::string text = b == std::string::npos ? std::string() : in.substr(b + 1);
  const strata::TokenizerFiles files =
      strata::parse_tokenizer_files(model, config, "tiktoken.model", "tokenizer_config.json");
  const strata::engine::Tokenizer tok = strata::engine::Tokenizer::from_files(files);
  const std::vector<int> ids = tok.encode(text);
  for (int id : ids)
    if (id < 0 || id >= files.vocab_size()) __builtin_trap();
  (void)tok.decode_text(ids);
}
