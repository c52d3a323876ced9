// `strata batch`: run a file of OpenAI Batch API requests (JSONL) through the engine and write one
// OpenAI batch output record per request line, durably (engine/batch_journal.h), with continuous
// batching (engine/batch_scheduler.h), progress on stderr, clean stops on SIGINT/SIGTERM, and
// sharding over MPI ranks (tools/mpi_shard.h). `strata batch merge` combines the ranks' parts in
// input order. Not here: the line formats (engine/batch_format.h).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <unordered_map>

#include "engine/batch_format.h"
#include "engine/batch_journal.h"
#include "engine/batch_scheduler.h"
#include "engine/cli_support.h"
#include "engine/model.h"
#include "engine/offload_executor.h"
#include "engine/tokenizer.h"
#include "storage/error.h"
#include "tools/command.h"
#include "tools/mpi_shard.h"

namespace strata::tools {

namespace fs = std::filesystem;

void add_engine_options(CLI::App& app, engine::InspectOptions& o);  // cmd_logits.cpp

namespace {

struct BatchOptions {
  std::string model_dir, input, output;
  bool resume = false;
  int max_tokens = 256;
  int slots = 4;
  int prefill_chunk = 2048;
  std::string mem_limit;
  bool no_think = false;
  std::string think_effort = "max";
  std::string progress = "auto";
  double log_every_s = 10;
  engine::InspectOptions engine_opts;  // device, precision, numerics, GPU budget, threads
  std::string shard;                   // "R/N": run one shard without an MPI launcher
  // merge
  std::string merge_output;
  std::vector<std::string> merge_parts;
};

// SIGINT/SIGTERM: stop after the current step. A second signal ends the process at once (the
// handler restores the default action).
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  sigaction(sig, &sa, nullptr);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// The input file, indexed once: where each line is, which lines are blank, which custom_ids are
// used twice (the first line keeps it; later ones get an error record), and the file's
// fingerprint (a resumed or merged job must answer the same bytes).
struct InputIndex {
  fs::path path;
  uint64_t bytes = 0;
  uint64_t fnv = 0;
  std::vector<uint64_t> begin, length;
  std::vector<bool> blank;
  std::vector<int64_t> first_use;  // for a line whose custom_id an earlier line used: that line
  int fd = -1;
  ~InputIndex() {
    if (fd >= 0) ::close(fd);
  }
  std::string line(size_t i) const {
    std::string s(length[i], '\0');
    size_t got = 0;
    while (got < s.size()) {
      const ssize_t r = ::pread(fd, s.data() + got, s.size() - got, off_t(begin[i] + got));
      if (r <= 0) throw Error(path.string() + ": line " + std::to_string(i + 1) + ": read failed");
      got += size_t(r);
    }
    return s;
  }
};

void index_input(const fs::path& p, InputIndex& ix) {
  ix.path = p;
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p.string() + ": cannot open the input file");
  ix.fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (ix.fd < 0) throw Error(p.string() + ": cannot open the input file");
  std::unordered_map<std::string, int64_t> seen;
  std::string s;
  uint64_t pos = 0;
  uint64_t h = engine::fnv1a64("");
  while (std::getline(in, s)) {
    const bool had_newline = !in.eof();
    h = engine::fnv1a64(s, h);
    if (had_newline) h = engine::fnv1a64("\n", h);
    ix.begin.push_back(pos);
    ix.length.push_back(s.size());
    const bool blank = engine::is_blank_line(s);
    ix.blank.push_back(blank);
    int64_t first = 0;
    if (!blank) {
      if (auto id = engine::peek_custom_id(s)) {
        auto [it, fresh] = seen.emplace(*id, int64_t(ix.begin.size()));
        if (!fresh) first = it->second;
      }
    }
    ix.first_use.push_back(first);
    pos += s.size() + (had_newline ? 1 : 0);
  }
  if (in.bad()) throw Error(p.string() + ": read failed");
  ix.bytes = pos;
  ix.fnv = h;
}

// Live progress on a TTY (one redrawn line), plain log lines otherwise.
class Progress {
 public:
  enum class Mode { bar, log, none };
  Progress(Mode mode, double log_every_s, std::string prefix, int64_t total, int64_t done_before)
      : mode_(mode),
        log_every_s_(log_every_s),
        prefix_(std::move(prefix)),
        total_(total),
        done_before_(done_before),
        t0_(std::chrono::steady_clock::now()),
        last_(t0_) {}

