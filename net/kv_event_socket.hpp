// One engine's KV event stream as sockets, and the loop that follows it. The
// SUB socket goes where vLLM's publisher is: bound where vLLM connects (a tcp
// address), connected where vLLM binds (an ipc:// path, wire::publisher_binds
// being vLLM's rule; or the address of an engine bound at tcp://*:PORT,
// engine_binds). A connected SUB reconnects by itself (ZeroMQ retries every
// 100 ms) when the publisher restarts or the network drops it. A DEALER goes to the engine's replay
// endpoint when it has one. Both are bounded: a message bigger than the decoder's payload limit
// drops the connection, and a full receive queue drops messages (a gap, which
// replay fills). pump() reads what arrived, feeds kv::event_stream, sends
// the replay requests it asks for and hands every action on. The agent's
// subscriber actor and `llmgw events` both follow a stream through it, so
// gaps, replay and restarts are handled one way.
#pragma once

#include "base/result.hpp"
#include "kv/event_stream.hpp"

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace llmgw {

struct kv_event_socket_options {
  /// vLLM's endpoint: tcp (port 0: any free port, when bound) or ipc://.
  std::string endpoint = "tcp://127.0.0.1:0";
  /// The endpoint is the address of a publisher that binds (vLLM's
  /// tcp://*:5557 as reached from here): connect to it whatever it says.
  bool engine_binds = false;
  std::string topic;                        ///< subscription prefix; empty: everything
  std::string replay;                       ///< the engine's replay endpoint, or empty
  std::size_t max_message_bytes = 8u << 20; ///< the decoder's payload limit
  int queue_messages = 1024;                ///< messages waiting to be read, at most
};

class kv_event_socket {
public:
  /// Opens the sockets. On failure, error() says which address and why,
  /// and nothing is open.
  explicit kv_event_socket(const kv_event_socket_options& opts);
  ~kv_event_socket();
  kv_event_socket(const kv_event_socket&) = delete;
  kv_event_socket& operator=(const kv_event_socket&) = delete;

  const std::string& error() const noexcept { return error_; }
  /// What the engine must be told: the bound `tcp://127.0.0.1:PORT` (port 0
  /// resolved), or the ipc:// path.
  const std::string& endpoint() const noexcept { return endpoint_; }
  bool has_replay() const noexcept;

  /// Connects the DEALER to the engine's replay endpoint (when it was not
  /// known at opening: a launched engine's is chosen after its events
  /// socket). Before the socket is handed to another thread. False, with
  /// `error` saying why, if it cannot.
  bool connect_replay(const std::string& endpoint, std::string& error);

  /// Waits until a socket has input, `timeout` passed, or a signal came.
  void wait(std::chrono::milliseconds timeout);

  struct handlers {
    /// Every action of the stream, in order (request_replay already sent).
    std::function<void(kv::stream_action&)> act;
    /// A message whose frames are not a vLLM message ("live" or "replay").
    std::function<void(const char* socket, const llmgw::error& e)> bad_frame;
  };

  /// Reads everything waiting, without blocking, into `stream`, then lets
  /// it check its replay deadline at `now`.
  void pump(kv::event_stream& stream, std::chrono::steady_clock::time_point now, const handlers& h);

  /// Closes the sockets now, not when the last owner lets go: once this
  /// returns, the address is free to bind again (a reload's new subscriber
  /// takes the same fixed port). Nothing but the destructor may be called
  /// afterwards.
  void close() noexcept;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::string endpoint_;
  std::string error_;
};

} // namespace llmgw
