#include "net/http_server.hpp"

#include "net/io_loop_impl.hpp"

#include "base/burst_log.hpp"
#include "base/log.hpp"
#include "wire/openai_request.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <poll.h>
#include <stdexcept>
#include <sys/socket.h>
#include <thread>
#include <unordered_map>

namespace llmgw {

http_reply json_reply(int status, std::string body) {
  return http_reply{status, "application/json", std::move(body), {}};
}

http_reply error_reply(int status, const std::string& type, const std::string& message) {
  return json_reply(status, wire::openai_error_json(message, type, status));
}

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string http_request::header(const std::string& name) const {
  for (const auto& [k, v] : headers)
    if (beast::iequals(k, name))
      return v;
  return {};
}

namespace {

/// Bytes a streamed answer may have queued for a client that does not read.
constexpr std::size_t max_stream_backlog = 8u << 20;
/// Pipelined bytes kept while an answer is pending.
constexpr std::size_t max_pipelined = 1u << 20;

/// Every loop runs one thread: a connection's handlers never race, and its
/// socket needs no strand. The executor is named, not type-erased: Asio's
/// any_io_executor costs a copy and a destroy per operation.
using executor = asio::io_context::executor_type;
using socket_type = tcp::socket::rebind_executor<executor>::other;
using clock = std::chrono::steady_clock;

class session;

/// The connections of one loop, whose deadlines one timer checks: a timer
/// per read and write (Beast's tcp_stream) costs more than the reads.
struct loop_sessions {
  explicit loop_sessions(asio::io_context& io) : sweep(io) {}
  asio::steady_timer sweep;
  std::vector<std::weak_ptr<session>> sessions; ///< the loop's thread only
};

/// What sessions share with the server. A responder may be called after the
/// server stopped (an actor answering late), so it holds only a weak
/// reference to its session; `alive` says whether its loop may still be
/// posted to.
struct shared_state {
  http_server_limits limits;
  http_handler handler;
  http_server_counters counters;
  std::mutex mtx;
  bool alive = true; ///< guarded by mtx
  std::mutex clients_mtx;
  std::unordered_map<std::string, std::size_t> clients;       ///< open connections per address
  std::unordered_map<std::string, std::size_t> client_bodies; ///< body bytes held per address
  burst_log refusal_log; ///< refusals are logged once per burst of a reason

  /// Counts a connection from `address`; false if that address is at its cap.
  bool admit(const std::string& address) {
    std::lock_guard<std::mutex> g(clients_mtx);
    auto& n = clients[address];
    if (limits.max_connections_per_client != 0 && n >= limits.max_connections_per_client) {
      if (n == 0)
        clients.erase(address);
      return false;
    }
    ++n;
    return true;
  }

  void release(const std::string& address) {
    std::lock_guard<std::mutex> g(clients_mtx);
    auto it = clients.find(address);
    if (it != clients.end() && --it->second == 0)
      clients.erase(it);
  }

  /// Counts `bytes` of request bodies for `address`; false if that would
  /// take it past `share`.
  bool hold_body(const std::string& address, std::size_t bytes, std::size_t share) {
    std::lock_guard<std::mutex> g(clients_mtx);
    auto& held = client_bodies[address];
    if (held + bytes > share) {
      if (held == 0)
        client_bodies.erase(address);
      return false;
    }
    held += bytes;
    return true;
  }

  void release_body(const std::string& address, std::size_t bytes) {
    std::lock_guard<std::mutex> g(clients_mtx);
    auto it = client_bodies.find(address);
    if (it != client_bodies.end() && (it->second -= bytes) == 0)
      client_bodies.erase(it);
  }
};

} // namespace

namespace detail {

/// One request's answer, shared by its responder and stream.
struct http_exchange {
  std::weak_ptr<session> owner;
  std::shared_ptr<shared_state> srv;
  std::atomic<bool> answered{false}; ///< a reply or a stream was started
  std::atomic<bool> gone{false};     ///< the client disconnected
  std::atomic<bool> ended{false};    ///< the stream was ended
  std::atomic<std::size_t> backlog{0};
  std::mutex mtx;
  std::vector<std::function<void()>> on_gone; ///< guarded by mtx