  // `answered`: records committed this run; `work_done`/`work_left`: input bytes of the requests
  // answered this run / still to answer (the ETA assumes time per input byte stays as it was).
  void update(int64_t answered, int64_t errors, const engine::SchedulerStats& st,
              uint64_t work_done, uint64_t work_left, bool force = false) {
    if (mode_ == Mode::none) return;
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (!force && since < (mode_ == Mode::bar ? 0.25 : log_every_s_)) return;
    last_ = now;
    const double el = std::chrono::duration<double>(now - t0_).count();
    const int64_t done = done_before_ + answered;
    char eta[32] = "?";
    if (work_done > 0 && el > 0) format_duration(el / double(work_done) * double(work_left), eta);
    if (work_left == 0) std::snprintf(eta, sizeof eta, "0s");
    const double ptps = st.seconds > 0 ? double(st.prompt_tokens) / st.seconds : 0;
    const double gtps = st.seconds > 0 ? double(st.generated_tokens) / st.seconds : 0;
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "%lld/%lld docs%s, prompt %.1f tok/s, generated %.1f tok/s, %d in flight, "
                  "ETA %s",
                  static_cast<long long>(done), static_cast<long long>(total_),
                  errors > 0 ? (" (" + std::to_string(errors) + " errors)").c_str() : "", ptps,
                  gtps, st.in_flight, eta);
    if (mode_ == Mode::bar) {
      constexpr int kWidth = 24;
      const int fill = total_ > 0 ? int(double(done) / double(total_) * kWidth) : kWidth;
      std::string bar(size_t(fill), '#');
      bar.resize(kWidth, '-');
      std::fprintf(stderr, "\r\033[K%s[%s] %s", prefix_.c_str(), bar.c_str(), msg);
      drawn_ = true;
    } else {
      std::fprintf(stderr, "strata batch: %s%s\n", prefix_.c_str(), msg);
    }
    std::fflush(stderr);
  }
  void end_line() {
    if (drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }

  static void format_duration(double s, char* out) {
    const long long t = static_cast<long long>(s + 0.5);
    if (t >= 3600)
      std::snprintf(out, 32, "%lldh%02lldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
      std::snprintf(out, 32, "%lldm%02llds", t / 60, t % 60);
    else
      std::snprintf(out, 32, "%llds", t);
  }

 private:
  Mode mode_;
  double log_every_s_;
  std::string prefix_;
  int64_t total_, done_before_;
  std::chrono::steady_clock::time_point t0_, last_;
  bool drawn_ = false;
};

std::string model_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// The prompt of a request as token ids: completions as given (text tokenized, ids checked against
// the vocabulary), chat rendered in K3's format. Throws strata::Error (a 400 for this request).
std::vector<int32_t> prompt_ids(const engine::BatchRequest& r, const engine::Tokenizer& tok,
                                int vocab, bool chat_tokens) {
  std::vector<int32_t> ids;
  if (r.endpoint == engine::Endpoint::chat) {
    if (!chat_tokens)
      throw Error(
          "this model's tokenizer has no K3 chat tokens (<|open|> <|sep|> <|close|> "
          "<|end_of_msg|>); chat requests need them");
    for (int id : tok.encode(engine::render_chat(r.messages, r.chat))) ids.push_back(id);
  } else if (r.prompt_text) {
    for (int id : tok.encode(*r.prompt_text)) ids.push_back(id);
    if (ids.empty()) throw Error("body.prompt: no tokens");
  } else {
    ids = r.prompt_ids;
  }
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw Error("body.prompt: token " + std::to_string(ids[i]) + " at position " +
                  std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(vocab) +
                  ")");
  return ids;
}

int run_merge(const BatchOptions& o) {
  std::vector<fs::path> parts(o.merge_parts.begin(), o.merge_parts.end());
  const int64_t n = engine::merge_job_parts(parts, o.merge_output);
  std::fprintf(stderr, "strata batch merge: %lld records from %zu part%s -> %s\n",
               static_cast<long long>(n), parts.size(), parts.size() == 1 ? "" : "s",
               o.merge_output.c_str());
  return 0;
}

int run_batch(const BatchOptions& o, MpiJob& mpi) {
  if (o.model_dir.empty() || o.input.empty() || o.output.empty())
    throw Error(
        "strata batch: give -m DIR, --input FILE and --output FILE (or: strata batch merge)");
  if (o.slots < 1) throw Error("--slots: expected at least 1");
  if (o.prefill_chunk < 1) throw Error("--prefill-chunk: expected at least 1 token");
  if (o.max_tokens < 1) throw Error("--max-tokens: expected at least 1");
  Progress::Mode mode;
  if (o.progress == "auto")
    mode = isatty(STDERR_FILENO) ? Progress::Mode::bar : Progress::Mode::log;
  else if (o.progress == "bar")
    mode = Progress::Mode::bar;
  else if (o.progress == "log")
    mode = Progress::Mode::log;
  else if (o.progress == "none")
    mode = Progress::Mode::none;
  else
    throw Error("--progress '" + o.progress + "': expected auto, bar, log or none");
  auto effort = engine::parse_thinking_effort(o.think_effort);
  if (!effort)
    throw Error("--think-effort '" + o.think_effort + "': expected low, medium, high or max");
  const engine::LoadOptions load = engine::load_options(o.engine_opts);  // checks its flags now

  int rank = mpi.rank(), ranks = mpi.ranks();
  if (!o.shard.empty()) {
    if (mpi.active() && mpi.ranks() > 1)
      throw Error("--shard: not with mpirun (the ranks shard the input)");
    int r = -1, n = -1;
    char tail = 0;
    if (std::sscanf(o.shard.c_str(), "%d/%d%c", &r, &n, &tail) != 2 || n < 1 || r < 0 || r >= n)
      throw Error("--shard '" + o.shard + "': expected R/N with 0 <= R < N");
    rank = r;
    ranks = n;
  }
  const std::string prefix =
      ranks > 1 ? "rank " + std::to_string(rank) + "/" + std::to_string(ranks) + ": " : "";

  install_stop_handlers();
  InputIndex ix;
  index_input(o.input, ix);
  std::vector<size_t> mine;  // 0-based input lines this rank answers
  for (size_t i = 0; i < ix.begin.size(); ++i)
    if (int64_t(i) % ranks == rank && !ix.blank[i]) mine.push_back(i);

  engine::JobHeader header;
  header.input = o.input;
  header.input_bytes = ix.bytes;
  header.input_fnv = engine::hex16(ix.fnv);
  header.requests = int64_t(mine.size());
  header.rank = rank;
  header.ranks = ranks;
  const fs::path out_path = engine::part_path(o.output, rank, ranks);
  engine::BatchOutput out(out_path, header, o.resume);
  const int64_t done_before = int64_t(out.done().size());
  uint64_t work_left = 0;
  for (size_t i : mine)
    if (!out.done().count(int64_t(i) + 1)) work_left += ix.length[i];

  auto model = engine::Model::load(o.model_dir, load);
  const ModelConfig& c = model->config();
  const engine::Tokenizer tok = engine::Tokenizer::load(o.model_dir);
  const bool chat_tokens =
      tok.special_id(engine::kChatOpen) >= 0 && tok.special_id(engine::kChatSep) >= 0 &&
      tok.special_id(engine::kChatClose) >= 0 && tok.special_id(engine::kChatEndOfMsg) >= 0;
  // Completions end at the model's eos or the tokenizer's document end [EOS]; a chat turn ends
  // only at the model's eos (<|end_of_msg|> for K3; spec/chat-format.md).
  std::vector<int> eos_completion, eos_chat;
  if (c.eos_token_id >= 0) {
    eos_completion.push_back(c.eos_token_id);
    eos_chat.push_back(c.eos_token_id);
  }
  if (tok.eos_id() >= 0 && tok.eos_id() != c.eos_token_id) eos_completion.push_back(tok.eos_id());

  const uint64_t mem_limit = o.mem_limit.empty()
                                 ? engine::available_memory_bytes()
                                 : engine::parse_size(o.mem_limit, 0, "--mem-limit");
  engine::SessionSetup setup(o.engine_opts, c);
  const engine::SessionOptions sopt = setup.options();
  auto backend = setup.make_backend(*model, sopt, o.slots);
  if (!setup.device_line().empty())
    std::fprintf(stderr, "strata: %s%s\n", prefix.c_str(), setup.device_line().c_str());
  auto runner = engine::make_schedule_runner(*backend, c);
  // Backends that size each slot's state up front (the GPU) hold max_context positions; the CPU
  // reference grows its state, limited by the memory for sequences.
  const int64_t max_context = backend->max_context();
  engine::SchedulerOptions so;
  so.prefill_chunk = o.prefill_chunk;
  so.mem_limit_bytes = max_context == INT64_MAX ? mem_limit : 0;
  engine::BatchScheduler sched(*runner, &tok, so);

  std::fprintf(
      stderr,
      "strata batch: %s%s: %zu request lines of %zu (%s); %lld already answered%s; "
      "output %s\n",
      prefix.c_str(), o.input.c_str(), mine.size(), ix.begin.size(),
      ranks > 1
          ? ("lines i with i % " + std::to_string(ranks) + " == " + std::to_string(rank)).c_str()
          : "all",
      static_cast<long long>(done_before),
      out.recovered_output_bytes() + out.recovered_journal_bytes() > 0
          ? (" (cut an unfinished record: " + std::to_string(out.recovered_output_bytes()) +
             " output bytes, " + std::to_string(out.recovered_journal_bytes()) + " journal bytes)")
                .c_str()
          : "",
      out_path.c_str());
  std::fprintf(stderr, "strata batch: %s%s: %s; %s; %s, prefill chunk %d, memory limit %s (%s)\n",
               prefix.c_str(), o.model_dir.c_str(), describe_config(c).c_str(),
               setup.describe().c_str(), runner->describe().c_str(), o.prefill_chunk,
               engine::format_bytes(mem_limit).c_str(),
               o.mem_limit.empty() ? "MemAvailable" : "--mem-limit");

  engine::RequestDefaults defaults;
  defaults.max_tokens = o.max_tokens;
  defaults.thinking = !o.no_think;
  defaults.effort = *effort;
  const std::string default_model = model_name(o.model_dir);

  int64_t answered = 0, errors = 0;
  uint64_t work_done = 0;
  auto commit = [&](int64_t line, const std::string& record, bool is_error) {
    out.append(line, record);
    ++answered;
    if (is_error) ++errors;
    const uint64_t b = ix.length[size_t(line - 1)];
    work_done += b;
    work_left -= b;
  };

  // Requests in flight: what the record needs besides the generation (the prompt is dropped).
  std::map<int64_t, engine::BatchRequest> in_flight;
  size_t cursor = 0;
  auto next = [&]() -> std::optional<engine::GenRequest> {
    while (cursor < mine.size()) {
      if (g_stop_signal.load() != 0) return std::nullopt;
      const size_t i = mine[cursor++];
      const int64_t line = int64_t(i) + 1;
      if (out.done().count(line)) continue;
      if (ix.first_use[i] > 0) {
        engine::LineError e;
        e.line = line;
        e.custom_id = engine::peek_custom_id(ix.line(i));
        e.code = "duplicate_custom_id";
        e.message = "line " + std::to_string(line) + ": custom_id '" + e.custom_id.value_or("") +
                    "' is already used by line " + std::to_string(ix.first_use[i]);
        commit(line, engine::error_record(e), true);
        continue;
      }
      engine::ParsedLine p = engine::parse_request_line(ix.line(i), line, defaults);
      if (auto* e = std::get_if<engine::LineError>(&p)) {
        commit(line, engine::error_record(*e), true);
        continue;
      }
      engine::BatchRequest& r = std::get<engine::BatchRequest>(p);
      std::vector<int32_t> ids;
      try {
        ids = prompt_ids(r, tok, c.vocab_size, chat_tokens);
      } catch (const Error& e) {
        commit(line, engine::error_record(engine::request_error(r, "invalid_request", e.what())),
               true);
        continue;
      }
      const int64_t tokens = int64_t(ids.size()) + r.max_tokens;
      const engine::SequenceMemory need = engine::sequence_memory(c, tokens, o.prefill_chunk);
      std::string cannot;  // why the request cannot fit, if it cannot
      if (tokens > max_context)
        cannot = std::to_string(ids.size()) + " prompt + " + std::to_string(r.max_tokens) +
                 " max tokens = " + std::to_string(tokens) +
                 " positions, more than the backend's --max-context " +
                 std::to_string(max_context) + " (" + backend->name() + ")";
      else if (max_context == INT64_MAX && mem_limit > 0 && need.total() > mem_limit)
        cannot = std::to_string(ids.size()) + " prompt + " + std::to_string(r.max_tokens) +
                 " max tokens need " + need.describe() + " at --prefill-chunk " +
                 std::to_string(o.prefill_chunk) + ", more than the memory limit of " +
                 engine::format_bytes(mem_limit) +
                 (o.mem_limit.empty() ? " (MemAvailable; --mem-limit)" : " (--mem-limit)");
      if (!cannot.empty()) {
        commit(line,
               engine::error_record(engine::request_error(r, "context_length_exceeded",
                                                          "the request cannot fit: " + cannot)),
               true);
        continue;
      }
      engine::GenRequest g;
      g.key = line;
      g.prompt = std::move(ids);
      g.max_tokens = r.max_tokens;
      g.sampler.temperature = float(r.temperature);
      g.sampler.top_p = float(r.top_p);
      g.sampler.top_k = r.top_k;
      g.sampler.seed = r.seed_given ? r.seed : engine::derived_seed(r.custom_id);
      g.stop = r.stop;
      g.eos_ids = r.endpoint == engine::Endpoint::chat ? eos_chat : eos_completion;
      g.reserve_bytes = need.total();
      r.prompt_text.reset();
      r.prompt_ids.clear();
      for (auto& m : r.messages) m.content.clear(), m.reasoning.clear();
      in_flight.emplace(line, std::move(r));
      return g;
    }
    return std::nullopt;
  };
  auto done = [&](engine::GenResult&& g) {
    auto it = in_flight.find(g.key);
    STRATA_ASSERT(it != in_flight.end());
    engine::Completion comp;
    comp.text = std::move(g.text);
    comp.finish_reason = g.finish_reason;
    comp.prompt_tokens = g.prompt_tokens;
    comp.completion_tokens = int64_t(g.tokens.size());
    commit(g.key, engine::success_record(it->second, comp, default_model), false);
    in_flight.erase(it);
  };

  Progress progress(mode, o.log_every_s, prefix, int64_t(mine.size()), done_before);
  std::atomic<bool> stop{false};
  bool complete = false;
  if (g_stop_signal.load() == 0) {
    complete = sched.run(next, done, stop, [&](const engine::SchedulerStats& st) {
      if (g_stop_signal.load() != 0) stop.store(true);
      progress.update(answered, errors, st, work_done, work_left);
    });
    // Error records written after the last generation (or with no generation at all).
    complete = complete && cursor == mine.size() && g_stop_signal.load() == 0;
  }
  const engine::SchedulerStats& st = sched.stats();
  progress.update(answered, errors, st, work_done, work_left, true);
  progress.end_line();

  const double s = st.seconds > 0 ? st.seconds : 0;
  auto rate = [&](double n) { return s > 0 ? n / s : 0.0; };
  const int64_t generated_docs = answered - errors;
  std::fprintf(stderr,
               "strata batch: %s%lld results this run (%lld generated, %lld error records), "
               "%lld/%zu answered; %.2f docs/s, prompt %.1f tok/s (%lld tokens), generated %.1f "
               "tok/s (%lld tokens), %lld steps, at most %d in flight, %.2f s, peak RSS %.1f MiB\n",
               prefix.c_str(), static_cast<long long>(answered),
               static_cast<long long>(generated_docs), static_cast<long long>(errors),
               static_cast<long long>(done_before + answered), mine.size(),
               rate(double(generated_docs)), rate(double(st.prompt_tokens)),
               static_cast<long long>(st.prompt_tokens), rate(double(st.generated_tokens)),
               static_cast<long long>(st.generated_tokens), static_cast<long long>(st.steps),
               st.max_in_flight, s, double(engine::peak_rss_bytes()) / (1024.0 * 1024.0));
  if (mpi.active() && mpi.ranks() > 1) {
    // One summary for the whole job: counts summed, the slowest rank's time.
    const std::vector<double> tot = mpi.sum(
        {double(answered), double(errors), double(st.prompt_tokens), double(st.generated_tokens),
         double(done_before + answered), double(mine.size()), complete ? 1.0 : 0.0});
    const std::vector<double> times = mpi.sum([&] {
      std::vector<double> v(size_t(mpi.ranks()), 0.0);
      v[size_t(mpi.rank())] = s;
      return v;
    }());
    double wall = 0;
    for (double t : times) wall = std::max(wall, t);
    if (mpi.rank() == 0) {
      const double gen = tot[0] - tot[1];
      std::fprintf(stderr,
                   "strata batch: job of %d ranks: %.0f/%.0f answered (%.0f error records this "
                   "run); %.2f docs/s, prompt %.1f tok/s, generated %.1f tok/s over %.2f s%s\n",
                   mpi.ranks(), tot[4], tot[5], tot[1], wall > 0 ? gen / wall : 0.0,
                   wall > 0 ? tot[2] / wall : 0.0, wall > 0 ? tot[3] / wall : 0.0, wall,
                   tot[6] == double(mpi.ranks())
                       ? ("; merge with: strata batch merge -o " + o.output + " " + o.output +
                          ".rank-*-of-" + std::to_string(mpi.ranks()))
                             .c_str()
                       : "");
    }
  }
  if (const int sig = g_stop_signal.load(); sig != 0) {
    std::fprintf(stderr,
                 "strata batch: %sstopped by %s after step %lld: %lld/%zu answered; rerun with "
                 "--resume to continue\n",
                 prefix.c_str(), sig == SIGINT ? "SIGINT" : "SIGTERM",
                 static_cast<long long>(st.steps), static_cast<long long>(done_before + answered),
                 mine.size());
    return 128 + sig;
  }
  STRATA_ASSERT(complete);
  return 0;
}

CommandRun setup_batch(CLI::App& app) {
  auto o = std::make_shared<BatchOptions>();
  app.add_option("-m,--model", o->model_dir, "model directory");
  app.add_option("--input", o->input, "requests, one OpenAI Batch API line each (JSONL)");
  app.add_option("--output", o->output,
                 "results (JSONL) + OUTPUT.journal; under mpirun -np N each rank writes "
                 "OUTPUT.rank-R-of-N");
  app.add_flag("--resume", o->resume,
               "continue the job that wrote OUTPUT (an existing output is never overwritten)");
  app.add_option("-n,--max-tokens", o->max_tokens, "max_tokens of requests that give none")
      ->capture_default_str();
  app.add_option("--slots", o->slots, "sequences in flight (continuous batching)")
      ->capture_default_str();
  app.add_option("--prefill-chunk", o->prefill_chunk,
                 "prompt tokens of one sequence per step (long documents are prefilled in "
                 "chunks)")
      ->capture_default_str();
  app.add_option("--mem-limit", o->mem_limit,
                 "memory for sequences in flight (e.g. 20GiB); default: MemAvailable");
  app.add_flag("--no-think", o->no_think,
               "chat requests: thinking off unless a request turns it on");
  app.add_option("--think-effort", o->think_effort, "chat requests: low|medium|high|max")
      ->capture_default_str();
  app.add_option("--progress", o->progress, "auto|bar|log|none (auto: bar on a TTY)")
      ->capture_default_str();
  app.add_option("--log-every", o->log_every_s, "seconds between progress log lines")
      ->capture_default_str();
  add_engine_options(app, o->engine_opts);
  app.add_option("--shard", o->shard,
                 "R/N: answer the lines i with i % N == R (what rank R of mpirun -np N does)");
  CLI::App* merge = app.add_subcommand(
      "merge", "Combine the output parts of an MPI job (OUTPUT.rank-R-of-N) in input order");
  merge->add_option("-o,--output", o->merge_output, "merged results (must not exist)")->required();
  merge->add_option("parts", o->merge_parts, "the parts (each with its .journal)")->required();
  return [o, merge] {
    if (merge->parsed()) return run_merge(*o);
    MpiJob mpi;
    try {
      return run_batch(*o, mpi);
    } catch (const Error& e) {
      if (!(mpi.active() && mpi.ranks() > 1)) throw;
      std::fprintf(stderr, "strata: error: rank %d of %d: %s\n", mpi.rank(), mpi.ranks(), e.what());
      mpi.abort(1);
    }
  };
}

}  // namespace

STRATA_COMMAND("batch",
               "Run a JSONL file of OpenAI Batch API requests (durable, resumable, MPI-sharded)",
               setup_batch);

}  // namespace strata::tools
