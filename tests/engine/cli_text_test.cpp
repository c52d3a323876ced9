// `strata run -p TEXT` on a synthetic k3-tiny checkpoint with its stand-in tokenizer (written by
// `strata synth`): text generation with the stats line, seeded sampling reproduces itself, stop
// strings cut the output at their first occurrence, and the contract expert mode runs.
#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <string>

#include "test_util.h"

namespace {

using Result = strata::test::CliResult;
Result run(const std::string& args) {
  return strata::test::run_cli(args);
}

// The generated text: between the config line and the stats line, minus the newline run adds.
std::string text_of(const Result& r) {
  size_t at = r.out.find("strata run: prompt");
  REQUIRE(at != std::string::npos);
  // The backend's telemetry line (stderr), when it has one, comes before the summary.
  const size_t tel = r.out.find("\nstrata: ");
  if (tel != std::string::npos && tel + 1 < at) at = tel + 1;
  // The first line is the start-up config line (stderr), then the text (stdout).
  REQUIRE(r.out.rfind("strata run: ", 0) == 0);
  const size_t begin = r.out.find('\n') + 1;
  REQUIRE(begin <= at);
  std::string t = r.out.substr(begin, at - begin);
  REQUIRE(!t.empty());
  REQUIRE(t.back() == '\n');
  t.pop_back();
  return t;
}

// Shell single-quoting.
std::string q(const std::string& s) {
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

}  // namespace

TEST_CASE("strata run -p generates text, seeds reproduce, stop strings cut", "[engine][cli]") {
  auto dir = strata::test::scratch_dir("cli-text");
  Result s = run("synth --preset k3-tiny -o " + (dir / "m").string());
  INFO(s.out);
  REQUIRE(s.status == 0);
  const std::string base = "run -m " + (dir / "m").string() + " -p 'Hello world, this is a test'";

  Result g = run(base + " -n 16 --temp 0 --ignore-eos");
  INFO(g.out);
  REQUIRE(g.status == 0);
  const std::string greedy = text_of(g);
  CHECK(g.out.find("decode") != std::string::npos);

  Result a = run(base + " -n 16 --temp 0.8 --top-k 40 --top-p 0.9 --seed 7 --ignore-eos");
  Result b = run(base + " -n 16 --temp 0.8 --top-k 40 --top-p 0.9 --seed 7 --ignore-eos");
  REQUIRE(a.status == 0);
  REQUIRE(b.status == 0);
  CHECK(text_of(a) == text_of(b));

  // A stop string taken from the middle of the greedy text: output ends right before its first
  // occurrence.
  REQUIRE(greedy.size() >= 8);
  const std::string stop = greedy.substr(greedy.size() / 2, 2);
  const size_t first = greedy.find(stop);
  Result c = run(base + " -n 16 --temp 0 --ignore-eos --stop " + q(stop));
  INFO("stop " << stop << "\n" << c.out);
  REQUIRE(c.status == 0);
  CHECK(text_of(c) == greedy.substr(0, first));

  Result k = run(base + " -n 4 --temp 0 --experts-numerics contract --precision bf16");
  INFO(k.out);
  CHECK(k.status == 0);
  CHECK(k.out.find("experts contract") != std::string::npos);
}
