// `strata batch` end to end on a synthetic k3-tiny: completion and chat requests give OpenAI batch
// records with the greedy continuation `strata run` gives; malformed lines and duplicate
// custom_ids give error records naming the line while the job goes on; an existing output is
// refused and left untouched; --resume of a finished job writes nothing twice; run --chat renders
// K3's chat format. Durability: a job killed with SIGKILL at random moments (50 times) and resumed
// holds exactly the uninterrupted run's records, each once; SIGTERM stops cleanly. A request's
// record does not depend on how many others are in flight (CPU reference).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "engine/batch_journal.h"
#include "storage/error.h"
#include "test_util.h"

extern char** environ;

namespace fs = std::filesystem;
using nlohmann::json;
using strata::test::run_cli;

namespace {

using strata::test::slurp;
using strata::test::write_file;

// One k3-tiny checkpoint for all cases of this file (synth takes well under a second).
const fs::path& tiny_model() {
  static const fs::path dir = [] {
    const fs::path d = strata::test::scratch_dir("batch_model");
    const auto r = run_cli("synth --preset k3-tiny -q -o " + (d / "m").string());
    REQUIRE(r.status == 0);
    return d / "m";
  }();
  return dir;
}

std::string request(const std::string& id, const json& body,
                    const std::string& url = "/v1/completions") {
  return json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", body}}.dump();
}

std::map<std::string, json> by_custom_id(const std::string& jsonl) {
  std::map<std::string, json> m;
  std::istringstream in(jsonl);
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line);
    std::string key =
        j["custom_id"].is_null() ? j["id"].get<std::string>() : j["custom_id"].get<std::string>();
    if (!j["error"].is_null() && j["error"]["code"] == "duplicate_custom_id") key += "#dup";
    m[key] = j;
  }
  return m;
}

std::vector<int> parse_ids(const std::string& out) {
  const size_t a = out.find('['), b = out.find(']', a);
  REQUIRE(a != std::string::npos);
  REQUIRE(b != std::string::npos);
  std::vector<int> ids;
  for (const auto& v : json::parse(out.substr(a, b - a + 1))) ids.push_back(v.get<int>());
  return ids;
}

}  // namespace

