// SIGHUP: a node reads its topology again while traffic flows. An engine
// removed from the file leaves every index while the requests already sent
// to it finish; one added is forwarded and routed on its KV state; the
// engine left alone keeps its state (no new session, no drop); a file with
// problems is refused, counted, and changes nothing.
#include "tests/integration/test_cluster.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <future>
#include <sstream>

using namespace llmgw;
using namespace std::chrono_literals;
namespace json = boost::json;

namespace {

/// One streamed completion: who served it and what came back.
struct stream_outcome {
  int status = 0;
  std::string replica;
  std::string body;
  bool complete = false;
};

class reload : public ::testing::Test {
protected:
  reload()
    : nodes(
      {{"control-1", true, false, "127.0.0.1", {}},
       {"agent-a", false, true, "127.0.0.1", {test::sim_engine("s0"), fixed_events_port("s1")}}}),
      c(nodes) {}

  /// A sim whose subscribers bind ports the topology names (two ranks: a
  /// launched engine of one rank uses a private ipc socket instead). When
  /// it changes, its new subscribers bind the same ports, free only once
  /// the old ones are gone.
  static test::test_engine_spec fixed_events_port(const std::string& replica) {
    auto e = test::sim_engine(replica);
    e.dp_size = 2;
    e.events_port = test::free_port_run(2);
    return e;
  }

  void SetUp() override {
    c.start("control-1");
    c.start("agent-a");
    ASSERT_TRUE(c.wait_ready("control-1", 20s)) << c.log_of("control-1");
    ASSERT_TRUE(c.eventually([&] { return in_step({"s0", "s1"}); }, 30s)) << c.log_of("agent-a");
  }

  /// The control node's entry of `replica` (rank 0), or null.
  const json::object* rank0(const json::value& view, const std::string& replica) {
    if (!view.is_object())
      return nullptr;
    for (const auto& r : view.at("replicas").as_array())
      if (r.at("replica").as_string() == replica.c_str()) {
        const auto& ranks = r.at("ranks").as_array();
        return ranks.empty() ? nullptr : &ranks[0].as_object();
      }
    return nullptr;
  }

  bool listed(const std::string& replica) {
    auto view = c.replicas("control-1");
    if (!view.is_object())
      return true;
    for (const auto& r : view.at("replicas").as_array())
      if (r.at("replica").as_string() == replica.c_str())
        return true;
    return false;
  }

  /// The agent's mirror of each replica's rank 0, by fingerprint.
  std::map<std::string, std::string> mirrors() {
    std::map<std::string, std::string> out;
    auto m = c.mirrors("agent-a");
    if (m.is_object())
      for (const auto& x : m.at("mirrors").as_array())
        if (x.at("dp_rank").to_number<std::int64_t>() == 0)
          out[json::value_to<std::string>(x.at("replica"))] =
            json::value_to<std::string>(x.at("fingerprint"));
    return out;
  }

  /// Every replica of `replicas` has state at the control node equal to
  /// the agent's mirror.
  bool in_step(const std::vector<std::string>& replicas) {
    auto mirror = mirrors();
    auto view = c.replicas("control-1");
    for (const auto& r : replicas) {
      const auto* x = rank0(view, r);
      if (!x || !x->at("has_state").as_bool() || !mirror.count(r)
          || x->at("fingerprint").as_string() != mirror[r].c_str())
        return false;
    }
    return true;
  }

  /// A completion streamed through the gateway, long enough to be in
  /// flight across a reload.
  std::future<stream_outcome> stream(int n) {
    auto done = std::make_shared<std::promise<stream_outcome>>();
    auto out = std::make_shared<stream_outcome>();
    http_call_handlers h;
    h.on_head = [out](int status, const std::vector<std::pair<std::string, std::string>>& hs) {
      out->status = status;
      for (const auto& [k, v] : hs)
        if (k == "x-llmgw-replica")
          out->replica = v;
    };
    h.on_data = [out](const std::string& data) { out->body += data; };
    h.on_done = [out, done](const http_error& e) {
      out->complete = e.ok();
      done->set_value(*out);
    };
    json::object body{{"model", "m"},
                      {"prompt", std::to_string(n) + ": a story"},
                      {"max_tokens", 400},
                      {"ignore_eos", true},
                      {"stream", true}};
    http.call("POST", c.gateway_url("control-1"), "/v1/completions", json::serialize(body), {}, 2s,
              60s, std::move(h));
    return done->get_future();
  }

  double metric(const std::string& node, const std::string& sample) {
    auto r = c.admin_get(node, "/metrics");
    std::istringstream in(r.body);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind(sample + " ", 0) == 0)
        return std::stod(line.substr(sample.size() + 1));
    return -1;
  }

