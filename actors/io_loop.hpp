// Threads running one Boost.Asio io_context, to be shared: a gateway runs
// its HTTP server and its upstream client on one loop, so a request and its
// upstream call, and the answer and its relay, never cross threads. With one
// thread (the gateway's default) everything on the loop is serialized and
// needs no strands. Asio stays out of this header.
#pragma once

#include <cstddef>
#include <memory>

namespace llmgw {

class io_loop {
public:
  explicit io_loop(std::size_t threads);
  ~io_loop();
  io_loop(const io_loop&) = delete;
  io_loop& operator=(const io_loop&) = delete;

  /// Stops the loop and joins its threads (idempotent). Handlers still
  /// pending stay queued until the loop is destroyed.
  void stop();

  std::size_t threads() const noexcept;

  struct impl; ///< the io_context and threads (actors/io_loop_impl.hpp)
  impl& get() noexcept { return *impl_; }

private:
  std::unique_ptr<impl> impl_;
};

} // namespace llmgw
