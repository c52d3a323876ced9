// The OpenAI Batch API line formats (engine/batch_format.h): valid completion and chat lines
// parse into requests with their fields; each kind of malformed line gives an error that names
// the line and the field; output records have the batch output layout with ids derived from
// custom_id (the same id on every run, different ids for different custom_ids).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/batch_format.h"

using namespace strata::engine;
using nlohmann::json;

namespace {

std::string line(const std::string& url, const json& body, const std::string& id = "r1") {
  return json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", body}}.dump();
}

BatchRequest ok(const std::string& text, int64_t n = 1) {
  ParsedLine p = parse_request_line(text, n, RequestDefaults{});
  if (auto* e = std::get_if<LineError>(&p)) FAIL("unexpected error: " << e->message);
  return std::get<BatchRequest>(p);
}

LineError err(const std::string& text, int64_t n = 7) {
  ParsedLine p = parse_request_line(text, n, RequestDefaults{});
  REQUIRE(std::holds_alternative<LineError>(p));
  return std::get<LineError>(p);
}

bool contains(const std::string& s, const std::string& sub) {
  return s.find(sub) != std::string::npos;
}

}  // namespace

TEST_CASE("batch lines: a completion request with every field", "[engine][batch]") {
  const BatchRequest r = ok(line("/v1/completions", {{"model", "k3"},
                                                     {"prompt", "Once upon"},
                                                     {"max_tokens", 7},
                                                     {"temperature", 0.5},
                                                     {"top_p", 0.9},
                                                     {"seed", 42},
                                                     {"stop", {"\n", "END"}}}),
                            3);
  CHECK(r.line == 3);
  CHECK(r.custom_id == "r1");
  CHECK(r.endpoint == Endpoint::completions);
  CHECK(r.model == "k3");
  REQUIRE(r.prompt_text.has_value());
  CHECK(*r.prompt_text == "Once upon");
  CHECK(r.max_tokens == 7);
  CHECK(r.temperature == 0.5);
  CHECK(r.top_p == 0.9);
  CHECK(r.seed_given);
  CHECK(r.seed == 42);
  CHECK(r.stop == std::vector<std::string>{"\n", "END"});
}

TEST_CASE("batch lines: defaults, token-id prompts, one-element prompt arrays", "[engine][batch]") {
  RequestDefaults d;
  d.max_tokens = 33;
  ParsedLine p = parse_request_line(line("/v1/completions", {{"prompt", {5, 6, 7}}}), 1, d);
  const BatchRequest& r = std::get<BatchRequest>(p);
  CHECK(r.max_tokens == 33);
  CHECK(r.temperature == 1.0);  // the API's default
  CHECK(r.top_p == 1.0);
  CHECK_FALSE(r.seed_given);
  CHECK(r.prompt_ids == std::vector<int32_t>{5, 6, 7});
  CHECK(ok(line("/v1/completions", {{"prompt", {"only"}}})).prompt_text == "only");
  CHECK(ok(line("/v1/completions", {{"prompt", {{1, 2}}}})).prompt_ids ==
        std::vector<int32_t>{1, 2});
  CHECK(ok(line("/v1/completions", {{"prompt", "x"}, {"stop", "S"}})).stop ==
        std::vector<std::string>{"S"});
}

