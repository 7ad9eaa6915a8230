#include "actors/http_server.hpp"

#include "actors/io_loop_impl.hpp"

#include "wire/log.hpp"
#include "wire/openai_request.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace llmgw {

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

class session;

/// What sessions share with the server. A responder may be called after the
/// server stopped (an actor answering late), so it holds only a weak
/// reference to its session: while a session waits for its answer, `waiting`
/// owns it, and stop() releases those while the io_context still exists.
struct shared_state {
  http_server_limits limits;
  http_handler handler;
  http_server_counters counters;
  std::mutex mtx;
  bool alive = true; ///< guarded by mtx: the io_context may still be posted to
  std::unordered_map<const void*, std::shared_ptr<session>> waiting; ///< guarded by mtx
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

  /// Runs `f` on the session's executor, if the server and session still exist.
  template <class F>
  bool post(F f);

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
  std::size_t next_loop = 0; ///< where the next connection goes (the acceptor's thread only)
  std::unique_ptr<tcp::acceptor> acceptor;
  std::atomic<bool> stopped{false};

  asio::io_context& io() { return loops.front()->get().io; }
  void accept();
};

namespace {

class session : public std::enable_shared_from_this<session> {
public:
  session(tcp::socket socket, std::shared_ptr<shared_state> srv)
    : stream_(std::move(socket)), srv_(std::move(srv)) {
    ++srv_->counters.open;
    ++srv_->counters.connections;
  }
  ~session() { --srv_->counters.open; }

  void start() { read(); }

  /// Answers with `status` and closes: for connections over the cap.
  void refuse(int status, const std::string& message) {
    http_reply r;
    r.status = status;
    r.body = wire::openai_error_json(message, "ServiceUnavailableError", status);
    keep_alive_ = false;
    write_whole(std::move(r));
  }

  // -- called on the session's executor by responders and streams ----------

  void write_whole(http_reply r) {
    auto res = std::make_shared<http::response<http::string_body>>();
    res->result(static_cast<unsigned>(r.status));
    res->version(11);
    res->set(http::field::server, "llmgw");
    res->set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers)
      res->set(k, v);
    res->body() = std::move(r.body);
    res->keep_alive(keep_alive_);
    res->prepare_payload();
    stream_.expires_after(srv_->limits.read_timeout);
    auto self = shared_from_this();
    http::async_write(stream_, *res,
                      [self, res](beast::error_code ec, std::size_t) { self->answer_done(!ec); });
  }

  void begin_stream(int status, const std::string& content_type,
                    const std::vector<std::pair<std::string, std::string>>& headers) {
    auto res = std::make_unique<http::response<http::empty_body>>();
    res->result(static_cast<unsigned>(status));
    res->version(11);
    res->set(http::field::server, "llmgw");
    res->set(http::field::content_type, content_type);
    res->set(http::field::cache_control, "no-cache");
    for (auto& [k, v] : headers)
      res->set(k, v);
    res->keep_alive(keep_alive_);
    res->chunked(true);
    stream_res_ = std::move(res);
    stream_sr_ = std::make_unique<http::response_serializer<http::empty_body>>(*stream_res_);
    queue_.push_back({piece::header, {}});
    pump();
  }

  void stream_write(std::string data) {
    if (data.empty())
      return;
    queue_.push_back({piece::chunk, std::move(data)});
    pump();
  }

  void stream_end() {
    queue_.push_back({piece::last, {}});
    pump();
  }

  /// The session's executor: a strand when its loop runs on several threads.
  auto executor() { return stream_.get_executor(); }

  /// Drops the connection mid-answer.
  void abort() {
    answer_complete_ = true;
    release();
    close();
  }

private:
  enum class piece { header, chunk, last };
  struct queued {
    piece what;
    std::string data;
  };

