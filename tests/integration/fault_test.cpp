// Faults injected into a running cluster of real processes while requests
// flow through the gateways and simulated engines publish KV events: two
// control nodes, two agents, four llmgw-sim engines, 20 requests a second.
// Each test checks what issue 14 asks of every fault:
//   - no request is lost: each gets an answer (a 200, or an error answer),
//     none hangs;
//   - no routing decision is made from wrong KV state: every answer whose
//     cached tokens were checked against the index's prediction met it
//     (llmgw_kv_answers_checked_total{outcome="short"} stays 0; the engines
//     have room for every document, so nothing is evicted that would excuse
//     a shortfall);
//   - the cluster converges back: every control node's view of every
//     replica equals the agent's mirror (fingerprints) within 5 s of the
//     traffic stopping.
// Each prints one line for RELIABILITY.md: the fault, when it was detected
// and when the cluster recovered (ms after the fault, and after its end).
#include "net/http_client.hpp"
#include "tests/integration/tcp_proxy.hpp"
#include "tests/integration/test_cluster.hpp"
#include "tests/support/child_process.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <atomic>
#include <csignal>
#include <fstream>
#include <future>
#include <mutex>
#include <netinet/in.h>
#include <sstream>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

using namespace std::chrono_literals;
using namespace llmgw;
namespace json = boost::json;
using clock_type = std::chrono::steady_clock;

#if defined(__SANITIZE_ADDRESS__)
/// Recovery under the sanitizers, with another test's cluster beside this
/// one on two cores, is slower: seen once, a restarted control node took
/// 16.6 s to accept an agent whose connects kept timing out.
constexpr auto slow_factor = 4;
#else
constexpr auto slow_factor = 1;
#endif

namespace {

/// Requests at a steady rate to the gateways named, each answer recorded.
class traffic {
public:
  struct outcome {
    int status = 0;
    bool body_ok = false; ///< a completion with choices, or an OpenAI error object
    std::string replica, tier, error;
  };

  explicit traffic(std::vector<std::string> gateways) : gateways_(std::move(gateways)) {
    thread_ = std::thread([this] { run(); });
  }
  ~traffic() { stop(); }

  /// Stops sending and waits (bounded) for every answer.
  void stop() {
    if (!thread_.joinable())
      return;
    stopping_ = true;
    thread_.join();
    test::test_cluster::eventually([this] { return answered() == sent_; }, 30s);
  }

  /// Waits (bounded) until `n` more answers came: traffic under way.
  bool more(std::size_t n) {
    auto target = answered() + n;
    return test::test_cluster::eventually([&] { return answered() >= target; }, 20s);
  }

  void use(std::vector<std::string> gateways) {
    std::lock_guard<std::mutex> lock(mtx_);
    gateways_ = std::move(gateways);
  }

  std::size_t sent() const { return sent_; }
  std::size_t answered() const {
    std::lock_guard<std::mutex> lock(mtx_);
    return outcomes_.size();
  }
  std::vector<outcome> outcomes() const {
    std::lock_guard<std::mutex> lock(mtx_);
    return outcomes_;
  }

private:
  void run() {
    // Six shared documents of about 75 blocks each, asked different things:
    // the prefix tree and the KV index both have something to find.
    std::vector<std::string> docs;
    for (int d = 0; d < 6; ++d) {
      std::string text;
      for (int w = 0; w < 400; ++w)
        text += fmt::format("doc{}word{} ", d, (w * 7919 + d) % 1000);
      docs.push_back(std::move(text));
    }
    auto next = clock_type::now();
    for (std::size_t n = 0; !stopping_; ++n) {
      std::string url;
      {
        std::lock_guard<std::mutex> lock(mtx_);
        url = gateways_[n % gateways_.size()];
      }
      json::object body{{"model", "m"},
                        {"prompt", docs[n % docs.size()] + fmt::format("question {}", n)},
                        {"max_tokens", 8}};
      auto state = std::make_shared<outcome>();
      auto received = std::make_shared<std::string>();
      http_call_handlers h;
      h.on_head = [state](int status, const std::vector<std::pair<std::string, std::string>>& hs) {
        state->status = status;
        for (const auto& [k, v] : hs) {
          if (k == "x-llmgw-replica")
            state->replica = v;
          if (k == "x-llmgw-tier")
            state->tier = v;
        }
      };
      h.on_data = [received](const std::string& data) { *received += data; };
      h.on_done = [this, state, received](const http_error& e) {
        if (!e.ok()) {
          state->error = e.message;
          if (state->status != 0)
            state->status = -state->status; // a head, then the body broke off
        }
        boost::system::error_code ec;
        auto doc = json::parse(*received, ec);
        state->body_ok = !ec && doc.is_object()
                         && (state->status == 200 ? doc.as_object().contains("choices")
                                                  : doc.as_object().contains("error"));
        std::lock_guard<std::mutex> lock(mtx_);
        outcomes_.push_back(*state);
      };
      http_.call("POST", url, "/v1/completions", json::serialize(body), {}, 2s, 20s, std::move(h));
      ++sent_;
      next += 50ms;
      std::this_thread::sleep_until(next);
    }
  }

