// strata CLI entry point: builds the CLI11 app from the registered commands and maps failures to
// one clear line on stderr and a non-zero exit status.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include "storage/error.h"
#include "storage/safetensors.h"
#include "tools/command.h"

namespace strata::tools {
std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> r;
  return r;
}
}  // namespace strata::tools

int main(int argc, char** argv) {
  using namespace strata::tools;
  strata::install_sigbus_handler();  // a shard truncated while mapped: one line, exit 1
  // Keep freed memory in the process. A step's buffers (activations, logits, expert outputs: 128
  // KiB to tens of MiB) were otherwise mapped and unmapped step after step by glibc, paying page
  // faults and zeroing each time (dev VM, k3-mini B=8 on the CPU backend: 5.8 ms per step outside
  // every timed kernel, 2.0 with these two settings, neither alone). Larger buffers are still
  // mapped directly and returned when freed. Advisory: a refusal changes only speed.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest allowed value on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{"strata — inference engine for the Kimi K3 model family"};
  app.require_subcommand(1);
  auto& reg = command_registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, CommandRun>> runs;
  for (auto& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    runs.emplace_back(sub, c.setup(*sub));
  }
  // CLI11 reports an unknown command as "A subcommand is required": name it instead.
  if (argc >= 2 && argv[1][0] != '-' &&
      std::none_of(reg.begin(), reg.end(), [&](auto& c) { return c.name == argv[1]; })) {
    std::string known;
    for (auto& c : reg) known += (known.empty() ? "" : ", ") + c.name;
    std::fprintf(stderr, "strata: error: unknown command '%s' (expected one of: %s)\n", argv[1],
                 known.c_str());
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // --help: the help text, exit 0
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // CLI11's own exit() prints two lines and returns its error codes (104-109); the README
    // promises one line naming what was wrong and exit status 1 for every bad input.
    std::string cmd = "strata";
    for (const CLI::App* sub = &app; sub != nullptr;) {
      const CLI::App* next = nullptr;
      for (const CLI::App* s : sub->get_subcommands())
        if (s->parsed()) next = s;
      if (next) cmd += " " + next->get_name();
      sub = next;
    }
    std::string msg = e.what();
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
    for (char& ch : msg)
      if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "strata: error: %s (see %s --help)\n", msg.c_str(), cmd.c_str());
    return 1;
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
