// The subscriber: one per engine (per data-parallel rank) that publishes KV
// events. A blocking actor on its own thread owns the ZMQ SUB socket and, if
// the engine has one, a DEALER to its replay endpoint. The SUB socket is
// bound where vLLM's PUB connects (a tcp address on loopback) and connects
// where vLLM binds (an ipc:// path: launched engines publish into a folder
// only the agent's user can enter, so no other local user can publish into
// a mirror). Inbound messages are bounded in size (the decoder's payload
// limit: a bigger one drops the connection) and in number (a full queue
// drops messages, which shows as a gap). It polls the sockets with a short timeout, runs
// kv::event_stream on what arrives, sends decoded batches and resets to the
// mirror, and checks its mailbox between polls; an exit message stops it.
#pragma once

#include "actors/interfaces.hpp"
#include "kv/event_stream.hpp"

#include <caf/fwd.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace llmgw {

/// Counters of one subscriber, read by tests and the metrics exporter.
struct subscriber_stats {
  std::atomic<std::uint64_t> messages{0};
  std::atomic<std::uint64_t> bad_frames{0};
  std::atomic<std::uint64_t> decode_errors{0};
  std::atomic<std::uint64_t> gaps{0};
  std::atomic<std::uint64_t> gaps_filled{0};
  std::atomic<std::uint64_t> restarts{0};
};

/// A bound SUB socket and what the subscriber needs besides; made before the
/// actor starts so the port is known when the engine is launched.
struct subscriber_socket;

struct subscriber_options {
  std::string replica; ///< for logs and metrics
  /// Bound unless vLLM binds it (wire::publisher_binds): tcp port 0 is any
  /// free port; an ipc:// path is connected to.
  std::string endpoint = "tcp://127.0.0.1:0";
  std::string topic;  ///< subscription prefix; empty: everything
  std::string replay; ///< the engine's replay endpoint, or empty
  std::chrono::milliseconds replay_timeout{2000};
  std::chrono::milliseconds poll_interval{20};
  std::size_t max_message_bytes = 8u << 20; ///< the decoder's payload limit
  int queue_messages = 1024;                ///< messages waiting to be read, at most
};

/// Binds or connects the SUB socket. The result's endpoint is what the
/// engine must be told (`tcp://127.0.0.1:PORT`, or the ipc:// path); on
/// failure, an error saying which address.
struct opened_subscriber {
  std::shared_ptr<subscriber_socket> socket; ///< null on failure
  std::string endpoint;
  std::string error;
};
opened_subscriber open_subscriber(const subscriber_options& opts);

/// The actor's body: runs until it receives an exit message.
void subscriber(caf::blocking_actor* self, const std::shared_ptr<subscriber_socket>& socket,
                const subscriber_options& opts, mirror_actor mirror,
                std::shared_ptr<subscriber_stats> stats);

} // namespace llmgw
