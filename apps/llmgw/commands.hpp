// The subcommands of the llmgw binary. Each registers itself on the CLI11 app
// and runs when selected; main() only dispatches.
#pragma once

#include "config/topology.hpp"

#include <string>

namespace CLI {
class App;
} // namespace CLI

namespace llmgw::apps {

/// `llmgw hash`: block keys of a token list, for checking parity with an engine.
void add_hash_command(CLI::App& app, int& exit_code);

/// `llmgw check`: validates a topology, listing every problem.
void add_check_command(CLI::App& app, int& exit_code);

/// `llmgw certs`: a private CA and node certificates.
void add_certs_command(CLI::App& app, int& exit_code);

/// `llmgw node`: runs one node of a topology.
void add_node_command(CLI::App& app, int& exit_code);

/// `llmgw up`: every node of a single-machine topology, for a demo.
void add_up_command(CLI::App& app, int& exit_code);

/// `llmgw status`: the cluster as one control node sees it, as a table.
void add_status_command(CLI::App& app, int& exit_code);

/// `llmgw events`: prints an engine's KV event stream as JSON lines.
void add_events_command(CLI::App& app, int& exit_code);

/// Loads a topology (checking the TLS files `opts` asks for); on problems
/// prints them all (prefixed "llmgw COMMAND") and returns false.
bool load_or_report(const std::string& path, config::topology& out, const char* command,
                    const config::topology_options& opts = {});

} // namespace llmgw::apps