  mutable std::mutex mtx_;
  std::vector<std::string> gateways_;
  std::vector<outcome> outcomes_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::size_t> sent_{0};
  http_client http_;
  std::thread thread_;
};

class faults : public ::testing::Test {
protected:
  faults()
    : nodes(
      {{"control-1", true, false, "127.0.0.1", {}},
       {"control-2", true, false, "127.0.0.1", {}},
       {"agent-a", false, true, "127.0.0.1", {test::sim_engine("a0"), test::sim_engine("a1")}},
       {"agent-b", false, true, "127.0.0.1", {test::sim_engine("b0"), test::sim_engine("b1")}}}),
      c(nodes) {
    std::ofstream(c.topology_path(), std::ios::app) << gateway_section;
  }

  /// Probes every 400 ms: detection in about a second, not the default 4 s.
  /// A replica marked down by failed requests (not its probes) is tried
  /// again after 2 s instead of 10: recovery is the probes' doing.
  static constexpr const char* gateway_section =
    "\n[gateway]\nhealth_interval_ms = 400\nhealth_timeout_ms = 400\nmark_down_ms = 2000\n";

  void SetUp() override {
    for (const char* n : {"control-1", "control-2", "agent-a", "agent-b"})
      c.start(n, topology_of[n]);
    ASSERT_TRUE(c.wait_ready("control-1", 20s)) << c.log_of("control-1");
    ASSERT_TRUE(c.wait_ready("control-2", 20s)) << c.log_of("control-2");
    ASSERT_TRUE(c.eventually([&] { return converged(); }, 30s))
      << "the cluster never agreed at the start\n"
      << c.log_of("agent-a");
  }

  /// The rank-0 view of `replica` on `control` (null if it has none).
  static const json::object* rank0(const json::value& view, const std::string& replica) {
    if (!view.is_object())
      return nullptr;
    for (const auto& r : view.at("replicas").as_array())
      if (r.at("replica").as_string() == replica.c_str()) {
        const auto& ranks = r.at("ranks").as_array();
        return ranks.empty() ? nullptr : &ranks[0].as_object();
      }
    return nullptr;
  }

  /// A field of `replica`'s entry in the control node's /v1/kv/replicas.
  bool replica_flag(const std::string& control, const std::string& replica, const char* field) {
    auto view = c.replicas(control);
    if (!view.is_object())
      return false;
    for (const auto& r : view.at("replicas").as_array())
      if (r.at("replica").as_string() == replica.c_str())
        return r.at(field).as_bool();
    return false;
  }

  bool has_state(const std::string& control, const std::string& replica) {
    auto view = c.replicas(control);
    const auto* r = rank0(view, replica);
    return r && r->at("has_state").as_bool();
  }

  /// Every running control node holds what every mirror holds, and every
  /// replica is up.
  bool converged(const std::vector<std::string>& controls = {"control-1", "control-2"}) {
    std::map<std::string, std::string> mirror;
    for (const char* agent : {"agent-a", "agent-b"}) {
      auto m = c.mirrors(agent);
      if (!m.is_object())
        return false;
      for (const auto& x : m.at("mirrors").as_array())
        mirror[json::value_to<std::string>(x.at("replica"))] =
          json::value_to<std::string>(x.at("fingerprint"));
    }
    for (const auto& control : controls) {
      auto view = c.replicas(control);
      for (const auto& r : replicas) {
        const auto* x = rank0(view, r);
        if (!x || !x->at("has_state").as_bool() || mirror.count(r) == 0
            || x->at("fingerprint").as_string() != mirror[r].c_str())
          return false;
        if (replica_flag(control, r, "down"))
          return false;
      }
    }
    return true;
  }

