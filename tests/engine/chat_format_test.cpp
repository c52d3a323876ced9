// K3's chat format (spec/chat-format.md): the rendered prompt, character for character, with
// thinking on and off, history turns, escaped attributes; and the split of a generated turn into
// its think and response channels.
#include <catch2/catch.hpp>

#include "engine/chat_format.h"
#include "storage/error.h"

using namespace strata::engine;

namespace {

const std::string kEffortText =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=";

}  // namespace

TEST_CASE("render_chat: one user message, thinking on (default effort max)", "[engine][chat]") {
  const std::string s = render_chat({{"user", "Hi", "", ""}}, ChatOptions{});
  CHECK(s == "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>" + kEffortText +
                 "max`.<|close|>message<|sep|><|end_of_msg|>"
                 "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
                 "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
}

TEST_CASE("render_chat: thinking off has no effort message and opens the response channel",
          "[engine][chat]") {
  ChatOptions o;
  o.thinking = false;
  const std::string s = render_chat({{"system", "Be brief.", "", ""}, {"user", "Hi", "", ""}}, o);
  CHECK(s ==
        "<|open|>message role=\"system\"<|sep|>Be brief.<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>");
}

TEST_CASE("render_chat: assistant history, names with escaped attributes, effort low",
          "[engine][chat]") {
  ChatOptions o;
  o.effort = ThinkingEffort::low;
  const std::string s = render_chat({{"user", "2+2?", "a\"b&c", ""},
                                     {"assistant", "4", "", "adding"},
                                     {"user", "and 3+3?", "", ""}},
                                    o);
  CHECK(s == "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>" + kEffortText +
                 "low`.<|close|>message<|sep|><|end_of_msg|>"
                 "<|open|>message role=\"user\" name=\"a&quot;b&amp;c\"<|sep|>2+2?"
                 "<|close|>message<|sep|><|end_of_msg|>"
                 "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>adding"
                 "<|close|>think<|sep|><|open|>response<|sep|>4<|close|>response<|sep|>"
                 "<|close|>message<|sep|><|end_of_msg|>"
                 "<|open|>message role=\"user\"<|sep|>and 3+3?<|close|>message<|sep|><|end_of_msg|>"
                 "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
  // Thinking off: the assistant turn in the history has no think channel.
  o.thinking = false;
  const std::string t = render_chat({{"assistant", "4", "", "adding"}}, o);
  CHECK(t ==
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>4<|close|>response"
        "<|sep|><|close|>message<|sep|><|end_of_msg|>"
        "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>");
}

TEST_CASE("render_chat refuses unknown roles, naming the message", "[engine][chat]") {
  try {
    render_chat({{"user", "x", "", ""}, {"tool", "y", "", ""}}, ChatOptions{});
    FAIL("expected an error");
  } catch (const strata::Error& e) {
    CHECK(std::string(e.what()).find("messages[1]") != std::string::npos);
    CHECK(std::string(e.what()).find("'tool'") != std::string::npos);
  }
}

TEST_CASE("parse_thinking_effort", "[engine][chat]") {
  CHECK(parse_thinking_effort("low") == ThinkingEffort::low);
  CHECK(parse_thinking_effort("medium") == ThinkingEffort::medium);
  CHECK(parse_thinking_effort("high") == ThinkingEffort::high);
  CHECK(parse_thinking_effort("max") == ThinkingEffort::max);
  CHECK_FALSE(parse_thinking_effort("MAX").has_value());
  CHECK_FALSE(parse_thinking_effort("").has_value());
}

TEST_CASE("split_chat_reply: think and response channels", "[engine][chat]") {
  auto r = split_chat_reply(
      "let me see<|close|>think<|sep|><|open|>response<|sep|>Four.<|close|>response<|sep|>"
      "<|close|>message<|sep|>",
      true);
  CHECK(r.reasoning == "let me see");
  CHECK(r.content == "Four.");
  // Generation cut while still thinking: everything is reasoning.
  r = split_chat_reply("still thinking", true);
  CHECK(r.reasoning == "still thinking");
  CHECK(r.content.empty());
  // Cut inside the response channel.
  r = split_chat_reply("x<|close|>think<|sep|><|open|>response<|sep|>Fo", true);
  CHECK(r.reasoning == "x");
  CHECK(r.content == "Fo");
  // Thinking off: the text starts inside the response channel.
  r = split_chat_reply("Four.<|close|>response<|sep|><|close|>message<|sep|>", false);
  CHECK(r.reasoning.empty());
  CHECK(r.content == "Four.");
}
