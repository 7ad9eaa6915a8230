// A small asynchronous HTTP/1.1 client on Boost.Beast, run on its own
// io_context threads: the router's tokenizer (and the gateway) call engines
// with it without blocking an actor. Each request has a deadline covering
// connect, write and read; the callback runs on one of the client's threads.
// Beast stays out of this header (compile time on two cores).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace llmgw {

class io_loop;

/// Why a call ended without a complete response.
enum class http_failure : std::uint8_t {
  none,      ///< the response is complete
  connect,   ///< resolving or connecting failed (or timed out): nothing was sent
  timeout,   ///< the deadline passed after the connection was made
  broken,    ///< writing or reading failed, or the answer was not HTTP the client takes
  cancelled, ///< cancel() was called
  refused,   ///< not a call the client makes (the URL or the method)
};
const char* to_string(http_failure f) noexcept;

/// How a call ended: `kind` for code to decide on, `message` for people
/// ("connect: Connection refused", "read: timed out").
struct http_error {
  http_failure kind = http_failure::none;
  std::string message;
  bool ok() const noexcept { return kind == http_failure::none; }
};

/// An HTTP answer, or why there is none (status 0).
struct http_response {
  int status = 0;
  std::string body;
  std::string error; ///< set when status is 0: connect, write or read failed, or timed out
  http_failure failure = http_failure::none;
};

/// Callbacks of a streamed call, run on the client's thread, in this order:
/// on_head once (if a response arrived), on_data for each piece of the body
/// as it arrives, on_done once (ok() when the response is complete, else why
/// not).
struct http_call_handlers {
  std::function<void(int status, const std::vector<std::pair<std::string, std::string>>& headers)>
    on_head;
  std::function<void(const std::string& data)> on_data;
  std::function<void(const http_error& error)> on_done;
};

/// A call in flight; cancel() ends it (on_done gets http_failure::cancelled).
class http_call {
public:
  virtual ~http_call() = default;
  virtual void cancel() = 0;
};

/// One io thread runs every call: handlers, cancels and the pool of idle
/// connections never race (a client shuttles bytes; one thread keeps up).
class http_client {
public:
  http_client();

  /// On a loop shared with others (a gateway's HTTP server); the loop must
  /// have exactly one thread.
  explicit http_client(std::shared_ptr<io_loop> loop);
  ~http_client();
  http_client(const http_client&) = delete;
  http_client& operator=(const http_client&) = delete;

  /// Sends `method` (GET, POST, ...) to `base_url` + `target` with `body`
  /// (JSON when not empty); `done` gets the answer.
  void request(const std::string& method, const std::string& base_url, const std::string& target,
               std::string body, std::chrono::milliseconds timeout,
               std::function<void(http_response)> done);

  /// POSTs `body` (JSON) to `base_url` + `target`; `done` gets the answer.
  void post_json(const std::string& base_url, const std::string& target, std::string body,
                 std::chrono::milliseconds timeout, std::function<void(http_response)> done) {
    request("POST", base_url, target, std::move(body), timeout, std::move(done));
  }

  /// Streams a request's response: the body is handed on piece by piece as
  /// it arrives (server-sent events stay events). `connect_timeout` bounds
  /// connecting; `timeout` the whole call; `head_timeout`, when not 0, the
  /// wait for the response head once the request is sent (a timeout too).
  std::shared_ptr<http_call> call(const std::string& method, const std::string& base_url,
                                  const std::string& target, std::string body,
                                  const std::vector<std::pair<std::string, std::string>>& headers,
                                  std::chrono::milliseconds connect_timeout,
                                  std::chrono::milliseconds timeout, http_call_handlers handlers,
                                  std::chrono::milliseconds head_timeout = {});

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace llmgw
