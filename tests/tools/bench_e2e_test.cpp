// `strata bench e2e` on a synthetic k3-tiny, the CPU backend: --prefill-repeats times the prompt
// that many times and reports their median (the slowest and fastest run in the JSON); one repeat
// keeps the single-run line.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;
using strata::test::run_cli;

TEST_CASE("bench e2e: --prefill-repeats times the prompt N times, the line is their median",
          "[cli][bench]") {
  const fs::path d = strata::test::scratch_dir("bench_e2e_repeats");
  REQUIRE(run_cli("synth --preset k3-tiny -q -o " + (d / "m").string()).status == 0);
  const std::string base = "bench e2e -m " + (d / "m").string() +
                           " --device cpu --placements 'all host' --batch 1 --prefill 32 48 "
                           "--context 4 --steps 1 --json ";
  for (int repeats : {1, 3, 4}) {
    INFO("repeats " << repeats);
    const fs::path out = d / ("e2e" + std::to_string(repeats) + ".json");
    const auto r = run_cli(base + out.string() + " --prefill-repeats " + std::to_string(repeats));
    INFO(r.out);
    REQUIRE(r.status == 0);
    const json j = json::parse(strata::test::slurp(out));
    std::vector<std::string> measures;
    for (const json& line : j["lines"]) {
      measures.push_back(line["measure"]);
      const double toks = line["tokens_per_s"];
      CHECK(toks > 0);
      if (line["measure"].get<std::string>().rfind("prefill", 0) != 0) continue;
      if (repeats == 1) {
        CHECK_FALSE(line.contains("repeats"));
        continue;
      }
      // The line is the median of the runs, between the slowest and the fastest.
      CHECK(line["repeats"] == repeats);
      const double lo = line["min_tokens_per_s"], hi = line["max_tokens_per_s"];
      CHECK(lo > 0);
      CHECK(lo <= toks);
      CHECK(toks <= hi);
    }
    CHECK(measures == std::vector<std::string>{"decode B=1", "prefill 32", "prefill 48"});
  }
}
