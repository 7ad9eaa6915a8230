// A small private CA for a cluster's mutual TLS: one CA key and certificate,
// and a key and certificate per node, signed by it (ECDSA P-256, SHA-256).
// What `llmgw certs` writes, and what tests use to run nodes over TLS. For a
// production cluster, an operator's own CA works the same: the topology only
// names PEM files.
#pragma once

#include <string>
#include <vector>

namespace llmgw::wire {

/// Files of one node.
struct node_credentials {
  std::string cert; ///< PEM certificate path
  std::string key;  ///< PEM private key path (mode 0600)
};

/// Makes `dir`/ca.pem and ca.key unless both exist already (then they are
/// reused, so nodes can be added later). Returns "" or what went wrong.
std::string ensure_ca(const std::string& dir, int days = 825);

/// Makes `dir`/NAME.pem and NAME.key signed by the CA in `dir`, with NAME and
/// `hosts` (DNS names or IP addresses) as subject alternative names.
/// Overwrites existing files. Returns "" or what went wrong.
std::string issue_node_certificate(const std::string& dir, const std::string& name,
                                   const std::vector<std::string>& hosts, int days = 825);

/// The paths issue_node_certificate writes for `name`.
node_credentials credentials_in(const std::string& dir, const std::string& name);

} // namespace llmgw::wire
