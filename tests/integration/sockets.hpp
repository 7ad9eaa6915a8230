// Raw loopback sockets and process memory for integration tests: what a
// hostile or half-finished client does, below any HTTP or TLS library.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

namespace llmgw::test {

/// A TCP connection to 127.0.0.1:`port` whose reads give up after
/// `read_timeout`; the test fails if it cannot connect.
inline int connect_to(std::uint16_t port,
                      std::chrono::seconds read_timeout = std::chrono::seconds(10)) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  timeval tv{static_cast<long>(read_timeout.count()), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

/// Sends all of `bytes`; the test fails if the peer stops taking them.
inline void send_all(int fd, const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    auto n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    sent += static_cast<std::size_t>(n);
  }
}

/// True if the peer closed the connection before the read timeout.
inline bool closed_by_peer(int fd) {
  char buf[256];
  for (;;) {
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET))
      return true;
    if (n < 0)
      return false; // timed out
  }
}

/// Resident set size of process `pid` ("self": this one), in MiB; -1 if unknown.
inline double rss_mib(const std::string& pid = "self") {
  std::ifstream in("/proc/" + pid + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stod(line.substr(6)) / 1024.0;
  return -1;
}

} // namespace llmgw::test
