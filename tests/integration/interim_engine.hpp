// A stand-in engine on raw sockets that answers every request the way
// uvicorn and Python's http.server may: interim answers first (100 Continue,
// 103 Early Hints), then the final 200 whose body is the request's own body.
// A client that takes an interim answer for the final one reads the wrong
// answer from then on; one whose answers match its requests byte for byte
// reads each final answer exactly.
//
// Each connection is kept alive and served on its own thread. The interim
// answers go out in a separate write from the final one, a little earlier,
// so a client sees them both arriving alone and sharing a read with it. The
// final answer's Connection header names X-Hop: a header for one hop only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace llmgw::test {

class interim_engine {
public:
  interim_engine() {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(listener_, 64);
    socklen_t len = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~interim_engine() {
    stop_ = true;
    acceptor_.join();
    ::close(listener_);
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> g(mtx_);
      threads.swap(connections_);
    }
    for (auto& t : threads)
      t.join();
  }

  interim_engine(const interim_engine&) = delete;
  interim_engine& operator=(const interim_engine&) = delete;

  std::uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  /// The heads of every request served so far, lower-cased.
  std::vector<std::string> heads() {
    std::lock_guard<std::mutex> g(mtx_);
    return heads_;
  }

  /// Requests that arrived on a connection that had served one before.
  int reused() const { return reused_; }

  /// From now on, each final answer is followed, a little later, by a stray
  /// answer nobody asked for (a broken upstream): "stray" as its body.
  void send_strays() { strays_ = true; }

  /// From now on, requests get their interim answers and then nothing (an
  /// upstream that hangs after saying it is working on it).
  void stall_after_interim() { stall_ = true; }

  /// Stray answers sent so far.
  int strays_sent() const { return strays_sent_; }

private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0)
        continue;
      int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0)
        continue;
      std::lock_guard<std::mutex> g(mtx_);
      connections_.emplace_back([this, fd] { serve(fd); });
    }
  }

  /// Reads into `buf` until it holds `n` bytes; false on EOF or stop.
  bool fill(int fd, std::string& buf, std::size_t n) {
    while (buf.size() < n) {
      pollfd p{fd, POLLIN, 0};
      if (stop_)
        return false;
      if (::poll(&p, 1, 20) <= 0)
        continue;
      char chunk[4096];
      auto got = ::recv(fd, chunk, sizeof chunk, 0);
      if (got <= 0)
        return false;
      buf.append(chunk, static_cast<std::size_t>(got));
    }
    return true;
  }

  void send_all(int fd, const std::string& bytes) {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      auto n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0)
        return;
      sent += static_cast<std::size_t>(n);
    }
  }

  void serve(int fd) {
    std::string buf;
    int served = 0;
    for (;;) {
      std::size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos)
        if (!fill(fd, buf, buf.size() + 1)) {
          ::close(fd);
          return;
        }
      std::string head = buf.substr(0, end + 4);
      std::transform(head.begin(), head.end(), head.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      std::size_t length = 0;
      auto at = head.find("\r\ncontent-length:");
      if (at != std::string::npos)
        length = std::stoul(head.substr(at + 17));
      if (!fill(fd, buf, end + 4 + length)) {
        ::close(fd);
        return;
      }
      std::string body = buf.substr(end + 4, length);
      buf.erase(0, end + 4 + length);
      {
        std::lock_guard<std::mutex> g(mtx_);
        heads_.push_back(head);
      }
      if (served++ > 0)
        ++reused_;
      send_all(fd, "HTTP/1.1 100 Continue\r\n\r\n"
                   "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n");
      if (stall_) {
        while (!stop_)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        ::close(fd);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      send_all(fd, "HTTP/1.1 103 Early Hints\r\nLink: </more.js>; rel=preload\r\n\r\n"
                   "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                   "Connection: keep-alive, X-Hop\r\nX-Hop: this hop only\r\nContent-Length: "
                     + std::to_string(body.size()) + "\r\n\r\n" + body);
      if (strays_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstray");
        ++strays_sent_;
      }
    }
  }

  int listener_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> reused_{0};
  std::atomic<bool> strays_{false};
  std::atomic<bool> stall_{false};
  std::atomic<int> strays_sent_{0};
  std::thread acceptor_;
  std::mutex mtx_;
  std::vector<std::thread> connections_;
  std::vector<std::string> heads_;
};

} // namespace llmgw::test