  void read() {
    exchange_.reset();
    parser_.emplace();
    parser_->body_limit(srv_->limits.max_body_bytes);
    parser_->header_limit(static_cast<std::uint32_t>(srv_->limits.max_header_bytes));
    stream_.expires_after(srv_->limits.idle_timeout);
    auto self = shared_from_this();
    http::async_read_header(stream_, buffer_, *parser_,
                            [self](beast::error_code ec, std::size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec)
      return on_error(ec);
    stream_.expires_after(srv_->limits.read_timeout);
    auto self = shared_from_this();
    http::async_read(stream_, buffer_, *parser_,
                     [self](beast::error_code ec2, std::size_t) { self->on_body(ec2); });
  }

  void on_error(const beast::error_code& ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof
        || ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
      return close();
    if (ec == beast::error::timeout) {
      ++srv_->counters.timeouts;
      return close();
    }
    http_reply r;
    if (ec == http::error::body_limit) {
      ++srv_->counters.too_large;
      r.status = 413;
      r.body = wire::openai_error_json("the request body exceeds "
                                         + std::to_string(srv_->limits.max_body_bytes) + " bytes",
                                       "BadRequestError", 413);
    } else if (ec == http::error::header_limit) {
      ++srv_->counters.too_large;
      r.status = 431;
      r.body = wire::openai_error_json("the request headers exceed "
                                         + std::to_string(srv_->limits.max_header_bytes) + " bytes",
                                       "BadRequestError", 431);
    } else {
      ++srv_->counters.bad_requests;
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
    stream_.expires_never();
    auto self = shared_from_this();
    exchange_ = std::make_shared<detail::http_exchange>();
    exchange_->owner = self;
    exchange_->srv = srv_;
    {
      std::lock_guard<std::mutex> g(srv_->mtx);
      srv_->waiting[this] = self;
    }
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
  /// gone; bytes are a pipelined next request, kept for later.
  void watch() {
    watching_ = true;
    auto self = shared_from_this();
    stream_.socket().async_read_some(
      buffer_.prepare(4096),
      [self](beast::error_code ec, std::size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, std::size_t n) {
    watching_ = false;
    if (!ec) {
      buffer_.commit(n);
      if (resume_after_watch_)
        return resume();
      if (!answer_complete_ && buffer_.size() < max_pipelined)
        return watch();
      return; // stop watching a client that floods; the answer continues
    }
    if (resume_after_watch_ && ec == asio::error::operation_aborted)
      return resume();
    if (answer_complete_ || closed_)
      return;
    ++srv_->counters.disconnects;
    auto x = exchange_;
    release();
    close();
    if (x)
      x->client_went_away();
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
    switch (front.what) {
    case piece::header:
      http::async_write_header(stream_, *stream_sr_, done);
      break;
    case piece::chunk:
      asio::async_write(stream_, http::make_chunk(asio::buffer(front.data)), done);
      break;
    case piece::last:
      asio::async_write(stream_, http::make_chunk_last(), done);
      break;
    }
  }

  /// The answer is out: serve the next request, or close.
  void answer_done(bool ok) {
    answer_complete_ = true;
    if (exchange_) { // nobody needs to hear of a disconnect now (and the
                     // callbacks may hold what holds the responder)
      std::lock_guard<std::mutex> g(exchange_->mtx);
      exchange_->on_gone.clear();
    }
    stream_sr_.reset();
    stream_res_.reset();
    release();
    if (!ok || !keep_alive_)
      return close();
    if (watching_) {
      // Let the watch read finish first: two reads at once are not allowed.
      resume_after_watch_ = true;
      beast::error_code ignored;
      stream_.socket().cancel(ignored);
      return;
    }
    resume();
  }

  void resume() {
    resume_after_watch_ = false;
    read();
  }

  /// Ends the server's ownership of this session (it was waiting).
  void release() {
    std::lock_guard<std::mutex> g(srv_->mtx);
    srv_->waiting.erase(this);
  }

  void close() {
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<shared_state> srv_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<detail::http_exchange> exchange_;
  bool keep_alive_ = true;
  bool watching_ = false;
  bool resume_after_watch_ = false;
  bool answer_complete_ = true;
  bool closed_ = false;
  bool writing_ = false;
  std::deque<queued> queue_;
  std::unique_ptr<http::response<http::empty_body>> stream_res_;
  std::unique_ptr<http::response_serializer<http::empty_body>> stream_sr_;
};

} // namespace

namespace detail {

template <class F>
bool http_exchange::post(F f) {
  std::lock_guard<std::mutex> g(srv->mtx);
  auto s = owner.lock();
  if (!srv->alive || !s)
    return false; // the server stopped, or the connection is gone
  asio::post(s->executor(), [s, f = std::move(f)]() mutable { f(*s); });
  return true;
}

} // namespace detail

void http_responder::operator()(http_reply r) const {
  if (x_->answered.exchange(true))
    return; // answered already: a bug in a handler, but never two answers
  x_->post([r = std::move(r)](session& s) mutable { s.write_whole(std::move(r)); });
}

http_stream http_responder::stream(int status, const std::string& content_type,
                                   std::vector<std::pair<std::string, std::string>> headers) const {
  if (!x_->answered.exchange(true))
    x_->post([status, content_type, headers = std::move(headers)](session& s) {
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
    // The client stopped reading: stop producing for it.
    x_->client_went_away();
    return false;
  }
  x_->backlog += data.size();
  return x_->post(
    [data = std::move(data)](session& s) mutable { s.stream_write(std::move(data)); });
}

void http_stream::end() const {
  if (x_->ended.exchange(true))
    return;
  x_->post([](session& s) { s.stream_end(); });
}

void http_stream::abort() const {
  if (x_->ended.exchange(true))
    return;
  x_->post([](session& s) { s.abort(); });
}

bool http_stream::client_gone() const {
  return x_->gone;
}

void http_server::impl::accept() {
  // One thread runs a loop: its handlers are serialized already, a strand
  // would only cost. More threads: each connection gets a strand.
  auto& target = *loops[next_loop++ % loops.size()];
  auto executor = target.threads() == 1 ? asio::any_io_executor(target.get().io.get_executor())
                                        : asio::any_io_executor(asio::make_strand(target.get().io));
  acceptor->async_accept(executor, [this](beast::error_code ec, tcp::socket socket) {
    if (stopped)
      return;
    if (!ec) {
      auto s = std::make_shared<session>(std::move(socket), shared);
      // On the session's own loop from its first step.
      asio::dispatch(s->executor(), [s, srv = shared] {
        if (srv->counters.open > srv->limits.max_connections) {
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

http_server::http_server(const std::string& host, std::uint16_t port, std::size_t threads,
                         http_server_limits limits, http_handler handler)
  : http_server(host, port, {std::make_shared<io_loop>(threads)}, limits, std::move(handler)) {}

http_server::http_server(const std::string& host, std::uint16_t port,
                         std::vector<std::shared_ptr<io_loop>> loops, http_server_limits limits,
                         http_handler handler)
  : impl_(std::make_shared<impl>()) {
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
  std::unordered_map<const void*, std::shared_ptr<session>> waiting;
  {
    std::lock_guard<std::mutex> g(impl_->shared->mtx);
    impl_->shared->alive = false;
    waiting.swap(impl_->shared->waiting);
  }
  for (const auto& loop : impl_->loops)
    loop->stop(); // a shared loop stops for its other users too
  // No thread runs the io_context now: close the listening socket here, so
  // new connections are refused rather than accepted and never served.
  beast::error_code ignored;
  impl_->acceptor->close(ignored);
  waiting.clear(); // sessions close their sockets while the io_context exists
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