TEST_CASE("strata batch: records for completions, chat, and bad lines", "[tools][batch]") {
  const fs::path m = tiny_model();
  const fs::path d = strata::test::scratch_dir("batch_basic");
  write_file(d / "ids.json", "[5, 17, 300, 42]");
  std::string in;
  in +=
      request("ids", {{"prompt", {5, 17, 300, 42}}, {"max_tokens", 6}, {"temperature", 0}}) + "\n";
  in += request("chat",
                {{"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                 {"max_tokens", 5},
                 {"temperature", 0}},
                "/v1/chat/completions") +
        "\n";
  in += "this is not json\n";
  in += "\n";  // blank: no record
  in += request("ids", {{"prompt", "again"}}) + "\n";
  in += request("bad-n", {{"prompt", "x"}, {"n", 2}}) + "\n";
  in += request("huge", {{"prompt", {1, 2, 3}}, {"max_tokens", 2000000000}}) + "\n";
  in += request("text", {{"prompt", "The quick brown fox"}, {"max_tokens", 3}, {"temperature", 0}});
  write_file(d / "in.jsonl", in);  // no final line feed: the last line still counts

  const auto r =
      run_cli("batch -m " + m.string() + " --input " + (d / "in.jsonl").string() + " --output " +
              (d / "out.jsonl").string() + " --progress none --device cpu-ref");
  INFO(r.out);
  REQUIRE(r.status == 0);
  const std::string out = slurp(d / "out.jsonl");
  const auto recs = by_custom_id(out);
  CHECK(std::count(out.begin(), out.end(), '\n') == 7);

  // The token-id request: the same greedy ids `strata run` gives.
  const json& ids = recs.at("ids");
  CHECK(ids["error"].is_null());
  CHECK(ids["response"]["status_code"] == 200);
  const json& body = ids["response"]["body"];
  CHECK(body["usage"]["prompt_tokens"] == 4);
  CHECK(body["usage"]["completion_tokens"].get<int>() <= 6);
  const auto run = run_cli("run -m " + m.string() + " --ids " + (d / "ids.json").string() +
                           " --temp 0 -n 6 --device cpu-ref");
  REQUIRE(run.status == 0);
  const std::string text = body["choices"][0]["text"].get<std::string>();
  CHECK_FALSE(text.empty());
  CHECK(run.out.find("\n" + text + "\n") != std::string::npos);  // run prints the same text

  const json& chat = recs.at("chat");
  CHECK(chat["response"]["body"]["object"] == "chat.completion");
  CHECK(chat["response"]["body"]["choices"][0]["message"]["role"] == "assistant");
  CHECK(chat["response"]["body"]["usage"]["prompt_tokens"].get<int>() > 10);

  CHECK(recs.at("batch_req_line3")["error"]["message"].get<std::string>().rfind(
            "line 3: not valid JSON", 0) == 0);
  const json& dup = recs.at("ids#dup");
  CHECK(dup["error"]["code"] == "duplicate_custom_id");
  CHECK(dup["error"]["message"] == "line 5: custom_id 'ids' is already used by line 1");
  CHECK(recs.at("bad-n")["response"]["status_code"] == 400);
  const json& huge = recs.at("huge")["response"]["body"]["error"];
  CHECK(huge["code"] == "context_length_exceeded");
  CHECK(huge["message"].get<std::string>().find("line 7: the request cannot fit") == 0);
  CHECK(recs.at("text")["response"]["status_code"] == 200);

  // Reruns: refused without --resume (output untouched); with it, nothing is written twice.
  const auto again = run_cli("batch -m " + m.string() + " --input " + (d / "in.jsonl").string() +
                             " --output " + (d / "out.jsonl").string());
  CHECK(again.status == 1);
  CHECK(again.out.find("exists; add --resume") != std::string::npos);
  CHECK(slurp(d / "out.jsonl") == out);
  const auto resumed =
      run_cli("batch -m " + m.string() + " --input " + (d / "in.jsonl").string() + " --output " +
              (d / "out.jsonl").string() + " --resume --progress none --device cpu-ref");
  CHECK(resumed.status == 0);
  CHECK(resumed.out.find("7 already answered") != std::string::npos);
  CHECK(slurp(d / "out.jsonl") == out);
}

TEST_CASE("strata batch: bad invocations exit 1 with one clear line", "[tools][batch]") {
  const fs::path m = tiny_model();
  const fs::path d = strata::test::scratch_dir("batch_badargs");
  write_file(d / "in.jsonl", request("a", {{"prompt", "x"}}) + "\n");
  auto r = run_cli("batch -m " + m.string() + " --input " + (d / "missing.jsonl").string() +
                   " --output " + (d / "o.jsonl").string());
  CHECK(r.status == 1);
  CHECK(r.out.find("missing.jsonl: cannot open the input file") != std::string::npos);
  r = run_cli("batch -m " + m.string() + " --input " + (d / "in.jsonl").string());
  CHECK(r.status == 1);
  CHECK(r.out.find("give -m DIR, --input FILE and --output FILE") != std::string::npos);
  r = run_cli("batch -m " + m.string() + " --input " + (d / "in.jsonl").string() + " --output " +
              (d / "o.jsonl").string() + " --shard 2/2");
  CHECK(r.status == 1);
  CHECK(r.out.find("--shard '2/2'") != std::string::npos);
  CHECK_FALSE(fs::exists(d / "o.jsonl"));
  // A malformed GPU budget is an error on a machine without a GPU too, before anything is written.
  r = run_cli("batch -m " + m.string() + " --input " + (d / "in.jsonl").string() + " --output " +
              (d / "o.jsonl").string() + " --gpu-mem 12XB");
  CHECK(r.status == 1);
  CHECK(r.out.find("--gpu-mem") != std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') == 1);
  CHECK_FALSE(fs::exists(d / "o.jsonl"));
}

TEST_CASE("strata run --chat renders K3's chat format", "[tools][batch]") {
  const fs::path m = tiny_model();
  // The rendered prompt's length in tokens: the tokenize command sees the same text.
  const auto on = run_cli("run -m " + m.string() + " -p Hello --chat --temp 0 -n 3");
  REQUIRE(on.status == 0);
  const auto off = run_cli("run -m " + m.string() + " -p Hello --chat --no-think --temp 0 -n 3");
  REQUIRE(off.status == 0);
  const std::string render_off =
      "<|open|>message role=\"user\"<|sep|>Hello<|close|>message<|sep|><|end_of_msg|>"
      "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";
  const auto tok = run_cli("tokenize -m " + m.string() + " --json -p '" + render_off + "'");
  REQUIRE(tok.status == 0);
  const size_t n_off = parse_ids(tok.out).size();
  CHECK(off.out.find("prompt " + std::to_string(n_off) + " tokens") != std::string::npos);
  CHECK(on.out.find("prompt " + std::to_string(n_off) + " tokens") == std::string::npos);
  const auto bad = run_cli("run -m " + m.string() + " -p Hello --no-think");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("only with --chat") != std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Durability: SIGKILL at random moments, then --resume; SIGTERM stops cleanly.

namespace {

// A job of short greedy requests (plus bad lines, whose error records must also appear exactly
// once), cheap enough that a run takes well under a second on k3-tiny.
std::string kill_job_input() {
  std::string in;
  for (int k = 0; k < 16; ++k) {
    json ids = json::array();
    for (int i = 0; i < 2 + (k * 7) % 23; ++i) ids.push_back((k * 97 + i * 31) % 900 + 3);
    in += request("doc-" + std::to_string(k),
                  {{"prompt", ids}, {"max_tokens", 2 + k % 6}, {"temperature", 0}}) +
          "\n";
    if (k % 8 == 3) in += "{\"custom_id\": \"broken-" + std::to_string(k) + "\"\n";
  }
  return in;
}

std::vector<std::string> batch_args(const fs::path& in, const fs::path& out) {
  return {strata::test::strata_exe(), "batch", "-m", tiny_model().string(), "--input", in.string(),
          "--output", out.string(), "--resume", "--progress", "none", "--device",
          // The CPU reference: every row computed on its own, so a record does not depend on
          // which requests share its steps (the fast CPU backend picks kernels by row count).
          "cpu-ref", "--slots", "3", "--prefill-chunk", "8"};
}

pid_t spawn(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  return pid;
}

// Output records by custom_id (error records of lines without one by their id); fails on a
// custom_id answered twice.
std::map<std::string, std::string> records_of(const std::string& jsonl) {
  std::map<std::string, std::string> m;
  std::istringstream in(jsonl);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line);
    const std::string key =
        j["custom_id"].is_null() ? j["id"].get<std::string>() : j["custom_id"].get<std::string>();
    INFO(key);
    CHECK(m.count(key) == 0);
    m[key] = line;
  }
  return m;
}

}  // namespace

TEST_CASE("strata batch: killed with SIGKILL at random moments, --resume loses and repeats nothing",
          "[tools][batch][kill]") {
  const fs::path d = strata::test::scratch_dir("batch_kill");
  write_file(d / "in.jsonl", kill_job_input());
  // The uninterrupted run with the same settings.
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t ref_pid = spawn(batch_args(d / "in.jsonl", d / "ref.jsonl"), d / "ref.log");
  int st = 0;
  waitpid(ref_pid, &st, 0);
  INFO(slurp(d / "ref.log"));
  REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  const double ref_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::map<std::string, std::string> ref = records_of(slurp(d / "ref.jsonl"));
  REQUIRE(ref.size() == 18);  // 16 documents + 2 broken lines

  // Start-up alone (index the input, load the model, recover): a resume of the finished job.
  const auto t1 = std::chrono::steady_clock::now();
  const pid_t idle_pid = spawn(batch_args(d / "in.jsonl", d / "ref.jsonl"), d / "ref.log");
  waitpid(idle_pid, &st, 0);
  REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  const double startup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const double work_s = std::max(ref_s - startup_s, 0.05);

  // Kill at uniform random moments within what the next run has left to do (start-up plus the
  // remaining share of the reference run's work), then resume; a job that completes is checked
  // and started again, until 50 kills. Bounded: at most 150 s (about 40 s on the 2-core CI
  // machine).
  std::mt19937 rng(20261201);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int kills = 0, completions = 0, cuts = 0, launches = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
  const fs::path out = d / "out.jsonl";
  size_t committed = 0;
  auto check_committed = [&](bool complete) {
    // What the journal commits (read as resume would) must be reference records, each once.
    const strata::engine::JobPart part = strata::engine::read_job_part(out);
    std::set<int64_t> lines;
    for (const auto& [line, rec] : part.records) {
      CHECK(lines.insert(line).second);
      const json j = json::parse(rec);
      const std::string key =
          j["custom_id"].is_null() ? j["id"].get<std::string>() : j["custom_id"].get<std::string>();
      REQUIRE(ref.count(key) == 1);
      CHECK(ref.at(key) == rec);
    }
    CHECK(part.records.size() >= committed);  // nothing committed is ever lost
    committed = part.records.size();
    if (complete) CHECK(records_of(slurp(out)) == ref);
  };
  while (kills < 50) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    const double left = 1.0 - double(committed) / double(ref.size());
    const double delay_s = unit(rng) * (startup_s + left * work_s);
    const pid_t pid = spawn(batch_args(d / "in.jsonl", out), d / "kill.log");
    ++launches;
    std::this_thread::sleep_for(std::chrono::duration<double>(delay_s));
    if (waitpid(pid, &st, WNOHANG) == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
    }
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
      ++kills;
      if (fs::exists(strata::engine::journal_path(out))) check_committed(false);
      continue;
    }
    INFO(slurp(d / "kill.log"));
    REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
    check_committed(true);
    ++completions;
    fs::remove(out);
    fs::remove(strata::engine::journal_path(out));
    committed = 0;
  }
  // Finish the last job.
  const pid_t pid = spawn(batch_args(d / "in.jsonl", out), d / "kill.log");
  waitpid(pid, &st, 0);
  REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  check_committed(true);
  const std::string log = slurp(d / "kill.log");
  for (size_t p = 0; (p = log.find("cut an unfinished record", p)) != std::string::npos; ++p)
    ++cuts;
  WARN("kill test: " << kills << " SIGKILLs over " << launches << " launches, " << completions
                     << " jobs completed in between, " << cuts
                     << " resumes cut an unfinished record; reference run " << ref_s
                     << " s, start-up " << startup_s << " s");
  CHECK(kills >= 50);
}

