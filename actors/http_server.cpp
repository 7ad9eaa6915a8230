#include "actors/http_server.hpp"

#include "wire/log.hpp"
#include "wire/openai_request.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

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
  std::unordered_map<const void*, std::shared_ptr<void>> waiting; ///< guarded by mtx
};

struct http_server::impl {
  std::shared_ptr<shared_state> shared = std::make_shared<shared_state>();
  std::uint16_t port = 0;
  std::string error;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  tcp::acceptor acceptor{io};
  std::vector<std::thread> threads;
  std::atomic<bool> stopped{false};

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
    write(std::move(r), false);
  }

private:
  void read() {
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
    LLMGW_LOG(debug, "http", "connection error: {} ({})", ec.message(), ec.category().name());
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
    write(std::move(r), false);
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
    bool keep_alive = msg.keep_alive();
    // The handler may answer much later (an actor, an upstream engine): no
    // deadline while the connection waits for its own answer.
    stream_.expires_never();
    auto self = shared_from_this();
    {
      std::lock_guard<std::mutex> g(srv_->mtx);
      srv_->waiting[this] = self;
    }
    auto answered = std::make_shared<std::atomic<bool>>(false);
    std::weak_ptr<session> weak = self;
    auto srv = srv_;
    http_responder respond = [weak, srv, keep_alive, answered](http_reply r) {
      if (answered->exchange(true))
        return; // answered already: a bug in a handler, but never two replies
      std::lock_guard<std::mutex> g(srv->mtx);
      auto s = weak.lock();
      if (!srv->alive || !s)
        return; // the server stopped: nobody to write to
      srv->waiting.erase(s.get());
      asio::post(s->stream_.get_executor(), [s, keep_alive, r = std::move(r)]() mutable {
        s->write(std::move(r), keep_alive);
      });
    };
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

  void write(http_reply r, bool keep_alive) {
    auto res = std::make_shared<http::response<http::string_body>>();
    res->result(static_cast<unsigned>(r.status));
    res->version(11);
    res->set(http::field::server, "llmgw");
    res->set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers)
      res->set(k, v);
    res->body() = std::move(r.body);
    res->keep_alive(keep_alive);
    res->prepare_payload();
    stream_.expires_after(srv_->limits.read_timeout);
    auto self = shared_from_this();
    http::async_write(stream_, *res, [self, res, keep_alive](beast::error_code ec, std::size_t) {
      if (ec || !keep_alive)
        return self->close();
      self->read();
    });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<shared_state> srv_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
};

} // namespace

void http_server::impl::accept() {
  acceptor.async_accept(asio::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
    if (stopped)
      return;
    if (!ec) {
      auto s = std::make_shared<session>(std::move(socket), shared);
      if (shared->counters.open > shared->limits.max_connections) {
        ++shared->counters.rejected_connections;
        s->refuse(503, "too many open connections");
      } else {
        s->start();
      }
    }
    accept();
  });
}

http_server::http_server(const std::string& host, std::uint16_t port, std::size_t threads,
                         http_server_limits limits, http_handler handler)
  : impl_(std::make_shared<impl>()) {
  impl_->shared->limits = limits;
  impl_->shared->handler = std::move(handler);
  beast::error_code ec;
  auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) {
    impl_->error = "'" + host + "' is not an IP address: " + ec.message();
    return;
  }
  tcp::endpoint ep(address, port);
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec)
    impl_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec)
    impl_->acceptor.bind(ep, ec);
  if (!ec)
    impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    impl_->error = "cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message();
    return;
  }
  impl_->port = impl_->acceptor.local_endpoint().port();
  impl_->accept();
  for (std::size_t i = 0; i < std::max<std::size_t>(threads, 1); ++i)
    impl_->threads.emplace_back([io = &impl_->io] { io->run(); });
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
  std::unordered_map<const void*, std::shared_ptr<void>> waiting;
  {
    std::lock_guard<std::mutex> g(impl_->shared->mtx);
    impl_->shared->alive = false;
    waiting.swap(impl_->shared->waiting);
  }
  asio::post(impl_->io, [i = impl_.get()] {
    beast::error_code ignored;
    i->acceptor.close(ignored);
  });
  impl_->work.reset();
  impl_->io.stop();
  for (auto& t : impl_->threads)
    t.join();
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
