// The Kimi tokenizer: long-input splitting, special-token scan, PCRE2 pre-tokenizer, byte-level
// BPE. Rules and their test cases: golden/tokenizer/README.md (sections referenced as §n).
#include "engine/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <queue>
#include <unordered_map>

#include "storage/error.h"

namespace strata::engine {
namespace {

constexpr int64_t kChunkCodePoints = 400'000;  // §3 step 1
constexpr int64_t kMaxRunCodePoints = 25'000;  // §3 step 2: a run of 25,001 is cut
// JIT stack for the regex: each repetition of the look-ahead letter group keeps a backtrack
// frame, and a 25,000-letter run (the longest after step 2) needs about 1 MiB (§5).
constexpr size_t kJitStackStartBytes = 32 * 1024;
constexpr size_t kJitStackMaxBytes = 4 * 1024 * 1024;

// --- UTF-8 -----------------------------------------------------------------------------------

// Length of the well-formed UTF-8 sequence at s[i] (and its code point), or, when ill-formed,
// minus the length of its maximal subpart (Unicode §3.9 / Python errors="replace"), or 0 when the
// bytes are a valid but incomplete prefix cut off by the end of the buffer.
int utf8_seq(const unsigned char* s, size_t n, size_t i, char32_t& cp) {
  const unsigned b = s[i];
  if (b < 0x80) {
    cp = b;
    return 1;
  }
  int len;
  unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
    cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    cp = b & 0x0F;
    if (b == 0xE0) lo = 0xA0;  // no overlongs
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    cp = b & 0x07;
    if (b == 0xF0) lo = 0x90;  // no overlongs
    if (b == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= n) return 0;
    const unsigned c = s[i + k];
    const unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return -k;
    cp = (cp << 6) | (c & 0x3F);
  }
  return len;
}

// Python str.isspace() (§3 step 2) — includes U+001C..001F, unlike the regex's \s.
bool py_isspace(char32_t c) {
  if (c <= 0x20) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// --- the pre-tokenizer regex ------------------------------------------------------------------

// The Kimi pat_str rewritten for PCRE2 (§5 "Porting to C++"): class intersections become a
// negative look-ahead per character, \p{Han} becomes Script=Han (\p{sc=Han}; plain \p{Han} is
// Script_Extensions in PCRE2 >= 10.40), and \s is spelled out as Unicode White_Space (PCRE2's \s
// also matches U+180E).
std::string kimi_pattern() {
  const std::string ws =
      "\\t\\n\\x{0B}\\x{0C}\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
      "\\x{202F}\\x{205F}\\x{3000}";
  const std::string upper = "(?:(?!\\p{sc=Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])";
  const std::string lower = "(?:(?!\\p{sc=Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])";
  const std::string contraction = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?";
  const std::string lead = "[^\\r\\n\\p{L}\\p{N}]?";
  const std::vector<std::string> branches = {
      "[\\p{sc=Han}]+",                                // 1 Han runs
      lead + upper + "*" + lower + "+" + contraction,  // 2 words ending in lower case
      lead + upper + "+" + lower + "*" + contraction,  // 3 words in upper case
      "\\p{N}{1,3}",                                   // 4 numbers, 3 digits at a time
      " ?[^" + ws + "\\p{L}\\p{N}]+[\\r\\n]*",         // 5 punctuation
      "[" + ws + "]*[\\r\\n]+",                        // 6 \s*[\r\n]+
      "[" + ws + "]+(?![^" + ws + "])",                // 7 \s+(?!\S)
      "[" + ws + "]+",                                 // 8 \s+
  };
  std::string p;
  for (const auto& b : branches) {
    if (!p.empty()) p += '|';
    p += b;
  }
  return p;
}

std::string pcre2_message(int rc) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(rc, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* m) const { pcre2_match_context_free(m); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* s) const { pcre2_jit_stack_free(s); }
};

// Lookup of std::string keys by std::string_view without allocating.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using RankMap = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;

}  // namespace

struct Tokenizer::Impl {
  RankMap ranks;                      // mergeable token bytes -> rank
  std::vector<std::string> id_bytes;  // id -> bytes (special ids: their name)
  RankMap special_ids;                // special text -> id
  std::array<std::vector<std::pair<std::string, int>>, 256> specials_by_first_byte;
  std::unique_ptr<pcre2_code, CodeDeleter> regex;
  bool jit = false;
  int num_mergeable = 0, vocab_size = 0;
  int bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;

