// The subcommands of the llmgw binary. Each registers itself on the CLI11 app
// and runs when selected; main() only dispatches.
#pragma once

namespace CLI {
class App;
} // namespace CLI

namespace llmgw::apps {

/// `llmgw hash`: block keys of a token list, for checking parity with an engine.
void add_hash_command(CLI::App& app, int& exit_code);

/// `llmgw events`: prints an engine's KV event stream as JSON lines.
void add_events_command(CLI::App& app, int& exit_code);

} // namespace llmgw::apps
