// The HTTP server and client on loopback, and the tokenizer actor against a
// stand-in /tokenize: real sockets and threads, every wait bounded.
#include "actors/control_plane.hpp"
#include "actors/registration.hpp"
#include "actors/tokenizer.hpp"
#include "net/http_client.hpp"
#include "net/http_server.hpp"
#include "tests/integration/interim_engine.hpp"
#include "tests/support/eventually.hpp"

#include <boost/json.hpp>
#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <future>
#include <map>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

using namespace std::chrono_literals;
using namespace llmgw;

namespace {

/// Sends raw bytes and reads until the server closes (or 5 s pass).
std::string raw_exchange(std::uint16_t port, const std::string& bytes,
                         std::chrono::milliseconds wait = 5000ms) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "<connect failed>";
  }
  timeval tv{static_cast<long>(wait.count() / 1000), static_cast<long>(wait.count() % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    auto n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0)
      break;
    sent += static_cast<std::size_t>(n);
  }
  std::string out;
  char buf[4096];
  for (;;) {
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

http_response post(std::uint16_t port, const std::string& target, const std::string& body,
                   std::chrono::milliseconds timeout = 5000ms) {
  http_client client;
  std::promise<http_response> p;
  client.post_json("http://127.0.0.1:" + std::to_string(port), target, body, timeout,
                   [&p](http_response r) { p.set_value(std::move(r)); });
  auto f = p.get_future();
  EXPECT_EQ(f.wait_for(10s), std::future_status::ready);
  return f.get();
}

/// A server that never answers (it keeps the responders, so connections stay
/// open until it stops).
struct silent_server {
  std::mutex mtx;
  std::vector<http_responder> held;
  http_server server{"127.0.0.1", 0, 1, http_server_limits{},
                     [this](http_request&&, http_responder respond) {
                       std::lock_guard<std::mutex> g(mtx);
                       held.push_back(std::move(respond));
                     }};
  ~silent_server() { server.stop(); }
};

http_handler echo_handler() {
  return [](http_request&& req, http_responder respond) {
    http_reply r;
    r.body = req.method + " " + req.target + " " + req.body;
    r.headers.emplace_back("x-seen-agent", req.header("user-agent"));
    respond(std::move(r));
  };
}

} // namespace

