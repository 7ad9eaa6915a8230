// The gateway's proxy against stand-in engines on loopback: relaying bodies,
// headers and event streams, trying the next replica, cutting short, client
// disconnects, data-parallel ranks, errors, and load accounting.
#include "actors/control.hpp"
#include "actors/registration.hpp"
#include "actors/router.hpp"
#include "actors/tokenizer.hpp"
#include "gateway/gateway.hpp"
#include "net/http_client.hpp"
#include "net/http_server.hpp"
#include "tests/integration/interim_engine.hpp"
#include "tests/support/eventually.hpp"
#include "wire/block_hash.hpp"

#include <boost/json.hpp>
#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <set>
#include <thread>

using namespace std::chrono_literals;
using namespace llmgw;
namespace json = boost::json;

namespace {

struct sys_config : caf::actor_system_config {
  sys_config() {
    register_message_types(*this);
    set("scheduler.max-threads", 2);
  }
};

/// A stand-in engine: records requests, answers as told.
struct fake_engine {
  enum class mode {
    json,
    sse,
    server_error,
    broken_server_error,
    fail_mid_stream,
    fail_before_first_token,
    hang
  };
  std::atomic<mode> how{mode::json};
  /// Cached prompt tokens a JSON answer reports (vLLM's usage), or -1: none.
  std::atomic<int> cached_tokens{-1};
  std::mutex mtx;
  std::vector<http_request> seen;
  std::vector<std::thread> workers;
  std::promise<void> release; ///< lets the second SSE event go
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> disconnects{0};
  std::atomic<int> render_calls{0}; ///< not in `seen`
  std::vector<http_responder> held;
  std::string name;
  std::unique_ptr<http_server> server;

  explicit fake_engine(std::string n) : name(std::move(n)) {
    server = std::make_unique<http_server>(
      "127.0.0.1", 0, 2, http_server_limits{}, [this](http_request&& req, http_responder respond) {
        std::lock_guard<std::mutex> g(mtx);
        if (req.target.size() > 7 && req.target.substr(req.target.size() - 7) == "/render") {
          ++render_calls; // vLLM without --enable-scale-out: not found
          respond(http_reply{404, "application/json", R"({"detail":"Not Found"})", {}});
          return;
        }
        seen.push_back(req);
        respond.on_disconnect([this] { ++disconnects; });
        if (req.target == "/tokenize") { // vLLM's shape; every prompt is 1..9
          respond(http_reply{200,
                             "application/json",
                             R"({"count":9,"max_model_len":4096,"tokens":[1,2,3,4,5,6,7,8,9]})",
                             {}});
          return;
        }
        switch (how.load()) {
        case mode::json:
          respond(http_reply{200,
                             "application/json",
                             R"({"id":"cmpl-1","served_by":")" + name + "\""
                               + (cached_tokens < 0
                                    ? std::string{}
                                    : R"(,"usage":{"prompt_tokens_details":{"cached_tokens": )"
                                        + std::to_string(cached_tokens.load()) + "}}")
                               + "}",
                             {{"x-engine", name}, {"connection", "keep-alive"}}});
          break;
        case mode::sse:
          workers.emplace_back([this, respond] {
            auto s = respond.stream(200, "text/event-stream; charset=utf-8");
            s.write("data: {\"n\":1}\n\n");
            released.wait_for(5s);
            s.write("data: {\"n\":2}\n\ndata: [DONE]\n\n");
            s.end();
          });
          break;
        case mode::server_error: // alive (its health says so), failing every request
          if (req.target == "/health") {
            respond(http_reply{200, "application/json", "{}", {}});
            break;
          }
          respond(http_reply{500,
                             "application/json",
                             R"({"error":{"message":"CUDA error","code":500}})",
                             {{"x-engine", name}}});
          break;
        case mode::broken_server_error: // a 500 head, part of a body, then the engine dies
          workers.emplace_back([respond] {
            auto s = respond.stream(500, "application/json");
            s.write(R"({"error":{"mess)");
            s.abort();
          });
          break;
        case mode::fail_mid_stream:
          workers.emplace_back([respond] {
            auto s = respond.stream(200, "text/event-stream");
            s.write("data: {\"n\":1}\n\n");
            std::this_thread::sleep_for(50ms);
            s.abort(); // the engine dies: the connection closes without an end
          });
          break;
        case mode::fail_before_first_token: // vLLM's head, then the engine dies
          workers.emplace_back([respond] {
            auto s = respond.stream(200, "text/event-stream");
            std::this_thread::sleep_for(50ms);
            s.abort();
          });
          break;
        case mode::hang:
          held.push_back(respond);
          break;
        }
      });
  }
  ~fake_engine() {
    server->stop();
    for (auto& w : workers)
      w.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server->port()); }
  /// Requests seen, /tokenize calls and health probes left out.
  std::size_t requests() {
    std::lock_guard<std::mutex> g(mtx);
    return static_cast<std::size_t>(std::count_if(seen.begin(), seen.end(), [](const auto& r) {
      return r.target != "/tokenize" && r.target != "/health";
    }));
  }
  std::size_t probes() {
    std::lock_guard<std::mutex> g(mtx);
    return static_cast<std::size_t>(
      std::count_if(seen.begin(), seen.end(), [](const auto& r) { return r.target == "/health"; }));
  }
  std::size_t tokenize_calls() {
    std::lock_guard<std::mutex> g(mtx);
    return static_cast<std::size_t>(std::count_if(
      seen.begin(), seen.end(), [](const auto& r) { return r.target == "/tokenize"; }));
  }
};

struct gateway_test : ::testing::Test {
  fake_engine e0{"e0"}, e1{"e1"};
  std::shared_ptr<config::topology> topo = std::make_shared<config::topology>();
  sys_config cfg;
  caf::actor_system sys{cfg};
  control_plane plane;
  std::unique_ptr<gateway> gw;
  http_client client;

  /// The URL the topology gives replica `e` (e0 or e1).
  virtual std::string url_of(const fake_engine& e) const { return e.url(); }
  /// Changes to the topology a test needs.
  virtual void adjust(config::topology&) const {}
  /// Whether the gateway also listens on an admin address.
  virtual bool with_admin() const { return false; }

