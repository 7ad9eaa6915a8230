// `llmgw certs --out DIR [--host H]... NAME...`: a private CA and one
// certificate per node for the cluster's mutual TLS. The CA in DIR is kept if
// it exists, so nodes can be added later; node files are written anew. Every
// certificate names its node and, as subject alternative names, localhost,
// 127.0.0.1 and each --host. The topology then points [tls] ca at DIR/ca.pem
// and each node's cert/key at DIR/NAME.pem and DIR/NAME.key, and may list
// each node's fingerprint (printed here) to revoke others later. The CA's
// key goes to DIR/private/ca.key: no node needs it.
#include "apps/llmgw/commands.hpp"
#include "config/node_identity.hpp"
#include "config/pki.hpp"

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
    int ca_days = 3650;
  };
  auto opts = std::make_shared<options>();
  cmd->add_option("--out", opts->out, "folder for ca.pem/ca.key and NAME.pem/NAME.key")->required();
  // One value per --host: a vector option would swallow the node names after it.
  cmd->add_option("--host", opts->hosts, "a DNS name or IP address the nodes are reached at")
    ->allow_extra_args(false);
  cmd->add_option("names", opts->names, "node names")->required();
  cmd->add_option("--days", opts->days, "node certificates' validity in days")
    ->check(CLI::Range(1, 3650))
    ->capture_default_str();
  cmd
    ->add_option("--ca-days", opts->ca_days,
                 "a new CA's validity in days (node certificates never outlive it)")
    ->check(CLI::Range(1, 36500))
    ->capture_default_str();
  cmd->callback([opts, &exit_code] {
    if (auto err = config::ensure_ca(opts->out, opts->ca_days); !err.empty()) {
      fmt::print(stderr, "llmgw certs: {}\n", err);
      exit_code = 1;
      return;
    }
    std::vector<std::string> hosts{"localhost", "127.0.0.1"};
    hosts.insert(hosts.end(), opts->hosts.begin(), opts->hosts.end());
    for (const auto& name : opts->names) {
      if (auto err = config::issue_node_certificate(opts->out, name, hosts, opts->days);
          !err.empty()) {
        fmt::print(stderr, "llmgw certs: {}: {}\n", name, err);
        exit_code = 1;
        return;
      }
      auto files = config::credentials_in(opts->out, name);
      auto id = config::node_identity::load(name, files.cert, files.key, opts->out + "/ca.pem");
      if (!id) {
        fmt::print(stderr, "llmgw certs: {}: {}\n", name, id.err().message);
        exit_code = 1;
        return;
      }
      fmt::print("{}: cert = \"{}\", key = \"{}\", fingerprints = [\"{}\"]\n", name, files.cert,
                 files.key, (*id)->fingerprint());
    }
    fmt::print("[tls] ca = \"{}/ca.pem\"\n", opts->out);
    fmt::print("The CA's key is {}: no node needs it. Keep it offline (it signs any node's "
               "certificate) and bring it back only to add or replace nodes.\n",
               config::ca_key_path(opts->out));
  });
}

} // namespace llmgw::apps