  /// The sum of a control node's samples of `name` whose labels contain `label`.
  double sum_of(const std::string& control, const std::string& name, const std::string& label) {
    auto r = c.admin_get(control, "/metrics");
    std::istringstream in(r.body);
    std::string line;
    double sum = 0;
    while (std::getline(in, line))
      if (line.rfind(name + "{", 0) == 0 && line.find(label) != std::string::npos)
        sum += std::stod(line.substr(line.rfind(' ') + 1));
    return sum;
  }

  static double ms_since(clock_type::time_point t) {
    return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
  }

  /// Waits for `check`, the ms it took from `from` (or -1 if it never held).
  double time_until(clock_type::time_point from, const std::function<bool()>& check,
                    std::chrono::milliseconds timeout) {
    if (!c.eventually(check, timeout))
      return -1;
    return ms_since(from);
  }

  /// Stops the traffic and checks the three properties; prints the row.
  void finish(traffic& t, const std::string& fault, double detected_ms, double recovered_ms,
              const std::vector<std::string>& controls = {"control-1", "control-2"}) {
    t.stop();
    auto outcomes = t.outcomes();
    ASSERT_EQ(outcomes.size(), t.sent()) << "every request is answered, none hangs";
    std::size_t ok = 0, errors = 0;
    for (const auto& o : outcomes) {
      EXPECT_NE(o.status, 0) << "a request got no answer: " << o.error;
      EXPECT_TRUE(o.body_ok) << "status " << o.status << " from " << o.replica << ": " << o.error;
      (o.status == 200 && o.body_ok ? ok : errors) += 1;
    }
    double met = 0, short_answers = 0;
    for (const auto& control : controls) {
      met += sum_of(control, "llmgw_kv_answers_checked_total", "outcome=\"met\"");
      short_answers += sum_of(control, "llmgw_kv_answers_checked_total", "outcome=\"short\"");
    }
    EXPECT_GT(met, 0) << "answers were checked against the index";
    EXPECT_EQ(short_answers, 0) << "a decision was made from wrong KV state";
    auto stopped = clock_type::now();
    double converged_ms = time_until(
      stopped, [&] { return converged(controls); }, 5s);
    EXPECT_GE(converged_ms, 0) << "the control nodes' views did not come to equal the mirrors";
    std::printf("[fault] %s | detected %.0f ms | recovered %.0f ms after the fault ended | "
                "%zu requests: %zu answered 200, %zu error answers, 0 lost | %.0f short of "
                "%.0f checked | views equal the mirrors %.0f ms after the traffic stopped\n",
                fault.c_str(), detected_ms, recovered_ms, outcomes.size(), ok, errors,
                short_answers, met + short_answers, converged_ms);
  }

  /// Both agents report their session with `control` ended.
  bool sessions_ended_with(const std::string& control) {
    for (const char* agent : {"agent-a", "agent-b"}) {
      auto r = c.admin_get(agent, "/metrics");
      if (r.body.find("llmgw_agent_session_up{control=\"" + control + "\"} 0") == std::string::npos)
        return false;
    }
    return true;
  }

  std::uint64_t resets_of(const std::string& control, const std::string& replica) {
    auto view = c.replicas(control);
    const auto* r = rank0(view, replica);
    return r ? json::value_to<std::uint64_t>(r->at("resets")) : 0;
  }

  std::vector<test::test_node_spec> nodes;
  test::test_cluster c;
  std::map<std::string, std::string> topology_of; ///< a node's own file ("": the cluster's)
  std::vector<std::string> replicas = {"a0", "a1", "b0", "b1"}; ///< in the topology in force
};

/// agent-b reaches control-1 through a proxy the test can stall and cut.
class link_faults : public faults {
protected:
  link_faults() : proxy(c.caf_port("control-1")) { write_agent_b_file(); }