  // Per-call matching state (a Tokenizer is shared across threads, so none of this lives in Impl).
  struct Matcher {
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> data;
    std::unique_ptr<pcre2_match_context, MatchContextDeleter> context;
    std::unique_ptr<pcre2_jit_stack, JitStackDeleter> stack;
    // BPE scratch, reused across pieces.
    std::vector<uint32_t> next, prev;
    std::vector<bool> alive;
  };

  Matcher make_matcher() const {
    Matcher m;
    m.data.reset(pcre2_match_data_create_from_pattern(regex.get(), nullptr));
    m.context.reset(pcre2_match_context_create(nullptr));
    if (!m.data || !m.context) throw Error("tokenizer: out of memory creating PCRE2 match data");
    if (jit) {
      m.stack.reset(pcre2_jit_stack_create(kJitStackStartBytes, kJitStackMaxBytes, nullptr));
      if (!m.stack) throw Error("tokenizer: out of memory creating the PCRE2 JIT stack");
      pcre2_jit_stack_assign(m.context.get(), nullptr, m.stack.get());
    }
    return m;
  }

  // §3 steps 1–2: calls fn(substring) for each substring after chunking and run splitting.
  // Validates UTF-8 on the way (the regex then runs with PCRE2_NO_UTF_CHECK).
  template <class Fn>
  static void split_long_input(std::string_view text, Fn&& fn) {
    const auto* s = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t slice_start = 0, pos = 0;
    int64_t in_chunk = 0, run = 0;
    bool run_is_space = false;
    while (pos < n) {
      char32_t cp = 0;
      const int len = utf8_seq(s, n, pos, cp);
      if (len <= 0)
        throw Error("tokenizer: input is not valid UTF-8 at byte offset " + std::to_string(pos));
      if (in_chunk == kChunkCodePoints) {
        fn(text.substr(slice_start, pos - slice_start));
        slice_start = pos;
        in_chunk = 0;
        run = 0;
      }
      const bool sp = py_isspace(cp);
      if (run == 0 || sp != run_is_space) {
        run = 1;
        run_is_space = sp;
      } else if (++run > kMaxRunCodePoints) {
        fn(text.substr(slice_start, pos - slice_start));
        slice_start = pos;
        run = 1;
      }
      ++in_chunk;
      pos += size_t(len);
    }
    if (pos > slice_start) fn(text.substr(slice_start, pos - slice_start));
  }

  // §3.1–3.2 on one substring: on_piece(piece) for each regex match of the ordinary text,
  // on_special(id, text) for each special-token string, in order.
  template <class OnPiece, class OnSpecial>
  void scan(Matcher& m, std::string_view sub, OnPiece&& on_piece, OnSpecial&& on_special) const {
    size_t seg_start = 0;
    size_t pos = 0;
    while (pos <= sub.size()) {
      int special = -1;
      size_t special_len = 0;
      for (; pos < sub.size(); ++pos) {
        const auto& cands = specials_by_first_byte[uint8_t(sub[pos])];
        for (const auto& [text, id] : cands) {  // longest first
          if (sub.compare(pos, text.size(), text) == 0) {
            special = id;
            special_len = text.size();
            break;
          }
        }
        if (special >= 0) break;
      }
      regex_pieces(m, sub.substr(seg_start, pos - seg_start), on_piece);
      if (special < 0) break;
      on_special(special, sub.substr(pos, special_len));
      pos += special_len;
      seg_start = pos;
    }
  }

