// Fuzz target: one line of a `strata batch` input file (the OpenAI Batch API request format) →
// parse_request_line, which must answer every line with a request or a LineError (never throw,
// never crash); then the record strata would write for it (an error record, or for a request its
// chat rendering and a success record), which must be valid JSON. Seeds: completion and chat
// request lines (fuzz_seeds).
#include <nlohmann/json.hpp>

#include "engine/batch_format.h"
#include "fuzz_target.h"

STRATA_FUZZ_TARGET(batch) {
  const std::string line = strata::fuzz::as_string(data, size);
  (void)strata::engine::peek_custom_id(line);
  const strata::engine::ParsedLine p =
      strata::engine::parse_request_line(line, 1, strata::engine::RequestDefaults{});
  std::string record;
  if (const auto* e = std::get_if<strata::engine::LineError>(&p)) {
    record = strata::engine::error_record(*e);
  } else {
    const auto& r = std::get<strata::engine::BatchRequest>(p);
    if (r.endpoint == strata::engine::Endpoint::chat)
      (void)strata::engine::render_chat(r.messages, r.chat);
    strata::engine::Completion c;
    c.text = "ok";
    c.finish_reason = "stop";
    record = strata::engine::success_record(r, c, "k3");
  }
  if (!nlohmann::json::accept(record)) __builtin_trap();  // a record strata writes is JSON
}
