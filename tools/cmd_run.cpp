// `strata run`: generate text (or ids) with the reference CPU engine. Prefill the prompt, then
// decode token by token with the sampler; stream text as it is generated; end with a stats line
// (prompt tokens, prefill and decode tok/s, peak RSS). The prompt is text (-p, tokenized with the
// checkpoint's tokenizer) or a JSON array of ids (--ids); --print-ids prints the generated ids as
// one JSON array instead of text. --chat sends -p as one user message in K3's chat format
// (engine/chat_format.h) and prints the generated turn as it comes (think channel, framing tags and
// response channel).
#include <chrono>
#include <cstdio>
#include <optional>

#include "engine/chat_format.h"
#include "engine/cli_support.h"
#include "engine/model.h"
#include "engine/offload_executor.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/tokenizer.h"
#include "nlohmann/json.hpp"
#include "storage/error.h"
#include "tools/command.h"

namespace strata::tools {

void add_inspect_options(CLI::App& app, engine::InspectOptions& o);  // cmd_logits.cpp
void add_offload_options(CLI::App& app, engine::OffloadOptions& o);  // offload_options.cpp

namespace {

struct RunOptions {
  std::string model_dir, prompt, ids_file;
  bool print_ids = false, ignore_eos = false;
  bool chat = false, no_think = false;
  std::string think_effort = "max";
  int n_predict = 256;
  float temp = 0.7f, top_p = 0.95f;
  int top_k = 0;
  uint64_t seed = 1;
  std::vector<std::string> stop;
  engine::InspectOptions inspect;
  engine::OffloadOptions offload;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_generate(const RunOptions& o) {
  if (o.prompt.empty() == o.ids_file.empty())
    throw Error("strata run: give exactly one of -p TEXT or --ids FILE.json");
  if (o.chat && o.prompt.empty()) throw Error("--chat: needs the user message as -p TEXT");
  if (!o.chat && (o.no_think || o.think_effort != "max"))
    throw Error("--no-think / --think-effort: only with --chat");
  if (o.n_predict < 0) throw Error("-n: expected a token count >= 0");
  for (const auto& s : o.stop)
    if (s.empty()) throw Error("--stop: an empty stop string would stop before the first token");
  engine::SamplerConfig sc;
  sc.temperature = o.temp;
  sc.top_k = o.top_k;
  sc.top_p = o.top_p;
  sc.seed = o.seed;
  engine::Sampler sampler(sc);  // checks the sampling options before anything is loaded
  engine::check_before_load(o.inspect, &o.offload, o.model_dir, {o.ids_file},
                            {{"--stats-json", o.offload.stats_json}});
  const engine::LoadOptions lo = engine::load_options(o.inspect);
  auto model = engine::Model::load(o.model_dir, lo);
  const ModelConfig& c = model->config();

  std::optional<engine::Tokenizer> tok;
  std::vector<int32_t> prompt;
  if (!o.prompt.empty()) {
    tok = engine::Tokenizer::load(o.model_dir);
    std::string text = o.prompt;
    if (o.chat) {
      // One user message in K3's chat format (spec/chat-format.md).
      for (const char* t :
           {engine::kChatOpen, engine::kChatSep, engine::kChatClose, engine::kChatEndOfMsg})
        if (tok->special_id(t) < 0)
          throw Error("--chat: the tokenizer of " + o.model_dir + " has no " + t +
                      " token (K3's chat format needs <|open|> <|sep|> <|close|> <|end_of_msg|>)");
      engine::ChatOptions co;
      co.thinking = !o.no_think;
      auto effort = engine::parse_thinking_effort(o.think_effort);
      if (!effort)
        throw Error("--think-effort '" + o.think_effort + "': expected low, medium, high or max");
      co.effort = *effort;
      text = engine::render_chat({{"user", o.prompt, "", ""}}, co);
    }
    std::vector<int> enc = tok->encode(text);
    if (enc.empty()) throw Error("-p: empty prompt (no tokens)");
    for (int id : enc) {
      if (id >= c.vocab_size)
        throw Error("-p: the tokenizer of " + o.model_dir + " produced id " + std::to_string(id) +
                    ", outside the model's vocabulary [0, " + std::to_string(c.vocab_size) + ")");
      prompt.push_back(id);
    }
  } else {
    prompt = engine::read_ids_file(o.ids_file, c.vocab_size);
    if (!o.print_ids) {
      try {
        tok = engine::Tokenizer::load(o.model_dir);
      } catch (const Error&) {
        throw Error("strata run --ids: " + o.model_dir +
                    " has no usable tokenizer to print text; add --print-ids");
      }
    }
  }

  // A replayed routing must cover exactly the positions this run can reach: the prompt, then
  // up to n − 1 decode steps (the last generated token is never fed back).
  const int64_t P = int64_t(prompt.size());
  const engine::PositionRange positions{
      P, o.inspect.stop_after_layer >= 0 ? P : P + std::max(0, o.n_predict - 1)};
  engine::SessionSetup setup(o.inspect, c, positions);
  engine::SessionOptions sopt = setup.options();
  engine::OffloadRuntime offload(*model, o.offload);  // --host-mem: experts from the store
  for (const auto& line : offload.describe()) std::fprintf(stderr, "strata: %s\n", line.c_str());
  offload.install(sopt);
  auto backend = setup.make_backend(*model, sopt);
  if (!setup.device_line().empty())
    std::fprintf(stderr, "strata: %s\n", setup.device_line().c_str());
  engine::Session session(*model, *backend, 0, sopt);
  engine::StopRules stop;
  stop.stop_strings = o.stop;
  if (!o.ignore_eos) {
    if (c.eos_token_id >= 0) stop.eos_ids.push_back(c.eos_token_id);
    // A chat turn ends only at the model's eos (<|end_of_msg|> for K3); the tokenizer's [EOS]
    // ends documents (spec/chat-format.md).
    if (!o.chat && tok && tok->eos_id() >= 0 && tok->eos_id() != c.eos_token_id)
      stop.eos_ids.push_back(tok->eos_id());
  }
  size_t max_stop = 0;
  for (const auto& s : o.stop) max_stop = std::max(max_stop, s.size());

  // One typed config, printed at start-up (STYLE §10).
  std::fprintf(stderr,
               "strata run: %s: %s; %s; backend %s; %.1f MiB of weights checked for NaN/Inf%s\n",
               o.model_dir.c_str(), describe_config(c).c_str(), setup.describe().c_str(),
               backend->name(), double(model->scanned_weight_bytes()) / 1048576.0,
               lo.check_weights ? " (--check-weights)" : "");
  // Prefill.
  auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = engine::process_cpu_seconds();
  // Each forward draws the next token where the logits are (Backend::sample: on the GPU only the
  // id comes back); the draws come from the one seeded stream, so a seed repeats a run.
  int32_t id = session.forward_token(prompt, sampler.next_draw());
  const double prefill_s = seconds_since(t0);
  const double prefill_cpu = engine::process_cpu_seconds() - cpu0;
  if (id < 0) {  // --stop-after-layer: nothing to sample
    setup.finish();
    std::fprintf(stderr, "strata run: stopped after layer %d (%zu prompt tokens, %.3f s)\n",
                 o.inspect.stop_after_layer, prompt.size(), prefill_s);
    return 0;
  }

  // Decode.
  std::vector<int32_t> generated;
  engine::Utf8Stream utf8;
  std::string text;    // generated text so far (whole characters)
  size_t printed = 0;  // bytes of `text` already written
  auto t1 = std::chrono::steady_clock::now();
  const double cpu1 = engine::process_cpu_seconds();
  int decode_steps = 0;
  for (int i = 0; i < o.n_predict; ++i) {
    if (stop.is_eos(id)) break;
    generated.push_back(id);
    bool stop_now = false;
    if (!o.print_ids) {
      text += utf8.push(tok->decode_token(id));
      size_t cut = stop.stop_position(text);
      // Hold back what could still become a stop string.
      size_t safe = cut != std::string::npos ? cut
                    : text.size() > max_stop ? text.size() - (max_stop > 0 ? max_stop - 1 : 0)
                                             : (max_stop == 0 ? text.size() : 0);
      if (safe > printed) {
        std::fwrite(text.data() + printed, 1, safe - printed, stdout);
        std::fflush(stdout);
        printed = safe;
      }
      stop_now = cut != std::string::npos;
    }
    if (stop_now || i + 1 == o.n_predict) break;
    const int32_t fed = id;
    id = session.forward_token(std::span<const int32_t>(&fed, 1), sampler.next_draw());
    ++decode_steps;
  }
  const double decode_s = seconds_since(t1);
  const double decode_cpu = engine::process_cpu_seconds() - cpu1;
  if (o.print_ids) {
    std::string out = "[";
    for (size_t i = 0; i < generated.size(); ++i)
      out += (i ? ", " : "") + std::to_string(generated[i]);
    std::printf("%s]\n", out.c_str());
  } else {
    text += utf8.flush();
    size_t cut = stop.stop_position(text);
    size_t end = cut != std::string::npos ? cut : text.size();
    if (end > printed) std::fwrite(text.data() + printed, 1, end - printed, stdout);
    std::printf("\n");
  }
  std::fflush(stdout);
  setup.finish();
  // --stats-json: the run's rates, the backend's telemetry, the expert tiers (when active).
  nlohmann::json stats;
  stats["run"] = {{"backend", backend->name()},
                  {"prompt_tokens", prompt.size()},
                  {"prefill_s", prefill_s},
                  {"prefill_tokens_per_s", double(prompt.size()) / prefill_s},
                  {"decode_steps", decode_steps},
                  {"decode_s", decode_s},
                  {"decode_tokens_per_s", decode_steps > 0 ? decode_steps / decode_s : 0.0},
                  {"generated_tokens", generated.size()},
                  {"peak_rss_mib", double(engine::peak_rss_bytes()) / (1024.0 * 1024.0)}};
  nlohmann::json bt = nlohmann::json::object();
  for (const auto& [k, v] : backend->telemetry_values()) bt[k] = v;
  stats["backend"] = bt;
  offload.finish(stats);  // the tier telemetry line (and --stats-json)
  if (!backend->telemetry_line().empty())
    std::fprintf(stderr, "strata: %s\n", backend->telemetry_line().c_str());
  // Decode rate counts the forward passes of generated tokens (the first token comes from the
  // prefill's logits). CPU seconds (all threads) next to wall seconds show starvation on a
  // shared machine.
  std::fprintf(stderr,
               "strata run: prompt %zu tokens, prefill %.2f tok/s (%.3f s, %.3f CPU s), decode "
               "%.2f tok/s (%d steps, %.3f s, %.3f CPU s), generated %zu tokens, peak RSS %.1f "
               "MiB (%s, %s)\n",
               prompt.size(), double(prompt.size()) / prefill_s, prefill_s, prefill_cpu,
               decode_steps > 0 ? decode_steps / decode_s : 0.0, decode_steps, decode_s, decode_cpu,
               generated.size(), double(engine::peak_rss_bytes()) / (1024.0 * 1024.0),
               setup.describe().c_str(), backend->name());
  return 0;
}

}  // namespace

STRATA_COMMAND(
    "run", "Generate text (prefill + decode) on the GPU engine or the CPU",
    [](CLI::App& app) -> CommandRun {
      auto o = std::make_shared<RunOptions>();
      app.add_option("-m,--model", o->model_dir, "model directory")->required();
      app.add_option("-p,--prompt", o->prompt, "prompt text");
      app.add_option("--ids", o->ids_file, "prompt as a JSON array of token ids");
      app.add_flag("--print-ids", o->print_ids,
                   "print the generated ids as one JSON array instead of text");
      app.add_option("-n,--n-predict", o->n_predict, "tokens to generate")->capture_default_str();
      app.add_option("--temp", o->temp, "temperature (0 = greedy)")->capture_default_str();
      app.add_option("--top-p", o->top_p, "nucleus sampling mass (1 = off)")->capture_default_str();
      app.add_option("--top-k", o->top_k, "top-k cut (0 = off)")->capture_default_str();
      app.add_option("--seed", o->seed, "sampling seed")->capture_default_str();
      app.add_option("--stop", o->stop, "stop string (repeatable)");
      app.add_flag("--ignore-eos", o->ignore_eos, "do not stop at the EOS token");
      app.add_flag("--chat", o->chat,
                   "send -p as one user message in K3's chat format (thinking on by default)");
      app.add_flag("--no-think", o->no_think,
                   "--chat: thinking off (the reply starts in the "
                   "response channel)");
      app.add_option("--think-effort", o->think_effort, "--chat: low|medium|high|max")
          ->capture_default_str();
      add_inspect_options(app, o->inspect);
      add_offload_options(app, o->offload);
      return [o] { return run_generate(*o); };
    });

}  // namespace strata::tools