  /// Runs `f` on the session's loop: at once when called there (the
  /// gateway's upstream answers on the same thread), else posted; false if
  /// the server or the session is gone.
  template <class F>
  bool run(F f);

  void client_went_away() {
    if (gone.exchange(true))
      return;
    std::vector<std::function<void()>> fs;
    {
      std::lock_guard<std::mutex> g(mtx);
      fs.swap(on_gone);
    }
    for (auto& f : fs)
      f();
  }
};

} // namespace detail

struct http_server::impl {
  std::shared_ptr<shared_state> shared = std::make_shared<shared_state>();
  std::uint16_t port = 0;
  std::string error;
  std::vector<std::shared_ptr<io_loop>> loops;
  std::vector<std::shared_ptr<loop_sessions>> slots; ///< one per loop
  std::size_t next_loop = 0; ///< where the next connection goes (the acceptor's thread only)
  std::unique_ptr<tcp::acceptor> acceptor;
  std::atomic<bool> stopped{false};

  asio::io_context& io() { return loops.front()->get().io; }
  void accept();
};

namespace {

/// "HTTP/1.1 200 OK\r\nServer: llmgw\r\n" and the handler's headers, minus
/// any that would break the framing this server does itself. A name or value
/// with CR or LF would split the head: such a header is left out.
void append_head(std::string& out, int status, const std::string& content_type,
                 const std::vector<std::pair<std::string, std::string>>& headers) {
  auto reason = http::obsolete_reason(static_cast<http::status>(status));
  out += "HTTP/1.1 ";
  out += std::to_string(status);
  out += ' ';
  out.append(reason.data(), reason.size());
  auto clean = [](const std::string& s) { return s.find_first_of("\r\n") == std::string::npos; };
  out += "\r\nServer: llmgw\r\nContent-Type: ";
  out += clean(content_type) ? content_type : "application/octet-stream";
  out += "\r\n";
  for (const auto& [k, v] : headers) {
    if (k.empty() || !clean(k) || !clean(v) || beast::iequals(k, "content-length")
        || beast::iequals(k, "transfer-encoding") || beast::iequals(k, "connection")
        || beast::iequals(k, "content-type") || beast::iequals(k, "server"))
      continue;
    out += k;
    out += ": ";
    out += v;
    out += "\r\n";
  }
}

class session : public std::enable_shared_from_this<session> {
public:
  /// `client`: the address admitted for it (released when it goes), or ""
  /// for a connection that is only told it is over a cap.
  session(socket_type socket, std::shared_ptr<shared_state> srv, std::string client)
    : socket_(std::move(socket)), srv_(std::move(srv)), client_(std::move(client)) {
    ++srv_->counters.open;
    ++srv_->counters.connections;
  }
  ~session() {
    release_body();
    --srv_->counters.open;
    if (!client_.empty())
      srv_->release(client_);
  }

  /// On the session's loop: joins the loop's deadline checks (the server
  /// and its loops exist while it accepts).
  void enroll(loop_sessions& slot) { slot.sessions.push_back(weak_from_this()); }

  /// Since when the connection waits for a request (or the rest of a head)
  /// with nothing in progress; max while a request is read or answered.
  clock::time_point idle_since() const { return closed_ ? clock::time_point::max() : idle_since_; }

  /// Closes an idle connection to make room for a new one.
  void evict() {
    ++srv_->counters.evicted;
    close(); // the pending read ends with operation_aborted
  }

  void start() {
    beast::error_code ignored; // latency matters more than packet count
    socket_.set_option(tcp::no_delay(true), ignored);
    read();
  }

  /// Answers with `status` and closes: for connections over a cap.
  void refuse(int status, const std::string& message) {
    note_refusal("connections", message);
    http_reply r;
    r.status = status;
    r.body = wire::openai_error_json(message, "ServiceUnavailableError", status);
    r.headers.emplace_back("Retry-After", "1");
    keep_alive_ = false;
    write_whole(std::move(r));
  }

  /// The loop's deadline check: closes the connection if its deadline passed.
  void check_deadline(clock::time_point now) {
    if (closed_)
      return;
    if (half_closed_ && !answer_complete_ && fully_closed())
      return lost_client();
    if (now < deadline_)
      return;
    ++srv_->counters.timeouts;
    note_refusal("timeout", "no whole request in time, or idle too long");
    close(); // the pending operation ends with operation_aborted
  }

