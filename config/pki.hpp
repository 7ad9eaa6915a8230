// A small private CA for a cluster's mutual TLS: one CA key and certificate,
// and a key and certificate per node, signed by it (ECDSA P-256, SHA-256).
// What `llmgw certs` writes, and what tests use to run nodes over TLS. For a
// production cluster, an operator's own CA works the same: the topology only
// names PEM files.
#pragma once

#include <string>
#include <vector>

namespace llmgw::config {

/// Files of one node.
struct node_credentials {
  std::string cert; ///< PEM certificate path
  std::string key;  ///< PEM private key path (mode 0600)
};

/// Where the CA's key is kept: `dir`/private/ca.key, in a folder only its
/// owner can enter, apart from the node keys (no node needs it; keep it
/// offline once the nodes have their certificates).
std::string ca_key_path(const std::string& dir);

/// Makes `dir`/ca.pem and ca_key_path(dir) unless both exist already (then
/// they are reused, so nodes can be added later), valid for `days`: longer
/// than its node certificates, which cannot outlive it. Returns "" or what
/// went wrong.
std::string ensure_ca(const std::string& dir, int days = 3650);

/// Makes `dir`/NAME.pem and NAME.key signed by the CA in `dir`, with NAME as
/// CN and NAME and `hosts` (DNS names or IP addresses) as subject
/// alternative names, valid for `days` but not beyond the CA. Replaces
/// existing files (never through a symlink; keys with mode 0600). Returns ""
/// or what went wrong.
std::string issue_node_certificate(const std::string& dir, const std::string& name,
                                   const std::vector<std::string>& hosts, int days = 825);

/// The paths issue_node_certificate writes for `name`.
node_credentials credentials_in(const std::string& dir, const std::string& name);

} // namespace llmgw::config
