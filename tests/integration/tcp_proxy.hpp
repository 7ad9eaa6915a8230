// A TCP proxy on loopback for fault tests: it forwards every connection made
// to its port to a target port, and the test can stall it (connections stay
// open, no byte moves and new connections wait unanswered, as over a network
// that stopped delivering), cut it (every connection closed, new ones closed
// as they come) and restore it.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace llmgw::test {

class tcp_proxy {
public:
  explicit tcp_proxy(std::uint16_t target);
  ~tcp_proxy();
  tcp_proxy(const tcp_proxy&) = delete;
  tcp_proxy& operator=(const tcp_proxy&) = delete;

  /// Where to connect instead of the target.
  std::uint16_t port() const noexcept { return port_; }

  void stall() { mode_ = mode::stalled; }
  void cut() { mode_ = mode::cut; }
  void restore() { mode_ = mode::forwarding; }

  /// Connections accepted and forwarded so far.
  std::uint64_t connections() const noexcept { return connections_; }

private:
  enum class mode : std::uint8_t { forwarding, stalled, cut };
  void run();

  std::uint16_t target_;
  std::uint16_t port_ = 0;
  int listener_ = -1;
  std::atomic<mode> mode_{mode::forwarding};
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> connections_{0};
  std::thread thread_;
};

} // namespace llmgw::test