  /// Logs a refusal, once per burst of its reason.
  void note_refusal(const char* reason, const std::string& detail) {
    if (auto n = srv_->refusal_log.admit(reason)) {
      beast::error_code ignored;
      auto peer = socket_.remote_endpoint(ignored).address().to_string();
      LLMGW_LOG(warning, "http", "refused {} ({}): {}{}", peer, reason, detail, burst_note(n));
    }
  }

  // -- called on the session's loop by responders and streams --------------

  void write_whole(http_reply r) {
    answer_started_ = true;
    head_.clear();
    append_head(head_, r.status, r.content_type, r.headers);
    // 1xx, 204 and 304 answers have no body, nor a length for one.
    if ((r.status >= 100 && r.status < 200) || r.status == 204 || r.status == 304) {
      r.body.clear();
    } else {
      head_ += "Content-Length: ";
      head_ += std::to_string(r.body.size());
      head_ += "\r\n";
    }
    head_ += keep_alive_ ? "\r\n" : "Connection: close\r\n\r\n";
    body_ = std::move(r.body);
    deadline_ = clock::now() + srv_->limits.read_timeout;
    auto self = shared_from_this();
    std::array<asio::const_buffer, 2> out{asio::buffer(head_), asio::buffer(body_)};
    asio::async_write(socket_, out, [self](beast::error_code ec, std::size_t) {
      self->deadline_ = clock::time_point::max();
      self->answer_done(!ec);
    });
  }

  void begin_stream(int status, const std::string& content_type,
                    const std::vector<std::pair<std::string, std::string>>& headers) {
    answer_started_ = true;
    std::string head;
    append_head(head, status, content_type, headers);
    if (std::none_of(headers.begin(), headers.end(),
                     [](const auto& h) { return beast::iequals(h.first, "cache-control"); }))
      head += "Cache-Control: no-cache\r\n";
    // HTTP/1.0 knows no chunked coding: its stream ends when the connection
    // closes.
    if (http10_)
      keep_alive_ = false;
    else
      head += "Transfer-Encoding: chunked\r\n";
    head += keep_alive_ ? "\r\n" : "Connection: close\r\n\r\n";
    queue_.push_back({piece::header, std::move(head)});
    pump();
  }

  void stream_write(std::string data) {
    if (data.empty())
      return;
    queue_.push_back({piece::chunk, std::move(data)});
    pump();
  }

  void stream_end() {
    queue_.push_back({piece::last, "0\r\n\r\n"});
    pump();
  }

  void stream_fail() {
    queue_.push_back({piece::broken, {}});
    pump();
  }

  executor get_executor() { return socket_.get_executor(); }

  /// Drops the connection mid-answer.
  void abort() {
    answer_complete_ = true;
    release();
    close();
  }

  /// The client left before its answer was out, or stopped reading a
  /// stream: counted, the connection closed, the handler told.
  void lost_client() {
    if (closed_)
      return;
    ++srv_->counters.disconnects;
    auto x = exchange_;
    release();
    close();
    if (x)
      x->client_went_away();
  }

  /// When the server stops (its loops stopped): lets go of a session that
  /// waits for an answer and closes its socket while the loop still exists.
  void shut() {
    release();
    close();
  }

private:
  enum class piece { header, chunk, last, broken };
  struct queued {
    piece what;
    std::string data;
  };

