// The strata CLI's command registry: each tools/cmd_*.cpp registers its subcommand with
// STRATA_COMMAND, so adding a command touches one file. Not a plugin system: everything is
// linked into the one `strata` binary.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace strata::tools {

// setup() declares the subcommand's options on `app` and returns the function that runs it
// (exit status). Bad user input is reported by throwing strata::UserError (see storage/error.h).
using CommandRun = std::function<int()>;
using CommandSetup = std::function<CommandRun(CLI::App& app)>;

struct CommandInfo {
  std::string name;
  std::string description;
  CommandSetup setup;
};

std::vector<CommandInfo>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string description, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

}  // namespace strata::tools

#define STRATA_CONCAT2(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT2(a, b)
#define STRATA_COMMAND(name, description, setup)                                                   \
  static ::strata::tools::CommandRegistrar STRATA_CONCAT(strata_cmd_, __LINE__)(name, description, \
                                                                                setup)