  std::vector<test::test_node_spec> nodes;
  test::test_cluster c;
  http_client http;
};

} // namespace

TEST_F(reload, engines_come_and_go_while_the_others_keep_their_state) {
  auto sessions = metric("control-1", "llmgw_agent_sessions_total");
  ASSERT_GE(sessions, 1);
  // Streams in flight on both engines when the file changes.
  std::vector<std::future<stream_outcome>> streams;
  auto both_busy = [&] {
    auto v = c.replicas("control-1");
    std::size_t busy = 0;
    for (const auto& r : v.at("replicas").as_array())
      busy += r.at("outstanding").as_int64() > 0;
    return busy == 2;
  };
  // The router spreads load, but may put a few on one engine first.
  for (int i = 0; i < 16 && !both_busy(); ++i) {
    streams.push_back(stream(i));
    c.eventually([&] { return both_busy(); }, 200ms);
  }
  ASSERT_TRUE(both_busy()) << "both engines are serving";

  // s1 leaves, s2 arrives; s0 stays as it was.
  auto changed = nodes;
  changed[1].engines = {test::sim_engine("s0"), test::sim_engine("s2")};
  c.write_topology(changed, "cluster.toml");
  ASSERT_EQ(c.topology_path(), c.dir() + "/cluster.toml");
  auto hup = std::chrono::steady_clock::now();
  c.signal("control-1", SIGHUP);
  c.signal("agent-a", SIGHUP);
  auto ms_since_hup = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - hup)
      .count();
  };

  EXPECT_TRUE(c.eventually([&] { return !listed("s1"); }, 10s)) << c.log_of("control-1");
  auto removed_ms = ms_since_hup();
  EXPECT_TRUE(c.eventually(
    [&] {
      return in_step({"s0", "s2"});
    },
    30s))
    << "the added engine's state reaches the control node\n"
    << c.log_of("agent-a");
  auto added_ms = ms_since_hup();
  EXPECT_EQ(mirrors().count("s1"), 0u) << "the agent stopped its mirror";
  EXPECT_EQ(metric("control-1", "llmgw_agent_sessions_total"), sessions)
    << "no new session: s0's state was never dropped";
  EXPECT_EQ(metric("control-1", "llmgw_topology_reloads_total{outcome=\"applied\"}"), 1);
  EXPECT_EQ(metric("agent-a", "llmgw_topology_reloads_total{outcome=\"applied\"}"), 1);

  std::set<std::string> served;
  for (auto& f : streams) {
    ASSERT_EQ(f.wait_for(60s), std::future_status::ready);
    auto o = f.get();
    served.insert(o.replica);
    EXPECT_EQ(o.status, 200);
    EXPECT_TRUE(o.complete);
    EXPECT_NE(o.body.find("data: [DONE]"), std::string::npos)
      << o.replica << " did not finish its stream: " << o.body.substr(0, 300);
  }
  EXPECT_TRUE(served.count("s1")) << "a stream was in flight on the removed engine";
  std::printf("[reload] s1 out of the index %.0f ms after SIGHUP, s2 (a new engine, launched) "
              "in step %.0f ms after; %zu streams in flight, all finished\n",
              removed_ms, added_ms, streams.size());

  // New requests go to the engines in force, and the new one is routed on
  // its KV state.
  for (int i = 0; i < 8; ++i) {
    json::object body{{"model", "m"}, {"prompt", "again " + std::to_string(i)}, {"max_tokens", 2}};
    auto r = c.post("control-1", "/v1/completions", json::serialize(body));
    EXPECT_EQ(r.status, 200) << r.body;
  }
}

TEST_F(reload, a_file_with_problems_is_refused_and_the_topology_in_force_stays) {
  {
    std::ofstream out(c.topology_path(), std::ios::app);
    out << "\n[[node]]\nname = \"agent-a\"\nroles = [\"agent\"]\n"; // a second agent-a
  }
  c.signal("control-1", SIGHUP);
  EXPECT_TRUE(c.eventually(
    [&] { return metric("control-1", "llmgw_topology_reloads_total{outcome=\"refused\"}") == 1; },
    10s));
  auto log = c.log_of("control-1");
  EXPECT_NE(log.find("reload refused"), std::string::npos) << log;
  EXPECT_NE(log.find("cluster.toml:"), std::string::npos)
    << "the problem is named with its line, as llmgw check names it\n"
    << log;
  EXPECT_TRUE(in_step({"s0", "s1"})) << "nothing changed";
  json::object body{{"model", "m"}, {"prompt", "still here"}, {"max_tokens", 2}};
  EXPECT_EQ(c.post("control-1", "/v1/completions", json::serialize(body)).status, 200);
}

