#include "tests/integration/tcp_proxy.hpp"

#include "tests/integration/test_cluster.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <vector>

namespace llmgw::test {

namespace {

sockaddr_in loopback(std::uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

/// Writes all of `data` (blocking); false if the peer is gone.
bool write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    auto n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0)
      return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

} // namespace

tcp_proxy::tcp_proxy(std::uint16_t target) : target_(target) {
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int on = 1;
  ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  port_ = free_port();
  auto addr = loopback(port_);
  if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0
      || ::listen(listener_, 16) != 0) {
    ADD_FAILURE() << "the proxy cannot listen on port " << port_;
    port_ = 0;
    return;
  }
  thread_ = std::thread([this] { run(); });
}

tcp_proxy::~tcp_proxy() {
  stopping_ = true;
  if (thread_.joinable())
    thread_.join();
  ::close(listener_);
}

void tcp_proxy::run() {
  struct pair {
    int a, b; // the client's side, the target's side
  };
  std::vector<pair> pairs;
  auto close_pair = [](const pair& p) {
    ::close(p.a);
    ::close(p.b);
  };
  while (!stopping_) {
    auto m = mode_.load();
    if (m == mode::cut) {
      for (const auto& p : pairs)
        close_pair(p);
      pairs.clear();
    }
    // Stalled, new connections wait in the backlog, as if the network
    // delivered nothing; cut, they are accepted and closed at once.
    std::vector<pollfd> fds{{listener_, static_cast<short>(m == mode::stalled ? 0 : POLLIN), 0}};
    if (m == mode::forwarding)
      for (const auto& p : pairs) {
        fds.push_back({p.a, POLLIN, 0});
        fds.push_back({p.b, POLLIN, 0});
      }
    if (::poll(fds.data(), fds.size(), 20) <= 0)
      continue;
    std::vector<pair> alive;
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      bool open = true;
      if (m == mode::forwarding)
        for (int side = 0; side < 2 && open; ++side) {
          const auto& pfd = fds[1 + 2 * i + static_cast<std::size_t>(side)];
          if (!(pfd.revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
          char buf[65536];
          auto n = ::recv(pfd.fd, buf, sizeof buf, 0);
          int to = side == 0 ? pairs[i].b : pairs[i].a;
          open = n > 0 && write_all(to, buf, static_cast<std::size_t>(n));
        }
      if (open)
        alive.push_back(pairs[i]);
      else
        close_pair(pairs[i]);
    }
    pairs = std::move(alive);
    if (fds[0].revents & POLLIN) {
      int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client >= 0 && m == mode::cut) {
        ::close(client);
      } else if (client >= 0) {
        int upstream = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        auto addr = loopback(target_);
        if (::connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
          pairs.push_back({client, upstream});
          ++connections_;
        } else {
          ::close(client);
          ::close(upstream);
        }
      }
    }
  }
  for (const auto& p : pairs)
    close_pair(p);
}

} // namespace llmgw::test
