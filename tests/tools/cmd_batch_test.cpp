// `strata batch` end to end on a synthetic k3-tiny: completion and chat requests give OpenAI batch
// records with the greedy continuation `strata run` gives; malformed lines and duplicate
// custom_ids give error records naming the line while the job goes on; an existing output is
// refused and left untouched; --resume of a finished job writes nothing twice; run --chat renders
// K3's chat format.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using strata::test::run_cli;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

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
              (d / "out.jsonl").string() + " --progress none --device cpu");
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
  const auto run =
      run_cli("run -m " + m.string() + " --ids " + (d / "ids.json").string() + " --temp 0 -n 6");
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
              (d / "out.jsonl").string() + " --resume --progress none");
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
