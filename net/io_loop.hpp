// Threads running one Boost.Asio io_context, to be shared: a gateway runs
// its HTTP server and its upstream client on one loop, so a request and its
// upstream call, and the answer and its relay, never cross threads. With one
// thread everything on the loop is serialized and needs no strands. A
// gateway with more threads runs as many one-thread loops, each with its
// connections and its own upstream client (as nginx runs workers). Asio
// stays out of this header.
#pragma once

#include <cstddef>
#include <memory>

namespace llmgw {

class io_loop {
public:
  /// Starts `threads` threads named `name` (at most 15 characters show, in
  /// top -H and /proc/PID/task/TID/comm).
  explicit io_loop(std::size_t threads, const char* name = "llmgw-io");
  ~io_loop();
  io_loop(const io_loop&) = delete;
  io_loop& operator=(const io_loop&) = delete;

  /// Stops the loop and joins its threads (idempotent). Handlers still
  /// pending stay queued until the loop is destroyed.
  void stop();

  std::size_t threads() const noexcept;

  /// The loop whose thread calls this; null on any other thread.
  static io_loop* current() noexcept;

  struct impl; ///< the io_context and threads (net/io_loop_impl.hpp)
  impl& get() noexcept { return *impl_; }

private:
  std::unique_ptr<impl> impl_;
};

} // namespace llmgw
