#include "net/http_client.hpp"

#include "wire/address.hpp"

#include "net/io_loop_impl.hpp"

#include <cstdint>

#include <boost/asio/connect.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <array>
#include <cerrno>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include <sys/socket.h>

namespace llmgw {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

const char* to_string(http_failure f) noexcept {
  switch (f) {
  case http_failure::none:
    return "none";
  case http_failure::connect:
    return "connect";
  case http_failure::timeout:
    return "timeout";
  case http_failure::broken:
    return "broken";
  case http_failure::cancelled:
    return "cancelled";
  case http_failure::refused:
    return "refused";
  }
  return "?";
}

namespace {

/// Connections run on the client's one-thread loop, with its executor named
/// rather than type-erased (any_io_executor costs per operation).
using executor = asio::io_context::executor_type;
using socket_type = tcp::socket::rebind_executor<executor>::other;

/// A connection to an upstream with its read buffers: they are kept with it
/// while it idles in the pool, so a call on it allocates none (a 16 KiB
/// allocation per call also made malloc consolidate its free lists).
struct upstream_connection {
  explicit upstream_connection(const executor& ex) : socket(ex) {}
  socket_type socket;
  beast::flat_buffer buffer;
  std::chrono::steady_clock::time_point idle_since; ///< when it went back to the pool
  char chunk[16384];
};

/// True if an idle connection is still fit to carry a request: the upstream
/// has neither closed it (a keep-alive timeout: uvicorn closes idle
/// connections after a few seconds) nor sent anything unasked. Bytes on an
/// idle connection belong to no request of ours, and the next caller must
/// never read them as its answer. A connection idle under a millisecond is
/// not asked: under load that check was one system call per request (about
/// 5% of the proxy's CPU), and neither a keep-alive timeout nor (for an
/// engine that answers what it is asked) unasked bytes come that soon.
bool quiet(upstream_connection& c) {
  if (std::chrono::steady_clock::now() - c.idle_since < std::chrono::milliseconds(1))
    return true;
  char byte;
  auto n = ::recv(c.socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/// Idle keep-alive connections to upstreams, by "host:port": a proxied
/// request need not pay a TCP connect.
struct connection_pool {
  static constexpr std::size_t max_idle_per_host = 64;
  std::mutex mtx;
  std::map<std::string, std::vector<std::unique_ptr<upstream_connection>>> idle;

  /// An idle connection that is still quiet, or null; the others are closed.
  std::unique_ptr<upstream_connection> take(const std::string& key) {
    std::lock_guard<std::mutex> g(mtx);
    auto it = idle.find(key);
    while (it != idle.end() && !it->second.empty()) {
      auto s = std::move(it->second.back());
      it->second.pop_back();
      if (quiet(*s))
        return s;
      beast::error_code ignored;
      s->socket.close(ignored);
    }
    return nullptr;
  }

  void give(const std::string& key, std::unique_ptr<upstream_connection> s) {
    s->idle_since = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> g(mtx);
    auto& list = idle[key];
    if (list.size() < max_idle_per_host)
      list.push_back(std::move(s));
  }
};

/// Headers a request must not carry twice or from the caller: this client
/// frames the request itself, and sends its body at once (never waiting for
/// a 100 Continue, so it asks for none).
bool framing_header(const std::string& name) {
  for (const char* h : {"host", "content-length", "transfer-encoding", "connection", "expect"})
    if (beast::iequals(name, h))
      return true;
  return false;
}

/// A streamed call: head first, then the body as it arrives. It uses an idle
/// pooled connection when there is one (trying a fresh one if that turns
/// out closed before any response byte). Interim answers (100 Continue, 103
/// Early Hints: a server may send them unasked) are read and skipped: only
/// the final answer is the caller's. The connection goes back to the pool
/// only after a complete, well-framed final answer with nothing read beyond
/// it; in any other state it is closed, so no later call can read what
/// belonged to this one. Everything after start() runs on the loop.
class streaming_call : public http_call, public std::enable_shared_from_this<streaming_call> {
public:
  streaming_call(asio::io_context& io, std::shared_ptr<connection_pool> pool,
                 const std::string& method, std::string host, std::string port,
                 const std::string& target, std::string body,
                 const std::vector<std::pair<std::string, std::string>>& headers,
                 std::chrono::milliseconds connect_timeout, std::chrono::milliseconds timeout,
                 http_call_handlers handlers, std::chrono::milliseconds head_timeout)
    : io_(io), pool_(std::move(pool)), deadline_timer_(io), host_(std::move(host)),
      port_(std::move(port)), key_(host_ + ":" + port_), connect_timeout_(connect_timeout),
      head_timeout_(head_timeout), deadline_(std::chrono::steady_clock::now() + timeout),
      handlers_(std::move(handlers)), body_(std::move(body)) {
    // The head by hand: Beast's message would allocate a node per field
    // and serialize them again.
    head_.reserve(128 + target.size());
    head_ += method;
    head_ += ' ';
    head_ += target;
    head_ += " HTTP/1.1\r\nHost: ";
    head_ += key_;
    head_ += "\r\n";
    bool agent = false; // the caller's User-Agent goes on; else llmgw's
    auto clean = [](const std::string& x) { return x.find_first_of("\r\n") == std::string::npos; };
    for (const auto& [k, v] : headers) {
      if (k.empty() || !clean(k) || !clean(v) || framing_header(k))
        continue;
      agent = agent || beast::iequals(k, "user-agent");
      head_ += k;
      head_ += ": ";
      head_ += v;
      head_ += "\r\n";
    }
    if (!agent)
      head_ += "User-Agent: llmgw\r\n";
    head_ += "Content-Length: ";
    head_ += std::to_string(body_.size());
    head_ += "\r\n\r\n";
  }

  void start() {
    auto self = shared_from_this();
    asio::dispatch(io_.get_executor(), [self] { self->begin(); });
  }

  void cancel() override {
    auto self = shared_from_this();
    asio::dispatch(io_.get_executor(), [self] {
      self->cancelled_ = true;
      self->drop_socket();
    });
  }

private:
  /// On the loop: arms the call's one timer (Beast's per-operation expiry
  /// would arm and cancel one for every read and write), then writes on an
  /// idle connection or connects.
  void begin() {
    if (cancelled_)
      return finish({http_failure::cancelled, "cancelled"});
    stream_ = pool_->take(key_);
    if (stream_) {
      reused_ = true;
      arm(deadline_);
      return write();
    }
    connect();
  }

  /// The timer fires at `when`: the socket and resolver are closed, and the
  /// operation in progress ends as timed out.
  void arm(std::chrono::steady_clock::time_point when) {
    std::weak_ptr<streaming_call> weak = shared_from_this();
    // A wait that fired just before it was re-armed still runs: its
    // generation tells it that it no longer counts.
    auto generation = ++armed_;
    deadline_timer_.expires_at(when);
    deadline_timer_.async_wait([weak, generation](const beast::error_code& ec) {
      auto self = weak.lock();
      if (ec || !self || self->done_ || generation != self->armed_)
        return;
      self->timed_out_ = true;
      if (self->resolver_)
        self->resolver_->cancel();
      self->drop_socket();
    });
  }

  void drop_socket() {
    if (!stream_)
      return;
    beast::error_code ignored;
    stream_->socket.shutdown(tcp::socket::shutdown_both, ignored);
    stream_->socket.close(ignored);
  }

  void connect() {
    reused_ = false;
    stream_ = std::make_unique<upstream_connection>(io_.get_executor());
    if (!resolver_)
      resolver_.emplace(io_.get_executor());
    arm(std::min(deadline_, std::chrono::steady_clock::now() + connect_timeout_));
    auto self = shared_from_this();
    resolver_->async_resolve(
      host_, port_, [self](beast::error_code ec, const tcp::resolver::results_type& rs) {
        if (ec)
          return self->finish(self->describe("resolve", ec));
        asio::async_connect(self->stream_->socket, rs,
                            [self](beast::error_code ec2, const tcp::endpoint&) {
                              if (ec2)
                                return self->finish(self->describe("connect", ec2));
                              beast::error_code ignored;
                              self->stream_->socket.set_option(tcp::no_delay(true), ignored);
                              self->arm(self->deadline_); // the connect timeout is over
                              self->write();
                            });
      });
  }

  /// Why step `what` ("resolve", "connect", "write", "read") failed.
  http_error describe(const char* what, const beast::error_code& ec) const {
    if (cancelled_)
      return {http_failure::cancelled, "cancelled"};
    // Whatever ends a connect (a timeout too) means nothing was sent.
    bool connecting = std::string_view(what) == "resolve" || std::string_view(what) == "connect";
    auto kind = connecting ? http_failure::connect
                           : (timed_out_ ? http_failure::timeout : http_failure::broken);
    if (timed_out_ && !connecting && !answered_ && head_timed())
      return {kind, std::string(what) + ": no answer began within "
                      + std::to_string(head_timeout_.count()) + " ms"};
    return {kind, std::string(what) + (timed_out_ ? ": timed out" : ": " + ec.message())};
  }

  /// Whether the head's deadline came before the whole call's.
  bool head_timed() const noexcept {
    return head_timeout_.count() > 0 && head_deadline_ < deadline_;
  }

  /// A pooled connection the upstream closed meanwhile fails at once: that
  /// is no failure of the request, so a fresh connection gets it.
  bool retry_fresh() {
    if (!reused_ || got_head_ || cancelled_ || timed_out_)
      return false;
    deadline_timer_.cancel();
    connect();
    return true;
  }

  void write() {
    auto self = shared_from_this();
    std::array<asio::const_buffer, 2> out{asio::buffer(head_), asio::buffer(body_)};
    asio::async_write(stream_->socket, out, [self](beast::error_code ec, std::size_t) {
      if (ec) {
        if (self->retry_fresh())
          return;
        return self->finish(self->describe("write", ec));
      }
      if (self->head_timeout_.count() > 0) { // sent: from now on the head is awaited
        self->head_deadline_ =
          std::min(self->deadline_, std::chrono::steady_clock::now() + self->head_timeout_);
        self->arm(self->head_deadline_);
      }
      self->stream_->buffer.clear();
      self->read_head();
    });
  }

  /// Reads a response head; an interim one is skipped and the next read
  /// (what follows it may already be in the buffer).
  void read_head() {
    parser_.emplace();
    parser_->body_limit(boost::none); // streamed through, not held
    parser_->header_limit(64u << 10); // an engine's head; Beast's default is 8 KiB
    auto self = shared_from_this();
    http::async_read_header(
      stream_->socket, stream_->buffer, *parser_, [self](beast::error_code ec, std::size_t) {
        if (ec) {
          if (self->retry_fresh())
            return;
          return self->finish(self->describe("read", ec));
        }
        self->got_head_ = true; // the request arrived: never resent
        auto status = self->parser_->get().result_int();
        if (status >= 200 && self->head_timeout_.count() > 0)
          self->arm(self->deadline_); // the answer began: the rest has the whole call's deadline
        if (status >= 200)
          return self->on_head();
        if (status == 101) // no Upgrade is ever sent
          return self->finish({http_failure::broken, "read: an unasked switch of protocols (101)"});
        if (++self->interim_ > max_interim)
          return self->finish(
            {http_failure::broken,
             "read: more than " + std::to_string(max_interim) + " interim (1xx) answers"});
        self->read_head();
      });
  }

  void on_head() {
    answered_ = true;
    const auto& res = parser_->get();
    std::vector<std::pair<std::string, std::string>> headers;
    for (const auto& f : res)
      headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    if (handlers_.on_head)
      handlers_.on_head(static_cast<int>(res.result_int()), headers);
    read_body();
  }

  void read_body() {
    if (parser_->is_done())
      return finish({});
    auto& c = *stream_;
    parser_->get().body().data = c.chunk;
    parser_->get().body().size = sizeof c.chunk;
    auto self = shared_from_this();
    http::async_read_some(c.socket, c.buffer, *parser_, [self](beast::error_code ec, std::size_t) {
      auto& chunk = self->stream_->chunk;
      auto got = sizeof chunk - self->parser_->get().body().size;
      if (got > 0 && self->handlers_.on_data)
        self->handlers_.on_data(std::string(chunk, got));
      if (ec == http::error::need_buffer)
        ec = {};
      if (ec)
        return self->finish(self->describe("read", ec));
      self->read_body();
    });
  }

  void finish(const http_error& error) {
    if (done_)
      return;
    done_ = true;
    deadline_timer_.cancel();
    bool reusable = error.ok() && parser_ && parser_->is_done() && parser_->keep_alive() && stream_
                    && stream_->buffer.size() == 0 && !cancelled_;
    if (reusable) {
      pool_->give(key_, std::move(stream_));
    } else if (stream_) {
      beast::error_code ignored;
      stream_->socket.shutdown(tcp::socket::shutdown_both, ignored);
    }
    if (handlers_.on_done)
      handlers_.on_done(error);
  }

  asio::io_context& io_;
  std::shared_ptr<connection_pool> pool_;
  std::optional<tcp::resolver> resolver_; ///< only when connecting
  asio::steady_timer deadline_timer_;
  std::unique_ptr<upstream_connection> stream_;
  std::string host_;
  std::string port_;
  std::string key_;
  std::chrono::milliseconds connect_timeout_;
  std::chrono::milliseconds head_timeout_; ///< 0: the head has the whole call's deadline
  std::chrono::steady_clock::time_point head_deadline_;
  std::uint64_t armed_ = 0; ///< arm() calls: only the last one's wait counts
  bool answered_ = false;   ///< a final (not 1xx) head arrived
  std::chrono::steady_clock::time_point deadline_;
  http_call_handlers handlers_;
  std::string head_;
  std::string body_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  /// Interim answers skipped before the final one; a server sending more is broken.
  static constexpr int max_interim = 16;
  int interim_ = 0;
  bool reused_ = false;
  bool got_head_ = false; ///< some response head, interim or final, was read
  bool cancelled_ = false;
  bool timed_out_ = false;
  bool done_ = false;
};

} // namespace

struct http_client::impl {
  std::shared_ptr<connection_pool> pool = std::make_shared<connection_pool>();
  std::shared_ptr<io_loop> loop;
  asio::io_context& io() { return loop->get().io; }
};

http_client::http_client() : http_client(std::make_shared<io_loop>(1)) {}

http_client::http_client(std::shared_ptr<io_loop> loop) : impl_(std::make_unique<impl>()) {
  if (loop->threads() != 1)
    throw std::invalid_argument("http_client needs a loop with one thread");
  impl_->loop = std::move(loop);
}

http_client::~http_client() {
  impl_->loop->stop();
  // Idle connections close while the io_context they belong to still exists.
  std::lock_guard<std::mutex> g(impl_->pool->mtx);
  impl_->pool->idle.clear();
}

void http_client::request(const std::string& method, const std::string& base_url,
                          const std::string& target, std::string body,
                          std::chrono::milliseconds timeout,
                          std::function<void(http_response)> done) {
  // A streamed call that collects the body: one implementation of framing,
  // interim answers and pooling for both kinds of call.
  struct collected {
    http_response response;
    bool too_large = false;
    std::weak_ptr<http_call> call;
  };
  static constexpr std::size_t max_body = 64u << 20;
  auto c = std::make_shared<collected>();
  http_call_handlers h;
  h.on_head = [c](int status, const std::vector<std::pair<std::string, std::string>>&) {
    c->response.status = status;
  };
  h.on_data = [c](const std::string& data) {
    if (c->too_large)
      return;
    if (c->response.body.size() + data.size() > max_body) {
      c->too_large = true;
      if (auto call = c->call.lock())
        call->cancel();
      return;
    }
    c->response.body += data;
  };
  h.on_done = [c, done = std::move(done)](const http_error& error) {
    auto r = std::move(c->response);
    if (c->too_large || !error.ok()) {
      r.status = 0;
      r.body.clear();
      r.failure = c->too_large ? http_failure::broken : error.kind;
      r.error = c->too_large ? "read: the body exceeds " + std::to_string(max_body) + " bytes"
                             : error.message;
    }
    done(std::move(r));
  };
  std::vector<std::pair<std::string, std::string>> headers;
  if (!body.empty())
    headers.emplace_back("Content-Type", "application/json");
  c->call =
    call(method, base_url, target, std::move(body), headers, timeout, timeout, std::move(h));
}

std::shared_ptr<http_call>
http_client::call(const std::string& method, const std::string& base_url, const std::string& target,
                  std::string body, const std::vector<std::pair<std::string, std::string>>& headers,
                  std::chrono::milliseconds connect_timeout, std::chrono::milliseconds timeout,
                  http_call_handlers handlers, std::chrono::milliseconds head_timeout) {
  auto url = wire::parse_http_url(base_url);
  if (!url || http::string_to_verb(method) == http::verb::unknown) {
    if (handlers.on_done)
      handlers.on_done({http_failure::refused,
                        "not an http://HOST:PORT URL or HTTP method: " + base_url + " " + method});
    return nullptr;
  }
  auto c = std::make_shared<streaming_call>(
    impl_->io(), impl_->pool, method, std::move(url->host), std::to_string(url->port), target,
    std::move(body), headers, connect_timeout, timeout, std::move(handlers), head_timeout);
  c->start();
  return c;
}

} // namespace llmgw