TEST_CASE("strata batch: SIGTERM stops after the current step, --resume finishes the job",
          "[tools][batch]") {
  const fs::path d = strata::test::scratch_dir("batch_sigterm");
  write_file(d / "in.jsonl", kill_job_input());
  const fs::path out = d / "out.jsonl";
  const pid_t pid = spawn(batch_args(d / "in.jsonl", out), d / "run.log");
  // Wait for the first committed record, then ask it to stop.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int st = 0;
  bool exited = false;
  while (!(fs::exists(out) && fs::file_size(out) > 0)) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    if (waitpid(pid, &st, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  REQUIRE_FALSE(exited);
  kill(pid, SIGTERM);
  waitpid(pid, &st, 0);
  const std::string log = slurp(d / "run.log");
  INFO(log);
  // Unless it had already finished, it stopped with 128 + SIGTERM and said how to continue.
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM));
    CHECK(log.find("stopped by SIGTERM after step") != std::string::npos);
    CHECK(log.find("rerun with --resume") != std::string::npos);
  }
  const size_t done_before = strata::engine::read_job_part(out).records.size();
  CHECK(done_before >= 1);
  const pid_t again = spawn(batch_args(d / "in.jsonl", out), d / "run2.log");
  waitpid(again, &st, 0);
  REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  CHECK(slurp(d / "run2.log").find(std::to_string(done_before) + " already answered") !=
        std::string::npos);
  CHECK(records_of(slurp(out)).size() == 18);
}

