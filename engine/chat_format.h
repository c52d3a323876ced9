// K3's chat format (spec/chat-format.md): a list of messages rendered to the prompt text that
// K3 was trained on (the four framing tokens <|open|> <|sep|> <|close|> <|end_of_msg|>, tags
// with escaped attributes, the thinking-effort system message, the generation prompt), and the
// generated text split back into its think and response channels.
// Not here: tokenization (the rendered text goes through Tokenizer::encode, which turns the
// framing strings into their special ids), tool declarations (refused until supported), the
// response-format message.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace strata::engine {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
  std::string name;       // optional name="" attribute (user/system)
  std::string reasoning;  // assistant history: the think channel (thinking on)
};

enum class ThinkingEffort { low, medium, high, max };

struct ChatOptions {
  bool thinking = true;  // K3's default
  ThinkingEffort effort = ThinkingEffort::max;
};

// "low" | "medium" | "high" | "max"; nullopt for anything else.
std::optional<ThinkingEffort> parse_thinking_effort(const std::string& s);
const char* thinking_effort_name(ThinkingEffort e);

// The prompt text for `messages` followed by the assistant generation prompt. Throws
// strata::Error for a role other than system/user/assistant (naming the message index).
std::string render_chat(const std::vector<ChatMessage>& messages, const ChatOptions& o);

// The framing token strings, for stop rules and tests.
inline constexpr const char* kChatOpen = "<|open|>";
inline constexpr const char* kChatSep = "<|sep|>";
inline constexpr const char* kChatClose = "<|close|>";
inline constexpr const char* kChatEndOfMsg = "<|end_of_msg|>";

// A generated assistant turn split into its channels. With thinking on the text starts inside
// the think channel (the generation prompt opened it): reasoning runs to <|close|>think<|sep|>,
// the response is what follows <|open|>response<|sep|> up to <|close|>response<|sep|> (or the
// end). With thinking off the text starts inside the response channel. A model that never closes
// the think channel leaves everything in `reasoning` and an empty `content`.
struct ChatReply {
  std::string reasoning;
  std::string content;
};
ChatReply split_chat_reply(const std::string& generated, bool thinking);

}  // namespace strata::engine
