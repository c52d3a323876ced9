// strata CLI entry point: builds the CLI11 app from the registered commands and maps failures to
// one clear line on stderr and a non-zero exit status.
#include <algorithm>
#include <cstdio>
#include <exception>

#include "storage/error.h"
#include "tools/command.h"

namespace strata::tools {
std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> r;
  return r;
}
}  // namespace strata::tools

int main(int argc, char** argv) {
  using namespace strata::tools;
  CLI::App app{"strata — inference engine for the Kimi K3 model family"};
  app.require_subcommand(1);
  auto& reg = command_registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, CommandRun>> runs;
  for (auto& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    runs.emplace_back(sub, c.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (auto& [sub, run] : runs)
      if (sub->parsed()) return run();
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "strata: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