  void SetUp() override {
    topo->seed = "0";
    topo->block_size = 4;
    topo->plaintext = true;
    topo->gateway.down_for = 60s;
    topo->gateway.health_interval =
      0ms; // probes would count as requests; tests that want them say so
    config::node_spec c;
    c.name = "control-1";
    c.roles.control = true;
    topo->nodes.push_back(c);
    config::node_spec a;
    a.name = "agent-a";
    a.roles.agent = true;
    for (auto* e : {&e0, &e1}) {
      config::engine_spec spec;
      spec.replica = e->name;
      spec.model = "m";
      spec.url = url_of(*e);
      spec.kv_events = true;
      spec.canary = false; // a fake engine here
      spec.dp_size = 2;
      a.engines.push_back(spec);
    }
    config::engine_spec dead; // nothing listens there
    dead.replica = "dead";
    dead.model = "only-dead";
    dead.url = "http://127.0.0.1:1";
    a.engines.push_back(dead);
    topo->nodes.push_back(a);
    adjust(*topo);
    plane = spawn_control_plane(sys, control_options{"control-1", topo, {}, {}, 64});
    gw = std::make_unique<gateway>(sys, topo, "127.0.0.1", 0, plane,
                                   with_admin() ? "127.0.0.1" : "", 0);
    ASSERT_NE(gw->port(), 0) << gw->error();
    ASSERT_EQ(gw->admin_port() != 0, with_admin());
  }

  void TearDown() override {
    gw->stop();
    stop_control_plane(plane);
  }

  std::string base() const { return "http://127.0.0.1:" + std::to_string(gw->port()); }

  /// A streamed request through the gateway, read as it arrives. What the
  /// call writes is shared with it: a reader may go before the call ends
  /// (a test's requests still held when the fixture stops the gateway).
  struct stream_reader {
    struct state {
      std::mutex mtx;
      std::string got;
      std::string error; ///< how the read ended ("" when whole)
      std::promise<void> done;
    };
    std::shared_ptr<state> st = std::make_shared<state>();
    std::shared_future<void> done = st->done.get_future().share();
    std::string text() const {
      std::lock_guard<std::mutex> g(st->mtx);
      return st->got;
    }
    std::string ended() const {
      std::lock_guard<std::mutex> g(st->mtx);
      return st->error;
    }
  };
  void stream(stream_reader& r, const std::string& path, const std::string& body) {
    auto st = r.st;
    client.call("POST", base(), path, body, {}, 2s, 10s,
                {[](int, std::vector<std::pair<std::string, std::string>>) {},
                 [st](std::string d) {
                   std::lock_guard<std::mutex> g(st->mtx);
                   st->got += d;
                 },
                 [st](const http_error& e) {
                   {
                     std::lock_guard<std::mutex> g(st->mtx);
                     st->error = e.message;
                   }
                   st->done.set_value();
                 }});
  }

  /// The gateway's /metrics text.
  std::string get_metrics() {
    std::promise<http_response> p;
    client.request("GET", base(), "/metrics", "", 5s,
                   [&p](http_response r) { p.set_value(std::move(r)); });
    return p.get_future().get().body;
  }

  /// A whole request through the gateway.
  struct answer {
    int status = 0;
    std::string headers;
    std::string body;
    std::string error;
  };
  answer post(const std::string& path, const std::string& body,
              std::vector<std::pair<std::string, std::string>> headers = {}) {
    answer a;
    std::promise<void> done;
    std::mutex mtx;
    client.call("POST", base(), path, body, std::move(headers), 2s, 10s,
                {[&](int s, std::vector<std::pair<std::string, std::string>> hs) {
                   std::lock_guard<std::mutex> g(mtx);
                   a.status = s;
                   for (auto& [k, v] : hs)
                     a.headers += k + ": " + v + "\n";
                 },
                 [&](std::string d) {
                   std::lock_guard<std::mutex> g(mtx);
                   a.body += d;
                 },
                 [&](const http_error& e) {
                   a.error = e.message;
                   done.set_value();
                 }});
    EXPECT_EQ(done.get_future().wait_for(15s), std::future_status::ready);
    std::lock_guard<std::mutex> g(mtx);
    return a;
  }

  /// Gives `replica` rank `rank` the blocks of `tokens` (as an agent would).
  void hold(const std::string& replica, std::uint32_t rank, const std::vector<std::uint32_t>& t) {
    wire::block_hasher h(topo->seed, topo->block_size);
    replica_update u;
    u.node = "agent-a";
    u.replica = replica;
    u.dp_rank = rank;
    u.reset = true;
    for (const auto& b : h.hash(t))
      u.added.push_back({b.key, kv::medium::gpu});
    caf::anon_send(plane.router, u);
    // The router applies it on its own thread: wait until the gateway's
    // decisions can see it.
    auto applied = [&] {
      return plane.shared_router->with([&](routing::router_core& core, routing::router_stats&) {
        auto held = core.kv().find(replica, rank);
        return held && core.kv().blocks().count(*held) == u.added.size();
      });
    };
    ASSERT_TRUE(test::eventually(applied))
      << replica << " rank " << rank << " never held the blocks";
  }

  json::value replicas() {
    std::promise<http_response> p;
    client.request("GET", base(), "/v1/kv/replicas", "", 5s,
                   [&p](http_response r) { p.set_value(std::move(r)); });
    return json::parse(p.get_future().get().body);
  }

  std::int64_t outstanding(const std::string& replica) {
    auto doc = replicas(); // a range-for over a temporary's member would dangle
    for (const auto& r : doc.at("replicas").as_array())
      if (r.at("replica") == replica.c_str())
        return r.at("outstanding").as_int64();
    return -1;
  }
};

const std::string body_ids =
  R"({"model": "m", "prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9], "max_tokens": 4})";

} // namespace

TEST_F(gateway_test, relays_the_answer_with_its_status_and_headers) {
  auto a = post("/v1/completions", body_ids, {{"Authorization", "Bearer k"}});
  EXPECT_EQ(a.status, 200) << a.body << a.error;
  auto served_by = json::parse(a.body).at("served_by").as_string();
  auto& engine = served_by == "e0" ? e0 : e1;
  EXPECT_NE(a.headers.find("x-engine: " + std::string(served_by)), std::string::npos) << a.headers;
  EXPECT_NE(a.headers.find("x-llmgw-replica: " + std::string(served_by)), std::string::npos);
  EXPECT_NE(a.headers.find("x-llmgw-tier: load"), std::string::npos) << "nothing is cached";
  ASSERT_EQ(engine.requests(), 1u);
  std::lock_guard<std::mutex> g(engine.mtx);
  EXPECT_EQ(engine.seen[0].body, body_ids) << "byte for byte";
  EXPECT_EQ(engine.seen[0].target, "/v1/completions");
  EXPECT_EQ(engine.seen[0].header("authorization"), "Bearer k");
}