TEST_CASE("strata batch: a request's record is the same alone and among others in flight",
          "[tools][batch]") {
  // On the CPU reference every row is computed on its own in a fixed order: one slot and 4 slots
  // (several sequences per step, experts routed together) give byte-identical records. The fast
  // CPU backend (bf16 + contract) picks its matmul by the step's row count (GEMV up to 8 rows,
  // oneDNN above), so a decode row that shares a step with another request's prompt chunk can
  // change bits there: counted and reported, not required.
  const fs::path d = strata::test::scratch_dir("batch_alone");
  write_file(d / "in.jsonl", kill_job_input());
  for (const bool reference : {true, false}) {
    std::map<int, std::map<std::string, std::string>> recs;
    for (int slots : {1, 4}) {
      const std::string name = (reference ? "ref" : "fast") + std::to_string(slots);
      std::vector<std::string> args = batch_args(d / "in.jsonl", d / name);
      args[args.size() - 3] = std::to_string(slots);  // --slots N
      if (!reference) args[args.size() - 5] = "cpu";  // --device: the fast CPU backend
      const pid_t pid = spawn(args, d / "log");
      int st = 0;
      waitpid(pid, &st, 0);
      INFO(slurp(d / "log"));
      REQUIRE((WIFEXITED(st) && WEXITSTATUS(st) == 0));
      recs[slots] = records_of(slurp(d / name));
    }
    REQUIRE(recs[1].size() == 18);
    REQUIRE(recs[4].size() == 18);
    int differ = 0;
    for (const auto& [k, v] : recs[1]) differ += recs[4].at(k) != v;
    if (reference)
      CHECK(differ == 0);
    else
      WARN("fast CPU backend: " << differ << " of 18 records differ between --slots 1 and 4");
  }
}