TEST_CASE("batch lines: chat requests, thinking switches", "[engine][batch]") {
  BatchRequest r = ok(line(
      "/v1/chat/completions",
      {{"messages",
        {{{"role", "system"}, {"content", "Be brief."}},
         {{"role", "user"},
          {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
       {"max_completion_tokens", 9}}));
  CHECK(r.endpoint == Endpoint::chat);
  REQUIRE(r.messages.size() == 2);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[1].content == "ab");
  CHECK(r.max_tokens == 9);
  CHECK(r.chat.thinking);  // default
  CHECK(r.chat.effort == ThinkingEffort::max);
  const json user = {{{"role", "user"}, {"content", "x"}}};
  CHECK_FALSE(
      ok(line("/v1/chat/completions", {{"messages", user}, {"thinking", false}})).chat.thinking);
  CHECK_FALSE(ok(line("/v1/chat/completions",
                      {{"messages", user}, {"chat_template_kwargs", {{"thinking", false}}}}))
                  .chat.thinking);
  CHECK(ok(line("/v1/chat/completions", {{"messages", user}, {"reasoning_effort", "high"}}))
            .chat.effort == ThinkingEffort::high);
  RequestDefaults d;
  d.thinking = false;
  ParsedLine p = parse_request_line(line("/v1/chat/completions", {{"messages", user}}), 1, d);
  CHECK_FALSE(std::get<BatchRequest>(p).chat.thinking);
}

TEST_CASE("batch lines: envelope errors name the line and the problem", "[engine][batch]") {
  LineError e = err("{not json");
  CHECK(e.envelope);
  CHECK(e.code == "invalid_json");
  CHECK(contains(e.message, "line 7: not valid JSON"));
  CHECK_FALSE(e.custom_id.has_value());

  e = err("[1, 2]");
  CHECK(contains(e.message, "line 7: expected a JSON object, got array"));
  e = err(R"({"method": "POST", "url": "/v1/completions", "body": {}})");
  CHECK(contains(e.message, "'custom_id' is missing"));
  e = err(R"({"custom_id": 5, "method": "POST"})");
  CHECK(contains(e.message, "'custom_id' must be a string"));
  e = err(R"({"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {}})");
  CHECK(contains(e.message, "'method' must be \"POST\""));
  CHECK(e.custom_id == "x");
  e = err(R"({"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {}})");
  CHECK(contains(e.message, "'url' must be"));
  CHECK(contains(e.message, "/v1/embeddings"));
  e = err(R"({"custom_id": "x", "method": "POST", "url": "/v1/completions"})");
  CHECK(contains(e.message, "'body' is missing"));
}

TEST_CASE("batch lines: body errors are 400 responses naming the field", "[engine][batch]") {
  struct Case {
    json body;
    std::string url, param, text;
  };
  const json user = {{{"role", "user"}, {"content", "x"}}};
  const std::vector<Case> cases = {
      {json::object(), "/v1/completions", "prompt", "missing"},
      {{{"prompt", ""}}, "/v1/completions", "prompt", "empty prompt"},
      {{{"prompt", json::array()}}, "/v1/completions", "prompt", "empty array"},
      {{{"prompt", {"a", "b"}}}, "/v1/completions", "prompt", "several prompts"},
      {{{"prompt", {1, -2}}}, "/v1/completions", "prompt[1]", "outside"},
      {{{"prompt", "x"}, {"max_tokens", 0}}, "/v1/completions", "max_tokens", "outside"},
      {{{"prompt", "x"}, {"max_tokens", "9"}}, "/v1/completions", "max_tokens", "integer"},
      {{{"prompt", "x"}, {"temperature", 3}}, "/v1/completions", "temperature", "outside"},
      {{{"prompt", "x"}, {"top_p", 0}}, "/v1/completions", "top_p", "greater than 0"},
      {{{"prompt", "x"}, {"stop", {"a", "b", "c", "d", "e"}}},
       "/v1/completions",
       "stop",
       "at most 4"},
      {{{"prompt", "x"}, {"stop", ""}}, "/v1/completions", "stop", "empty stop"},
      {{{"prompt", "x"}, {"n", 2}}, "/v1/completions", "n", "n = 1"},
      {{{"prompt", "x"}, {"stream", true}}, "/v1/completions", "stream", "streaming"},
      {{{"prompt", "x"}, {"logprobs", 5}}, "/v1/completions", "logprobs", "not supported"},
      {{{"messages", user}}, "/v1/completions", "messages", "belongs to /v1/chat"},
      {json::object(), "/v1/chat/completions", "messages", "missing"},
      {{{"messages", json::array()}}, "/v1/chat/completions", "messages", "non-empty"},
      {{{"messages", {{{"role", "tool"}, {"content", "x"}}}}},
       "/v1/chat/completions",
       "messages[0].role",
       "'tool'"},
      {{{"messages", user}, {"tools", {{{"type", "function"}}}}},
       "/v1/chat/completions",
       "tools",
       "not supported"},
      {{{"messages", user}, {"reasoning_effort", "huge"}},
       "/v1/chat/completions",
       "reasoning_effort",
       "'huge'"},
      {{{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}},
       "/v1/chat/completions",
       "messages[0].content[0]",
       "only text parts"},
  };
  for (const Case& c : cases) {
    INFO(c.body.dump());
    const LineError e = err(line(c.url, c.body, "cid"), 12);
    CHECK_FALSE(e.envelope);
    CHECK(e.status_code == 400);
    CHECK(e.custom_id == "cid");
    CHECK(e.param == c.param);
    CHECK(contains(e.message, "line 12: body." + c.param));
    CHECK(contains(e.message, c.text));
  }
}

TEST_CASE("batch records: success layout and ids derived from custom_id", "[engine][batch]") {
  BatchRequest r = ok(line("/v1/completions", {{"prompt", "x"}}, "doc-1"));
  Completion c;
  c.text = "hello";
  c.finish_reason = "length";
  c.prompt_tokens = 3;
  c.completion_tokens = 4;
  const std::string s = success_record(r, c, "m");
  CHECK(s == success_record(r, c, "m"));  // nothing random, nothing timed
  const json j = json::parse(s);
  CHECK(j["id"] == record_id("doc-1"));
  CHECK(j["custom_id"] == "doc-1");
  CHECK(j["error"].is_null());
  CHECK(j["response"]["status_code"] == 200);
  CHECK(j["response"]["request_id"].get<std::string>().rfind("req_", 0) == 0);
  const json& b = j["response"]["body"];
  CHECK(b["object"] == "text_completion");
  CHECK(b["model"] == "m");
  CHECK_FALSE(b.contains("created"));
  CHECK(b["choices"][0]["text"] == "hello");
  CHECK(b["choices"][0]["finish_reason"] == "length");
  CHECK(b["usage"] == json{{"prompt_tokens", 3}, {"completion_tokens", 4}, {"total_tokens", 7}});
  CHECK(record_id("doc-1") != record_id("doc-2"));
  CHECK(derived_seed("doc-1") != derived_seed("doc-2"));

  BatchRequest chat =
      ok(line("/v1/chat/completions",
              {{"model", "k3"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}, "c"));
  c.text = "hm<|close|>think<|sep|><|open|>response<|sep|>Yes.<|close|>response<|sep|>";
  c.finish_reason = "stop";
  const json k = json::parse(success_record(chat, c, "m"));
  CHECK(k["response"]["body"]["object"] == "chat.completion");
  CHECK(k["response"]["body"]["model"] == "k3");
  const json& msg = k["response"]["body"]["choices"][0]["message"];
  CHECK(msg["role"] == "assistant");
  CHECK(msg["content"] == "Yes.");
  CHECK(msg["reasoning_content"] == "hm");
}

TEST_CASE("batch records: error layouts", "[engine][batch]") {
  LineError e = err("nope", 4);
  json j = json::parse(error_record(e));
  CHECK(j["id"] == "batch_req_line4");
  CHECK(j["custom_id"].is_null());
  CHECK(j["response"].is_null());
  CHECK(j["error"]["code"] == "invalid_json");
  CHECK(j["error"]["message"].get<std::string>().rfind("line 4: ", 0) == 0);

  e = err(line("/v1/completions", {{"prompt", "x"}, {"n", 3}}, "q"), 5);
  j = json::parse(error_record(e));
  CHECK(j["id"] == record_id("q"));
  CHECK(j["custom_id"] == "q");
  CHECK(j["error"].is_null());
  CHECK(j["response"]["status_code"] == 400);
  CHECK(j["response"]["body"]["error"]["type"] == "invalid_request_error");
  CHECK(j["response"]["body"]["error"]["param"] == "n");

  // A duplicate custom_id gets an id of its own (the first line keeps record_id(custom_id)).
  LineError d;
  d.line = 9;
  d.custom_id = "q";
  d.code = "duplicate_custom_id";
  d.message = "line 9: custom_id 'q' is already used by line 5";
  j = json::parse(error_record(d));
  CHECK(j["custom_id"] == "q");
  CHECK(j["id"] != record_id("q"));
}

TEST_CASE("batch lines: peek_custom_id and blank lines", "[engine][batch]") {
  CHECK(peek_custom_id(R"({"custom_id": "z", "body": 1})") == "z");
  CHECK_FALSE(peek_custom_id("not json").has_value());
  CHECK_FALSE(peek_custom_id(R"({"custom_id": 3})").has_value());
  CHECK(is_blank_line(""));
  CHECK(is_blank_line(" \t\r"));
  CHECK_FALSE(is_blank_line(" x"));
}