  // Find-all of the regex over one ordinary-text segment (the segment end is end of text).
  template <class OnPiece>
  void regex_pieces(Matcher& m, std::string_view seg, OnPiece&& on_piece) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(seg.data());
    size_t off = 0;
    while (off < seg.size()) {
      const int rc = pcre2_match(regex.get(), subject, seg.size(), off, PCRE2_NO_UTF_CHECK,
                                 m.data.get(), m.context.get());
      if (rc == PCRE2_ERROR_NOMATCH) break;  // (cannot happen: the branches cover every char)
      if (rc < 0)
        throw Error("tokenizer: pre-tokenizer regex failed (PCRE2 error " + std::to_string(rc) +
                    ": " + pcre2_message(rc) + ")");
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data.get());
      const size_t begin = ov[0], end = ov[1];
      if (end == begin) {  // an empty match cannot happen either; step over one character
        off = begin + 1;
        while (off < seg.size() && (uint8_t(seg[off]) & 0xC0) == 0x80) ++off;
        continue;
      }
      on_piece(seg.substr(begin, end - begin));  // text between matches is dropped, as tiktoken
      off = end;
    }
  }

  int rank_of(std::string_view bytes) const {
    auto it = ranks.find(bytes);
    return it == ranks.end() ? -1 : it->second;
  }

  // §3.3: byte-level BPE of one piece. Merges the adjacent pair whose concatenation has the
  // lowest rank (leftmost on ties) until none is a token; a heap with lazy invalidation keeps
  // this O(n log n) for long pieces (up to 25,000 code points).
  void bpe(Matcher& m, std::string_view piece, std::vector<int>& out) const {
    if (const int r = rank_of(piece); r >= 0) {  // whole-piece shortcut
      out.push_back(r);
      return;
    }
    const uint32_t n = uint32_t(piece.size());
    m.next.resize(n);
    m.prev.resize(n);
    m.alive.assign(n, true);
    // Part i covers bytes [i, next[i]); next[last] = n.
    for (uint32_t i = 0; i < n; ++i) {
      m.next[i] = i + 1;
      m.prev[i] = i - 1;  // wraps for i = 0; never read there
    }
    struct Cand {
      int rank;
      uint32_t left, mid, end;  // parts [left, mid) and [mid, end)
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    auto push = [&](uint32_t left, uint32_t mid, uint32_t end) {
      const int r = rank_of(piece.substr(left, end - left));
      if (r >= 0) heap.push({r, left, mid, end});
    };
    for (uint32_t i = 0; i + 1 < n; ++i) push(i, i + 1, i + 2);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      if (!m.alive[c.left] || !m.alive[c.mid] || m.next[c.left] != c.mid || m.next[c.mid] != c.end)
        continue;  // stale: one of the two parts has merged since
      m.alive[c.mid] = false;
      m.next[c.left] = c.end;
      if (c.end < n) m.prev[c.end] = c.left;
      if (c.left > 0) push(m.prev[c.left], c.left, c.end);
      if (c.end < n) push(c.left, c.end, m.next[c.end]);
    }
    for (uint32_t i = 0; i < n; i = m.next[i]) {
      const int r = rank_of(piece.substr(i, m.next[i] - i));
      STRATA_ASSERT(r >= 0);  // single bytes are all tokens (checked at load)
      out.push_back(r);
    }
  }
};

Tokenizer Tokenizer::load(const std::filesystem::path& model_dir) {
  return from_files(load_tokenizer_files(model_dir));
}

Tokenizer Tokenizer::from_files(const TokenizerFiles& files) {
  auto impl = std::make_shared<Impl>();
  impl->num_mergeable = files.num_mergeable;
  impl->vocab_size = files.vocab_size();
  impl->bos_id = files.bos_id;
  impl->eos_id = files.eos_id;
  impl->pad_id = files.pad_id;
  impl->unk_id = files.unk_id;
  impl->id_bytes.resize(static_cast<size_t>(impl->vocab_size));
  impl->ranks.reserve(files.ranks.size());
  for (const auto& [bytes, rank] : files.ranks) {
    STRATA_ASSERT(rank >= 0 && rank < files.num_mergeable);
    impl->ranks.emplace(bytes, rank);
    impl->id_bytes[size_t(rank)] = bytes;
  }
  for (int b = 0; b < 256; ++b)
    if (!impl->ranks.count(std::string(1, char(b)))) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      throw Error(std::string("tiktoken.model: byte ") + hex +
                  " has no token (byte-level BPE needs all 256 single bytes)");
    }
  for (const auto& [id, text] : files.specials) {
    STRATA_ASSERT(id >= files.num_mergeable && id < impl->vocab_size && !text.empty());
    impl->id_bytes[size_t(id)] = text;
    impl->special_ids.emplace(text, id);
    impl->specials_by_first_byte[uint8_t(text[0])].emplace_back(text, id);
  }
  for (auto& v : impl->specials_by_first_byte)
    std::stable_sort(v.begin(), v.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });

  const std::string pattern = kimi_pattern();
  int err = 0;
  PCRE2_SIZE err_off = 0;
  impl->regex.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr));
  if (!impl->regex)
    throw Error("tokenizer: the pre-tokenizer regex does not compile with this PCRE2 (" +
                pcre2_message(err) + " at offset " + std::to_string(err_off) +
                "; PCRE2 >= 10.40 is needed for \\p{sc=Han})");
  const int jit_rc = pcre2_jit_compile(impl->regex.get(), PCRE2_JIT_COMPLETE);
  impl->jit = jit_rc == 0;
  if (!impl->jit)  // STYLE §12: a fallback is reported, not silent
    std::fprintf(stderr, "strata: tokenizer: PCRE2 JIT unavailable (%s); using the interpreter\n",
                 pcre2_message(jit_rc).c_str());
  Tokenizer t;
  t.impl_ = std::move(impl);
  return t;
}

