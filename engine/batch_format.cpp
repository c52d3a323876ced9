// OpenAI Batch API lines in and out (engine/batch_format.h). Each check names the line and the
// field; the job goes on after a bad line.
#include "engine/batch_format.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace strata::engine {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

std::string at_line(int64_t line) {
  return "line " + std::to_string(line) + ": ";
}

LineError envelope_error(int64_t line, std::optional<std::string> custom_id, std::string code,
                         const std::string& problem) {
  LineError e;
  e.line = line;
  e.custom_id = std::move(custom_id);
  e.envelope = true;
  e.code = std::move(code);
  e.message = at_line(line) + problem;
  return e;
}

// A body problem: thrown inside parse_body, turned into a 400 record.
struct BodyError {
  std::string param, message;
};

[[noreturn]] void bad(const std::string& param, const std::string& problem) {
  throw BodyError{param, "body." + param + ": " + problem};
}

const char* type_name(const json& v) {
  return v.type_name();
}

std::string get_string(const json& v, const std::string& param) {
  if (!v.is_string()) bad(param, std::string("expected a string, got ") + type_name(v));
  return v.get<std::string>();
}

int64_t get_int(const json& v, const std::string& param, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad(param, std::string("expected an integer, got ") + type_name(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    bad(param, "out of range");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad(param, std::to_string(x) + " is outside " + std::to_string(lo) + ".." + std::to_string(hi));
  return x;
}

double get_number(const json& v, const std::string& param, double lo, double hi) {
  if (!v.is_number()) bad(param, std::string("expected a number, got ") + type_name(v));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    bad(param,
        std::to_string(x) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

bool present(const json& body, const char* key) {
  auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

// Fields whose non-default values change what the API returns and that we do not implement:
// refused with a clear message rather than ignored.
void refuse_unsupported(const json& body) {
  auto value_is = [&](const char* key, auto pred) {
    auto it = body.find(key);
    return it == body.end() || it->is_null() || pred(*it);
  };
  auto is_false = [](const json& v) { return v.is_boolean() && !v.get<bool>(); };
  auto is_one = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; };
  auto is_zero = [](const json& v) { return v.is_number() && v.get<double>() == 0.0; };
  auto is_empty = [](const json& v) { return (v.is_array() || v.is_object()) && v.empty(); };
  if (!value_is("n", is_one)) bad("n", "only n = 1 is supported");
  if (!value_is("best_of", is_one)) bad("best_of", "only best_of = 1 is supported");
  if (!value_is("stream", is_false)) bad("stream", "streaming is not supported in a batch");
  if (!value_is("echo", is_false)) bad("echo", "echo is not supported");
  if (!value_is("logprobs", [&](const json& v) { return is_false(v) || is_zero(v); }))
    bad("logprobs", "logprobs are not supported yet");
  if (!value_is("top_logprobs", is_zero)) bad("top_logprobs", "logprobs are not supported yet");
  if (!value_is("presence_penalty", is_zero))
    bad("presence_penalty", "penalties are not supported");
  if (!value_is("frequency_penalty", is_zero))
    bad("frequency_penalty", "penalties are not supported");
  if (!value_is("logit_bias", is_empty)) bad("logit_bias", "logit_bias is not supported");
  if (!value_is("suffix", [](const json& v) { return v.is_string() && v.empty(); }))
    bad("suffix", "suffix is not supported");
  if (!value_is("tools", is_empty)) bad("tools", "tools are not supported yet");
  if (!value_is("functions", is_empty)) bad("functions", "tools are not supported yet");
  if (!value_is("response_format", [](const json& v) {
        return v.is_object() && v.value("type", std::string()) == "text";
      }))
    bad("response_format", "only {\"type\": \"text\"} is supported");
}

std::vector<int32_t> id_list(const json& v, const std::string& param) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    ids.push_back(int32_t(get_int(v[i], param + "[" + std::to_string(i) + "]", 0,
                                  std::numeric_limits<int32_t>::max())));
  return ids;
}

void parse_prompt(const json& p, BatchRequest& r) {
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    r.prompt_ids = id_list(p, "prompt");
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    r.prompt_text = p[0].get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_array()) {
    r.prompt_ids = id_list(p[0], "prompt[0]");
  } else if (p.is_array() && p.size() > 1) {
    bad("prompt", "several prompts in one request are not supported (one prompt per line)");
  } else {
    bad("prompt", std::string("expected a string or an array of token ids, got ") +
                      (p.is_array() ? "an empty array" : type_name(p)));
  }
  if (r.prompt_text && r.prompt_text->empty()) bad("prompt", "empty prompt");
  if (!r.prompt_text && r.prompt_ids.empty()) bad("prompt", "empty prompt");
}

// content: a string, or an array of {"type": "text", "text": ...} parts (concatenated).
std::string message_content(const json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string s;
    for (size_t i = 0; i < c.size(); ++i) {
      const std::string pi = param + "[" + std::to_string(i) + "]";
      if (!c[i].is_object() || c[i].value("type", std::string()) != "text" ||
          !c[i].contains("text"))
        bad(pi, "only text parts ({\"type\": \"text\", \"text\": ...}) are supported");
      s += get_string(c[i]["text"], pi + ".text");
    }
    return s;
  }
  if (c.is_null()) return {};
  bad(param, std::string("expected a string or an array of text parts, got ") + type_name(c));
}

void parse_messages(const json& body, BatchRequest& r) {
  if (!present(body, "messages")) bad("messages", "missing (a chat request needs messages)");
  const json& ms = body["messages"];
  if (!ms.is_array() || ms.empty()) bad("messages", "expected a non-empty array of messages");
  for (size_t i = 0; i < ms.size(); ++i) {
    const std::string pi = "messages[" + std::to_string(i) + "]";
    const json& m = ms[i];
    if (!m.is_object()) bad(pi, std::string("expected an object, got ") + type_name(m));
    ChatMessage cm;
    if (!m.contains("role")) bad(pi + ".role", "missing");
    cm.role = get_string(m["role"], pi + ".role");
    if (cm.role == "developer") cm.role = "system";  // the API's newer name for system
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
      bad(pi + ".role", "'" + cm.role + "' is not supported (system, user or assistant)");
    if (cm.role == "assistant" && present(m, "tool_calls"))
      bad(pi + ".tool_calls", "tools are not supported yet");
    cm.content = message_content(m.contains("content") ? m["content"] : json(), pi + ".content");
    if (present(m, "name")) cm.name = get_string(m["name"], pi + ".name");
    if (present(m, "reasoning_content"))
      cm.reasoning = get_string(m["reasoning_content"], pi + ".reasoning_content");
    r.messages.push_back(std::move(cm));
  }
  // Thinking: on by default (K3's default, or the command's flag); off with "thinking": false or
  // "chat_template_kwargs": {"thinking": false} (the form vLLM serves Kimi models with);
  // "reasoning_effort" sets the effort.
  auto thinking_flag = [&](const json& v, const std::string& param) {
    if (!v.is_boolean()) bad(param, std::string("expected true or false, got ") + type_name(v));
    r.chat.thinking = v.get<bool>();
  };
  if (present(body, "thinking")) thinking_flag(body["thinking"], "thinking");
  if (present(body, "chat_template_kwargs")) {
    const json& k = body["chat_template_kwargs"];
    if (!k.is_object()) bad("chat_template_kwargs", "expected an object");
    if (present(k, "thinking")) thinking_flag(k["thinking"], "chat_template_kwargs.thinking");
  }
  if (present(body, "reasoning_effort")) {
    const std::string e = get_string(body["reasoning_effort"], "reasoning_effort");
    auto eff = parse_thinking_effort(e);
    if (!eff) bad("reasoning_effort", "'" + e + "' is not one of low, medium, high, max");
    r.chat.effort = *eff;
  }
}

void parse_body(const json& body, BatchRequest& r, const RequestDefaults& d) {
  refuse_unsupported(body);
  if (present(body, "model")) r.model = get_string(body["model"], "model");
  r.max_tokens = d.max_tokens;
  r.chat.thinking = d.thinking;
  r.chat.effort = d.effort;
  if (r.endpoint == Endpoint::completions) {
    if (present(body, "messages")) bad("messages", "belongs to /v1/chat/completions");
    if (!present(body, "prompt")) bad("prompt", "missing (a completion request needs a prompt)");
    parse_prompt(body["prompt"], r);
  } else {
    if (present(body, "prompt")) bad("prompt", "belongs to /v1/completions");
    parse_messages(body, r);
  }
  const int kMaxTokens = std::numeric_limits<int32_t>::max();
  if (present(body, "max_completion_tokens"))
    r.max_tokens =
        int(get_int(body["max_completion_tokens"], "max_completion_tokens", 1, kMaxTokens));
  else if (present(body, "max_tokens"))
    r.max_tokens = int(get_int(body["max_tokens"], "max_tokens", 1, kMaxTokens));
  if (present(body, "temperature"))
    r.temperature = get_number(body["temperature"], "temperature", 0.0, 2.0);
  if (present(body, "top_p")) {
    r.top_p = get_number(body["top_p"], "top_p", 0.0, 1.0);
    if (r.top_p <= 0.0) bad("top_p", "must be greater than 0");
  }
  if (present(body, "top_k")) r.top_k = int(get_int(body["top_k"], "top_k", 0, kMaxTokens));
  if (present(body, "seed")) {
    const json& s = body["seed"];
    if (!s.is_number_integer())
      bad("seed", std::string("expected an integer, got ") + type_name(s));
    r.seed = s.is_number_unsigned() ? s.get<uint64_t>() : uint64_t(s.get<int64_t>());
    r.seed_given = true;
  }
  if (present(body, "stop")) {
    const json& s = body["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 4) bad("stop", "at most 4 stop strings");
      for (size_t i = 0; i < s.size(); ++i)
        r.stop.push_back(get_string(s[i], "stop[" + std::to_string(i) + "]"));
    } else {
      bad("stop", std::string("expected a string or an array of strings, got ") + type_name(s));
    }
    for (const auto& x : r.stop)
      if (x.empty()) bad("stop", "empty stop string");
  }
}

ordered_json usage_json(const Completion& c) {
  return ordered_json{{"prompt_tokens", c.prompt_tokens},
                      {"completion_tokens", c.completion_tokens},
                      {"total_tokens", c.prompt_tokens + c.completion_tokens}};
}

std::string dump_line(const ordered_json& j) {
  // Replace (never throw on) invalid UTF-8: generated text is already valid (decode_text), but a
  // record must always be writable.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

bool is_blank_line(std::string_view text) {
  for (char ch : text)
    if (ch != ' ' && ch != '\t' && ch != '\r') return false;
  return true;
}

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char ch : bytes) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex16(uint64_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[size_t(i)] = digits[v & 15];
  return s;
}

std::string record_id(const std::string& custom_id) {
  return "batch_req_" + hex16(fnv1a64(custom_id));
}

uint64_t derived_seed(const std::string& custom_id) {
  return fnv1a64(custom_id, fnv1a64("seed"));
}

std::optional<std::string> peek_custom_id(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  auto it = j.find("custom_id");
  if (it == j.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

ParsedLine parse_request_line(std::string_view text, int64_t line, const RequestDefaults& d) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // also out_of_range: a number beyond double (1e999)
    return envelope_error(line, std::nullopt, "invalid_json",
                          std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object())
    return envelope_error(line, std::nullopt, "invalid_line",
                          std::string("expected a JSON object, got ") + j.type_name());
  auto cid = j.find("custom_id");
  if (cid == j.end() || cid->is_null())
    return envelope_error(line, std::nullopt, "invalid_line", "'custom_id' is missing");
  if (!cid->is_string())
    return envelope_error(line, std::nullopt, "invalid_line",
                          std::string("'custom_id' must be a string, got ") + cid->type_name());
  BatchRequest r;
  r.line = line;
  r.custom_id = cid->get<std::string>();
  if (r.custom_id.empty())
    return envelope_error(line, std::nullopt, "invalid_line", "'custom_id' is empty");
  auto method = j.find("method");
  if (method == j.end() || !method->is_string() || method->get<std::string>() != "POST")
    return envelope_error(
        line, r.custom_id, "invalid_line",
        "'method' must be \"POST\"" + std::string(method == j.end() ? " (missing)" : ""));
  auto url = j.find("url");
  const std::string u = url != j.end() && url->is_string() ? url->get<std::string>() : "";
  if (u == "/v1/completions")
    r.endpoint = Endpoint::completions;
  else if (u == "/v1/chat/completions")
    r.endpoint = Endpoint::chat;
  else
    return envelope_error(line, r.custom_id, "invalid_line",
                          url == j.end() ? "'url' is missing"
                                         : "'url' must be \"/v1/completions\" or "
                                           "\"/v1/chat/completions\", got " +
                                               url->dump());
  auto body = j.find("body");
  if (body == j.end() || !body->is_object())
    return envelope_error(line, r.custom_id, "invalid_line",
                          body == j.end() ? "'body' is missing" : "'body' must be an object");
  try {
    parse_body(*body, r, d);
  } catch (const BodyError& e) {
    LineError le = request_error(r, "invalid_request", e.message, 400, e.param);
    return le;
  }
  return r;
}

LineError request_error(const BatchRequest& r, const std::string& code, const std::string& message,
                        int status_code, const std::string& param) {
  LineError e;
  e.line = r.line;
  e.custom_id = r.custom_id;
  e.envelope = false;
  e.status_code = status_code;
  e.code = code;
  e.message = at_line(r.line) + message;
  e.param = param;
  return e;
}

std::string success_record(const BatchRequest& r, const Completion& c,
                           const std::string& default_model) {
  const std::string hex = hex16(fnv1a64(r.custom_id));
  const std::string model = r.model.empty() ? default_model : r.model;
  ordered_json body;
  ordered_json choice;
  choice["index"] = 0;
  if (r.endpoint == Endpoint::completions) {
    body["id"] = "cmpl-" + hex;
    body["object"] = "text_completion";
    body["model"] = model;
    choice["text"] = c.text;
    choice["logprobs"] = nullptr;
  } else {
    body["id"] = "chatcmpl-" + hex;
    body["object"] = "chat.completion";
    body["model"] = model;
    const ChatReply reply = split_chat_reply(c.text, r.chat.thinking);
    ordered_json msg;
    msg["role"] = "assistant";
    msg["content"] = reply.content;
    if (r.chat.thinking) msg["reasoning_content"] = reply.reasoning;
    choice["message"] = msg;
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = c.finish_reason;
  body["choices"] = ordered_json::array({choice});
  body["usage"] = usage_json(c);
  ordered_json rec;
  rec["id"] = "batch_req_" + hex;
  rec["custom_id"] = r.custom_id;
  rec["response"] = {{"status_code", 200}, {"request_id", "req_" + hex}, {"body", body}};
  rec["error"] = nullptr;
  return dump_line(rec);
}

std::string error_record(const LineError& e) {
  // A duplicate custom_id shares the first line's custom_id: its id mixes in the line number so
  // ids stay unique; a line without a custom_id is named by its line number.
  std::string hex;
  if (!e.custom_id)
    hex = "line" + std::to_string(e.line);
  else if (e.code == "duplicate_custom_id")
    hex = hex16(fnv1a64(*e.custom_id + "\n" + std::to_string(e.line)));
  else
    hex = hex16(fnv1a64(*e.custom_id));
  ordered_json rec;
  rec["id"] = "batch_req_" + hex;
  rec["custom_id"] = e.custom_id ? ordered_json(*e.custom_id) : ordered_json(nullptr);
  if (e.envelope) {
    rec["response"] = nullptr;
    rec["error"] = {{"code", e.code}, {"message", e.message}};
  } else {
    ordered_json err;
    err["message"] = e.message;
    err["type"] = e.status_code >= 500 ? "server_error" : "invalid_request_error";
    err["param"] = e.param.empty() ? ordered_json(nullptr) : ordered_json(e.param);
    err["code"] = e.code;
    rec["response"] = {
        {"status_code", e.status_code}, {"request_id", "req_" + hex}, {"body", {{"error", err}}}};
    rec["error"] = nullptr;
  }
  return dump_line(rec);
}

}  // namespace strata::engine