  /// agent-b's own file: the cluster's, with control-1 at the proxy's port.
  void write_agent_b_file() {
    std::ifstream in(c.topology_path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto from = fmt::format("port = {}\n", c.caf_port("control-1"));
    auto at = text.find(from);
    EXPECT_NE(at, std::string::npos);
    text.replace(at, from.size(), fmt::format("port = {}\n", proxy.port()));
    topology_of["agent-b"] = c.dir() + "/agent-b.toml";
    std::ofstream(topology_of["agent-b"]) << text;
  }

  /// Whether control-1 holds state for agent-b's replicas.
  bool control1_has_b() { return has_state("control-1", "b0") && has_state("control-1", "b1"); }

  /// Runs one link fault: `fault` starts it, the proxy's restore ends it;
  /// `while_on` checks more once control-1 saw it.
  void run(const std::string& name, const std::function<void()>& fault,
           const std::function<void()>& while_on = {}) {
    traffic t({c.gateway_url("control-1"), c.gateway_url("control-2")});
    ASSERT_TRUE(t.more(20));
    auto sessions = proxy.connections();
    auto t0 = clock_type::now();
    fault();
    double detected = time_until(
      t0, [&] { return !has_state("control-1", "b0"); }, 10s);
    EXPECT_GE(detected, 0) << "control-1 drops the replicas it no longer hears of";
    EXPECT_TRUE(has_state("control-2", "b0")) << "the other control node is not affected";
    if (while_on)
      while_on();
    ASSERT_TRUE(t.more(20));
    auto t1 = clock_type::now();
    proxy.restore();
    double recovered = time_until(
      t1, [&] { return control1_has_b(); }, 15s * slow_factor);
    EXPECT_GE(recovered, 0) << "a new session sends a full copy";
    EXPECT_GT(proxy.connections(), sessions) << "agent-b connected again";
    ASSERT_TRUE(t.more(20));
    finish(t, name, detected, recovered);
  }

  test::tcp_proxy proxy;
};

TEST_F(faults, engine_killed_and_restarted) {
  traffic t({c.gateway_url("control-1"), c.gateway_url("control-2")});
  ASSERT_TRUE(t.more(20)) << "traffic flows before the fault";
  auto pid = c.sim_pid("a0");
  ASSERT_GT(pid, 0);
  auto before1 = resets_of("control-1", "a0");
  auto before2 = resets_of("control-2", "a0");
  auto t0 = clock_type::now();
  ::kill(pid, SIGKILL);
  double detected = time_until(
    t0,
    [&] {
      return resets_of("control-1", "a0") > before1 && resets_of("control-2", "a0") > before2;
    },
    10s);
  EXPECT_GE(detected, 0) << "the engine's exit reset its state on both control nodes";
  // The agent restarts it; the fault ends when its new process runs.
  ASSERT_TRUE(c.eventually(
    [&] {
      auto p = c.sim_pid("a0");
      return p > 0 && p != pid;
    },
    15s * slow_factor));
  auto t1 = clock_type::now();
  double recovered = time_until(
    t1,
    [&] {
      return !replica_flag("control-1", "a0", "down") && !replica_flag("control-2", "a0", "down")
             && has_state("control-1", "a0") && has_state("control-2", "a0");
    },
    15s * slow_factor);
  EXPECT_GE(recovered, 0) << "the restarted engine is routed to again";
  // An operator sees it on the agent: an exit nobody asked for, and a start
  // after each (a restart that fails at once exits and starts again).
  auto exits = c.metric("agent-a", "llmgw_agent_engine_exits_total{replica=\"a0\"}");
  EXPECT_GE(exits, 1);
  EXPECT_EQ(c.metric("agent-a", "llmgw_agent_engine_starts_total{replica=\"a0\"}"), exits + 1);
  EXPECT_EQ(c.metric("agent-a", "llmgw_agent_engine_exits_total{replica=\"a1\"}"), 0);
  ASSERT_TRUE(t.more(20));
  finish(t, "engine killed (kill -9), restarted by its agent", detected, recovered);
}

TEST_F(faults, engine_answering_500_is_avoided_and_probed_back) {
  traffic t({c.gateway_url("control-1"), c.gateway_url("control-2")});
  ASSERT_TRUE(t.more(20));
  auto t0 = clock_type::now();
  std::ofstream(c.fail_file("b0")) << "dead\n";
  double detected = time_until(
    t0,
    [&] {
      return replica_flag("control-1", "b0", "down") && replica_flag("control-2", "b0", "down");
    },
    10s);
  EXPECT_GE(detected, 0) << "probes answered 503: both gateways avoid the engine";
  ASSERT_TRUE(t.more(20));
  auto t1 = clock_type::now();
  ::unlink(c.fail_file("b0").c_str());
  double recovered = time_until(
    t1,
    [&] {
      return !replica_flag("control-1", "b0", "down") && !replica_flag("control-2", "b0", "down");
    },
    10s);
  EXPECT_GE(recovered, 0) << "a good probe brings it back";
  finish(t, "engine answers 500 (and /health 503)", detected, recovered);
}

TEST_F(faults, engine_frozen_is_avoided_and_probed_back) {
  traffic t({c.gateway_url("control-1"), c.gateway_url("control-2")});
  ASSERT_TRUE(t.more(20));
  auto pid = c.sim_pid("b1");
  ASSERT_GT(pid, 0);
  auto t0 = clock_type::now();
  ::kill(pid, SIGSTOP); // accepts connections (the kernel does), never answers
  std::shared_ptr<void> resume(nullptr, [pid](void*) { ::kill(pid, SIGCONT); }); // on any exit
  double detected = time_until(
    t0,
    [&] {
      return replica_flag("control-1", "b1", "down") && replica_flag("control-2", "b1", "down");
    },
    10s);
  EXPECT_GE(detected, 0) << "probes time out: both gateways avoid the engine";
  ASSERT_TRUE(t.more(20));
  auto t1 = clock_type::now();
  ::kill(pid, SIGCONT);
  double recovered = time_until(
    t1,
    [&] {
      return !replica_flag("control-1", "b1", "down") && !replica_flag("control-2", "b1", "down");
    },
    10s);
  EXPECT_GE(recovered, 0);
  finish(t, "engine frozen (SIGSTOP, then SIGCONT)", detected, recovered);
}

TEST_F(faults, agent_killed_and_restarted) {
  traffic t({c.gateway_url("control-1"), c.gateway_url("control-2")});
  ASSERT_TRUE(t.more(20));
  auto t0 = clock_type::now();
  c.stop("agent-b", SIGKILL);
  double detected = time_until(
    t0,
    [&] {
      for (const char* ctl : {"control-1", "control-2"})
        for (const char* r : {"b0", "b1"})
          if (has_state(ctl, r))
            return false;
      return true;
    },
    10s);
  EXPECT_GE(detected, 0) << "both control nodes drop the dead agent's replicas";
  {
    // An operator at a terminal sees which node is gone.
    test::child_process status({LLMGW_BINARY, "status", "--config", c.topology_path()});
    auto table = status.read_stdout_all(20s);
    EXPECT_EQ(status.wait(10s), std::optional<int>(0)) << table;
    EXPECT_NE(table.find("node agent-b (agent): down ("), std::string::npos) << table;
    EXPECT_NE(table.find("node agent-a (agent): up; 2 of 2 replicas with KV state"),
              std::string::npos)
      << table;
    EXPECT_NE(table.find("node control-2 (control): up\n"), std::string::npos) << table;
  }
  auto t1 = clock_type::now();
  c.start("agent-b");
  double recovered = time_until(
    t1,
    [&] {
      for (const char* ctl : {"control-1", "control-2"})
        for (const char* r : {"b0", "b1"})
          if (!has_state(ctl, r) || replica_flag(ctl, r, "down"))
            return false;
      return true;
    },
    20s);
  EXPECT_GE(recovered, 0) << "a full copy from the restarted agent";
  ASSERT_TRUE(t.more(20));
  finish(t, "agent killed (kill -9; its engines die with it), restarted", detected, recovered);
}

TEST_F(faults, agent_frozen_then_resumed) {
  traffic t({c.gateway_url("control-1"), c.gateway_url("control-2")});
  ASSERT_TRUE(t.more(20));
  auto t0 = clock_type::now();
  c.signal("agent-a", SIGSTOP); // its engines keep serving; their events wait
  std::shared_ptr<void> resume(nullptr, [&](void*) { c.signal("agent-a", SIGCONT); });
  double detected = time_until(
    t0, [&] { return !has_state("control-1", "a0") && !has_state("control-2", "a0"); }, 10s);
  EXPECT_GE(detected, 0) << "the heartbeat timeout drops the frozen agent's replicas";
  ASSERT_TRUE(t.more(20));
  auto t1 = clock_type::now();
  c.signal("agent-a", SIGCONT);
  double recovered = time_until(
    t1,
    [&] {
      return has_state("control-1", "a0") && has_state("control-2", "a0")
             && has_state("control-1", "a1") && has_state("control-2", "a1");
    },
    15s * slow_factor);
  EXPECT_GE(recovered, 0) << "the agent comes back with a full copy";
  finish(t, "agent frozen (SIGSTOP, then SIGCONT)", detected, recovered);
}

TEST_F(faults, control_killed_the_other_serves_and_the_restarted_one_catches_up) {
  traffic t({c.gateway_url("control-1")}); // a load balancer stops sending to the dead one
  ASSERT_TRUE(t.more(20));
  auto t0 = clock_type::now();
  c.stop("control-2", SIGKILL);
  double detected = time_until(
    t0, [&] { return sessions_ended_with("control-2"); }, 10s);
  EXPECT_GE(detected, 0) << "both agents see the session end";
  ASSERT_TRUE(t.more(20));
  auto t1 = clock_type::now();
  c.start("control-2");
  double recovered = time_until(
    t1, [&] { return converged({"control-2"}); }, 15s * slow_factor);
  EXPECT_GE(recovered, 0) << "the restarted control node holds every agent's full copy";
  t.use({c.gateway_url("control-1"), c.gateway_url("control-2")});
  ASSERT_TRUE(t.more(20));
  finish(t, "control node killed (kill -9), restarted; traffic on the other", detected, recovered);
}

TEST_F(faults, control_frozen_then_resumed) {
  traffic t({c.gateway_url("control-1")});
  ASSERT_TRUE(t.more(20));
  auto t0 = clock_type::now();
  c.signal("control-2", SIGSTOP);
  std::shared_ptr<void> resume(nullptr, [&](void*) { c.signal("control-2", SIGCONT); });
  double detected = time_until(
    t0, [&] { return sessions_ended_with("control-2"); }, 10s);
  EXPECT_GE(detected, 0) << "both agents' heartbeats find the frozen control node";
  ASSERT_TRUE(t.more(20));
  auto t1 = clock_type::now();
  c.signal("control-2", SIGCONT);
  double recovered = time_until(
    t1, [&] { return converged({"control-2"}); }, 15s * slow_factor);
  EXPECT_GE(recovered, 0) << "the agents send it a full copy again";
  t.use({c.gateway_url("control-1"), c.gateway_url("control-2")});
  ASSERT_TRUE(t.more(20));
  finish(t, "control node frozen (SIGSTOP, then SIGCONT)", detected, recovered);
}

} // namespace

namespace {

TEST_F(link_faults, a_stalled_link_ends_the_session_and_a_new_one_sends_a_full_copy) {
  const std::string up = "llmgw_agent_session_up{control=\"control-1\"}";
  run(
    "link agent to control node stalls (no byte delivered), then delivers", [&] { proxy.stall(); },
    [&] {
      // The agent finds the stall too (CAF's heartbeats) and ends its
      // session: nothing queues toward a link that delivers nothing.
      EXPECT_TRUE(test::test_cluster::eventually([&] { return c.metric("agent-b", up) == 0; }, 10s))
        << c.admin_get("agent-b", "/metrics").body;
    });
}

TEST_F(link_faults, a_cut_link_ends_the_session_and_a_new_one_sends_a_full_copy) {
  run("link agent to control node cut (connections closed, new ones closed at once), then restored",
      [&] { proxy.cut(); });
  // The agent counts the session it lost, and the one it started after.
  EXPECT_GE(
    c.metric("agent-b", "llmgw_agent_sessions_ended_total{control=\"control-1\",reason=\"lost\"}"),
    1);
  EXPECT_EQ(
    c.metric("agent-b", "llmgw_agent_sessions_ended_total{control=\"control-2\",reason=\"lost\"}"),
    0)
    << "the other control node's link was never cut";
}

// The topology changes while agent-b is cut off from control-1: control-1
// takes the change from its file, and agent-b's state from the full copies
// of the session that starts once the link is back.
TEST_F(link_faults, a_reload_while_a_link_is_cut_converges_once_it_is_back) {
  traffic t({c.gateway_url("control-1"), c.gateway_url("control-2")});
  ASSERT_TRUE(t.more(20));
  auto t0 = clock_type::now();
  proxy.cut();
  double detected = time_until(
    t0, [&] { return !has_state("control-1", "b0"); }, 10s);
  ASSERT_GE(detected, 0);
  auto changed = nodes;
  changed[3].engines = {test::sim_engine("b0"), test::sim_engine("b2")}; // b1 leaves, b2 arrives
  c.write_topology(changed, "cluster.toml");
  std::ofstream(c.topology_path(), std::ios::app) << gateway_section;
  write_agent_b_file();
  for (const char* n : {"control-1", "control-2", "agent-a", "agent-b"})
    c.signal(n, SIGHUP);
  replicas = {"a0", "a1", "b0", "b2"};
  EXPECT_TRUE(c.eventually([&] { return converged({"control-2"}); }, 30s))
    << "control-2, still linked, follows the change\n"
    << c.log_of("agent-b");
  EXPECT_TRUE(c.eventually(
    [&] { return c.metric("control-1", "llmgw_topology_reloads_total{outcome=\"applied\"}") == 1; },
    10s))
    << "control-1 reloads before the link is back";
  EXPECT_FALSE(has_state("control-1", "b2")) << "control-1 cannot have heard of b2's blocks yet";
  ASSERT_TRUE(t.more(20));
  auto t1 = clock_type::now();
  proxy.restore();
  double recovered = time_until(
    t1, [&] { return converged(); }, 15s * slow_factor);
  EXPECT_GE(recovered, 0) << c.log_of("control-1");
  for (const char* control : {"control-1", "control-2"}) {
    auto view = c.replicas(control);
    ASSERT_TRUE(view.is_object());
    for (const auto& r : view.at("replicas").as_array())
      EXPECT_NE(r.at("replica").as_string(), "b1") << control << " still lists the removed engine";
  }
  for (const char* n : {"control-1", "control-2", "agent-a", "agent-b"})
    EXPECT_EQ(c.metric(n, "llmgw_topology_reloads_total{outcome=\"applied\"}"), 1) << n;
  ASSERT_TRUE(t.more(20));
  finish(t, "topology reloaded while a link is cut, then the link restored", detected, recovered);
}

} // namespace

namespace {

/// The replay port in a launched sim's command line (0 if none).
int replay_port_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
  std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string key = "\"replay_endpoint\":\"tcp://127.0.0.1:";
  auto at = cmd.find(key);
  return at == std::string::npos ? 0 : std::atoi(cmd.c_str() + at + key.size());
}

TEST(engine_restart, moves_the_replay_port_when_another_socket_took_it) {
  // Two data-parallel ranks: the replay is on tcp ports the engine binds
  // itself (vLLM offsets them per rank), picked by the agent.
  auto engine = test::sim_engine("a0");
  engine.dp_size = 2;
  test::test_cluster c(
    {{"control-1", true, false, "127.0.0.1", {}}, {"agent-a", false, true, "127.0.0.1", {engine}}});
  c.start("control-1");
  c.start("agent-a");
  ASSERT_TRUE(c.wait_ready("control-1", 20s));
  pid_t pid = -1;
  ASSERT_TRUE(c.eventually([&] { return (pid = c.sim_pid("a0")) > 0; }, 10s));
  int port = replay_port_of(pid);
  ASSERT_GT(port, 0);
  ::kill(pid, SIGKILL);
  // Another socket takes the port as soon as the dead engine lets go of it.
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int on = 1; // past the dead engine's connections in TIME_WAIT, as any server binds
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_TRUE(c.eventually(
    [&] { return ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0; }, 5s));
  ::listen(fd, 1);
  pid_t again = -1;
  ASSERT_TRUE(
    c.eventually([&] { return (again = c.sim_pid("a0")) > 0 && again != pid; }, 15s * slow_factor));
  int moved = replay_port_of(again);
  EXPECT_NE(moved, port) << "the restarted engine was given the taken port again";
  EXPECT_GT(moved, 0);
  EXPECT_NE(c.log_of("agent-a").find("is taken: the engine moves to"), std::string::npos);
  // The restarted engine came up: llmgw-sim, like vLLM, does not serve
  // before its replay sockets are bound, and exits if they cannot be.
  http_client http;
  EXPECT_TRUE(c.eventually(
    [&] {
      std::promise<http_response> p;
      http.request("GET", c.engine_url("a0"), "/health", "", 2s,
                   [&p](http_response r) { p.set_value(std::move(r)); });
      return p.get_future().get().status == 200;
    },
    10s));
  EXPECT_EQ(c.sim_pid("a0"), again) << "the engine stayed up on the new ports";
  ::close(fd);
}

} // namespace
