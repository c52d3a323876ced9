// `strata tokenize`: encode text with a checkpoint's Kimi tokenizer (or decode ids back), for
// users checking prompts and for scripts. Special-token strings in the text become their ids.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/tokenizer.h"
#include "storage/error.h"
#include "storage/files.h"
#include "tools/command.h"

namespace strata::tools {
namespace {

struct TokenizeOptions {
  std::string model_dir;
  std::string prompt;
  std::string file;
  std::string decode;
  bool json = false;
  bool tokens = false;
};

std::string read_input(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), {});
  return read_small_file(path, "-f " + path, 1ull << 32);
}

std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> ids;
  std::string item;
  std::istringstream in(s);
  while (in >> item) {
    for (auto& c : item)
      if (c == ',' || c == '[' || c == ']') c = ' ';
    std::istringstream parts(item);
    std::string p;
    while (parts >> p) {
      size_t used = 0;
      int v = 0;
      try {
        v = std::stoi(p, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != p.size()) throw Error("--decode: '" + p + "' is not a token id (integer)");
      ids.push_back(v);
    }
  }
  return ids;
}

// JSON string of arbitrary bytes (a token may hold part of a UTF-8 character: U+FFFD in JSON).
std::string json_bytes(const std::string& bytes) {
  return nlohmann::json(bytes).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Token bytes for a terminal: valid UTF-8 as is, control characters and bytes that are not part
// of a whole UTF-8 character (tokens may split one) as \xNN, quoted.
std::string show_bytes(const std::string& bytes) {
  // When some bytes are not whole characters, show every non-ASCII byte in hex.
  const bool partial = engine::utf8_replace_invalid(bytes) != bytes;
  std::string out = "\"";
  for (unsigned char c : bytes) {
    if (c < 0x20 || c == 0x7F || c == '"' || c == '\\' || (partial && c >= 0x80)) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

int run_tokenize(const TokenizeOptions& o) {
  const engine::Tokenizer tok = engine::Tokenizer::load(o.model_dir);
  if (!o.decode.empty()) {
    const std::vector<int> ids = parse_ids(o.decode);
    const std::string text = tok.decode_text(ids);
    if (o.json)
      std::printf("{\"text\": %s}\n", json_bytes(text).c_str());
    else
      std::printf("%s\n", text.c_str());
    return 0;
  }
  const std::string text = o.file.empty() ? o.prompt : read_input(o.file);
  const std::vector<int> ids = tok.encode(text);
  if (o.json) {
    std::string out = "{\"count\": " + std::to_string(ids.size()) + ", \"ids\": [";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(ids[i]);
    }
    out += "]";
    if (o.tokens) {
      out += ", \"tokens\": [";
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ", ";
        out += json_bytes(tok.decode_token(ids[i]));
      }
      out += "]";
    }
    std::printf("%s}\n", out.c_str());
  } else if (o.tokens) {
    for (int id : ids)
      std::printf("%d\t%s%s\n", id, show_bytes(tok.decode_token(id)).c_str(),
                  tok.is_special(id) ? "\t(special)" : "");
  } else {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(ids[i]);
    }
    std::printf("%s\n", out.c_str());
  }
  return 0;
}

CommandRun setup_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  app.add_option("-m,--model", o->model_dir,
                 "checkpoint directory holding tiktoken.model and tokenizer_config.json")
      ->required();
  auto* p = app.add_option("-p,--prompt", o->prompt, "text to encode");
  auto* f = app.add_option("-f,--file", o->file, "file with the text to encode ('-' = stdin)");
  auto* d = app.add_option("--decode", o->decode,
                           "decode these ids instead (\"1 2 3\", \"1,2,3\" or \"[1, 2, 3]\")");
  p->excludes(f)->excludes(d);
  f->excludes(d);
  app.add_flag("--json", o->json, "print JSON: {\"count\": N, \"ids\": [...]}");
  app.add_flag("--tokens", o->tokens, "also show each token's bytes (one per line without --json)");
  return [o, p, f, d]() {
    if (p->count() == 0 && f->count() == 0 && d->count() == 0)
      throw Error("tokenize: give the text with -p TEXT or -f FILE, or ids with --decode");
    return run_tokenize(*o);
  };
}

}  // namespace

STRATA_COMMAND("tokenize", "encode text to token ids with a checkpoint's tokenizer (or --decode)",
               setup_tokenize);

}  // namespace strata::tools