TEST_F(reload, a_change_that_needs_a_restart_is_refused_whole) {
  auto changed = nodes;
  changed[1].engines = {test::sim_engine("s0")}; // would be live...
  c.write_topology(changed, "cluster.toml");
  std::ofstream(c.topology_path(), std::ios::app)
    << "\n[gateway]\nmax_attempts = 7\n"; // ...this not
  c.signal("control-1", SIGHUP);
  EXPECT_TRUE(c.eventually(
    [&] { return metric("control-1", "llmgw_topology_reloads_total{outcome=\"refused\"}") == 1; },
    10s));
  EXPECT_NE(c.log_of("control-1").find("[gateway] differs"), std::string::npos);
  EXPECT_TRUE(listed("s1")) << "the removal did not take effect either";
}

TEST_F(reload, a_changed_engine_restarts_on_its_ports_and_the_unchanged_one_keeps_its_state) {
  auto sessions = metric("control-1", "llmgw_agent_sessions_total");
  auto s1_pid = c.sim_pid("s1");
  ASSERT_GT(s1_pid, 0);
  auto changed = nodes;
  changed[1].engines[1].model = "m2"; // the same ports, another model: a new engine
  c.write_topology(changed, "cluster.toml");
  auto log_before = c.log_of("agent-a").size();
  c.signal("control-1", SIGHUP);
  c.signal("agent-a", SIGHUP);
  // The old engine had to stop first: the new one binds the same HTTP port.
  EXPECT_TRUE(c.eventually(
    [&] {
      auto pid = c.sim_pid("s1");
      return pid > 0 && pid != s1_pid;
    },
    20s))
    << c.log_of("agent-a");
  EXPECT_TRUE(c.eventually(
    [&] {
      json::object body{{"model", "m2"}, {"prompt", "for the new model"}, {"max_tokens", 2}};
      return c.post("control-1", "/v1/completions", json::serialize(body)).status == 200;
    },
    20s))
    << c.log_of("agent-a");
  EXPECT_TRUE(c.eventually([&] { return in_step({"s0", "s1"}); }, 20s)) << c.log_of("agent-a");
  // Started once, and its subscriber bound the events port: a new engine
  // started beside the old one fails to bind its HTTP port, exits and is
  // restarted after a backoff; a new subscriber beside the old one fails to
  // bind the events port and the engine's state never reaches the index.
  auto since = c.log_of("agent-a").substr(log_before);
  EXPECT_EQ(since.find("engine s1: exited"), std::string::npos) << since;
  EXPECT_EQ(since.find("cannot"), std::string::npos) << since;
  EXPECT_EQ(metric("control-1", "llmgw_agent_sessions_total"), sessions);
  json::object old_model{{"model", "m"}, {"prompt", "still served by s0"}, {"max_tokens", 2}};
  EXPECT_EQ(c.post("control-1", "/v1/completions", json::serialize(old_model)).status, 200);
}

// An engine removed, then added back while its old process still drains
// (30 s by default): the new one needs the old one's ports, so the old one
// stops first and the new one starts once.
TEST_F(reload, a_replica_added_back_while_it_drains_starts_once) {
  auto s1_pid = c.sim_pid("s1");
  ASSERT_GT(s1_pid, 0);
  auto without = nodes;
  without[1].engines = {test::sim_engine("s0")};
  c.write_topology(without, "cluster.toml");
  c.signal("control-1", SIGHUP);
  c.signal("agent-a", SIGHUP);
  ASSERT_TRUE(c.eventually([&] { return !listed("s1") && mirrors().count("s1") == 0; }, 10s))
    << c.log_of("agent-a");
  EXPECT_EQ(c.sim_pid("s1"), s1_pid) << "the removed engine drains";
  auto log_before = c.log_of("agent-a").size();
  c.write_topology(nodes, "cluster.toml");
  c.signal("control-1", SIGHUP);
  c.signal("agent-a", SIGHUP);
  EXPECT_TRUE(c.eventually(
    [&] {
      auto pid = c.sim_pid("s1");
      return pid > 0 && pid != s1_pid;
    },
    20s))
    << c.log_of("agent-a");
  EXPECT_TRUE(c.eventually([&] { return in_step({"s0", "s1"}); }, 20s)) << c.log_of("agent-a");
  auto since = c.log_of("agent-a").substr(log_before);
  EXPECT_EQ(since.find("engine s1: exited"), std::string::npos)
    << "the new engine met the old one on its port\n"
    << since;
  EXPECT_NE(since.find("added back while its old engine drains"), std::string::npos) << since;
}
