// Tests for `strata tokenize`: runs the CLI on the golden tokenizer and checks its ids against
// golden/tokenizer/cases.jsonl, the --decode round trip and the error exit.
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using RunResult = strata::test::CliResult;
using strata::test::run_cli;

}  // namespace

TEST_CASE("cmd_tokenize: ids match the golden cases, and --decode inverts", "[tokenizer]") {
  const fs::path tok = strata::test::golden_dir() / "tokenizer";
  strata::test::need_shared(tok / "cases.jsonl");
  // Golden cases whose text is safe to pass through a shell argument and a text file.
  std::ifstream f(tok / "cases.jsonl");
  std::string line;
  int checked = 0;
  while (std::getline(f, line) && checked < 6) {
    const auto c = nlohmann::json::parse(line);
    const std::string cat = c.at("category"), text = c.at("text");
    if (cat != "special" && cat != "english" && cat != "chinese") continue;
    if (text.empty() || text.find('\0') != std::string::npos) continue;
    const fs::path in = strata::test::scratch_dir("cmd_tokenize") / "text.txt";
    std::ofstream(in, std::ios::binary) << text;
    const RunResult r =
        run_cli("tokenize -m '" + tok.string() + "' -f '" + in.string() + "' --json");
    INFO(c.at("name").get<std::string>() << ": " << r.out);
    REQUIRE(r.status == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j.at("ids") == c.at("ids"));
    CHECK(j.at("count") == c.at("ids").size());

    std::string ids;
    for (int id : c.at("ids")) ids += std::to_string(id) + ",";
    const RunResult d = run_cli("tokenize -m '" + tok.string() + "' --decode '" + ids + "' --json");
    REQUIRE(d.status == 0);
    CHECK(nlohmann::json::parse(d.out).at("text") == text);
    ++checked;
  }
  CHECK(checked == 6);

  const RunResult plain = run_cli("tokenize -m '" + tok.string() + "' -p '[BOS]aaa'");
  CHECK(plain.status == 0);
  CHECK(plain.out.rfind("3840 ", 0) == 0);
  const RunResult none = run_cli("tokenize -m '" + tok.string() + "'");
  CHECK(none.status == 1);
  CHECK(none.out.find("give the text with -p TEXT or -f FILE") != std::string::npos);
  const RunResult bad = run_cli("tokenize -m '" + tok.string() + "' --decode 5000");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("token id 5000 is outside the vocabulary 0..4095") != std::string::npos);
}
