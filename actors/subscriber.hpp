// The subscriber: one per engine (per data-parallel rank) that publishes KV
// events. A blocking actor on its own thread owns the engine's event sockets
// (net/kv_event_socket: the SUB socket and a DEALER to the replay endpoint,
// bounded; launched engines publish on an ipc:// path in a folder only the
// agent's user can enter, so no other local user can publish into a mirror).
// It waits on the sockets with a short timeout, pumps what arrived through
// kv::event_stream, sends decoded batches and resets to the mirror, and
// checks its mailbox between polls; an exit message stops it.
#pragma once

#include "actors/interfaces.hpp"
#include "net/kv_event_socket.hpp"

#include <caf/fwd.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace llmgw {

/// Counters of one subscriber, read by tests and the metrics exporter.
struct subscriber_stats {
  std::atomic<std::uint64_t> messages{0};
  std::atomic<std::uint64_t> bad_frames{0};
  std::atomic<std::uint64_t> decode_errors{0};
  std::atomic<std::uint64_t> unknown_events{0};
  std::atomic<std::uint64_t> gaps{0};
  std::atomic<std::uint64_t> gaps_filled{0};
  std::atomic<std::uint64_t> restarts{0};
  std::atomic<bool> replay{false}; ///< gaps can be filled from the engine's replay endpoint
};

/// Where an engine's replay endpoint is now. The agent moves it when it
/// restarts a launched engine on other ports (the old ones taken meanwhile);
/// the subscriber, which owns the socket, reconnects between polls.
class replay_address {
public:
  void set(std::string endpoint) {
    std::lock_guard<std::mutex> lock(mtx_);
    endpoint_ = std::move(endpoint);
    ++version_;
  }
  /// The endpoint, if it was set since version `seen` (then updated).
  std::optional<std::string> changed(std::uint64_t& seen) const {
    std::lock_guard<std::mutex> lock(mtx_);
    if (seen == version_)
      return std::nullopt;
    seen = version_;
    return endpoint_;
  }

private:
  mutable std::mutex mtx_;
  std::string endpoint_;
  std::uint64_t version_ = 0;
};

struct subscriber_options : kv_event_socket_options {
  std::shared_ptr<replay_address> replay_moves; ///< may be null: the replay never moves
  std::string replica;                          ///< for logs and metrics
  std::chrono::milliseconds replay_timeout{2000};
  std::chrono::milliseconds poll_interval{20};
  wire::event_dialect dialect = wire::event_dialect::vllm; ///< whose publisher
};

/// The sockets, opened before the actor starts so the port is known when
/// the engine is launched. The endpoint is what the engine must be told
/// (`tcp://127.0.0.1:PORT`, or the ipc:// path); on failure, an error saying
/// which address.
struct opened_subscriber {
  std::shared_ptr<kv_event_socket> socket; ///< null on failure
  std::string endpoint;
  std::string error;
};
opened_subscriber open_subscriber(const subscriber_options& opts);

/// The actor's body: runs until it receives an exit message.
void subscriber(caf::blocking_actor* self, const std::shared_ptr<kv_event_socket>& socket,
                const subscriber_options& opts, mirror_actor mirror,
                std::shared_ptr<subscriber_stats> stats);

} // namespace llmgw
