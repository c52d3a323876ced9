// The OpenAI Batch API line formats of `strata batch`: one input line (custom_id, method, url of
// /v1/completions or /v1/chat/completions, body) parsed into a BatchRequest or a LineError that
// names the line and the problem, and the output records (id, custom_id, response {status_code,
// request_id, body {choices, usage}}, error) written for it. Record ids are derived from the
// custom_id (FNV-1a), never random, and bodies carry no timestamp ("created" is left out), so two
// runs of the same job give byte-identical records and a resumed job can be compared with an
// uninterrupted one.
// Not here: tokenization, generation (engine/batch_scheduler.h), durability
// (engine/batch_journal.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/chat_format.h"

namespace strata::engine {

enum class Endpoint { completions, chat };

// Defaults for fields a request leaves out (the command's flags).
struct RequestDefaults {
  int max_tokens = 256;
  bool thinking = true;
  ThinkingEffort effort = ThinkingEffort::max;
};

struct BatchRequest {
  int64_t line = 0;  // 1-based line of the input file
  std::string custom_id;
  Endpoint endpoint = Endpoint::completions;
  std::string model;  // body.model, echoed in the response (may be empty)
  // Completions: the prompt as text, or as token ids (an array of integers).
  std::optional<std::string> prompt_text;
  std::vector<int32_t> prompt_ids;
  // Chat: the messages and how to render them.
  std::vector<ChatMessage> messages;
  ChatOptions chat;
  int max_tokens = 256;
  double temperature = 1.0;  // the API's defaults
  double top_p = 1.0;
  int top_k = 0;  // strata extension; 0 = off
  uint64_t seed = 0;
  bool seed_given = false;  // without one the seed is derived from custom_id (reproducible)
  std::vector<std::string> stop;
};

// Why a line produced no generation. Envelope problems (not JSON, no custom_id, bad method or url,
// a duplicate custom_id) become a batch-level error (response null); problems inside a valid
// envelope's body (a bad field, a prompt too long for memory) become a response with status 400
// and an OpenAI error body.
struct LineError {
  int64_t line = 0;
  std::optional<std::string> custom_id;  // when the line named one
  bool envelope = true;
  int status_code = 400;  // for body errors
  std::string code;       // "invalid_json", "invalid_request", "duplicate_custom_id", ...
  std::string message;    // starts with "line N: "
  std::string param;      // the offending body field, when one
};

using ParsedLine = std::variant<BatchRequest, LineError>;

// Parses one input line (without its line feed). `line` is 1-based.
ParsedLine parse_request_line(std::string_view text, int64_t line, const RequestDefaults& d);

// The custom_id of a line, if it is a JSON object with a string custom_id (used to find duplicate
// custom_ids across the whole input before any request runs).
std::optional<std::string> peek_custom_id(std::string_view text);

// Blank lines (only spaces, tabs, CR) are skipped: they hold no request and produce no record.
bool is_blank_line(std::string_view text);

// 64-bit FNV-1a, hex (16 digits): the basis of derived ids and of the input fingerprint.
uint64_t fnv1a64(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull);
std::string hex16(uint64_t v);

// Record ids derived from the custom_id: "batch_req_<hex>", request id "req_<hex>", body id
// "cmpl-<hex>" / "chatcmpl-<hex>".
std::string record_id(const std::string& custom_id);
// The seed used when a request gives none (so temperature > 0 is reproducible per custom_id).
uint64_t derived_seed(const std::string& custom_id);

// What generation produced for a request.
struct Completion {
  std::string text;           // completions: the text; chat: the whole generated turn (split below)
  std::string finish_reason;  // "stop" (EOS or a stop string) or "length" (max_tokens)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // tokens sampled (including the one that ended the turn)
};

// One output line (without the line feed), JSON with keys in a fixed order.
std::string success_record(const BatchRequest& r, const Completion& c,
                           const std::string& default_model);
std::string error_record(const LineError& e);

// A LineError for a valid envelope whose request cannot run (400 with an OpenAI error body).
LineError request_error(const BatchRequest& r, const std::string& code, const std::string& message,
                        int status_code = 400, const std::string& param = "");

}  // namespace strata::engine