TEST(http_server, answers_and_keeps_the_connection_alive) {
  http_server server("127.0.0.1", 0, 1, {}, echo_handler());
  ASSERT_NE(server.port(), 0) << server.error();
  auto two = raw_exchange(server.port(), "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
                                         "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                                         "Connection: close\r\n\r\nxyz");
  EXPECT_NE(two.find("GET /a "), std::string::npos) << two;
  EXPECT_NE(two.find("POST /b xyz"), std::string::npos) << "two requests on one connection";
  auto r = post(server.port(), "/tokenize", "{}");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST /tokenize {}");
  EXPECT_EQ(server.counters().requests.load(), 3u);
}

TEST(http_server, an_answer_may_come_later_from_another_thread) {
  std::vector<std::thread> workers;
  std::mutex mtx;
  http_server server("127.0.0.1", 0, 1, {}, [&](http_request&&, http_responder respond) {
    std::lock_guard<std::mutex> g(mtx);
    workers.emplace_back([respond] {
      std::this_thread::sleep_for(50ms);
      respond(http_reply{202, "text/plain", "later", {}});
      respond(http_reply{500, "text/plain", "twice", {}}); // ignored: one answer only
    });
  });
  auto r = post(server.port(), "/", "");
  EXPECT_EQ(r.status, 202);
  EXPECT_EQ(r.body, "later");
  for (auto& w : workers)
    w.join();
}

TEST(http_server, hostile_requests_are_bounded_and_counted) {
  http_server_limits limits;
  limits.max_body_bytes = 100;
  limits.max_header_bytes = 256;
  limits.idle_timeout = 300ms;
  limits.read_timeout = 300ms;
  http_server server("127.0.0.1", 0, 1, limits, echo_handler());
  auto big = raw_exchange(server.port(), "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n"
                                           + std::string(101, 'b'));
  EXPECT_EQ(big.rfind("HTTP/1.1 413", 0), 0u) << big;
  EXPECT_NE(big.find("exceeds 100 bytes"), std::string::npos);
  auto headers = raw_exchange(
    server.port(), "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(400, 'h') + "\r\n\r\n");
  EXPECT_EQ(headers.rfind("HTTP/1.1 431", 0), 0u) << headers;
  auto garbage = raw_exchange(server.port(), "HELLO THERE\r\n\r\n");
  EXPECT_EQ(garbage.rfind("HTTP/1.1 400", 0), 0u) << garbage;
  auto start = std::chrono::steady_clock::now();
  auto slow = raw_exchange(server.port(), "GET / HTTP/1.1\r\nHost: x\r\n"); // never finished
  EXPECT_TRUE(slow.empty()) << slow;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s) << "closed by the deadline";
  EXPECT_EQ(server.counters().too_large.load(), 2u);
  EXPECT_EQ(server.counters().bad_requests.load(), 1u);
  // The deadline check counts, then closes; the client may see the close
  // before this thread sees the count.
  test::eventually([&] { return server.counters().timeouts.load() != 0; }, 1s);
  EXPECT_EQ(server.counters().timeouts.load(), 1u);
  auto ok = post(server.port(), "/", "fine");
  EXPECT_EQ(ok.status, 200) << "the server still serves";
}

TEST(http_server, a_handler_cannot_break_the_framing_of_its_answer) {
  http_server server("127.0.0.1", 0, 1, {}, [](http_request&& req, http_responder respond) {
    http_reply r;
    r.status = req.target == "/empty" ? 204 : 200;
    r.body = req.target == "/empty" ? "" : "body";
    r.content_type = req.target == "/bad-type" ? "text/plain\r\nx-injected: 1" : "text/plain";
    r.headers = {
      {"x-ok", "fine"},          {"x-split", "a\r\nx-injected: 1"}, {"x-bad\nname", "v"},
      {"Content-Length", "999"}, {"Transfer-Encoding", "chunked"},  {"Connection", "keep-alive"}};
    respond(std::move(r));
  });
  auto got = raw_exchange(server.port(), "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("x-ok: fine\r\n"), std::string::npos) << got;
  EXPECT_EQ(got.find("x-injected"), std::string::npos) << got;
  EXPECT_EQ(got.find("x-split"), std::string::npos) << got;
  EXPECT_EQ(got.find("x-bad"), std::string::npos) << got;
  EXPECT_EQ(got.find("999"), std::string::npos) << got;
  EXPECT_EQ(got.find("chunked"), std::string::npos) << got;
  EXPECT_NE(got.find("Content-Length: 4\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << got;
  EXPECT_EQ(got.substr(got.size() - 8), "\r\n\r\nbody") << got;
  auto bad_type =
    raw_exchange(server.port(), "GET /bad-type HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(bad_type.find("x-injected"), std::string::npos) << bad_type;
  EXPECT_NE(bad_type.find("Content-Type: application/octet-stream\r\n"), std::string::npos)
    << bad_type;
  auto empty =
    raw_exchange(server.port(), "GET /empty HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(empty.rfind("HTTP/1.1 204 No Content\r\n", 0), 0u) << empty;
  EXPECT_EQ(empty.find("Content-Length"), std::string::npos) << empty;
}

TEST(http_server, connections_over_the_cap_are_turned_away) {
  http_server_limits limits;
  limits.max_connections = 1;
  std::promise<void> release;
  auto released = release.get_future().share();
  http_server server("127.0.0.1", 0, 2, limits, [released](http_request&&, http_responder respond) {
    std::thread([released, respond] {
      released.wait_for(5s);
      respond(http_reply{});
    }).detach();
  });
  auto first = std::async(std::launch::async, [&] { return post(server.port(), "/", ""); });
  ASSERT_TRUE(test::eventually([&] { return server.counters().open.load() == 1; }, 5s))
    << "the first request holds the one connection";
  auto second = post(server.port(), "/", "");
  EXPECT_EQ(second.status, 503);
  release.set_value();
  EXPECT_EQ(first.get().status, 200);
  EXPECT_EQ(server.counters().rejected_connections.load(), 1u);
}

TEST(http_server, a_port_in_use_is_an_error) {
  http_server a("127.0.0.1", 0, 1, {}, echo_handler());
  http_server b("127.0.0.1", a.port(), 1, {}, echo_handler());
  EXPECT_EQ(b.port(), 0);
  EXPECT_NE(b.error().find("cannot listen on 127.0.0.1:"), std::string::npos) << b.error();
  http_server c("not-an-ip", 0, 1, {}, echo_handler());
  EXPECT_NE(c.error().find("is not an IP address"), std::string::npos);
}

TEST(http_client, errors_and_deadlines) {
  auto refused = post(1, "/", ""); // nothing listens on port 1
  EXPECT_EQ(refused.status, 0);
  EXPECT_EQ(refused.error.rfind("connect: ", 0), 0u) << refused.error;
  EXPECT_EQ(refused.failure, http_failure::connect);
  silent_server silent;
  auto start = std::chrono::steady_clock::now();
  auto slow = post(silent.server.port(), "/", "", 200ms);
  EXPECT_EQ(slow.error, "read: timed out");
  EXPECT_EQ(slow.failure, http_failure::timeout);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  http_client client;
  std::promise<http_response> bad_url;
  client.post_json("https://127.0.0.1:1", "/", "", 1s,
                   [&bad_url](http_response r) { bad_url.set_value(std::move(r)); });
  auto refused_url = bad_url.get_future().get();
  EXPECT_EQ(refused_url.failure, http_failure::refused);
  EXPECT_NE(refused_url.error.find("not an http://HOST:PORT URL"), std::string::npos)
    << "the client takes the topology's URL form only (wire::parse_http_url)";
}

namespace {

struct actor_config : caf::actor_system_config {
  actor_config() {
    register_message_types(*this);
    set("scheduler.max-threads", 2);
  }
};

/// A stand-in engine's /tokenize: one token per character, counting calls;
/// with `render`, its /v1/completions/render too (a token per character
/// plus 1000, so the test sees which answered), else a 404 there as vLLM
/// gives without --enable-scale-out.
struct fake_tokenize {
  std::atomic<int> calls{0};
  std::atomic<int> render_calls{0};
  std::atomic<bool> broken{false};
  std::atomic<bool> render{false};
  std::atomic<int> render_refuses{0}; ///< render answers this status, vLLM's error shape
  std::unique_ptr<http_server> server;
  fake_tokenize() {
    server = std::make_unique<http_server>(
      "127.0.0.1", 0, 1, http_server_limits{}, [this](http_request&& req, http_responder respond) {
        ++calls;
        bool rendering = req.target == "/v1/completions/render";
        render_calls += rendering;
        if (rendering && !render) {
          respond(http_reply{404, "application/json", R"({"detail":"Not Found"})", {}});
          return;
        }
        if (rendering && render_refuses != 0) {
          respond(http_reply{render_refuses.load(),
                             "application/json",
                             R"({"error":{"message":"no","type":"BadRequestError"}})",
                             {}});
          return;
        }
        if (broken) {
          respond(http_reply{500, "text/plain", "engine on fire", {}});
          return;
        }
        auto body = boost::json::parse(req.body).as_object();
        boost::json::array tokens;
        for (char c : std::string(body.at("prompt").as_string()))
          tokens.push_back(static_cast<unsigned char>(c) + (rendering ? 1000 : 0));
        boost::json::object out;
        if (rendering) {
          out["request_id"] = "cmpl-1";
          out["token_ids"] = std::move(tokens);
          out["features"] = nullptr;
          respond(http_reply{
            200, "application/json", boost::json::serialize(boost::json::array{out}), {}});
          return;
        }
        out["count"] = tokens.size();
        out["tokens"] = std::move(tokens);
        respond(http_reply{200, "application/json", boost::json::serialize(out), {}});
      });
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server->port()); }
};

config::topology two_engines(const std::string& url0, const std::string& url1) {
  config::topology t;
  config::node_spec n;
  n.name = "agent-a";
  for (int i = 0; i < 2; ++i) {
    config::engine_spec e;
    e.replica = "r" + std::to_string(i);
    e.model = "m";
    e.url = i == 0 ? url0 : url1;
    n.engines.push_back(e);
  }
  t.nodes.push_back(n);
  t.router.tokenize_timeout = 300ms;
  t.router.tokenize_cache_entries = 2;
  return t;
}

/// Tokenizes `prompt` through `tok`; with `render`, its render endpoint is
/// tried first, as the gateway asks.
tokenize_reply ask(caf::actor_system& sys, const tokenizer_actor& tok, const std::string& prompt,
                   bool render = false) {
  caf::scoped_actor self{sys};
  tokenize_reply out;
  auto body = R"({"model":"m","prompt":")" + prompt + R"(","add_special_tokens":true})";
  tokenize_request req{"m", body, render ? "/v1/completions/render" : "",
                       R"({"model":"m","prompt":")" + prompt + R"("})"};
  self->request(tok, 10s, tokenize_atom::value, std::move(req))
    .receive([&](tokenize_reply& r) { out = std::move(r); },
             [&](const caf::error& e) { out.error = sys.render(e); });
  return out;
}

} // namespace

TEST(tokenizer, asks_engines_in_turn_and_caches_answers) {
  fake_tokenize a, b;
  actor_config cfg;
  caf::actor_system sys{cfg};
  auto topo = two_engines(a.url(), b.url());
  auto tok = sys.spawn(tokenizer, topo, token_cache_of(topo));
  auto r = ask(sys, tok, "abc");
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.tokens, (std::vector<std::uint32_t>{'a', 'b', 'c'}));
  EXPECT_FALSE(r.cached);
  EXPECT_GT(r.seconds, 0.0);
  auto again = ask(sys, tok, "abc");
  EXPECT_TRUE(again.cached);
  EXPECT_EQ(again.tokens, r.tokens);
  EXPECT_EQ(a.calls + b.calls, 1) << "the second answer came from the cache";
  ask(sys, tok, "x");
  EXPECT_EQ(a.calls.load(), 1);
  EXPECT_EQ(b.calls.load(), 1) << "replicas take turns";
  ask(sys, tok, "y");
  ask(sys, tok, "z"); // capacity 2: "abc" is out by now
  EXPECT_FALSE(ask(sys, tok, "abc").cached);
  caf::anon_send_exit(tok, caf::exit_reason::user_shutdown);
}

TEST(tokenizer, renders_where_the_engine_can_and_asks_tokenize_where_it_cannot) {
  fake_tokenize a;
  a.render = true;
  actor_config cfg;
  caf::actor_system sys{cfg};
  auto topo = two_engines(a.url(), a.url());
  topo.nodes[0].engines.pop_back();
  auto tok = sys.spawn(tokenizer, topo, token_cache_of(topo));
  auto r = ask(sys, tok, "ab", true);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.method, "render");
  EXPECT_EQ(r.tokens, (std::vector<std::uint32_t>{1000 + 'a', 1000 + 'b'}));
  EXPECT_EQ(a.render_calls.load(), 1);

  fake_tokenize old; // vLLM without --enable-scale-out: 404 on render
  auto topo2 = two_engines(old.url(), old.url());
  topo2.nodes[0].engines.pop_back();
  auto tok2 = sys.spawn(tokenizer, topo2, token_cache_of(topo2));
  r = ask(sys, tok2, "ab", true);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.method, "tokenize") << "this request too, without a failure";
  EXPECT_EQ(r.tokens, (std::vector<std::uint32_t>{'a', 'b'}));
  EXPECT_EQ(old.calls.load(), 2);
  r = ask(sys, tok2, "cd", true);
  EXPECT_EQ(r.method, "tokenize");
  EXPECT_EQ(old.render_calls.load(), 1) << "a replica without render is not asked again";
  EXPECT_EQ(old.calls.load(), 3);

  // vLLM refusing one request's render (an unknown model's 404, beam
  // search's 400) is about that request: it is asked /tokenize, and the
  // replica's render is asked again for the next one.
  for (int status : {404, 400, 500}) {
    a.render_refuses = status;
    auto before = a.render_calls.load();
    r = ask(sys, tok, "x" + std::to_string(status), true);
    ASSERT_TRUE(r.ok) << status << ": " << r.error;
    EXPECT_EQ(r.method, "tokenize") << status;
    a.render_refuses = 0;
    r = ask(sys, tok, "y" + std::to_string(status), true);
    ASSERT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.method, "render") << "after a " << status << ", render is still used";
    EXPECT_EQ(a.render_calls.load(), before + 2);
  }
  caf::anon_send_exit(tok, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(tok2, caf::exit_reason::user_shutdown);
}

TEST(tokenizer, a_failing_engine_is_skipped_for_a_while) {
  fake_tokenize a, b;
  a.broken = true;
  actor_config cfg;
  caf::actor_system sys{cfg};
  auto topo = two_engines(a.url(), b.url());
  auto tok = sys.spawn(tokenizer, topo, token_cache_of(topo));
  auto r = ask(sys, tok, "p1");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "/tokenize answered 500: engine on fire");
  EXPECT_EQ(r.replica, "r0");
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(ask(sys, tok, "q" + std::to_string(i)).ok);
  EXPECT_EQ(a.calls.load(), 1) << "r0 is not asked again while marked bad";
  caf::anon_send_exit(tok, caf::exit_reason::user_shutdown);
}

TEST(tokenizer, a_silent_engine_times_out) {
  silent_server silent;
  auto url = "http://127.0.0.1:" + std::to_string(silent.server.port());
  actor_config cfg;
  caf::actor_system sys{cfg};
  auto topo = two_engines(url, url);
  auto tok = sys.spawn(tokenizer, topo, token_cache_of(topo));
  auto start = std::chrono::steady_clock::now();
  auto r = ask(sys, tok, "p");
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.error, "read: timed out");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s) << "bounded by tokenize_timeout_ms";
  caf::anon_send_exit(tok, caf::exit_reason::user_shutdown);
}

