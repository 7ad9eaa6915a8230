// The inside of io_loop, for the files that run Asio on it.
#pragma once

#include "net/io_loop.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <thread>
#include <vector>

namespace llmgw {

struct io_loop::impl {
  /// One thread: Asio then queues handlers posted from that thread without
  /// taking the scheduler's lock.
  explicit impl(std::size_t threads) : io(threads == 1 ? 1 : BOOST_ASIO_CONCURRENCY_HINT_SAFE) {}
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};
};

} // namespace llmgw
