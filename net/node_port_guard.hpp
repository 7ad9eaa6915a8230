// What llmgw bounds on its CAF node port, below CAF. CAF 0.17.6 keeps a TCP
// connection that never starts or finishes TLS forever (no handshake
// timeout, no cap), and sizes its read buffer from whatever payload length
// a BASP header announces (one 32-byte header made a node allocate 1 GiB,
// zero-filled, until the connection closed). CAF offers no option for
// either; llmgw's TLS hooks (net/tls_hooks.cpp, which sit between CAF and
// libssl) enforce these limits, and count what they refuse here.
//
// The BASP framing as CAF 0.17.6 writes it (libcaf_io basp/header.hpp, its
// binary serializer: integers big-endian): a 32-byte header
//   byte 0 operation, 1-2 padding, 3 flags, 4-7 payload_len,
//   8-15 operation_data, 16-23 source actor, 24-31 destination actor
// followed by payload_len bytes of payload, then the next header.
// Operations: 0 server handshake, 1 client handshake, 2 direct message,
// 3 routed message, 4 monitor message, 5 down message, 6 heartbeat. The
// handshakes' payloads begin with the sender's node id; so do routed,
// monitor and down messages' payloads, with the node they speak for, which
// CAF believes: a peer could make a node kill its proxy of another node's
// actor (so llmgw drops that node's session) or route messages as it. A
// direct message is the connection's own node's, always.
//
// So a peer's first message must be a handshake; routed messages (llmgw's
// nodes all talk directly) are refused; monitor and down messages must
// speak for the node the connection's handshake named.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace llmgw {

/// The limits; set before the actor system starts.
struct node_port_limits {
  /// TLS handshakes in progress on accepted connections at once; more are
  /// closed at once.
  std::size_t max_pending_handshakes = 64;
  /// An accepted connection that has not finished its TLS handshake by then
  /// is closed.
  std::chrono::milliseconds handshake_timeout{10000};
  /// The payload a peer's first BASP message (its handshake) may announce.
  std::uint32_t max_first_payload = 1u << 20;
  /// The payload any later message may announce: above llmgw's largest
  /// message (a replica's full copy).
  std::uint32_t max_payload = 64u << 20;
  /// The topology's nodes and the certificates each may present (empty: any
  /// the CA signed). When not empty, a TLS peer whose certificate's CN is no
  /// node, or not one of that node's, is cut off as its handshake ends:
  /// a revoked key does not even reach CAF.
  std::map<std::string, std::vector<std::string>> nodes;
};

/// What the hooks refused, for /metrics.
struct node_port_counts {
  std::atomic<std::uint64_t> handshakes_refused{0};   ///< over max_pending_handshakes
  std::atomic<std::uint64_t> handshakes_timed_out{0}; ///< past handshake_timeout
  std::atomic<std::uint64_t> payloads_refused{0};     ///< a header over the payload limit
  std::atomic<std::uint64_t> messages_refused{0};     ///< routed, forged source, no handshake
  std::atomic<std::uint64_t> certificates_refused{0}; ///< no node's, or not among its fingerprints
  std::atomic<std::uint64_t> pending_handshakes{0};   ///< in progress now
};

/// The process's limits (one node per process).
node_port_limits& node_port_settings();

/// The process's counts.
node_port_counts& node_port_counters();

namespace wire {
class metrics_text;
} // namespace wire

/// The counts as Prometheus text (llmgw_node_port_*).
void append_node_port_metrics(wire::metrics_text& m);

/// Why a TLS peer's certificate (DER) is not one `limits.nodes` allows, or
/// "" (also when nodes is empty).
std::string check_node_certificate(const node_port_limits& limits, std::string_view der);

/// Puts `nodes` in force as node_port_settings().nodes (a reload of the
/// topology), while the hooks may be checking connections on other threads.
void set_node_certificates(std::map<std::string, std::vector<std::string>> nodes);

/// Whether node_port_settings().nodes is set (certificates are checked).
bool node_certificates_checked();

/// check_node_certificate against the nodes in force, under their lock.
std::string check_node_certificate_now(std::string_view der);

/// Follows one peer's BASP byte stream, as TLS hands it over in pieces of
/// any size, and refuses it at the first header that announces more payload
/// than allowed or a message llmgw does not accept (above). Pure: no sockets.
class basp_frame_guard {
public:
  /// Why a stream was refused.
  enum class verdict : std::uint8_t {
    ok,
    too_large,     ///< a payload over the limit
    not_handshake, ///< the first message is no handshake
    routed,        ///< a routed message
    forged_source, ///< a monitor or down message for another node
  };

  basp_frame_guard(std::uint32_t max_first_payload, std::uint32_t max_payload)
    : max_first_(max_first_payload), max_(max_payload) {}

  /// Takes `n` more bytes; false once refused (and ever after).
  bool feed(const unsigned char* data, std::size_t n);

  verdict why() const noexcept { return why_; }

  /// The payload length of the header that was refused (0 if none).
  std::uint32_t refused_length() const noexcept { return refused_; }

private:
  /// Ends the stream with `why`.
  void refuse(verdict why, std::uint32_t length);
  /// A payload prefix is complete: recorded (handshake) or compared.
  void captured();

  static constexpr std::size_t node_bytes = 32; ///< a node id as CAF 0.17 writes it
  std::uint32_t max_first_;
  std::uint32_t max_;
  unsigned char header_[32] = {};
  std::size_t have_ = 0;       ///< header bytes gathered
  std::uint64_t payload_ = 0;  ///< payload bytes still to come
  std::uint64_t messages_ = 0; ///< headers seen
  std::string peer_node_;      ///< the handshake's node id (its first bytes)
  std::string capture_;        ///< the current payload's first bytes, while gathered
  std::size_t capture_need_ = 0;
  bool capture_is_handshake_ = false;
  std::uint32_t refused_ = 0;
  verdict why_ = verdict::ok;
};

} // namespace llmgw