// ---------------------------------------------------------------------------------------------
// Scale-out: mpirun -np 2 shards the input, merge restores input order, a dead rank resumes.

namespace {

std::string which(const std::string& prog) {
  FILE* p = popen(("command -v " + prog + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return "";
  char buf[512] = {0};
  const size_t n = fread(buf, 1, sizeof buf - 1, p);
  pclose(p);
  std::string s(buf, n);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::vector<std::string> mpirun_args(const std::string& mpirun, std::vector<std::string> batch) {
  std::vector<std::string> a = {mpirun,  "-np", "2",       "--oversubscribe", "--allow-run-as-root",
                                "--mca", "btl", "self,tcp"};
  a.insert(a.end(), batch.begin(), batch.end());
  return a;
}

int wait_exit(pid_t pid, int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// The pid of the strata process of MPI rank `rank` among `parent`'s descendants (mpirun starts
// the local ranks itself), or -1.
pid_t rank_pid(pid_t parent, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = slurp(e.path() / "stat");
    const size_t rp = stat.rfind(')');
    if (rp == std::string::npos || stat.find("(strata)") == std::string::npos) continue;
    std::istringstream rest(stat.substr(rp + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != parent) continue;
    const std::string env = slurp(e.path() / "environ");
    if (env.find("OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0') != std::string::npos)
      return pid_t(std::stoi(name));
  }
  return -1;
}

// Results a running rank has committed to `part`: 0 before its journal has a whole header (the
// rank creates the journal, then writes the header, so a poll can fall between the two).
size_t committed(const fs::path& part) {
  if (!fs::exists(strata::engine::journal_path(part))) return 0;
  try {
    return strata::engine::read_job_part(part).records.size();
  } catch (const strata::Error&) {
    return 0;
  }
}

}  // namespace

TEST_CASE("strata batch under mpirun -np 2: shards, merge in input order, a dead rank resumes",
          "[tools][batch][mpi]") {
#if !STRATA_HAVE_MPI
  STRATA_SKIP("strata was built without MPI (scripts/install-deps.sh installs libopenmpi-dev)");
#endif
  const std::string mpirun = which("mpirun");
  if (mpirun.empty())
    STRATA_SKIP("mpirun not found (scripts/install-deps.sh installs openmpi-bin)");
  const fs::path d = strata::test::scratch_dir("batch_mpi");
  // Enough documents that each rank runs for a few seconds (room to kill one mid-job).
  std::string in;
  for (int k = 0; k < 48; ++k) {
    json ids = json::array();
    for (int i = 0; i < 4 + (k * 13) % 40; ++i) ids.push_back((k * 53 + i * 29) % 900 + 3);
    in += request("doc-" + std::to_string(k),
                  {{"prompt", ids}, {"max_tokens", 3 + k % 5}, {"temperature", 0}}) +
          "\n";
    if (k == 17) in += "not json\n";
  }
  write_file(d / "in.jsonl", in);
  auto batch = [&](const std::string& out) {
    std::vector<std::string> a = batch_args(d / "in.jsonl", d / out);
    return a;
  };

  // Reference: one process, merged into input order.
  REQUIRE(wait_exit(spawn(batch("ref.jsonl"), d / "ref.log"), 120) == 0);
  REQUIRE(run_cli("batch merge -o " + (d / "ref-merged.jsonl").string() + " " +
                  (d / "ref.jsonl").string())
              .status == 0);
  const std::string want = slurp(d / "ref-merged.jsonl");
  REQUIRE(std::count(want.begin(), want.end(), '\n') == 49);

  // Two ranks: each writes its part; merge gives the reference byte for byte.
  {
    const int rc = wait_exit(spawn(mpirun_args(mpirun, batch("mpi.jsonl")), d / "mpi.log"), 180);
    INFO(slurp(d / "mpi.log"));
    REQUIRE(rc == 0);
    CHECK(slurp(d / "mpi.log").find("job of 2 ranks: 49/49 answered") != std::string::npos);
    CHECK_FALSE(fs::exists(d / "mpi.jsonl"));
    const auto m = run_cli("batch merge -o " + (d / "mpi-merged.jsonl").string() + " " +
                           (d / "mpi.jsonl.rank-1-of-2").string() + " " +
                           (d / "mpi.jsonl.rank-0-of-2").string());
    INFO(m.out);
    REQUIRE(m.status == 0);
    CHECK(slurp(d / "mpi-merged.jsonl") == want);
    // Rank 0 answered the even input lines, rank 1 the odd ones.
    for (const auto& [line, rec] :
         strata::engine::read_job_part(d / "mpi.jsonl.rank-1-of-2").records)
      CHECK(line % 2 == 0);  // 1-based line numbers of 0-based odd lines
  }

  // A rank that fails at start-up ends the whole job (MPI_Abort), naming itself.
  {
    const int rc = wait_exit(spawn(mpirun_args(mpirun,
                                               [&] {
                                                 auto a = batch("mpi.jsonl");
                                                 a.erase(std::find(a.begin(), a.end(), "--resume"));
                                                 return a;
                                               }()),
                                   d / "exists.log"),
                             120);
    CHECK(rc != 0);
    CHECK(slurp(d / "exists.log").find("exists; add --resume") != std::string::npos);
  }

  // Rank 1 dies (SIGKILL) after committing some results; mpirun ends the job; rerunning it with
  // --resume completes both parts and the merge is again the reference.
  {
    const pid_t mp = spawn(mpirun_args(mpirun, batch("dead.jsonl")), d / "dead.log");
    const fs::path part1 = d / "dead.jsonl.rank-1-of-2";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    pid_t victim = -1;
    while (std::chrono::steady_clock::now() < deadline) {
      if (committed(part1) > 0) {
        victim = rank_pid(mp, 1);
        break;
      }
      int st = 0;
      if (waitpid(mp, &st, WNOHANG) == mp) FAIL("mpirun ended before rank 1 committed anything");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(victim > 0);
    kill(victim, SIGKILL);
    const int rc = wait_exit(mp, 120);
    INFO(slurp(d / "dead.log"));
    const size_t done1 = strata::engine::read_job_part(part1).records.size();
    CHECK(rc != 0);
    CHECK(done1 < 24);  // it died mid-job
    const int rc2 =
        wait_exit(spawn(mpirun_args(mpirun, batch("dead.jsonl")), d / "dead2.log"), 180);
    INFO(slurp(d / "dead2.log"));
    REQUIRE(rc2 == 0);
    CHECK(slurp(d / "dead2.log").find("rank 1/2: ") != std::string::npos);
    CHECK(slurp(d / "dead2.log").find(std::to_string(done1) + " already answered") !=
          std::string::npos);
    REQUIRE(run_cli("batch merge -o " + (d / "dead-merged.jsonl").string() + " " +
                    (d / "dead.jsonl.rank-0-of-2").string() + " " + part1.string())
                .status == 0);
    CHECK(slurp(d / "dead-merged.jsonl") == want);
  }
}

TEST_CASE("strata batch: progress as log lines, as a bar, and a final summary", "[tools][batch]") {
  const fs::path m = tiny_model();
  const fs::path d = strata::test::scratch_dir("batch_progress");
  std::string in;
  for (int k = 0; k < 3; ++k)
    in += request("p" + std::to_string(k),
                  {{"prompt", {1 + k, 2, 3}}, {"max_tokens", 3}, {"temperature", 0}}) +
          "\n";
  write_file(d / "in.jsonl", in);
  const std::string base = "batch -m " + m.string() + " --input " + (d / "in.jsonl").string() +
                           " --device cpu-ref --slots 2 --output ";
  const auto log = run_cli(base + (d / "a.jsonl").string() + " --progress log --log-every 0");
  REQUIRE(log.status == 0);
  CHECK(log.out.find("strata batch: 0/3 docs") != std::string::npos);  // after the first step
  CHECK(log.out.find("strata batch: 3/3 docs") != std::string::npos);
  CHECK(log.out.find("ETA") != std::string::npos);
  CHECK(log.out.find("\r") == std::string::npos);  // plain lines when not a bar
  // The summary: results, rates, in flight.
  CHECK(log.out.find("3 results this run (3 generated, 0 error records), 3/3 answered") !=
        std::string::npos);
  CHECK(log.out.find("docs/s, prompt") != std::string::npos);
  CHECK(log.out.find("at most 2 in flight") != std::string::npos);
  const auto bar = run_cli(base + (d / "b.jsonl").string() + " --progress bar");
  REQUIRE(bar.status == 0);
  CHECK(bar.out.find("\r\033[K[########################] 3/3 docs") != std::string::npos);
  const auto none = run_cli(base + (d / "c.jsonl").string() + " --progress none");
  CHECK(none.out.find("docs, prompt") == std::string::npos);
  CHECK(run_cli(base + (d / "e.jsonl").string() + " --progress fancy").status == 1);
}

TEST_CASE(
    "strata batch: long prompts are prefilled in chunks, and what cannot fit says what it needs",
    "[tools][batch]") {
  const fs::path m = tiny_model();
  const fs::path d = strata::test::scratch_dir("batch_long");
  json ids = json::array();
  for (int i = 0; i < 600; ++i) ids.push_back((i * 37) % 900 + 3);
  write_file(d / "in.jsonl",
             request("long", {{"prompt", ids}, {"max_tokens", 4}, {"temperature", 0}}) + "\n");
  const std::string base = "batch -m " + m.string() + " --input " + (d / "in.jsonl").string() +
                           " --device cpu --progress none --output ";
  const auto r = run_cli(base + (d / "a.jsonl").string() + " --prefill-chunk 64");
  INFO(r.out);
  REQUIRE(r.status == 0);
  // 600 prompt tokens in chunks of 64 = 10 steps, then 3 decode steps (the first token comes
  // from the last prefill step).
  CHECK(r.out.find("prompt") != std::string::npos);
  CHECK(r.out.find("(600 tokens)") != std::string::npos);
  CHECK(r.out.find(" 13 steps") != std::string::npos);
  const json rec = json::parse(slurp(d / "a.jsonl"));
  CHECK(rec["response"]["status_code"] == 200);
  CHECK(rec["response"]["body"]["usage"]["prompt_tokens"] == 600);
  CHECK(rec["response"]["body"]["usage"]["completion_tokens"] == 4);

  const auto small = run_cli(base + (d / "b.jsonl").string() + " --mem-limit 1MiB");
  REQUIRE(small.status == 0);  // the job goes on: the request gets an error record
  const json err = json::parse(slurp(d / "b.jsonl"));
  CHECK(err["response"]["status_code"] == 400);
  const std::string msg = err["response"]["body"]["error"]["message"].get<std::string>();
  CHECK(err["response"]["body"]["error"]["code"] == "context_length_exceeded");
  CHECK(msg.find("line 1: the request cannot fit: 600 prompt + 4 max tokens need ") == 0);
  CHECK(msg.find("MLA cache") != std::string::npos);
  CHECK(msg.find("more than the memory limit of 1.0 MiB (--mem-limit)") != std::string::npos);
  CHECK(run_cli(base + (d / "c.jsonl").string() + " --mem-limit lots").status == 1);
}
