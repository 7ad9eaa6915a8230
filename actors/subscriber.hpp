// The subscriber: one per engine (per data-parallel rank) that publishes KV
// events. A blocking actor on its own thread owns the ZMQ SUB socket (bound on
// loopback; vLLM's PUB connects to it) and, if the engine has one, a DEALER to
// its replay endpoint. It polls the sockets with a short timeout, runs
// wire::event_stream on what arrives, sends decoded batches and resets to the
// mirror, and checks its mailbox between polls; an exit message stops it.
#pragma once

#include "actors/interfaces.hpp"
#include "wire/event_stream.hpp"

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
  std::string replica;                    ///< for logs and metrics
  std::string bind = "tcp://127.0.0.1:0"; ///< port 0: any free port
  std::string topic;                      ///< subscription prefix; empty: everything
  std::string replay;                     ///< the engine's replay endpoint, or empty
  std::chrono::milliseconds replay_timeout{2000};
  std::chrono::milliseconds poll_interval{20};
};

/// Binds the SUB socket. The result's endpoint is what the engine must be
/// told (`tcp://127.0.0.1:PORT`); on failure, an error saying which address.
struct bound_subscriber {
  std::shared_ptr<subscriber_socket> socket; ///< null on failure
  std::string endpoint;
  std::string error;
};
bound_subscriber bind_subscriber(const subscriber_options& opts);

/// The actor's body: runs until it receives an exit message.
void subscriber(caf::blocking_actor* self, const std::shared_ptr<subscriber_socket>& socket,
                const subscriber_options& opts, mirror_actor mirror,
                std::shared_ptr<subscriber_stats> stats);

} // namespace llmgw
