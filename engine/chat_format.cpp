// K3's chat rendering and reply splitting; the format is spec/chat-format.md, written from its
// description (our own renderer).
#include "engine/chat_format.h"

#include "storage/error.h"

namespace strata::engine {

namespace {

std::string escape_attr(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char ch : v) {
    if (ch == '&')
      out += "&amp;";
    else if (ch == '"')
      out += "&quot;";
    else
      out += ch;
  }
  return out;
}

// <|open|>name key="value" ...<|sep|>
std::string open_tag(const std::string& name,
                     const std::vector<std::pair<std::string, std::string>>& attrs = {}) {
  std::string s = std::string(kChatOpen) + name;
  for (const auto& [k, v] : attrs) s += " " + k + "=\"" + escape_attr(v) + "\"";
  return s + kChatSep;
}

std::string close_tag(const std::string& name) {
  return std::string(kChatClose) + name + kChatSep;
}

// Ends every message: the close tag and the turn terminator (K3's eos).
std::string end_message() {
  return close_tag("message") + kChatEndOfMsg;
}

std::string before(const std::string& s, const std::string& marker) {
  const size_t p = s.find(marker);
  return p == std::string::npos ? s : s.substr(0, p);
}

}  // namespace

std::optional<ThinkingEffort> parse_thinking_effort(const std::string& s) {
  if (s == "low") return ThinkingEffort::low;
  if (s == "medium") return ThinkingEffort::medium;
  if (s == "high") return ThinkingEffort::high;
  if (s == "max") return ThinkingEffort::max;
  return std::nullopt;
}

const char* thinking_effort_name(ThinkingEffort e) {
  switch (e) {
    case ThinkingEffort::low:
      return "low";
    case ThinkingEffort::medium:
      return "medium";
    case ThinkingEffort::high:
      return "high";
    case ThinkingEffort::max:
      return "max";
  }
  return "max";
}

std::string render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& o) {
  std::string s;
  if (o.thinking) {
    s += open_tag("message", {{"role", "system"}, {"type", "thinking-effort"}});
    s += "`thinking_effort` guides on how much to think in your thinking channel (not including "
         "the response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
         "Now the system is invoked with `thinking_effort=";
    s += thinking_effort_name(o.effort);
    s += "`.";
    s += end_message();
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || m.role == "system") {
      std::vector<std::pair<std::string, std::string>> attrs = {{"role", m.role}};
      if (!m.name.empty()) attrs.emplace_back("name", m.name);
      s += open_tag("message", attrs) + m.content + end_message();
    } else if (m.role == "assistant") {
      s += open_tag("message", {{"role", "assistant"}});
      if (o.thinking) s += open_tag("think") + m.reasoning + close_tag("think");
      s += open_tag("response") + m.content + close_tag("response");
      s += end_message();
    } else {
      throw Error("messages[" + std::to_string(i) + "]: role '" + m.role +
                  "' is not supported (system, user or assistant)");
    }
  }
  s += open_tag("message", {{"role", "assistant"}});
  s += open_tag(o.thinking ? "think" : "response");
  return s;
}

ChatReply split_chat_reply(const std::string& generated, bool thinking) {
  ChatReply r;
  std::string rest = generated;
  if (thinking) {
    const std::string close_think = close_tag("think");
    const size_t p = generated.find(close_think);
    if (p == std::string::npos) {  // still thinking when generation stopped
      r.reasoning = before(generated, kChatEndOfMsg);
      return r;
    }
    r.reasoning = generated.substr(0, p);
    rest = generated.substr(p + close_think.size());
    const std::string open_response = open_tag("response");
    if (rest.compare(0, open_response.size(), open_response) == 0)
      rest = rest.substr(open_response.size());
  }
  r.content =
      before(before(before(rest, close_tag("response")), close_tag("message")), kChatEndOfMsg);
  return r;
}

}  // namespace strata::engine