TEST_F(gateway_test, an_event_stream_is_relayed_as_it_arrives) {
  e0.how = e1.how = fake_engine::mode::sse;
  stream_reader r;
  stream(r, "/v1/chat/completions",
         R"({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})");
  bool first = test::eventually([&] { return r.text() == "data: {\"n\":1}\n\n"; }, 5s);
  EXPECT_TRUE(first) << "the first event arrives before the engine sends the second: " << r.text();
  e0.release.set_value();
  e1.release.set_value();
  ASSERT_EQ(r.done.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(r.text(), "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n") << "byte for byte";
}

TEST_F(gateway_test, a_drain_refuses_new_requests_and_lets_a_stream_in_flight_finish) {
  e0.how = e1.how = fake_engine::mode::sse;
  stream_reader r;
  stream(r, "/v1/completions", R"({"model": "m", "prompt": "hi", "stream": true})");
  ASSERT_TRUE(test::eventually([&] { return !r.text().empty(); }));
  auto drained = std::async(std::launch::async, [&] { return gw->drain(10s); });
  auto healthz = [&] {
    std::promise<http_response> p;
    client.request("GET", base(), "/healthz", "", 5s,
                   [&p](http_response r) { p.set_value(std::move(r)); });
    return p.get_future().get();
  };
  ASSERT_TRUE(test::eventually([&] { return healthz().status == 503; }))
    << "a load balancer is told to stop sending";
  EXPECT_NE(healthz().body.find("draining"), std::string::npos);
  auto refused = post("/v1/completions", body_ids);
  EXPECT_EQ(refused.status, 503);
  EXPECT_NE(refused.body.find("draining"), std::string::npos) << refused.body;
  EXPECT_EQ(e0.requests() + e1.requests(), 1u) << "the new request went nowhere";
  EXPECT_EQ(drained.wait_for(100ms), std::future_status::timeout) << "the stream is still on";
  e0.release.set_value();
  e1.release.set_value();
  ASSERT_EQ(drained.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(drained.get()) << "every request in flight finished before the deadline";
  ASSERT_EQ(r.done.wait_for(10s), std::future_status::ready);
  EXPECT_NE(r.text().find("data: [DONE]"), std::string::npos)
    << "the stream ended whole: " << r.text();
}

TEST_F(gateway_test, a_drain_gives_up_at_its_deadline_and_answers_what_is_left) {
  e0.how = e1.how = fake_engine::mode::hang;
  std::promise<http_response> p;
  client.request("POST", base(), "/v1/completions", body_ids, 10s,
                 [&p](http_response r) { p.set_value(std::move(r)); });
  ASSERT_TRUE(test::eventually([&] { return e0.requests() + e1.requests() == 1; }));
  // 0, as drain_timeout_ms = 0: what is in flight is cut at once.
  EXPECT_FALSE(gw->drain(0ms)) << "the engine never answers";
  auto f = p.get_future();
  ASSERT_EQ(f.wait_for(10s), std::future_status::ready) << "not left hanging";
  auto a = f.get();
  EXPECT_EQ(a.status, 503) << a.body;
  EXPECT_NE(a.body.find("drain deadline"), std::string::npos) << a.body;
  EXPECT_EQ(e0.requests() + e1.requests(), 1u) << "not sent anywhere else";
}

// A stream still on when the drain deadline passes must not look whole: an
// error event in OpenAI's shape, then no last chunk (issue 14 saw a clean
// end of all 8 streams a SIGTERM'd control node had in flight).
TEST_F(gateway_test, a_stream_still_on_at_the_drain_deadline_ends_as_a_failure) {
  e0.how = e1.how = fake_engine::mode::sse;
  stream_reader r;
  stream(r, "/v1/completions", R"({"model": "m", "prompt": "hi", "stream": true})");
  ASSERT_TRUE(test::eventually([&] { return !r.text().empty(); }));
  EXPECT_FALSE(gw->drain(100ms)) << "the engine holds its second event back";
  ASSERT_EQ(r.done.wait_for(10s), std::future_status::ready);
  auto text = r.text();
  const std::string relayed = "data: {\"n\":1}\n\n";
  ASSERT_EQ(text.rfind(relayed, 0), 0u) << text;
  auto rest = text.substr(relayed.size());
  ASSERT_EQ(rest.rfind("data: ", 0), 0u) << rest;
  ASSERT_GE(rest.size(), 8u);
  auto event = json::parse(rest.substr(6, rest.size() - 8));
  EXPECT_EQ(event.at("error").at("code"), 503) << rest;
  EXPECT_EQ(text.find("[DONE]"), std::string::npos);
  EXPECT_FALSE(r.ended().empty()) << "no last chunk: the client's read fails";
  EXPECT_NE(get_metrics().find("llmgw_gateway_requests_cut_at_stop_total 1\n"), std::string::npos);
  e0.release.set_value();
  e1.release.set_value();
}

TEST_F(gateway_test, a_replica_that_refuses_is_skipped_and_marked_down) {
  e0.server->stop(); // e0 refuses connections from now on
  for (int i = 0; i < 4; ++i) {
    auto a = post("/v1/completions", body_ids);
    EXPECT_EQ(a.status, 200) << a.body;
    EXPECT_NE(a.headers.find("x-llmgw-replica: e1"), std::string::npos) << a.headers;
  }
  auto metrics = get_metrics();
  EXPECT_NE(metrics.find("llmgw_upstream_failures_total{replica=\"e0\",reason=\"connect\"} 1\n"),
            std::string::npos)
    << "tried once, then avoided while down: " << metrics;
  EXPECT_NE(metrics.find("llmgw_upstream_retries_total 1\n"), std::string::npos);
  EXPECT_EQ(e1.requests(), 4u);
}

TEST_F(gateway_test, a_server_error_goes_to_another_replica_and_three_in_a_row_mark_it_down) {
  e0.how = fake_engine::mode::server_error;
  int sent = 0;
  auto one = [&] {
    auto a = post("/v1/completions", body_ids);
    ++sent;
    EXPECT_EQ(a.status, 200) << "e1 answered instead: " << a.body;
    EXPECT_NE(a.headers.find("x-llmgw-replica: e1"), std::string::npos) << a.headers;
  };
  while (e0.requests() < 3 && sent < 40) // equal costs go in turn: e0 gets some
    one();
  ASSERT_EQ(e0.requests(), 3u);
  for (int i = 0; i < 5; ++i)
    one();
  EXPECT_EQ(e0.requests(), 3u) << "three server errors in a row, then avoided while down";
  EXPECT_EQ(e1.requests(), static_cast<std::size_t>(sent));
  auto metrics = get_metrics();
  EXPECT_NE(
    metrics.find("llmgw_upstream_failures_total{replica=\"e0\",reason=\"server_error\"} 3\n"),
    std::string::npos)
    << metrics;
  EXPECT_NE(metrics.find("llmgw_upstream_retries_total 3\n"), std::string::npos) << metrics;
}

// A reload that changes a replica makes a new entry of it: the errors its
// old entry answered are not the new one's (it may be another engine).
TEST_F(gateway_test, a_changed_replica_starts_its_server_error_count_over) {
  e0.how = fake_engine::mode::server_error;
  int sent = 0;
  auto one = [&] {
    auto a = post("/v1/completions", body_ids);
    ++sent;
    EXPECT_EQ(a.status, 200) << "e1 answered instead: " << a.body;
  };
  while (e0.requests() < 2 && sent < 40)
    one();
  ASSERT_EQ(e0.requests(), 2u) << "two server errors: one short of being marked down";
  auto changed = *topo;
  for (auto& n : changed.nodes)
    for (auto& e : n.engines)
      if (e.replica == "e0")
        e.lora = {"an-adapter"}; // a change: a new entry
  plane.shared_router->apply_topology(changed);
  while (e0.requests() < 5 && sent < 80)
    one();
  ASSERT_EQ(e0.requests(), 5u)
    << "the new entry is marked down after its own three server errors, not after one";
  for (int i = 0; i < 5; ++i)
    one();
  EXPECT_EQ(e0.requests(), 5u) << "and then avoided while down";
}

// A request sent to a replica's old entry can fail after a reload changed the
// replica: that server error is the old entry's and leaves the new entry's
// count alone.
TEST_F(gateway_test, a_late_server_error_of_an_old_entry_leaves_the_new_count_alone) {
  e0.how = fake_engine::mode::hang;
  std::vector<std::unique_ptr<stream_reader>> sent;
  auto send_one = [&] {
    sent.push_back(std::make_unique<stream_reader>());
    stream(*sent.back(), "/v1/completions", body_ids);
    return test::eventually([&] { return e0.requests() + e1.requests() >= sent.size(); }, 2s);
  };
  while (e0.requests() < 1 && sent.size() < 8)
    ASSERT_TRUE(send_one());
  ASSERT_EQ(e0.requests(), 1u) << "e0 holds one request of its old entry";
  auto changed = *topo;
  for (auto& n : changed.nodes)
    for (auto& e : n.engines)
      if (e.replica == "e0")
        e.lora = {"an-adapter"}; // a change: a new entry
  plane.shared_router->apply_topology(changed);
  e0.how = fake_engine::mode::server_error;
  int posted = 0;
  auto one = [&] {
    auto a = post("/v1/completions", body_ids);
    ++posted;
    EXPECT_EQ(a.status, 200) << "e1 answered instead: " << a.body;
  };
  while (e0.requests() < 3 && posted < 40)
    one();
  ASSERT_EQ(e0.requests(), 3u) << "two server errors of the new entry";
  auto retried = e1.requests();
  {
    std::lock_guard<std::mutex> g(e0.mtx);
    e0.held.at(0)(http_reply{500, "application/json", R"({"error":{"message":"late"}})", {}});
  }
  ASSERT_TRUE(test::eventually([&] { return e1.requests() > retried; }, 5s))
    << "the old entry's late error is retried on e1";
  while (e0.requests() < 4 && posted < 80)
    one();
  ASSERT_EQ(e0.requests(), 4u) << "the new entry's third server error";
  for (int i = 0; i < 5; ++i)
    one();
  EXPECT_EQ(e0.requests(), 4u) << "marked down after its own three in a row";
}

// A request sent to a replica's old entry ends after a reload changed the
// replica: its end is the old entry's, not the new one's load.
TEST_F(gateway_test, a_request_sent_before_a_change_ends_on_the_old_entry) {
  e0.how = e1.how = fake_engine::mode::hang;
  auto held_by_e0 = [&] {
    std::lock_guard<std::mutex> g(e0.mtx);
    return e0.held.size();
  };
  auto answer = [&](std::size_t i) {
    std::lock_guard<std::mutex> g(e0.mtx);
    e0.held.at(i)(http_reply{200, "application/json", R"({"id":"cmpl-1"})", {}});
  };
  // Sends requests until e0 holds `n` (the others wait on e1).
  std::vector<std::unique_ptr<stream_reader>> sent;
  std::vector<std::shared_future<void>> ended;
  auto until_e0_holds = [&](std::size_t n) {
    for (int i = 0; i < 8 && held_by_e0() < n; ++i) {
      sent.push_back(std::make_unique<stream_reader>());
      ended.push_back(sent.back()->done);
      stream(*sent.back(), "/v1/completions", body_ids);
      test::eventually(
        [&] {
          std::lock_guard<std::mutex> g(e1.mtx);
          return held_by_e0() + e1.held.size() >= sent.size();
        },
        2s);
    }
    return held_by_e0() == n;
  };
  auto ends_seen = [&] {
    return std::count_if(ended.begin(), ended.end(), [](const std::shared_future<void>& f) {
      return f.wait_for(0s) == std::future_status::ready;
    });
  };
  ASSERT_TRUE(until_e0_holds(1));
  EXPECT_EQ(outstanding("e0"), 1);
  auto changed = *topo;
  for (auto& n : changed.nodes)
    for (auto& e : n.engines)
      if (e.replica == "e0")
        e.lora = {"an-adapter"}; // a change: a new entry
  plane.shared_router->apply_topology(changed);
  EXPECT_EQ(outstanding("e0"), 0) << "the new entry starts with no load";
  ASSERT_TRUE(until_e0_holds(2));
  EXPECT_EQ(outstanding("e0"), 1) << "one request sent to the new entry";
  answer(0); // the request sent before the change ends (the router hears first)
  ASSERT_TRUE(test::eventually([&] { return ends_seen() == 1; }, 5s));
  EXPECT_EQ(outstanding("e0"), 1) << "the old entry's request did not take the new entry's load";
  answer(1);
  ASSERT_TRUE(test::eventually([&] { return ends_seen() == 2; }, 5s));
  EXPECT_EQ(outstanding("e0"), 0);
}

TEST_F(gateway_test, a_server_error_cut_short_leaves_nothing_in_the_next_attempts_answer) {
  e0.how = fake_engine::mode::broken_server_error;
  int sent = 0;
  while (e0.requests() == 0 && sent++ < 20) {
    auto a = post("/v1/completions", body_ids);
    EXPECT_EQ(a.status, 200);
    EXPECT_NE(a.headers.find("x-llmgw-replica: e1"), std::string::npos) << a.headers;
    EXPECT_EQ(a.headers.find("x-llmgw-replica: e0"), std::string::npos) << a.headers;
    EXPECT_EQ(json::parse(a.body).at("served_by"), "e1") << "e1's answer alone: " << a.body;
  }
  EXPECT_EQ(e0.requests(), 1u);
}

TEST_F(gateway_test, when_every_replica_answers_a_server_error_the_last_is_relayed) {
  e0.how = e1.how = fake_engine::mode::server_error;
  auto a = post("/v1/completions", body_ids);
  EXPECT_EQ(a.status, 500);
  EXPECT_NE(a.body.find("CUDA error"), std::string::npos) << "the engine's own words: " << a.body;
  EXPECT_EQ(e0.requests() + e1.requests(), 2u) << "each tried once";
  // A success clears a replica's count: errors must come in a row. Both
  // answer once (equal costs go in turn), then two more errors each.
  e0.how = e1.how = fake_engine::mode::json;
  std::set<std::string> answered;
  for (int i = 0; i < 10 && answered.size() < 2; ++i) {
    auto ok = post("/v1/completions", body_ids);
    ASSERT_EQ(ok.status, 200);
    answered.insert(ok.headers.find("x-llmgw-replica: e0") != std::string::npos ? "e0" : "e1");
  }
  ASSERT_EQ(answered.size(), 2u);
  // A request every replica fails is its own fault (a poison input): it
  // marks nobody down, however often it comes.
  auto before = e0.requests() + e1.requests();
  e0.how = e1.how = fake_engine::mode::server_error;
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(post("/v1/completions", body_ids).status, 500);
  EXPECT_EQ(e0.requests() + e1.requests(), before + 8) << "nobody was marked down";
  auto doc = replicas();
  for (const auto& r : doc.at("replicas").as_array())
    EXPECT_FALSE(r.at("down").as_bool()) << r;
}

TEST_F(gateway_test, a_stream_cut_short_ends_as_a_failure_the_client_notices) {
  e0.how = e1.how = fake_engine::mode::fail_mid_stream;
  auto a = post("/v1/completions", R"({"model": "m", "prompt": "x", "stream": true})");
  EXPECT_EQ(a.status, 200);
  const std::string relayed = "data: {\"n\":1}\n\n";
  ASSERT_EQ(a.body.rfind(relayed, 0), 0u) << "what was relayed stays: " << a.body;
  // Then an error event in OpenAI's shape (the openai client raises on it),
  // and no [DONE].
  auto rest = a.body.substr(relayed.size());
  ASSERT_EQ(rest.rfind("data: ", 0), 0u) << rest;
  ASSERT_GE(rest.size(), 8u);
  auto event = json::parse(rest.substr(6, rest.size() - 8));
  EXPECT_EQ(event.at("error").at("code"), 502) << rest;
  EXPECT_NE(event.at("error").at("message").as_string().find("failed mid-response"),
            std::string::npos);
  EXPECT_EQ(a.body.find("[DONE]"), std::string::npos);
  EXPECT_FALSE(a.error.empty()) << "the stream never ended properly: the client's read fails";
  EXPECT_EQ(e0.requests() + e1.requests(), 1u) << "nothing is retried once bytes were relayed";
}

// vLLM sends a stream's head before it schedules the request: an engine
// that dies before the first token relayed nothing but that head, so the
// gateway holds it back and another replica answers the whole stream.
TEST_F(gateway_test, a_stream_whose_engine_dies_before_its_first_token_goes_elsewhere) {
  e0.how = fake_engine::mode::fail_before_first_token;
  e1.how = fake_engine::mode::sse;
  e1.release.set_value();
  for (int i = 0; i < 4 && e0.requests() == 0; ++i) { // equal costs go in turn
    auto a = post("/v1/completions", R"({"model": "m", "prompt": "x", "stream": true})");
    EXPECT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(a.body, "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n") << "whole, from e1";
    EXPECT_NE(a.headers.find("x-llmgw-replica: e1"), std::string::npos) << a.headers;
    EXPECT_TRUE(a.error.empty()) << a.error;
  }
  ASSERT_EQ(e0.requests(), 1u) << "one stream was sent to e0 first";
  EXPECT_NE(
    get_metrics().find("llmgw_upstream_failures_total{replica=\"e0\",reason=\"broken\"} 1\n"),
    std::string::npos);
}

TEST_F(gateway_test, a_client_that_leaves_cancels_the_upstream_request) {
  e0.how = e1.how = fake_engine::mode::hang;
  auto call = client.call("POST", base(), "/v1/completions", body_ids, {}, 2s, 10s, {});
  test::eventually([&] { return e0.requests() + e1.requests() != 0; }, 5s);
  ASSERT_EQ(e0.requests() + e1.requests(), 1u);
  call->cancel();
  test::eventually([&] { return e0.disconnects + e1.disconnects != 0; }, 5s);
  EXPECT_EQ(e0.disconnects + e1.disconnects, 1) << "the engine can stop generating";
  test::eventually([&] { return outstanding("e0") == 0 && outstanding("e1") == 0; }, 1s);
  EXPECT_EQ(outstanding("e0") + outstanding("e1"), 0) << "the request no longer counts as load";
}

TEST_F(gateway_test, the_index_prediction_is_checked_against_the_cached_tokens_engines_report) {
  hold("e1", 0, {1, 2, 3, 4, 5, 6, 7, 8}); // two 4-token blocks of the 9-token prompt
  e1.cached_tokens = 4;                    // but the engine evicted the second meanwhile
  auto a = post("/v1/completions", body_ids);
  ASSERT_EQ(a.status, 200) << a.body;
  ASSERT_NE(a.headers.find("x-llmgw-tier: kv"), std::string::npos) << a.headers;
  // The answer corrected the index at once: no event said the engine
  // stored the second block again, so it is no longer claimed.
  auto doc = replicas();
  for (const auto& r : doc.at("replicas").as_array())
    if (r.at("replica") == "e1") {
      EXPECT_EQ(r.at("blocks").as_int64(), 1) << r;
      EXPECT_EQ(r.at("index_check").at("dropped_blocks").as_int64(), 1) << r;
      EXPECT_EQ(r.at("index_check").at("recent_shortfalls").as_int64(), 1) << r;
    }
  e1.cached_tokens = 8; // it has them both again (its own prefill computed the second)
  EXPECT_EQ(post("/v1/completions", body_ids).status, 200);
  auto metrics = get_metrics();
  for (const char* line : {"llmgw_kv_checked_answers_total{replica=\"e1\"} 2\n",
                           "llmgw_kv_predicted_cached_tokens_total{replica=\"e1\"} 12\n",
                           "llmgw_kv_reported_cached_tokens_total{replica=\"e1\"} 12\n",
                           "llmgw_kv_prediction_shortfalls_total{replica=\"e1\"} 1\n",
                           "llmgw_kv_shortfall_dropped_blocks_total{replica=\"e1\"} 1\n"})
    EXPECT_NE(metrics.find(line), std::string::npos) << line << "in:\n" << metrics;
}

TEST_F(gateway_test, the_rank_holding_the_prefix_is_named_for_the_engine) {
  hold("e1", 1, {1, 2, 3, 4, 5, 6, 7, 8});
  auto a = post("/v1/completions", body_ids);
  EXPECT_EQ(a.status, 200);
  EXPECT_NE(a.headers.find("x-llmgw-replica: e1"), std::string::npos) << a.headers;
  EXPECT_NE(a.headers.find("x-llmgw-tier: kv"), std::string::npos) << a.headers;
  std::lock_guard<std::mutex> g(e1.mtx);
  ASSERT_EQ(e1.seen.size(), 1u);
  EXPECT_EQ(e1.seen[0].header("x-data-parallel-rank"), "1");
}

TEST_F(gateway_test, errors_are_openai_json_with_the_right_status) {
  auto bad = post("/v1/completions", R"({"prompt": "x"})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(json::parse(bad.body).at("error").at("message"), "'model' must be a non-empty string");
  auto unknown = post("/v1/chat/completions",
                      R"({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(json::parse(unknown.body).at("error").at("type"), "NotFoundError");
  auto dead = post("/v1/completions", R"({"model": "only-dead", "prompt": [1, 2]})");
  EXPECT_EQ(dead.status, 502) << dead.body;
  EXPECT_NE(json::parse(dead.body).at("error").at("message").as_string().find("replica dead:"),
            json::string::npos)
    << dead.body;
  std::promise<http_response> p;
  client.request("GET", base(), "/v1/completions", "", 5s,
                 [&p](http_response r) { p.set_value(std::move(r)); });
  EXPECT_EQ(p.get_future().get().status, 405);
}

TEST_F(gateway_test, a_text_prompt_seen_before_is_not_tokenized_again) {
  const std::string body = R"({"model": "m", "prompt": "the same words", "max_tokens": 4})";
  hold("e1", 0, {1, 2, 3, 4, 5, 6, 7, 8});
  for (int i = 0; i < 3; ++i) {
    auto a = post("/v1/completions", body);
    EXPECT_EQ(a.status, 200) << a.body;
    EXPECT_NE(a.headers.find("x-llmgw-tier: kv"), std::string::npos)
      << "request " << i << " was hashed from the engine's tokens: " << a.headers;
  }
  EXPECT_EQ(e0.tokenize_calls() + e1.tokenize_calls(), 1u) << "then from the cache";
  auto metrics = get_metrics();
  EXPECT_NE(metrics.find("llmgw_tokenize_cache_hits_total 2\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("llmgw_tokenize_cache_misses_total 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("llmgw_tokenize_cache_entries 1\n"), std::string::npos);
  auto at = metrics.find("\nllmgw_tokenize_cache_bytes ");
  ASSERT_NE(at, std::string::npos) << metrics;
  EXPECT_GT(std::stod(metrics.substr(at + 28)), 256.0) << "one entry: its bytes and overhead";
}

TEST_F(gateway_test, finished_requests_leave_no_load_behind) {
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(post("/v1/completions", body_ids).status, 200);
  EXPECT_EQ(outstanding("e0"), 0);
  EXPECT_EQ(outstanding("e1"), 0);
  EXPECT_EQ(e0.requests(), 3u) << "by load, in turn";
  EXPECT_EQ(e1.requests(), 3u);
}

TEST_F(gateway_test, what_the_gateway_accepts_an_engine_takes_too) {
  // The stand-in engines' server takes a 16 KiB head, as uvicorn's h11 does.
  auto fits = post("/v1/completions", body_ids, {{"X-Pad", std::string(15u * 1024 - 600, 'h')}});
  EXPECT_EQ(fits.status, 200) << fits.body;
  EXPECT_EQ(e0.requests() + e1.requests(), 1u);
  auto over = post("/v1/completions", body_ids, {{"X-Pad", std::string(15u * 1024, 'h')}});
  EXPECT_EQ(over.status, 431) << "refused by the gateway, not by the engine behind it";
  EXPECT_EQ(e0.requests() + e1.requests(), 1u);
}

namespace {

/// The gateway in front of engines that send interim answers (100, 103)
/// before each final one, as uvicorn and Python's http.server may.
struct interim_gateway_test : gateway_test {
  test::interim_engine i0, i1;
  std::string url_of(const fake_engine& e) const override {
    return &e == &e0 ? i0.url() : i1.url();
  }
};

/// A request with a marker only its sender knows; the engines echo the body.
std::string marked_body(int client, int request) {
  return R"({"model": "m", "prompt": [1, 2, 3, 4, 5], "max_tokens": 1, "user": "client-)"
         + std::to_string(client) + "-request-" + std::to_string(request) + R"("})";
}

} // namespace

TEST_F(interim_gateway_test, concurrent_clients_each_get_exactly_their_own_answer) {
  // Before: the engine's 100 went to the client as its answer, and the pooled
  // connection carried the real answer to the next client.
  constexpr int clients = 8, requests = 6;
  std::vector<std::thread> threads;
  std::atomic<int> own{0};
  std::mutex mtx;
  std::vector<std::string> wrong;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      http_client mine; // a connection of its own
      for (int r = 0; r < requests; ++r) {
        auto body = marked_body(c, r);
        std::promise<std::pair<int, std::string>> got;
        auto answer = std::make_shared<std::pair<int, std::string>>();
        mine.call("POST", base(), "/v1/completions", body, {}, 2s, 10s,
                  {[answer](int s, const std::vector<std::pair<std::string, std::string>>&) {
                     answer->first = s;
                   },
                   [answer](const std::string& d) { answer->second += d; },
                   [&got, answer](const http_error&) { got.set_value(*answer); }});
        auto f = got.get_future();
        if (f.wait_for(15s) != std::future_status::ready)
          return;
        auto [status, text] = f.get();
        if (status == 200 && text == body) {
          ++own;
        } else {
          std::lock_guard<std::mutex> g(mtx);
          wrong.push_back(body + " got " + std::to_string(status) + " " + text);
        }
      }
    });
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(own.load(), clients * requests);
  for (const auto& w : wrong)
    ADD_FAILURE() << w;
  EXPECT_GT(i0.reused() + i1.reused(), 0) << "upstream connections were pooled and reused";
}

