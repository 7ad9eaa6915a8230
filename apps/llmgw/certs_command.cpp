// `llmgw certs --out DIR [--host H]... NAME...`: a private CA and one
// certificate per node for the cluster's mutual TLS. The CA in DIR is kept if
// it exists, so nodes can be added later; node files are written anew. Every
// certificate names its node and, as subject alternative names, localhost,
// 127.0.0.1 and each --host. The topology then points [tls] ca at DIR/ca.pem
// and each node's cert/key at DIR/NAME.pem and DIR/NAME.key.
#include "apps/llmgw/commands.hpp"
#include "wire/pki.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace llmgw::apps {

void add_certs_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("certs", "make a private CA and node certificates for mutual TLS");
  struct options {
    std::string out;
    std::vector<std::string> hosts;
    std::vector<std::string> names;
    int days = 825;
  };
  auto opts = std::make_shared<options>();
  cmd->add_option("--out", opts->out, "folder for ca.pem/ca.key and NAME.pem/NAME.key")->required();
  // One value per --host: a vector option would swallow the node names after it.
  cmd->add_option("--host", opts->hosts, "a DNS name or IP address the nodes are reached at")
    ->allow_extra_args(false);
  cmd->add_option("names", opts->names, "node names")->required();
  cmd->add_option("--days", opts->days, "validity in days")
    ->check(CLI::Range(1, 3650))
    ->capture_default_str();
  cmd->callback([opts, &exit_code] {
    if (auto err = wire::ensure_ca(opts->out, opts->days); !err.empty()) {
      fmt::print(stderr, "llmgw certs: {}\n", err);
      exit_code = 1;
      return;
    }
    std::vector<std::string> hosts{"localhost", "127.0.0.1"};
    hosts.insert(hosts.end(), opts->hosts.begin(), opts->hosts.end());
    for (const auto& name : opts->names) {
      if (auto err = wire::issue_node_certificate(opts->out, name, hosts, opts->days);
          !err.empty()) {
        fmt::print(stderr, "llmgw certs: {}: {}\n", name, err);
        exit_code = 1;
        return;
      }
      auto files = wire::credentials_in(opts->out, name);
      fmt::print("{}: cert = \"{}\", key = \"{}\"\n", name, files.cert, files.key);
    }
    fmt::print("[tls] ca = \"{}/ca.pem\"   (keep {}/ca.key private)\n", opts->out, opts->out);
  });
}

} // namespace llmgw::apps
