// `llmgw check --config FILE`: reads the topology and reports every problem at
// once, each with FILE:LINE:COLUMN, before anything is started. Exit 0 when the
// file is usable, 2 when it is not.
#include "apps/llmgw/commands.hpp"
#include "config/topology.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace llmgw::apps {

namespace {

std::string roles_of(const config::node_spec& n) {
  if (n.roles.agent && n.roles.control)
    return "agent+control";
  return n.roles.agent ? "agent" : "control";
}

} // namespace

bool load_or_report(const std::string& path, config::topology& out, const char* command,
                    const config::topology_options& opts) {
  auto loaded = config::load_topology(path, opts);
  if (!loaded.value) {
    fmt::print(stderr, "llmgw {}: {} has {} problem{}:\n", command, path, loaded.problems.size(),
               loaded.problems.size() == 1 ? "" : "s");
    for (const auto& p : loaded.problems)
      fmt::print(stderr, "  {}\n", p.to_string());
    return false;
  }
  out = std::move(*loaded.value);
  return true;
}

void add_check_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("check", "check a topology file and list every problem in it");
  auto path = std::make_shared<std::string>();
  cmd->add_option("--config", *path, "the topology (TOML)")->required();
  cmd->callback([path, &exit_code] {
    config::topology topo;
    if (!load_or_report(*path, topo, "check")) {
      exit_code = 2;
      return;
    }
    std::size_t engines = 0;
    for (const auto& n : topo.nodes)
      engines += n.engines.size();
    fmt::print("{}: cluster '{}', {} node{}, {} engine{}, block size {}, seed \"{}\", {}\n", *path,
               topo.name, topo.nodes.size(), topo.nodes.size() == 1 ? "" : "s", engines,
               engines == 1 ? "" : "s", topo.block_size, topo.seed,
               topo.plaintext ? "PLAINTEXT (loopback only)" : "mutual TLS");
    for (const auto& n : topo.nodes) {
      fmt::print("  node {} ({}) at {}:{}", n.name, roles_of(n), n.host, n.port);
      if (n.roles.control)
        fmt::print(", gateway http://{}:{}", n.http_host, n.http_port);
      fmt::print("\n");
      for (const auto& e : n.engines) {
        fmt::print("    engine {} model {} at {}{}{}{}{}\n", e.replica, e.model, e.url,
                   e.kv_events ? ", kv events" : ", prefix tree only",
                   e.launch.empty() ? ", attached" : ", launched",
                   e.kv_events && !e.translate_keys ? ", engine's own block keys" : "",
                   e.kv_events && !e.canary ? ", no canary (routed on its KV state unchecked)"
                                            : "");
        for (const auto& note : config::events_notes(e))
          fmt::print("      {}\n", note);
      }
    }
  });
}

} // namespace llmgw::apps
