// Catch2 v2 main for every test executable (one per folder of tests/), with skips (tests/skip.h).
// A skip ends the case through Catch's own abort path (Catch::TestFailureException, what a failed
// REQUIRE throws after recording its failure), so Catch neither counts it as a failure nor runs
// the rest of the case; a listener records which cases skipped and prints why. Exit status: Catch's
// own when an assertion failed (never kSkipExitCode, so a failure cannot read as a skip);
// kSkipExitCode when every case that ran skipped; 0 otherwise, with a count of the skipped cases.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <iostream>
#include <string>

#include "skip.h"

namespace {

struct Tally {
  int ran = 0, skipped = 0;
  bool skip_requested = false;  // by the running case
  std::string reason;
};

Tally& tally() {
  static Tally t;
  return t;
}

struct SkipListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    tally().skip_requested = false;
    tally().reason.clear();
    TestEventListenerBase::testCaseStarting(info);
  }
  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    Tally& t = tally();
    t.ran++;
    // A case that failed before it skipped is a failure (Catch counted it); only a clean skip
    // counts as skipped.
    if (t.skip_requested && stats.totals.assertions.failed == 0) {
      t.skipped++;
      std::cout << "SKIPPED: " << stats.testInfo.name << ": " << t.reason << std::endl;
    }
    TestEventListenerBase::testCaseEnded(stats);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(SkipListener)

namespace strata::test {

void skip_case(const std::string& reason) {
  tally().skip_requested = true;
  tally().reason = reason;
  throw Catch::TestFailureException{};
}

}  // namespace strata::test

int main(int argc, char** argv) {
  const int rc = Catch::Session().run(argc, argv);
  const Tally& t = tally();
  if (t.ran == 0) return rc;  // listing, --help, or no case matched (-w NoTests fails that)
  if (rc != 0) return rc == strata::test::kSkipExitCode ? 1 : rc;
  if (t.skipped == t.ran) return strata::test::kSkipExitCode;
  if (t.skipped > 0)
    std::cout << "strata tests: " << t.skipped << " of " << t.ran
              << " test cases SKIPPED (see the SKIPPED lines above)" << std::endl;
  return 0;
}
