// A small asynchronous HTTP/1.1 server on Boost.Beast, on its own io_context
// threads: the gateway's front door, the simulator's API (and test engines').
// Each thread runs its own loop and owns the connections it accepted, as
// nginx's workers do; Beast parses requests, and answers are written from a
// head formatted here. One timer per loop checks every connection's deadline.
// Each request goes to a handler with a responder that may be called later
// from any thread (an actor's answer, an upstream engine's stream); the
// connection waits for it, then reads the next request (keep-alive). An
// answer can be whole or streamed (chunked, flushed piece by piece). While
// an answer is pending the connection is watched, so a client that goes away
// is noticed at once and the handler can cancel its work.
//
// Hostile clients are bounded: body and header sizes (413 and 431), a
// deadline for reading a whole request and an idle timeout between requests
// (the connection is closed), a cap on open connections, a cap per client
// address (503 and close), and malformed requests (400 and close). When the
// connections run short, the one idle longest (waiting for a request, or
// for the rest of a request head) is closed to make room: idle connections
// cannot keep others out, only requests in progress count against the cap.
// Each case is counted.
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

class io_loop;

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

/// A JSON answer.
http_reply json_reply(int status, std::string body);

/// An OpenAI-style error answer: {"error": {"message", "type", "code"}}
/// (wire::openai_error_json), as vLLM and the gateway send them.
http_reply error_reply(int status, const std::string& type, const std::string& message);

namespace detail {
struct http_exchange;
} // namespace detail

/// A response sent in pieces (chunked transfer encoding, e.g. server-sent
/// events), each flushed to the client as soon as it is written. Any thread.
class http_stream {
public:
  explicit http_stream(std::shared_ptr<detail::http_exchange> x) : x_(std::move(x)) {}

  /// Queues `data` for the client; false once the client is gone (or the
  /// stream ended, or the client stopped reading and too much is queued).
  bool write(std::string data) const;

  /// Ends the response; the connection then serves the next request.
  void end() const;

  /// Drops the connection without ending the response properly: the client
  /// sees a broken stream (an engine that died mid-answer).
  void abort() const;

  /// Like abort(), but once what was written is out: the client gets the
  /// last words (an error event, say), then a stream that never ends
  /// properly (no last chunk), which every HTTP/1.1 client takes as failed.
  void fail() const;

  /// True once the client disconnected.
  bool client_gone() const;

private:
  std::shared_ptr<detail::http_exchange> x_;
};

/// Answers one request, from any thread, exactly once: either a whole reply
/// (call it) or a stream (stream(), then write and end).
class http_responder {
public:
  explicit http_responder(std::shared_ptr<detail::http_exchange> x) : x_(std::move(x)) {}

  /// Sends a whole reply.
  void operator()(http_reply r) const;

  /// Starts a streamed reply with `status` and headers.
  http_stream stream(int status, const std::string& content_type,
                     std::vector<std::pair<std::string, std::string>> headers = {}) const;

  /// `f` runs once if the client disconnects before the answer is complete
  /// (on a server thread): cancel what was started for it.
  void on_disconnect(std::function<void()> f) const;

private:
  std::shared_ptr<detail::http_exchange> x_;
};

using http_handler = std::function<void(http_request&&, http_responder)>;

struct http_server_limits {
  std::size_t max_body_bytes = 16u << 20;
  std::size_t max_header_bytes = 16u << 10;
  std::chrono::milliseconds read_timeout{30000}; ///< to receive one whole request
  std::chrono::milliseconds idle_timeout{60000}; ///< between requests on a connection
  // Both are checked every tenth of the shorter (10 ms to 1 s): a connection
  // is closed within that much after its deadline.
  std::size_t max_connections = 1024;
  /// Open connections from one client address at most (0: no cap). Behind a
  /// load balancer every client has its address: raise it or set 0.
  std::size_t max_connections_per_client = 0;
  /// Request bodies held at once, in bytes, from their head until their
  /// answer is out (0: no budget). Each body counts its Content-Length (a
  /// chunked one max_body_bytes) when its head arrives; one that does not
  /// fit gets 503 with Retry-After before a byte of it is read. One client
  /// address may hold an eighth of it (at least max_body_bytes).
  std::size_t max_buffered_body_bytes = 0;
};

/// What the server counts (read by /metrics).
struct http_server_counters {
  std::atomic<std::uint64_t> connections{0};
  std::atomic<std::uint64_t> open{0};
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> rejected_connections{0}; ///< over max_connections, none idle
  std::atomic<std::uint64_t> rejected_per_client{0};  ///< over max_connections_per_client
  std::atomic<std::uint64_t> evicted{0};              ///< idle connections closed to make room
  std::atomic<std::uint64_t> over_body_budget{0};  ///< requests refused: bodies held at the budget
  std::atomic<std::size_t> buffered_body_bytes{0}; ///< held now (see max_buffered_body_bytes)
  std::atomic<std::uint64_t> bad_requests{0};      ///< malformed: 400
  std::atomic<std::uint64_t> too_large{0};         ///< body or header over the limit
  std::atomic<std::uint64_t> unsupported{0};       ///< an expectation or transfer coding: 417, 501
  std::atomic<std::uint64_t> timeouts{0};          ///< read or idle deadline passed
  std::atomic<std::uint64_t> disconnects{0};       ///< clients gone before their answer
};

class http_server {
public:
  /// Binds host:port (0: any port) and starts `threads` loops of one thread
  /// each. On failure the server does not run and error() says why.
  http_server(const std::string& host, std::uint16_t port, std::size_t threads,
              http_server_limits limits, http_handler handler);

  /// The same on loops shared with others (a gateway's upstream clients):
  /// new connections go to the loops in turn, and each stays on its loop.
  /// Each loop must have one thread (std::invalid_argument otherwise).
  /// stop() stops those loops.
  http_server(const std::string& host, std::uint16_t port,
              std::vector<std::shared_ptr<io_loop>> loops, http_server_limits limits,
              http_handler handler);
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
