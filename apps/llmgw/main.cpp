// llmgw: one binary, one subcommand per role or tool.
#include "apps/common/memory.hpp"
#include "apps/llmgw/commands.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <exception>

int main(int argc, char** argv) {
  llmgw::apps::return_large_blocks_when_freed();
  try {
    CLI::App app{"llmgw: a KV-cache-aware gateway for fleets of vLLM engines"};
    app.require_subcommand(1);
    int exit_code = 0;
    llmgw::apps::add_hash_command(app, exit_code);
    llmgw::apps::add_events_command(app, exit_code);
    llmgw::apps::add_check_command(app, exit_code);
    llmgw::apps::add_certs_command(app, exit_code);
    llmgw::apps::add_node_command(app, exit_code);
    llmgw::apps::add_up_command(app, exit_code);
    llmgw::apps::add_status_command(app, exit_code);
    CLI11_PARSE(app, argc, argv);
    return exit_code;
  } catch (const std::exception& e) {
    // Subcommands handle what they expect; anything else ends the process
    // with a message instead of std::terminate.
    fmt::print(stderr, "llmgw: {}\n", e.what());
    return 1;
  }
}
