// A small asynchronous HTTP/1.1 server on Boost.Beast, on its own io_context
// threads: the gateway's front door (and test engines'). Each request goes to
// a handler with a responder that may be called later from any thread (an
// actor's answer); the connection waits for it, then reads the next request
// (keep-alive).
//
// Hostile clients are bounded: body and header sizes (413 and 431), a
// deadline for reading a whole request and an idle timeout between requests
// (the connection is closed), a cap on open connections (503 and close), and
// malformed requests (400 and close). Each case is counted.
// Beast stays out of this header.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace llmgw {

/// A request as handlers see it.
struct http_request {
  std::string method; ///< "GET", "POST", ...
  std::string target; ///< path and query
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  /// The first value of header `name` (case-insensitive), or "".
  std::string header(const std::string& name) const;
};

/// A whole answer.
struct http_reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

/// Answers a request; call exactly once, from any thread.
using http_responder = std::function<void(http_reply)>;
using http_handler = std::function<void(http_request&&, http_responder)>;

struct http_server_limits {
  std::size_t max_body_bytes = 16u << 20;
  std::size_t max_header_bytes = 16u << 10;
  std::chrono::milliseconds read_timeout{30000}; ///< to receive one whole request
  std::chrono::milliseconds idle_timeout{60000}; ///< between requests on a connection
  std::size_t max_connections = 1024;
};

/// What the server counts (read by /metrics).
struct http_server_counters {
  std::atomic<std::uint64_t> connections{0};
  std::atomic<std::uint64_t> open{0};
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> rejected_connections{0}; ///< over max_connections
  std::atomic<std::uint64_t> bad_requests{0};         ///< malformed: 400
  std::atomic<std::uint64_t> too_large{0};            ///< body or header over the limit
  std::atomic<std::uint64_t> timeouts{0};             ///< read or idle deadline passed
};

class http_server {
public:
  /// Binds host:port (0: any port) and starts `threads` threads. On failure
  /// the server does not run and error() says why.
  http_server(const std::string& host, std::uint16_t port, std::size_t threads,
              http_server_limits limits, http_handler handler);
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// The bound port (0 if binding failed).
  std::uint16_t port() const noexcept;
  const std::string& error() const noexcept;
  const http_server_counters& counters() const noexcept;

  /// Stops accepting and closes every connection; joins the threads.
  void stop();

  struct impl; ///< the server's io_context, acceptor and sessions' shared parts

private:
  std::shared_ptr<impl> impl_;
};

} // namespace llmgw