TEST_F(interim_gateway_test, expect_is_answered_by_the_gateway_and_never_forwarded) {
  auto body = marked_body(0, 0);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(gw->port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string head = "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: "
                     "application/json\r\nExpect: 100-continue\r\nConnection: close, X-Secret"
                     "\r\nX-Secret: s3cret\r\nX-Kept: yes\r\nContent-Length: "
                     + std::to_string(body.size()) + "\r\n\r\n";
  ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
  std::string got;
  char buf[4096];
  while (got.find("\r\n\r\n") == std::string::npos) { // the client waits for 100 to send
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  EXPECT_EQ(got, "HTTP/1.1 100 Continue\r\n\r\n") << "the gateway's own 100";
  ::send(fd, body.data(), body.size(), MSG_NOSIGNAL);
  for (;;) {
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    got.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  auto final_at = got.find("HTTP/1.1 200 OK\r\n");
  EXPECT_EQ(final_at, std::string("HTTP/1.1 100 Continue\r\n\r\n").size())
    << "no interim answer of the engine's reaches the client: " << got;
  EXPECT_EQ(got.substr(got.size() - body.size()), body) << got;
  EXPECT_EQ(got.find("X-Hop"), std::string::npos)
    << "the engine's Connection header named it for its hop alone: " << got;
  auto heads = i0.heads();
  auto more = i1.heads();
  heads.insert(heads.end(), more.begin(), more.end());
  ASSERT_EQ(heads.size(), 1u);
  EXPECT_EQ(heads[0].find("expect:"), std::string::npos) << heads[0];
  EXPECT_EQ(heads[0].find("x-secret"), std::string::npos)
    << "a header the Connection header names is for one hop only: " << heads[0];
  EXPECT_NE(heads[0].find("x-kept: yes"), std::string::npos) << heads[0];
}

namespace {

/// Streams' replicas must begin their answers within 300 ms.
struct gateway_first_byte_test : gateway_test {
  void adjust(config::topology& t) const override { t.gateway.first_byte_timeout = 300ms; }
};

} // namespace

// A replica that takes a stream and never begins its answer (no head: its
// server is stuck) is given up on at the first-byte deadline, and the
// stream goes to another replica, as nothing was relayed. Issue 14 saw
// such requests wait 6-9 s, and up to request_timeout_ms (10 minutes)
// with no health probes.
TEST_F(gateway_first_byte_test, a_stream_whose_replica_never_begins_goes_elsewhere) {
  e0.how = fake_engine::mode::hang;
  e1.how = fake_engine::mode::sse;
  e1.release.set_value();
  const std::string stream = R"({"model": "m", "prompt": "x", "stream": true})";
  for (int i = 0; i < 4 && e0.requests() == 0; ++i) { // equal costs go in turn
    auto a = post("/v1/completions", stream);
    EXPECT_EQ(a.status, 200) << a.body;
    EXPECT_NE(a.body.find("data: [DONE]"), std::string::npos) << "whole, from e1: " << a.body;
    EXPECT_NE(a.headers.find("x-llmgw-replica: e1"), std::string::npos) << a.headers;
  }
  ASSERT_EQ(e0.requests(), 1u) << "one stream was sent to e0 first";
  auto metrics = get_metrics();
  EXPECT_NE(metrics.find("llmgw_upstream_failures_total{replica=\"e0\",reason=\"timeout\"} 1\n"),
            std::string::npos)
    << metrics;
  EXPECT_NE(metrics.find("llmgw_upstream_retries_total 1\n"), std::string::npos);
}

namespace {

/// The gateway probes every replica's /health every 200 ms.
struct gateway_probe_test : gateway_test {
  void adjust(config::topology& t) const override {
    t.gateway.health_interval = 200ms;
    t.gateway.health_timeout = 200ms;
  }
  /// Whether /v1/kv/replicas says `replica` is down.
  bool down(const std::string& replica) {
    auto doc = replicas();
    for (const auto& r : doc.at("replicas").as_array())
      if (r.at("replica") == replica.c_str())
        return r.at("down").as_bool();
    ADD_FAILURE() << replica << " is not listed";
    return false;
  }
};

} // namespace

TEST_F(gateway_probe_test,
       a_frozen_replica_is_avoided_before_clients_find_it_and_back_when_it_answers) {
  e0.how = fake_engine::mode::hang; // accepts, never answers
  ASSERT_TRUE(test::eventually([&] { return down("e0"); }, 5s)) << "two probes timed out";
  EXPECT_GE(e0.probes(), 2u);
  EXPECT_FALSE(down("e1"));
  for (int i = 0; i < 3; ++i) {
    auto a = post("/v1/completions", body_ids);
    EXPECT_EQ(a.status, 200);
    EXPECT_NE(a.headers.find("x-llmgw-replica: e1"), std::string::npos) << a.headers;
  }
  EXPECT_EQ(e0.requests(), 0u) << "no client request waited on the frozen engine";
  e0.how = fake_engine::mode::json;
  EXPECT_TRUE(test::eventually([&] { return !down("e0"); }, 5s)) << "a probe succeeded";
}

TEST_F(gateway_probe_test, a_request_waiting_on_a_replica_that_froze_goes_elsewhere) {
  e0.how = fake_engine::mode::hang; // froze: accepts, never answers (probes neither)
  // Until its probes fail, requests may still go to e0 (equal costs go in
  // turn); one that does waits there until the probes declare e0 down.
  std::future<answer> waiting;
  for (int i = 0; i < 20 && e0.requests() == 0 && !down("e0"); ++i) {
    auto f = std::async(std::launch::async, [&] { return post("/v1/completions", body_ids); });
    if (!test::eventually([&] { return e0.requests() + e1.requests() > std::size_t(i); }))
      break;
    if (e0.requests() == 1) {
      waiting = std::move(f);
      break;
    }
    EXPECT_EQ(f.get().status, 200);
  }
  ASSERT_TRUE(waiting.valid()) << "no request reached e0 before its probes failed";
  ASSERT_EQ(waiting.wait_for(8s), std::future_status::ready)
    << "abandoned when e0 was declared down, not left for request_timeout_ms";
  auto a = waiting.get();
  EXPECT_EQ(a.status, 200) << a.body;
  EXPECT_NE(a.headers.find("x-llmgw-replica: e1"), std::string::npos) << a.headers;
  EXPECT_NE(
    get_metrics().find("llmgw_upstream_failures_total{replica=\"e0\",reason=\"replica_down\"} 1"),
    std::string::npos);
}

TEST_F(gateway_probe_test, ready_once_a_replica_that_is_up_has_reported_its_kv_state) {
  auto readyz = [&] {
    std::promise<http_response> p;
    client.request("GET", base(), "/readyz", "", 5s,
                   [&p](http_response r) { p.set_value(std::move(r)); });
    return p.get_future().get();
  };
  // e0 and e1 have KV events and no state yet; "dead" has none, and fails
  // its probes.
  auto r = readyz();
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("not ready"), std::string::npos) << r.body;
  hold("e1", 0, {1, 2, 3, 4});
  EXPECT_EQ(readyz().status, 200);
  e1.how = fake_engine::mode::hang; // its probes time out: avoided
  ASSERT_TRUE(test::eventually([&] { return down("e1"); }, 5s));
  r = readyz();
  EXPECT_EQ(r.status, 503) << "the only replica with state is avoided: " << r.body;
  e1.how = fake_engine::mode::json;
  ASSERT_TRUE(test::eventually([&] { return readyz().status == 200; }, 5s));
}

TEST_F(gateway_probe_test, server_errors_keep_a_replica_down_though_its_probes_succeed) {
  e0.how = fake_engine::mode::server_error; // its /health answers 200
  int sent = 0;
  while (e0.requests() < 3 && sent++ < 40)
    EXPECT_EQ(post("/v1/completions", body_ids).status, 200);
  ASSERT_EQ(e0.requests(), 3u);
  EXPECT_TRUE(down("e0")) << "marked down for mark_down_ms, 60 s here";
  auto probes = e0.probes();
  ASSERT_TRUE(test::eventually([&] { return e0.probes() >= probes + 3; }, 5s));
  EXPECT_TRUE(down("e0")) << "a live engine that fails requests stays avoided";
  auto metrics = get_metrics();
  EXPECT_NE(metrics.find("llmgw_health_probes_total{replica=\"e1\",outcome=\"ok\"}"),
            std::string::npos)
    << metrics;
  EXPECT_NE(metrics.find("llmgw_replica_up{replica=\"e0\"} 0\n"), std::string::npos) << metrics;
}

namespace {

/// Clients may hold at most two connections; health and metrics have an
/// admin listener of their own.
struct gateway_admin_test : gateway_test {
  void adjust(config::topology& t) const override { t.gateway.max_connections = 2; }
  bool with_admin() const override { return true; }
};

} // namespace

TEST_F(gateway_admin_test, health_and_metrics_answer_while_clients_hold_every_connection) {
  e0.how = e1.how = fake_engine::mode::hang;
  std::vector<std::shared_ptr<http_call>> held; // two requests the engines never answer
  for (int i = 0; i < 2; ++i)
    held.push_back(client.call("POST", base(), "/v1/completions", body_ids, {}, 2s, 30s, {}));
  test::eventually([&] { return e0.requests() + e1.requests() >= 2; }, 5s);
  ASSERT_EQ(e0.requests() + e1.requests(), 2u);
  auto get = [&](std::uint16_t port, const std::string& target) {
    std::promise<http_response> p;
    client.request("GET", "http://127.0.0.1:" + std::to_string(port), target, "", 5s,
                   [&p](http_response r) { p.set_value(std::move(r)); });
    return p.get_future().get();
  };
  EXPECT_EQ(get(gw->port(), "/healthz").status, 503) << "the gateway's port is full";
  EXPECT_EQ(get(gw->admin_port(), "/healthz").status, 200);
  auto metrics = get(gw->admin_port(), "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find(
              "llmgw_http_refused_total{listener=\"gateway\",reason=\"too_many_connections\"} 1\n"),
            std::string::npos)
    << metrics.body;
  EXPECT_NE(metrics.body.find("llmgw_http_open_connections{listener=\"gateway\"} 2\n"),
            std::string::npos);
  EXPECT_EQ(get(gw->admin_port(), "/v1/kv/replicas").status, 200);
  EXPECT_EQ(get(gw->admin_port(), "/v1/models").status, 404) << "only the admin endpoints";
  for (auto& h : held)
    h->cancel();
  test::eventually([&] { return e0.disconnects + e1.disconnects >= 2; }, 5s);
  EXPECT_EQ(get(gw->port(), "/metrics").status, 404) << "counters stay off the clients' port";
  EXPECT_EQ(get(gw->port(), "/v1/kv/replicas").status, 404);
  EXPECT_EQ(get(gw->port(), "/healthz").status, 200);
}