  void read() {
    exchange_.reset();
    answer_started_ = false;
    parser_.emplace();
    parser_->body_limit(srv_->limits.max_body_bytes);
    parser_->header_limit(static_cast<std::uint32_t>(srv_->limits.max_header_bytes));
    deadline_ = clock::now() + srv_->limits.idle_timeout;
    idle_since_ = clock::now();
    auto self = shared_from_this();
    http::async_read_header(socket_, buffer_, *parser_,
                            [self](beast::error_code ec, std::size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    idle_since_ = clock::time_point::max();
    if (ec)
      return on_error(ec);
    deadline_ = clock::now() + srv_->limits.read_timeout;
    const auto& head = parser_->get();
    http10_ = head.version() < 11;
    // Only chunked is a transfer coding this server decodes (RFC 9112,
    // section 6.1: 501 for any other).
    auto codings = head.equal_range(http::field::transfer_encoding);
    for (auto te = codings.first; te != codings.second; ++te)
      if (!beast::iequals(te->value(), "chunked"))
        return refuse_request(501, "NotImplementedError",
                              "the transfer coding '" + std::string(te->value())
                                + "' is not supported; only chunked is");
    // Expect is answered here and never passed on: 100 Continue before the
    // body is read (a client may wait for it), 417 for any other expectation.
    auto expect = head[http::field::expect];
    if (!expect.empty() && !beast::iequals(expect, "100-continue"))
      return refuse_request(417, "BadRequestError",
                            "the expectation '" + std::string(expect)
                              + "' is not supported; only 100-continue is");
    if (!reserve_body())
      return;
    if (!expect.empty() && !http10_ && !parser_->is_done())
      return send_continue();
    read_body();
  }

  /// Counts the body against the server's budget; false (and a 503 on its
  /// way) if it does not fit.
  bool reserve_body() {
    auto budget = srv_->limits.max_buffered_body_bytes;
    if (budget == 0)
      return true;
    std::size_t need = 0;
    if (auto length = parser_->content_length())
      need = static_cast<std::size_t>(*length);
    else if (parser_->chunked())
      need = srv_->limits.max_body_bytes;
    if (need == 0)
      return true;
    auto refuse = [&](const std::string& why) {
      ++srv_->counters.over_body_budget;
      note_refusal("over_body_budget", why);
      keep_alive_ = false;
      write_whole(http_reply{503,
                             "application/json",
                             wire::openai_error_json("the server holds as many request bodies "
                                                     "as it may; retry shortly",
                                                     "ServiceUnavailableError", 503),
                             {{"Retry-After", "1"}}});
      return false;
    };
    // One address gets an eighth of the budget (at least one whole body):
    // one client cannot hold it all with bodies it never finishes sending.
    auto share = std::max(srv_->limits.max_body_bytes, budget / 8);
    if (!srv_->hold_body(client_, need, share))
      return refuse("this address holds its share of the bodies");
    auto& held = srv_->counters.buffered_body_bytes;
    auto now = held.load();
    do {
      if (now + need > budget) {
        srv_->release_body(client_, need);
        return refuse(std::to_string(now) + " bytes of bodies held");
      }
    } while (!held.compare_exchange_weak(now, now + need));
    reserved_ = need;
    return true;
  }

  /// Gives the body's share of the budget back (once).
  void release_body() {
    if (reserved_ != 0) {
      srv_->counters.buffered_body_bytes -= reserved_;
      srv_->release_body(client_, reserved_);
    }
    reserved_ = 0;
  }

  void send_continue() {
    static constexpr char interim[] = "HTTP/1.1 100 Continue\r\n\r\n";
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(interim, sizeof interim - 1),
                      [self](beast::error_code ec, std::size_t) {
                        if (ec)
                          return self->close();
                        self->read_body();
                      });
  }

  void read_body() {
    auto self = shared_from_this();
    http::async_read(socket_, buffer_, *parser_,
                     [self](beast::error_code ec, std::size_t) { self->on_body(ec); });
  }

  /// Answers a request this server will not read with `status` and closes.
  void refuse_request(int status, const char* type, const std::string& message) {
    ++srv_->counters.unsupported;
    note_refusal("unsupported", message);
    keep_alive_ = false;
    write_whole(error_reply(status, type, message));
  }

  void on_error(const beast::error_code& ec) {
    if (closed_ || ec == http::error::end_of_stream || ec == asio::error::eof
        || ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
      return close();
    http_reply r;
    if (ec == http::error::body_limit) {
      ++srv_->counters.too_large;
      note_refusal("too_large", "a body over the limit");
      r.status = 413;
      r.body = wire::openai_error_json("the request body exceeds "
                                         + std::to_string(srv_->limits.max_body_bytes) + " bytes",
                                       "BadRequestError", 413);
    } else if (ec == http::error::bad_transfer_encoding) {
      // Beast's parser stops here when chunked is not the last coding.
      return refuse_request(501, "NotImplementedError",
                            "the request's transfer coding is not supported; only chunked is");
    } else if (ec == http::error::header_limit) {
      ++srv_->counters.too_large;
      note_refusal("too_large", "a head over the limit");
      r.status = 431;
      r.body = wire::openai_error_json("the request headers exceed "
                                         + std::to_string(srv_->limits.max_header_bytes) + " bytes",
                                       "BadRequestError", 431);
    } else {
      ++srv_->counters.bad_requests;
      note_refusal("malformed", ec.message());
      r.status = 400;
      r.body =
        wire::openai_error_json("malformed HTTP request: " + ec.message(), "BadRequestError", 400);
    }
    keep_alive_ = false;
    write_whole(std::move(r));
  }

  void on_body(beast::error_code ec) {
    if (ec)
      return on_error(ec);
    ++srv_->counters.requests;
    auto msg = parser_->release();
    http_request req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    req.body = std::move(msg.body());
    for (const auto& f : msg)
      req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    keep_alive_ = msg.keep_alive();
    // The handler may answer much later (an actor, an upstream engine): no
    // deadline while the connection waits, but a watch for the client going.
    // The session owns itself until the answer is out (or the server stops).
    deadline_ = clock::time_point::max();
    auto self = shared_from_this();
    keep_ = self;
    exchange_ = std::make_shared<detail::http_exchange>();
    exchange_->owner = self;
    exchange_->srv = srv_;
    answer_complete_ = false;
    watch();
    http_responder respond(exchange_);
    try {
      srv_->handler(std::move(req), respond);
    } catch (const std::exception& e) {
      LLMGW_LOG(error, "http", "handler failed: {}", e.what());
      http_reply r;
      r.status = 500;
      r.body = wire::openai_error_json(std::string("internal error: ") + e.what(),
                                       "InternalServerError", 500);
      respond(std::move(r));
    }
  }

  /// Reads while an answer is pending: EOF or an error means the client is
  /// gone; bytes are a pipelined next request, kept for later. Once the
  /// answer is out, the watch's bytes start the next request: a keep-alive
  /// client's next request costs no extra read.
  void watch() {
    watching_ = true;
    auto self = shared_from_this();
    socket_.async_read_some(buffer_.prepare(4096),
                            [self](beast::error_code ec, std::size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, std::size_t n) {
    watching_ = false;
    if (closed_)
      return;
    if (!ec) {
      buffer_.commit(n);
      if (answer_complete_)
        return read(); // the next request has begun
      if (buffer_.size() < max_pipelined)
        return watch();
      return; // stop watching a client that floods; the answer continues
    }
    if (answer_complete_) {
      if (ec == asio::error::operation_aborted)
        return read(); // cancelled: the buffer holds the next request
      if (ec == asio::error::eof || ec == asio::error::connection_reset)
        return close(); // the client closed between requests
      return on_error(ec);
    }
    if (ec == asio::error::eof && !http10_ && !half_closed_ && probe_half_close())
      return; // it may have closed only its side: it still gets its answer
    lost_client();
  }

  /// The client ended its side while its answer is pending: it may have
  /// closed only that side (a half-close; it still reads), or all of it.
  /// Only a write tells: an interim 100 Continue, which an HTTP/1.1 client
  /// must accept at any time before the answer, draws a reset from a closed
  /// socket. False if it cannot be asked: the answer has begun (nothing may
  /// be written into it; a client ending its side mid-answer is taken as
  /// gone, so a stalled stream's engine is not left generating), or the
  /// probe could not be written.
  bool probe_half_close() {
    if (answer_started_)
      return false;
    half_closed_ = true;
    keep_alive_ = false; // no further request can come
    static constexpr char interim[] = "HTTP/1.1 100 Continue\r\n\r\n";
    auto n =
      ::send(socket_.native_handle(), interim, sizeof interim - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n != static_cast<ssize_t>(sizeof interim - 1))
      return false;
    // A reset raises an error condition on the socket: noticed at once (the
    // sweep is the fallback).
    auto self = shared_from_this();
    socket_.async_wait(tcp::socket::wait_error, [self](beast::error_code ec) {
      if (!ec && !self->closed_ && !self->answer_complete_ && self->fully_closed())
        self->lost_client();
    });
    return true;
  }

  /// True once the client's socket is gone (a reset came back).
  bool fully_closed() {
    pollfd p{socket_.native_handle(), 0, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP)) != 0;
  }

  void pump() {
    if (writing_ || queue_.empty() || closed_)
      return;
    writing_ = true;
    auto self = shared_from_this();
    auto& front = queue_.front();
    auto done = [self](beast::error_code ec, std::size_t) {
      self->writing_ = false;
      auto what = self->queue_.front().what;
      if (self->exchange_ && what == piece::chunk)
        self->exchange_->backlog -= self->queue_.front().data.size();
      self->queue_.pop_front();
      if (ec) {
        auto x = self->exchange_;
        self->release();
        self->close();
        if (x)
          x->client_went_away();
        return;
      }
      if (what == piece::last)
        return self->answer_done(true);
      self->pump();
    };
    if (front.what == piece::broken) {
      // What was queued before is out: drop the connection mid-answer.
      writing_ = false;
      queue_.pop_front();
      return abort();
    }
    if (front.what == piece::last && http10_) {
      // A close-delimited stream ends with the connection (answer_done).
      writing_ = false;
      queue_.pop_front();
      return answer_done(true);
    }
    if (front.what == piece::chunk && !http10_) {
      char size[24];
      auto len = std::snprintf(size, sizeof size, "%zx\r\n", front.data.size());
      chunk_size_.assign(size, static_cast<std::size_t>(len));
      std::array<asio::const_buffer, 3> out{asio::buffer(chunk_size_), asio::buffer(front.data),
                                            asio::buffer("\r\n", 2)};
      asio::async_write(socket_, out, done);
    } else {
      asio::async_write(socket_, asio::buffer(front.data), done);
    }
  }

  /// The answer is out: serve the next request, or close.
  void answer_done(bool ok) {
    answer_complete_ = true;
    release_body();
    if (exchange_) { // nobody needs to hear of a disconnect now (and the
                     // callbacks may hold what holds the responder)
      std::lock_guard<std::mutex> g(exchange_->mtx);
      exchange_->on_gone.clear();
    }
    body_.clear();
    release();
    if (!ok || !keep_alive_)
      return close();
    if (watching_) {
      exchange_.reset();
      deadline_ = clock::now() + srv_->limits.idle_timeout;
      idle_since_ = clock::now();
      if (buffer_.size() > 0) {
        // A pipelined request waits in the buffer: end the watch (two reads
        // at once are not allowed); its handler then reads.
        beast::error_code ignored;
        socket_.cancel(ignored);
      }
      return; // else the watch's read goes on: its bytes are the next request
    }
    read();
  }

  /// Ends the session's ownership of itself (it was waiting).
  void release() { keep_.reset(); }

  void close() {
    if (closed_)
      return;
    closed_ = true;
    release_body();
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  socket_type socket_;
  std::shared_ptr<shared_state> srv_;
  std::string client_;
  clock::time_point idle_since_ = clock::time_point::max();
  std::size_t reserved_ = 0;      ///< this request's share of the body budget
  std::shared_ptr<session> keep_; ///< set while an answer is pending
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<detail::http_exchange> exchange_;
  clock::time_point deadline_ = clock::time_point::max();
  std::string head_;       ///< a whole answer's head, while it is written
  std::string body_;       ///< and its body
  std::string chunk_size_; ///< the chunk being written's size line
  bool keep_alive_ = true;
  bool http10_ = false;         ///< the request was HTTP/1.0: no 1xx, no chunked answers
  bool half_closed_ = false;    ///< the client ended its side; its answer still goes out
  bool answer_started_ = false; ///< a whole answer or a stream's head was written
  bool watching_ = false;
  bool answer_complete_ = true;
  bool closed_ = false;
  bool writing_ = false;
  std::deque<queued> queue_;
};

/// Closes the loop's connection that has been idle longest (not `except`);
/// false if none is idle.
bool evict_oldest_idle(loop_sessions& slot, const session* except) {
  session* oldest = nullptr;
  auto since = clock::time_point::max();
  for (const auto& w : slot.sessions) {
    auto s = w.lock();
    if (!s || s.get() == except)
      continue;
    auto t = s->idle_since();
    if (t < since) {
      since = t;
      oldest = s.get();
    }
  }
  if (!oldest)
    return false;
  oldest->evict();
  return true;
}

/// Checks the deadlines of a loop's sessions every `period`, and forgets
/// sessions that are gone.
void sweep(const std::shared_ptr<loop_sessions>& slot, std::chrono::milliseconds period) {
  slot->sweep.expires_after(period);
  slot->sweep.async_wait(
    [weak = std::weak_ptr<loop_sessions>(slot), period](const beast::error_code& ec) {
      auto s = weak.lock();
      if (ec || !s)
        return;
      auto now = clock::now();
      auto& v = s->sessions;
      v.erase(std::remove_if(v.begin(), v.end(),
                             [now](const std::weak_ptr<session>& w) {
                               auto live = w.lock();
                               if (!live)
                                 return true;
                               live->check_deadline(now);
                               return false;
                             }),
              v.end());
      sweep(s, period);
    });
}

/// How often deadlines are checked: a tenth of the shortest, within 10 ms
/// and 1 s (a deadline is met within that much).
std::chrono::milliseconds sweep_period(const http_server_limits& limits) {
  auto shortest = std::min(limits.read_timeout, limits.idle_timeout);
  return std::clamp<std::chrono::milliseconds>(shortest / 10, std::chrono::milliseconds(10),
                                               std::chrono::milliseconds(1000));
}

} // namespace

namespace detail {

template <class F>
bool http_exchange::run(F f) {
  std::shared_ptr<session> s;
  {
    std::lock_guard<std::mutex> g(srv->mtx);
    s = owner.lock();
    if (!srv->alive || !s)
      return false; // the server stopped, or the connection is gone
  }
  // dispatch runs `f` here when this thread runs the session's loop.
  asio::dispatch(s->get_executor(), [s, f = std::move(f)]() mutable { f(*s); });
  return true;
}

} // namespace detail

void http_responder::operator()(http_reply r) const {
  if (x_->answered.exchange(true))
    return; // answered already: a bug in a handler, but never two answers
  x_->run([r = std::move(r)](session& s) mutable { s.write_whole(std::move(r)); });
}

http_stream http_responder::stream(int status, const std::string& content_type,
                                   std::vector<std::pair<std::string, std::string>> headers) const {
  if (!x_->answered.exchange(true))
    x_->run([status, content_type, headers = std::move(headers)](session& s) {
      s.begin_stream(status, content_type, headers);
    });
  else
    x_->ended = true; // a second answer: this stream accepts nothing
  return http_stream(x_);
}

void http_responder::on_disconnect(std::function<void()> f) const {
  {
    std::lock_guard<std::mutex> g(x_->mtx);
    if (!x_->gone) {
      x_->on_gone.push_back(std::move(f));
      return;
    }
  }
  f(); // gone already
}

bool http_stream::write(std::string data) const {
  if (x_->gone || x_->ended)
    return false;
  if (x_->backlog + data.size() > max_stream_backlog) {
    // The client stopped reading: stop producing for it. The disconnect
    // callbacks run later, on the session's loop: the caller may hold a lock
    // they take.
    auto s = x_->owner.lock();
    if (s)
      asio::post(s->get_executor(), [s] { s->lost_client(); });
    else
      x_->gone = true;
    return false;
  }
  x_->backlog += data.size();
  return x_->run([data = std::move(data)](session& s) mutable { s.stream_write(std::move(data)); });
}

void http_stream::end() const {
  if (x_->ended.exchange(true))
    return;
  x_->run([](session& s) { s.stream_end(); });
}

void http_stream::fail() const {
  if (x_->ended.exchange(true))
    return;
  x_->run([](session& s) { s.stream_fail(); });
}

void http_stream::abort() const {
  if (x_->ended.exchange(true))
    return;
  x_->run([](session& s) { s.abort(); });
}

bool http_stream::client_gone() const {
  return x_->gone;
}

void http_server::impl::accept() {
  auto i = next_loop++ % loops.size();
  auto& target = loops[i]->get().io;
  acceptor->async_accept(
    target.get_executor(), [this, i](beast::error_code ec, socket_type socket) {
      if (stopped)
        return;
      if (!ec) {
        beast::error_code ignored;
        auto client = socket.remote_endpoint(ignored).address().to_string();
        bool admitted = shared->admit(client);
        auto s = std::make_shared<session>(std::move(socket), shared,
                                           admitted ? std::move(client) : std::string{});
        // On the session's own loop from its first step.
        asio::dispatch(s->get_executor(), [s, srv = shared, slot = slots[i], admitted] {
          s->enroll(*slot);
          if (!admitted) {
            ++srv->counters.rejected_per_client;
            s->refuse(503, "too many open connections from this address");
          } else if (srv->counters.open > srv->limits.max_connections
                     && !evict_oldest_idle(*slot, s.get())) {
            ++srv->counters.rejected_connections;
            s->refuse(503, "too many open connections");
          } else {
            s->start();
          }
        });
      }
      accept();
    });
}

namespace {

std::vector<std::shared_ptr<io_loop>> single_thread_loops(std::size_t n) {
  std::vector<std::shared_ptr<io_loop>> loops;
  for (std::size_t i = 0; i < std::max<std::size_t>(n, 1); ++i)
    loops.push_back(std::make_shared<io_loop>(1));
  return loops;
}

} // namespace

http_server::http_server(const std::string& host, std::uint16_t port, std::size_t threads,
                         http_server_limits limits, http_handler handler)
  : http_server(host, port, single_thread_loops(threads), limits, std::move(handler)) {}

http_server::http_server(const std::string& host, std::uint16_t port,
                         std::vector<std::shared_ptr<io_loop>> loops, http_server_limits limits,
                         http_handler handler)
  : impl_(std::make_shared<impl>()) {
  if (loops.empty())
    throw std::invalid_argument("http_server needs at least one loop");
  for (const auto& l : loops)
    if (l->threads() != 1)
      throw std::invalid_argument("http_server needs loops with one thread each");
  impl_->loops = std::move(loops);
  impl_->acceptor = std::make_unique<tcp::acceptor>(impl_->io());
  impl_->shared->limits = limits;
  impl_->shared->handler = std::move(handler);
  beast::error_code ec;
  auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) {
    impl_->error = "'" + host + "' is not an IP address: " + ec.message();
    return;
  }
  tcp::endpoint ep(address, port);
  impl_->acceptor->open(ep.protocol(), ec);
  if (!ec)
    impl_->acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec)
    impl_->acceptor->bind(ep, ec);
  if (!ec)
    impl_->acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    impl_->error = "cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message();
    return;
  }
  impl_->port = impl_->acceptor->local_endpoint().port();
  auto period = sweep_period(limits);
  for (const auto& l : impl_->loops) {
    impl_->slots.push_back(std::make_shared<loop_sessions>(l->get().io));
    // Armed on its loop: a timer is used by one thread at a time.
    // Held weakly: a handler left queued when the loop stops must not keep
    // a timer past its io_context.
    asio::post(l->get().io, [weak = std::weak_ptr<loop_sessions>(impl_->slots.back()), period] {
      if (auto slot = weak.lock())
        sweep(slot, period);
    });
  }
  impl_->accept();
}

http_server::~http_server() {
  try {
    stop();
  } catch (const std::exception& e) {
    // Joining threads can throw std::system_error; nothing to do but say so.
    LLMGW_LOG(error, "http", "stopping the server: {}", e.what());
  }
}

void http_server::stop() {
  if (impl_->stopped.exchange(true))
    return;
  {
    std::lock_guard<std::mutex> g(impl_->shared->mtx);
    impl_->shared->alive = false;
  }
  for (const auto& loop : impl_->loops)
    loop->stop(); // a shared loop stops for its other users too
  // No thread runs the loops now: close the listening socket here, so new
  // connections are refused rather than accepted and never served; close
  // every connection and drop the timers while their io_contexts exist.
  beast::error_code ignored;
  impl_->acceptor->close(ignored);
  for (const auto& slot : impl_->slots) {
    for (const auto& w : slot->sessions)
      if (auto s = w.lock())
        s->shut();
    slot->sessions.clear();
    slot->sweep.cancel();
  }
}

std::uint16_t http_server::port() const noexcept {
  return impl_->port;
}

const std::string& http_server::error() const noexcept {
  return impl_->error;
}

const http_server_counters& http_server::counters() const noexcept {
  return impl_->shared->counters;
}

} // namespace llmgw