std::vector<int> Tokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 1);
  auto m = impl_->make_matcher();
  Impl::split_long_input(text, [&](std::string_view sub) {
    impl_->scan(
        m, sub, [&](std::string_view piece) { impl_->bpe(m, piece, ids); },
        [&](int id, std::string_view) { ids.push_back(id); });
  });
  return ids;
}

std::vector<std::string> Tokenizer::pretokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  auto m = impl_->make_matcher();
  Impl::split_long_input(text, [&](std::string_view sub) {
    impl_->scan(
        m, sub, [&](std::string_view piece) { pieces.emplace_back(piece); },
        [&](int, std::string_view special) { pieces.emplace_back(special); });
  });
  return pieces;
}

const std::string& Tokenizer::decode_token(int id) const {
  if (id < 0 || id >= impl_->vocab_size)
    throw Error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary 0.." +
                std::to_string(impl_->vocab_size - 1));
  return impl_->id_bytes[size_t(id)];
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string out;
  for (int id : ids) out += decode_token(id);
  return out;
}

std::string Tokenizer::decode_text(const std::vector<int>& ids) const {
  return utf8_replace_invalid(decode(ids));
}

int Tokenizer::bos_id() const {
  return impl_->bos_id;
}
int Tokenizer::eos_id() const {
  return impl_->eos_id;
}
int Tokenizer::pad_id() const {
  return impl_->pad_id;
}
int Tokenizer::unk_id() const {
  return impl_->unk_id;
}
int Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}
int Tokenizer::num_mergeable() const {
  return impl_->num_mergeable;
}
bool Tokenizer::is_special(int id) const {
  return id >= impl_->num_mergeable && id < impl_->vocab_size;
}
int Tokenizer::special_id(std::string_view text) const {
  auto it = impl_->special_ids.find(text);
  return it == impl_->special_ids.end() ? -1 : it->second;
}
bool Tokenizer::jit() const {
  return impl_->jit;
}

// --- UTF-8 helpers ----------------------------------------------------------------------------

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Appends the valid characters of bytes (ill-formed subparts -> U+FFFD) to out; returns how many
// bytes were consumed (less than bytes.size() only when keep_tail and the end is an incomplete
// character).
size_t append_replacing(std::string_view bytes, bool keep_tail, std::string& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    char32_t cp;
    const int len = utf8_seq(s, n, i, cp);
    if (len > 0) {
      out.append(bytes.substr(i, size_t(len)));
      i += size_t(len);
    } else if (len < 0) {
      out += kReplacement;
      i += size_t(-len);
    } else {
      if (keep_tail) return i;
      out += kReplacement;  // truncated at the end: one maximal subpart
      i = n;
    }
  }
  return n;
}
}  // namespace

std::string utf8_replace_invalid(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_replacing(bytes, false, out);
  return out;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const size_t used = append_replacing(pending_, true, out);
  pending_.erase(0, used);
  return out;
}

std::string Utf8Stream::flush() {
  std::string out = utf8_replace_invalid(pending_);
  pending_.clear();
  return out;
}

}  // namespace strata::engine
