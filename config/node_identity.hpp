// Who a node is, proven. Each node holds a certificate from the cluster's CA
// whose subject CN is its name (`llmgw certs` writes it so; subject
// alternative names list hosts, and name no node) and the matching key. CAF 0.17's TLS accepts any
// certificate the CA signed and never shows llmgw which one a peer
// presented, so an agent's session with a control node is authenticated
// again inside it, at the application level:
//
//   agent -> control   agent_hello:   agent name, session id, nonce Na, X25519 share Ea
//   control -> agent   control_proof: control name, nonce Nc, share Ec, certificate,
//                                     signature over ("llmgw control proof", T)
//   agent -> control   agent_proof:   certificate, signature over ("llmgw agent proof", T)
//
// T is SHA-256 over both names, the session id, both nonces and both shares,
// each length-prefixed. Each side checks the other's certificate (signed by
// the CA, valid now, naming the node it expects, and listed in the
// topology's fingerprints for that node when it has any) and its signature.
// Both derive the session key HKDF-SHA256(X25519(Ea, Ec), salt = T), and every
// update of the session carries an HMAC-SHA256 under that key.
//
// Why the key as well as the signatures: a node that relays a handshake
// between a genuine agent and a control node (its own valid certificate
// carries both TLS connections) gets a session accepted, but cannot compute
// the key, so nothing it sends on that session is accepted; it can only
// pass the genuine agent's updates on, or drop them. The names in T keep a
// proof made for one control node from being used with another, and the
// fresh nonces keep an old proof from being used again.
//
// Plain OpenSSL (libcrypto), no actors: unit-tested directly.
#pragma once

#include "base/result.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llmgw::config {

/// `n` bytes from OpenSSL's CSPRNG (aborts if it has no entropy: a node
/// cannot run safely without it).
std::string random_bytes(std::size_t n);

/// "sha256:" and the lowercase hex SHA-256 of a DER certificate: how the
/// topology's `fingerprints` name a certificate.
std::string fingerprint_of(std::string_view der);

/// A fingerprint as written in a topology ("sha256:AB:CD:...", "abcd...",
/// any case, colons optional) in fingerprint_of's form; "" if it is not one.
std::string normalize_fingerprint(std::string_view text);

/// What a session's proofs cover.
struct session_transcript {
  std::string agent;   ///< the agent node's name
  std::string control; ///< the control node's name
  std::uint64_t session = 0;
  std::string agent_nonce;
  std::string agent_share; ///< X25519 public key, 32 bytes
  std::string control_nonce;
  std::string control_share;

  /// SHA-256 over every field, each length-prefixed (32 bytes).
  std::string digest() const;
};

/// Which side signs: the labels keep one side's proof from passing as the
/// other's.
enum class proof_role : std::uint8_t { agent, control };

/// The bytes a side signs for a transcript.
std::string proof_input(proof_role role, const session_transcript& t);

/// One side's fresh X25519 key pair and nonce for one session attempt.
class key_share {
public:
  /// A new key pair and a 32-byte nonce.
  static result<key_share> make();

  key_share(key_share&&) noexcept;
  key_share& operator=(key_share&&) noexcept;
  ~key_share();

  const std::string& nonce() const noexcept { return nonce_; }
  const std::string& public_key() const noexcept { return public_; }

  /// The session key (32 bytes): HKDF-SHA256 over X25519 with the peer's
  /// share, salted with the transcript's digest. Fails on a share that is
  /// not a valid X25519 public key (or a low-order point).
  result<std::string> session_key(std::string_view peer_share, const session_transcript& t) const;

private:
  key_share() = default;
  struct impl;
  std::unique_ptr<impl> impl_;
  std::string nonce_;
  std::string public_;
};

/// Why a peer's certificate or signature was refused; `reason` is a metric
/// label (certificate, name, fingerprint, signature), empty when accepted.
struct peer_check {
  std::string reason;
  std::string detail;
  explicit operator bool() const noexcept { return reason.empty(); }
};

/// A node's own credentials and the cluster's CA, loaded once at start.
class node_identity {
public:
  /// Reads the PEM certificate and unencrypted key of node `name` and the CA
  /// it must chain to. Fails if any cannot be read, the key does not belong
  /// to the certificate, the certificate is not valid under the CA now, or it
  /// does not name `name`.
  static result<std::shared_ptr<const node_identity>> load(const std::string& name,
                                                           const std::string& cert_path,
                                                           const std::string& key_path,
                                                           const std::string& ca_path);
  ~node_identity();

  const std::string& name() const noexcept { return name_; }
  /// The certificate, DER.
  const std::string& certificate() const noexcept { return der_; }
  /// fingerprint_of(certificate()).
  const std::string& fingerprint() const noexcept { return fingerprint_; }

  /// A signature of `data` with this node's key (ECDSA or RSA with SHA-256,
  /// or Ed25519).
  std::string sign(std::string_view data) const;

  /// Accepts a peer that proves to be node `expected`: its DER certificate is
  /// signed by the CA and valid now, names `expected`, is one of
  /// `fingerprints` (normalized; none listed: any), and `signature` is its
  /// key's signature of `data`.
  peer_check check_peer(std::string_view der, const std::string& expected,
                        const std::vector<std::string>& fingerprints, std::string_view data,
                        std::string_view signature) const;

private:
  node_identity() = default;
  struct impl;
  std::unique_ptr<impl> impl_;
  std::string name_;
  std::string der_;
  std::string fingerprint_;
};

/// Why the certificate in PEM file `cert_path` does not name `name` (its one
/// subject CN), or "" when it does; for `llmgw check`.
std::string certificate_names(const std::string& cert_path, const std::string& name);

/// The subject CN of a DER certificate: the node it names; nothing if it
/// is not a certificate or has no single CN.
std::optional<std::string> certificate_cn(std::string_view der);

/// HMAC-SHA256 of `data` under a session key (32 bytes).
std::string session_mac(std::string_view key, std::string_view data);

/// Compares two MACs in constant time.
bool same_mac(std::string_view a, std::string_view b) noexcept;

} // namespace llmgw::config