namespace {

/// A client on a raw socket that reads as bytes arrive.
class raw_client {
public:
  explicit raw_client(std::uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    timeval tv{0, 100000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~raw_client() { close(); }
  void send(const std::string& bytes) { ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }
  /// Reads until `text` has arrived (everything read so far is returned).
  std::string read_until(const std::string& text, std::chrono::milliseconds timeout = 5000ms) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (got_.find(text) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      char buf[4096];
      auto n = ::recv(fd_, buf, sizeof buf, 0);
      if (n > 0)
        got_.append(buf, static_cast<std::size_t>(n));
      else if (n == 0)
        break;
    }
    return got_;
  }
  /// Ends this side: the request is all there is.
  void shut_write() { ::shutdown(fd_, SHUT_WR); }
  /// True once the server closed the connection (EOF), false if it is
  /// still open after `timeout`.
  bool closed_by_server(std::chrono::milliseconds timeout = 5000ms) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      char buf[4096];
      auto n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET))
        return true;
      if (n > 0)
        got_.append(buf, static_cast<std::size_t>(n));
    }
    return false;
  }
  void close() {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = -1;
  }

private:
  int fd_ = -1;
  std::string got_;
};

} // namespace

TEST(http_server, a_streamed_answer_is_flushed_piece_by_piece) {
  std::promise<void> first_seen;
  auto seen = first_seen.get_future().share();
  std::vector<std::thread> workers;
  http_server server("127.0.0.1", 0, 1, {}, [&](http_request&& req, http_responder respond) {
    if (req.target == "/plain") {
      respond(http_reply{200, "text/plain", "plain", {}});
      return;
    }
    workers.emplace_back([respond, seen] {
      auto s = respond.stream(200, "text/event-stream", {{"x-llmgw-replica", "r1"}});
      EXPECT_TRUE(s.write("data: one\n\n"));
      // The client must have the first event before the second is written.
      EXPECT_EQ(seen.wait_for(5s), std::future_status::ready);
      EXPECT_TRUE(s.write("data: two\n\n"));
      s.end();
    });
  });
  raw_client c(server.port());
  c.send("GET /sse HTTP/1.1\r\nHost: x\r\n\r\n");
  auto got = c.read_until("data: one");
  EXPECT_NE(got.find("Transfer-Encoding: chunked"), std::string::npos) << got;
  EXPECT_NE(got.find("x-llmgw-replica: r1"), std::string::npos);
  EXPECT_EQ(got.find("data: two"), std::string::npos) << "not written yet";
  first_seen.set_value();
  got = c.read_until("0\r\n\r\n");
  EXPECT_NE(got.find("data: two"), std::string::npos) << got;
  // The same connection serves the next request.
  c.send("GET /plain HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(c.read_until("plain").find("\r\n\r\nplain"), std::string::npos);
  for (auto& w : workers)
    w.join();
}

TEST(http_server, a_client_that_leaves_is_noticed_while_its_answer_is_pending) {
  std::promise<void> gone;
  auto gone_f = gone.get_future();
  std::mutex mtx;
  std::vector<http_responder> held;
  http_server server("127.0.0.1", 0, 1, {}, [&](http_request&&, http_responder respond) {
    respond.on_disconnect([&gone] { gone.set_value(); });
    std::lock_guard<std::mutex> g(mtx);
    held.push_back(respond); // the answer never comes
  });
  {
    raw_client c(server.port());
    c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
    ASSERT_TRUE(test::eventually([&] {
      std::lock_guard<std::mutex> g(mtx);
      return !held.empty();
    }))
      << "the handler has the request";
  } // the client goes away
  EXPECT_EQ(gone_f.wait_for(5s), std::future_status::ready) << "the handler can cancel its work";
  test::eventually([&] { return server.counters().disconnects.load() != 0; }, 1s);
  EXPECT_EQ(server.counters().disconnects.load(), 1u);
  // Late answers to a gone client are dropped quietly.
  std::lock_guard<std::mutex> g(mtx);
  held[0](http_reply{});
  auto s = held[0].stream(200, "text/plain");
  EXPECT_FALSE(s.write("x"));
}

TEST(http_server, a_client_that_stops_reading_a_stream_is_cut_off_without_deadlock) {
  // The producer writes under its own lock, and its disconnect callback takes
  // that lock, as the gateway's proxy does: the callback must not run inside
  // write().
  struct producer {
    std::mutex mtx;
    std::atomic<bool> callback_ran{false};
    std::atomic<bool> write_refused{false};
    std::atomic<std::size_t> written{0};
  };
  auto p = std::make_shared<producer>();
  std::promise<void> finished;
  auto finished_f = finished.get_future();
  http_server server("127.0.0.1", 0, 1, {}, [&](http_request&& req, http_responder respond) {
    if (req.target != "/sse") {
      respond(http_reply{});
      return;
    }
    respond.on_disconnect([p] {
      std::lock_guard<std::mutex> g(p->mtx);
      p->callback_ran = true;
    });
    // Detached: were it to deadlock, the test reports instead of hanging.
    std::thread([p, respond, &finished] {
      auto s = respond.stream(200, "text/event-stream");
      const std::string piece(64u << 10, 'x');
      for (int i = 0; i < 1000; ++i) { // 64 MB at most, far over the backlog
        std::lock_guard<std::mutex> g(p->mtx);
        if (!s.write(piece)) {
          p->write_refused = true;
          break;
        }
        p->written += piece.size();
      }
      finished.set_value();
    }).detach();
  });
  raw_client c(server.port());
  c.send("GET /sse HTTP/1.1\r\nHost: x\r\n\r\n"); // and never read
  ASSERT_EQ(finished_f.wait_for(20s), std::future_status::ready)
    << "the producer is stuck after " << p->written.load() << " bytes";
  EXPECT_TRUE(p->write_refused) << "a client that does not read stops the producer";
  EXPECT_LT(p->written.load(), std::size_t{32} << 20) << "the backlog is bounded";
  test::eventually([&] { return p->callback_ran.load(); }, 5s);
  EXPECT_TRUE(p->callback_ran) << "the handler hears the client is gone";
  EXPECT_EQ(server.counters().disconnects.load(), 1u);
  auto ok = post(server.port(), "/", "");
  EXPECT_EQ(ok.status, 200) << "the server still serves";
}

TEST(http_server, a_pipelined_request_waits_for_the_pending_answer) {
  std::vector<std::thread> workers;
  std::mutex mtx;
  http_server server("127.0.0.1", 0, 1, {}, [&](http_request&& req, http_responder respond) {
    std::lock_guard<std::mutex> g(mtx);
    workers.emplace_back([respond, target = req.target] {
      std::this_thread::sleep_for(target == "/slow" ? 200ms : 0ms);
      respond(http_reply{200, "text/plain", "answer " + target, {}});
    });
  });
  raw_client c(server.port());
  c.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /fast HTTP/1.1\r\nHost: x\r\n\r\n");
  auto got = c.read_until("answer /fast");
  auto slow = got.find("answer /slow");
  auto fast = got.find("answer /fast");
  ASSERT_NE(slow, std::string::npos) << got;
  ASSERT_NE(fast, std::string::npos) << got;
  EXPECT_LT(slow, fast) << "answers in request order";
  std::lock_guard<std::mutex> g(mtx);
  for (auto& w : workers)
    w.join();
}

namespace {

/// What a streamed call saw.
struct call_log {
  std::mutex mtx;
  int status = 0;
  std::string headers;
  std::vector<std::string> pieces;
  std::promise<std::string> done;

  http_call_handlers handlers() {
    return {[this](int s, std::vector<std::pair<std::string, std::string>> hs) {
              std::lock_guard<std::mutex> g(mtx);
              status = s;
              for (auto& [k, v] : hs)
                headers += k + ": " + v + "\n";
            },
            [this](std::string d) {
              std::lock_guard<std::mutex> g(mtx);
              pieces.push_back(std::move(d));
            },
            [this](const http_error& e) { done.set_value(e.message); }};
  }
  std::string joined() {
    std::lock_guard<std::mutex> g(mtx);
    std::string all;
    for (auto& p : pieces)
      all += p;
    return all;
  }
};

} // namespace

TEST(http_client, a_streamed_call_hands_on_pieces_as_they_arrive) {
  std::promise<void> second;
  auto second_f = second.get_future().share();
  std::vector<std::thread> workers;
  http_server server("127.0.0.1", 0, 1, {}, [&](http_request&& req, http_responder respond) {
    EXPECT_EQ(req.header("x-test"), "yes");
    workers.emplace_back([respond, second_f] {
      auto s = respond.stream(201, "text/event-stream", {{"x-up", "1"}});
      s.write("data: a\n\n");
      second_f.wait_for(5s);
      s.write("data: b\n\n");
      s.end();
    });
  });
  http_client client;
  call_log log;
  auto call = client.call("POST", "http://127.0.0.1:" + std::to_string(server.port()), "/x", "{}",
                          {{"x-test", "yes"}}, 1000ms, 5000ms, log.handlers());
  ASSERT_TRUE(call);
  test::eventually([&] { return !log.joined().empty(); }, 5s);
  EXPECT_EQ(log.joined(), "data: a\n\n") << "the first event, before the response ended";
  second.set_value();
  auto done = log.done.get_future();
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(done.get(), "");
  EXPECT_EQ(log.status, 201);
  EXPECT_NE(log.headers.find("x-up: 1"), std::string::npos) << log.headers;
  EXPECT_EQ(log.joined(), "data: a\n\ndata: b\n\n");
  for (auto& w : workers)
    w.join();
}

TEST(http_client, a_call_frames_its_request_itself) {
  std::mutex mtx;
  std::vector<std::pair<std::string, std::string>> seen;
  std::string body;
  http_server server("127.0.0.1", 0, 1, {}, [&](http_request&& req, http_responder respond) {
    {
      std::lock_guard<std::mutex> g(mtx);
      seen = req.headers;
      body = req.body;
    }
    respond(http_reply{});
  });
  auto url = "http://127.0.0.1:" + std::to_string(server.port());
  auto send = [&](std::vector<std::pair<std::string, std::string>> headers) {
    http_client client;
    call_log log;
    auto call =
      client.call("POST", url, "/x", "{\"a\":1}", headers, 1000ms, 5000ms, log.handlers());
    EXPECT_TRUE(call);
    auto done = log.done.get_future();
    EXPECT_EQ(done.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(done.get(), "");
    std::lock_guard<std::mutex> g(mtx);
    std::map<std::string, std::vector<std::string>> by_name;
    for (const auto& [k, v] : seen) {
      std::string lower;
      for (char c : k)
        lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      by_name[lower].push_back(v);
    }
    return by_name;
  };
  auto got = send({{"User-Agent", "client/1.0"},
                   {"Content-Length", "999"},
                   {"Host", "elsewhere"},
                   {"Transfer-Encoding", "chunked"},
                   {"x-split", "a\r\nx-injected: 1"},
                   {"x-kept", "yes"}});
  EXPECT_EQ(got["user-agent"], std::vector<std::string>{"client/1.0"}) << "the caller's agent";
  EXPECT_EQ(got["content-length"], std::vector<std::string>{"7"}) << "the body's own length";
  EXPECT_EQ(got["host"], std::vector<std::string>{"127.0.0.1:" + std::to_string(server.port())});
  EXPECT_EQ(got.count("transfer-encoding"), 0u);
  EXPECT_EQ(got.count("x-split"), 0u);
  EXPECT_EQ(got.count("x-injected"), 0u);
  EXPECT_EQ(got["x-kept"], std::vector<std::string>{"yes"});
  EXPECT_EQ(body, "{\"a\":1}");
  EXPECT_EQ(send({})["user-agent"], std::vector<std::string>{"llmgw"}) << "llmgw's when none";
}

TEST(http_client, cancelling_a_call_reaches_the_server_as_a_disconnect) {
  std::promise<void> gone;
  std::mutex mtx;
  std::vector<http_responder> held;
  http_server server("127.0.0.1", 0, 1, {}, [&](http_request&&, http_responder respond) {
    respond.on_disconnect([&gone] { gone.set_value(); });
    auto s = respond.stream(200, "text/event-stream");
    s.write("data: started\n\n");
    std::lock_guard<std::mutex> g(mtx);
    held.push_back(respond);
  });
  http_client client;
  call_log log;
  auto call = client.call("GET", "http://127.0.0.1:" + std::to_string(server.port()), "/", "", {},
                          1000ms, 5000ms, log.handlers());
  test::eventually([&] { return !log.joined().empty(); }, 5s);
  call->cancel();
  auto done = log.done.get_future();
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(done.get(), "cancelled");
  EXPECT_EQ(gone.get_future().wait_for(5s), std::future_status::ready)
    << "the upstream sees its client leave and can stop generating";
}

TEST(http_client, a_call_ends_at_its_deadline_before_or_during_the_answer) {
  silent_server silent;
  http_client client;
  auto url = "http://127.0.0.1:" + std::to_string(silent.server.port());
  call_log quiet;
  auto start = std::chrono::steady_clock::now();
  client.call("POST", url, "/", "{}", {}, 1000ms, 200ms, quiet.handlers());
  auto done = quiet.done.get_future();
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(done.get(), "read: timed out");
  EXPECT_EQ(quiet.status, 0) << "no head: a proxy may try elsewhere";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);

  // An answer that starts and then stalls ends at the same deadline.
  std::mutex mtx;
  std::vector<http_responder> held;
  http_server stalling("127.0.0.1", 0, 1, {}, [&](http_request&&, http_responder respond) {
    auto s = respond.stream(200, "text/event-stream");
    s.write("data: first\n\n");
    std::lock_guard<std::mutex> g(mtx);
    held.push_back(respond);
  });
  call_log stalled;
  client.call("GET", "http://127.0.0.1:" + std::to_string(stalling.port()), "/", "", {}, 1000ms,
              300ms, stalled.handlers());
  auto ended = stalled.done.get_future();
  ASSERT_EQ(ended.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(ended.get(), "read: timed out");
  EXPECT_EQ(stalled.status, 200);
  EXPECT_EQ(stalled.joined(), "data: first\n\n");
  stalling.stop();
}

// The first-byte deadline of a streamed request through the gateway.
TEST(http_client, a_head_deadline_bounds_the_wait_for_the_answer_to_begin) {
  http_client client;
  // No answer at all: the head's deadline ends the call, long before the
  // whole call's.
  silent_server silent;
  call_log quiet;
  auto start = std::chrono::steady_clock::now();
  client.call("POST", "http://127.0.0.1:" + std::to_string(silent.server.port()), "/", "{}", {},
              1000ms, 30s, quiet.handlers(), 200ms);
  auto done = quiet.done.get_future();
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(done.get(), "read: no answer began within 200 ms");
  EXPECT_EQ(quiet.status, 0) << "no head: a proxy may try elsewhere";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);

  // An interim answer (100, 103) is not the answer: it does not stop the
  // head's deadline.
  test::interim_engine stalling;
  stalling.stall_after_interim();
  call_log interim;
  client.call("POST", stalling.url(), "/", "{}", {}, 1000ms, 30s, interim.handlers(), 200ms);
  auto ended = interim.done.get_future();
  ASSERT_EQ(ended.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(ended.get(), "read: no answer began within 200 ms");
  EXPECT_EQ(interim.status, 0);

  // Once the answer began, the whole call's deadline holds, not the head's.
  std::mutex mtx;
  std::vector<http_responder> held;
  http_server begun("127.0.0.1", 0, 1, {}, [&](http_request&&, http_responder respond) {
    auto s = respond.stream(200, "text/event-stream");
    s.write("data: first\n\n");
    std::lock_guard<std::mutex> g(mtx);
    held.push_back(respond);
  });
  call_log slow;
  auto sent = std::chrono::steady_clock::now();
  client.call("POST", "http://127.0.0.1:" + std::to_string(begun.port()), "/", "{}", {}, 1000ms,
              600ms, slow.handlers(), 100ms);
  auto over = slow.done.get_future();
  ASSERT_EQ(over.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(over.get(), "read: timed out");
  EXPECT_EQ(slow.status, 200);
  EXPECT_GE(std::chrono::steady_clock::now() - sent, 550ms) << "not the head's 100 ms";
  begun.stop();
}

TEST(http_client, a_refused_call_reports_before_any_head) {
  http_client client;
  call_log log;
  client.call("POST", "http://127.0.0.1:1", "/", "{}", {}, 1000ms, 5000ms, log.handlers());
  auto done = log.done.get_future();
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(done.get().rfind("connect: ", 0), 0u);
  EXPECT_EQ(log.status, 0) << "no head: a proxy may try elsewhere";
}

namespace {

/// One streamed call, waited for: what it got, and how it ended.
struct call_result {
  int status = 0;
  std::string body;
  std::string error;
};

call_result call_once(http_client& client, const std::string& url, const std::string& body) {
  call_log log;
  client.call("POST", url, "/v1/completions", body, {}, 1000ms, 5000ms, log.handlers());
  auto done = log.done.get_future();
  EXPECT_EQ(done.wait_for(5s), std::future_status::ready);
  call_result r;
  r.error = done.get();
  r.status = log.status;
  r.body = log.joined();
  return r;
}

} // namespace

TEST(http_client, interim_answers_are_skipped_and_each_call_reads_its_own_answer) {
  // Before: the 100 was taken for the final answer, the connection went back
  // to the pool with the real answer still coming, and each later call read
  // the answer of the call before it.
  test::interim_engine engine;
  http_client client;
  for (int i = 0; i < 4; ++i) {
    auto body = R"({"call":)" + std::to_string(i) + "}";
    auto r = call_once(client, engine.url(), body);
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.status, 200) << "call " << i;
    EXPECT_EQ(r.body, body) << "call " << i << " read another call's answer";
  }
  EXPECT_EQ(engine.reused(), 3) << "one connection, reused after each complete final answer";
  auto whole = post(engine.port(), "/tokenize", R"({"whole":1})");
  EXPECT_EQ(whole.status, 200) << whole.error;
  EXPECT_EQ(whole.body, R"({"whole":1})");
}

TEST(http_client, a_pooled_connection_with_unasked_bytes_is_not_reused) {
  // A broken upstream sends a second answer after the first: it belongs to
  // no call, and the next call must not read it as its own.
  test::interim_engine engine;
  engine.send_strays();
  http_client client;
  EXPECT_EQ(call_once(client, engine.url(), R"({"n":1})").body, R"({"n":1})");
  test::eventually([&] { return engine.strays_sent() != 0; }, 5s);
  ASSERT_EQ(engine.strays_sent(), 1);
  auto second = call_once(client, engine.url(), R"({"n":2})");
  EXPECT_EQ(second.status, 200);
  EXPECT_EQ(second.body, R"({"n":2})") << "the stray answer was read as this call's";
  EXPECT_EQ(engine.reused(), 0) << "the connection that carried a stray answer was closed";
}

TEST(http_server, expect_100_continue_is_answered_here_and_other_expectations_refused) {
  http_server server("127.0.0.1", 0, 1, {}, echo_handler());
  raw_client c(server.port());
  c.send("POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
  auto interim = c.read_until("\r\n\r\n");
  EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n") << "the client waits for it to send";
  c.send("body");
  auto got = c.read_until("POST /e body");
  EXPECT_NE(got.find("HTTP/1.1 200 OK\r\n"), std::string::npos) << got;
  auto other = raw_exchange(server.port(), "POST / HTTP/1.1\r\nHost: x\r\nExpect: magic\r\n"
                                           "Content-Length: 1\r\n\r\nx");
  EXPECT_EQ(other.rfind("HTTP/1.1 417", 0), 0u) << other;
  EXPECT_NE(other.find("'magic' is not supported"), std::string::npos) << other;
  EXPECT_EQ(server.counters().unsupported.load(), 1u);
}

TEST(http_server, a_transfer_coding_other_than_chunked_gets_501) {
  http_server server("127.0.0.1", 0, 1, {}, echo_handler());
  for (const char* coding : {"gzip", "gzip, chunked", "identity"}) {
    auto got = raw_exchange(server.port(), std::string("POST / HTTP/1.1\r\nHost: x\r\n"
                                                       "Transfer-Encoding: ")
                                             + coding + "\r\n\r\n1\r\nx\r\n0\r\n\r\n");
    EXPECT_EQ(got.rfind("HTTP/1.1 501", 0), 0u) << coding << ": " << got;
  }
  EXPECT_EQ(server.counters().unsupported.load(), 3u);
  auto chunked = raw_exchange(server.port(), "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                                             "chunked\r\nConnection: close\r\n\r\n"
                                             "1\r\nx\r\n0\r\n\r\n");
  EXPECT_NE(chunked.find("POST /c x"), std::string::npos) << chunked;
}

TEST(http_server, a_stream_to_an_http10_client_is_close_delimited_with_one_cache_control) {
  std::vector<std::thread> workers;
  http_server server("127.0.0.1", 0, 1, {}, [&](http_request&&, http_responder respond) {
    workers.emplace_back([respond] {
      auto s = respond.stream(200, "text/event-stream", {{"Cache-Control", "no-store"}});
      s.write("data: one\n\n");
      s.write("data: two\n\n");
      s.end();
    });
  });
  auto old = raw_exchange(server.port(), "GET /sse HTTP/1.0\r\nHost: x\r\n\r\n");
  EXPECT_EQ(old.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << old;
  EXPECT_EQ(old.find("chunked"), std::string::npos) << "HTTP/1.0 has no chunked coding: " << old;
  EXPECT_NE(old.find("Connection: close\r\n"), std::string::npos) << old;
  EXPECT_EQ(old.substr(old.find("\r\n\r\n") + 4), "data: one\n\ndata: two\n\n") << old;
  auto modern =
    raw_exchange(server.port(), "GET /sse HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_NE(modern.find("Transfer-Encoding: chunked"), std::string::npos) << modern;
  for (const auto& got : {old, modern}) {
    auto first = got.find("Cache-Control");
    EXPECT_NE(first, std::string::npos) << got;
    EXPECT_EQ(got.find("Cache-Control", first + 1), std::string::npos) << "twice: " << got;
    EXPECT_NE(got.find("Cache-Control: no-store\r\n"), std::string::npos) << "the handler's own";
  }
  for (auto& w : workers)
    w.join();
}

TEST(http_server, idle_connections_make_room_for_new_ones) {
  // Before: 4,100 idle connections made every client get 503.
  http_server_limits limits;
  limits.max_connections = 4;
  http_server server("127.0.0.1", 0, 1, limits, echo_handler());
  std::vector<std::unique_ptr<raw_client>> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<raw_client>(server.port()));
    // One at a time, so the first is the one idle longest.
    test::eventually([&] { return server.counters().open.load() >= static_cast<unsigned>(i + 1); },
                     5s);
  }
  idle[3]->send("GET /half HTTP/1.1\r\nHost"); // half a head: idle too
  auto r = post(server.port(), "/work", "x");
  EXPECT_EQ(r.status, 200) << "a client with a request gets in";
  EXPECT_EQ(r.body, "POST /work x");
  EXPECT_EQ(server.counters().evicted.load(), 1u);
  EXPECT_EQ(server.counters().rejected_connections.load(), 0u);
  EXPECT_TRUE(idle[0]->closed_by_server()) << "the one idle longest was closed";
  // The others still work.
  for (int i : {1, 2}) {
    idle[static_cast<std::size_t>(i)]->send("GET /still HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_NE(idle[static_cast<std::size_t>(i)]->read_until("GET /still").find("GET /still"),
              std::string::npos)
      << i;
  }
}

TEST(http_server, one_address_cannot_take_every_connection) {
  http_server_limits limits;
  limits.max_connections_per_client = 2;
  http_server server("127.0.0.1", 0, 1, limits, echo_handler());
  auto a = std::make_unique<raw_client>(server.port());
  raw_client b(server.port());
  test::eventually([&] { return server.counters().open.load() >= 2; }, 5s);
  auto third = raw_exchange(server.port(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(third.rfind("HTTP/1.1 503", 0), 0u) << third;
  EXPECT_NE(third.find("too many open connections from this address"), std::string::npos);
  EXPECT_NE(third.find("Retry-After: 1\r\n"), std::string::npos) << third;
  EXPECT_EQ(server.counters().rejected_per_client.load(), 1u);
  a.reset(); // one closes: its slot is free again
  test::eventually([&] { return server.counters().open.load() <= 1; }, 5s);
  auto fourth =
    raw_exchange(server.port(), "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(fourth.rfind("HTTP/1.1 200", 0), 0u) << fourth;
}

TEST(http_server, bodies_held_at_once_are_bounded_and_returned) {
  http_server_limits limits;
  limits.max_body_bytes = 100 << 10; // so one address may hold the whole budget
  limits.max_buffered_body_bytes = 100 << 10;
  http_server server("127.0.0.1", 0, 1, limits, echo_handler());
  auto head = [](std::size_t length, const char* extra = "") {
    return "POST /b HTTP/1.1\r\nHost: x\r\n" + std::string(extra)
           + "Content-Length: " + std::to_string(length) + "\r\n\r\n";
  };
  auto a = std::make_unique<raw_client>(server.port());
  a->send(head(60000) + std::string(30000, 'a')); // half a body, held
  test::eventually([&] { return server.counters().buffered_body_bytes.load() != 0; }, 500ms);
  EXPECT_EQ(server.counters().buffered_body_bytes.load(), 60000u);
  auto over = raw_exchange(server.port(), head(60000) + std::string(60000, 'b'));
  EXPECT_EQ(over.rfind("HTTP/1.1 503", 0), 0u) << over;
  EXPECT_NE(over.find("Retry-After: 1\r\n"), std::string::npos) << over;
  // A client that waits for 100 Continue is told at once, before it sends.
  raw_client waiting(server.port());
  waiting.send(head(60000, "Expect: 100-continue\r\n"));
  auto told = waiting.read_until("\r\n\r\n");
  EXPECT_EQ(told.rfind("HTTP/1.1 503", 0), 0u) << told;
  EXPECT_EQ(server.counters().over_body_budget.load(), 2u);
  auto small = post(server.port(), "/", std::string(30000, 's'));
  EXPECT_EQ(small.status, 200) << "what fits beside it is served";
  a.reset(); // the half-sent body's client goes
  test::eventually([&] { return server.counters().buffered_body_bytes.load() == 0; }, 500ms);
  EXPECT_EQ(server.counters().buffered_body_bytes.load(), 0u) << "its share is given back";
  EXPECT_EQ(post(server.port(), "/", std::string(60000, 'c')).status, 200);
  EXPECT_EQ(server.counters().buffered_body_bytes.load(), 0u);
}

TEST(http_server, a_client_that_half_closes_after_its_request_still_gets_its_answer) {
  std::promise<void> go;
  auto go_f = go.get_future().share();
  std::vector<std::thread> workers;
  std::atomic<int> gone{0};
  http_server server("127.0.0.1", 0, 1, {}, [&](http_request&& req, http_responder respond) {
    respond.on_disconnect([&gone] { ++gone; });
    workers.emplace_back([respond, go_f, body = req.body] {
      go_f.wait_for(10s);
      respond(http_reply{200, "text/plain", "answer to " + body, {}});
    });
  });
  raw_client c(server.port());
  c.send("POST /q HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc");
  c.shut_write(); // as `printf ... | nc -N` does: nothing more to send
  // The server cannot tell a half-close from a close without writing: its
  // interim 100 is the sign it saw the end of the request side.
  auto got = c.read_until("100 Continue\r\n\r\n");
  EXPECT_EQ(got, "HTTP/1.1 100 Continue\r\n\r\n");
  go.set_value();
  got = c.read_until("answer to abc");
  EXPECT_NE(got.find("HTTP/1.1 200 OK\r\n"), std::string::npos) << got;
  EXPECT_NE(got.find("Connection: close\r\n"), std::string::npos) << "nothing more can come";
  EXPECT_TRUE(c.closed_by_server());
  EXPECT_EQ(gone.load(), 0) << "a half-closed client is no client that left";
  for (auto& w : workers)
    w.join();
}

TEST(http_server, one_address_holds_an_eighth_of_the_body_budget) {
  http_server_limits limits;
  limits.max_body_bytes = 10000;
  limits.max_buffered_body_bytes = 160000; // an address's share: 20000
  http_server server("127.0.0.1", 0, 1, limits, echo_handler());
  std::vector<std::unique_ptr<raw_client>> held;
  for (int i = 0; i < 2; ++i) { // two bodies of 10000, never finished
    held.push_back(std::make_unique<raw_client>(server.port()));
    held.back()->send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10000\r\n\r\nabc");
  }
  test::eventually([&] { return server.counters().buffered_body_bytes.load() >= 20000; }, 500ms);
  ASSERT_EQ(server.counters().buffered_body_bytes.load(), 20000u);
  auto third =
    raw_exchange(server.port(), "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n12345");
  EXPECT_EQ(third.rfind("HTTP/1.1 503", 0), 0u) << "its share is taken, though the budget is not";
  EXPECT_EQ(server.counters().over_body_budget.load(), 1u);
  held.clear();
  test::eventually([&] { return server.counters().buffered_body_bytes.load() == 0; }, 500ms);
  auto later = raw_exchange(server.port(), "POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                           "Content-Length: 5\r\n\r\n12345");
  EXPECT_EQ(later.rfind("HTTP/1.1 200", 0), 0u) << later;
}
