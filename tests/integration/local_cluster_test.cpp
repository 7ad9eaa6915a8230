// `llmgw up` with the sample topology (deploy/local/cluster.toml, its ports
// swapped for free ones): through the gateway, a repeated long prompt lands
// on the replica that served it first, by tier 2, with cached tokens; a
// streamed answer arrives in order; a killed engine's traffic goes
// elsewhere; Ctrl-C leaves nothing running; the demo runs; an engine that
// cannot listen is named instead of the cluster being called up.
#include "net/http_client.hpp"
#include "tests/integration/test_cluster.hpp"
#include "tests/support/child_process.hpp"
#include "tests/support/eventually.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <arpa/inet.h>
#include <csignal>
#include <dirent.h>
#include <fstream>
#include <future>
#include <sstream>
#include <sys/socket.h>
#include <thread>

using namespace std::chrono_literals;
using namespace llmgw;
namespace json = boost::json;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (auto at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

/// Pids of running processes whose command line contains `needle`.
std::vector<pid_t> processes_with(const std::string& needle) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  while (auto* e = d ? ::readdir(d) : nullptr) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0])))
      continue;
    auto cmd = read(std::string("/proc/") + e->d_name + "/cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos)
      out.push_back(static_cast<pid_t>(std::stoi(e->d_name)));
  }
  if (d)
    ::closedir(d);
  return out;
}

/// The quoted strings of a TOML array's text: a launch command's argv.
std::vector<std::string> quoted_strings(const std::string& text) {
  std::vector<std::string> out;
  for (auto at = text.find('"'); at != std::string::npos; at = text.find('"', at + 1)) {
    auto end = text.find('"', at + 1);
    out.push_back(text.substr(at + 1, end - at - 1));
    at = end;
  }
  return out;
}

/// How the sample's engines run.
enum class engines {
  launched,      ///< by the agents, as the sample says
  vllm_defaults, ///< by the operator (the test) at vLLM's defaults: each
                 ///< binds tcp://*:PORT, hashes with sha256, no PYTHONHASHSEED
  sglang,        ///< by the operator, as SGLang (llmgw-sim --sim-as sglang):
                 ///< its publisher binds, its own page ids, engine = "sglang"
};

/// The sample topology in a fresh folder, on free ports.
struct local_cluster {
  std::string dir;
  std::string gateway;
  std::vector<std::uint16_t> engine_ports;
  std::vector<std::unique_ptr<test::child_process>> attached; ///< engines::vllm_defaults
  std::unique_ptr<test::child_process> up;

  /// `start`: run `llmgw up` on it and wait until it says the cluster is up;
  /// `admin`: the control node has an admin listener.
  explicit local_cluster(bool start = true, bool admin = false, engines how = engines::launched) {
    char tmpl[] = "/tmp/llmgw-local-XXXXXX";
    dir = ::mkdtemp(tmpl);
    auto text = read(LLMGW_SOURCE_DIR "/deploy/local/cluster.toml");
    // Each port is marked first, then written: written at once, a free
    // port such as 28104 would have its 8104 replaced by a later one.
    auto http = test::free_port();
    replace_all(text, "7100", "{control}");
    replace_all(text, "127.0.0.1:8080", "127.0.0.1:{http}");
    const char* engines[] = {"8101", "8102", "8103", "8104"};
    for (const char* p : engines)
      replace_all(text, p, std::string("{") + p + "}");
    replace_all(text, "{control}", std::to_string(test::free_port()));
    replace_all(text, "{http}", std::to_string(http));
    if (admin)
      replace_all(text, "http = \"127.0.0.1:" + std::to_string(http) + "\"",
                  "http = \"127.0.0.1:" + std::to_string(http)
                    + "\"\nadmin = \"127.0.0.1:" + std::to_string(test::free_port()) + "\"");
    for (const char* p : engines) {
      engine_ports.push_back(test::free_port());
      replace_all(text, std::string("{") + p + "}", std::to_string(engine_ports.back()));
    }
    if (how != engines::launched)
      attach_at_defaults(text, how == engines::sglang);
    std::ofstream(dir + "/cluster.toml") << text;
    gateway = "http://127.0.0.1:" + std::to_string(http);
    if (!start)
      return;
    up = std::make_unique<test::child_process>(std::vector<std::string>{
      LLMGW_BINARY, "up", "--config", dir + "/cluster.toml", "--logs", dir + "/logs"});
    for (;;) {
      auto line = up->read_stdout_line(60s);
      EXPECT_TRUE(line) << "llmgw up stopped before the cluster was up";
      if (!line || line->find("is up; the gateway is " + gateway) != std::string::npos)
        break;
    }
  }
  /// Each engine's launch command becomes an engine the test starts the way
  /// an operator starts vLLM (its publisher binding, its own hashes), and
  /// the topology names where its publisher is.
  /// (SGLang: the same, its own stream and flags, and `engine = "sglang"`.)
  void attach_at_defaults(std::string& text, bool sglang) {
    for (auto at = text.find("launch = ["); at != std::string::npos; at = text.find("launch = [")) {
      auto end = text.find("]\n", at) + 2;
      auto argv = quoted_strings(text.substr(at, end - at));
      auto events = test::free_port();
      text.replace(at, end - at,
                   "events = \"tcp://127.0.0.1:" + std::to_string(events) + "\"\n"
                     + (sglang ? "engine = \"sglang\"\n" : ""));
      argv.at(0) = LLMGW_SIM;
      // vLLM's default has no render endpoints; SGLang has none at all.
      argv.erase(std::remove(argv.begin(), argv.end(), "--enable-scale-out"), argv.end());
      json::object cfg{{"publisher", "zmq"}, {"endpoint", "tcp://*:" + std::to_string(events)}};
      if (sglang)
        argv.insert(argv.end(), {"--sim-as", "sglang", "--page-size", "16"});
      else
        cfg["enable_kv_cache_events"] = true;
      argv.insert(argv.end(), {"--kv-events-config", json::serialize(cfg)});
      // vLLM's default hash algorithm and no PYTHONHASHSEED: hashes nobody
      // outside the engine can reproduce.
      argv.insert(argv.begin(), {"/usr/bin/env", "-u", "PYTHONHASHSEED"});
      attached.push_back(std::make_unique<test::child_process>(argv));
    }
  }

  ~local_cluster() {
    if (up) {
      up->signal(SIGINT); // Ctrl-C
      EXPECT_EQ(up->wait(30s), std::optional<int>(0));
    }
    if (!::testing::Test::HasFailure())
      std::system(("rm -rf " + dir).c_str());
  }
};

struct answer {
  int status = 0;
  std::map<std::string, std::string> headers;
  std::vector<std::string> pieces;
  std::string body;
};

answer post(http_client& http, const std::string& base, const std::string& path,
            const json::object& body) {
  answer a;
  std::promise<void> done;
  std::mutex mtx;
  http.call("POST", base, path, json::serialize(body), {{"Content-Type", "application/json"}}, 2s,
            30s,
            {[&](int s, std::vector<std::pair<std::string, std::string>> hs) {
               std::lock_guard<std::mutex> g(mtx);
               a.status = s;
               for (auto& [k, v] : hs) { // names as sent: compare in lower case
                 std::string lower = k;
                 std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
                 a.headers[lower] = v;
               }
             },
             [&](std::string d) {
               std::lock_guard<std::mutex> g(mtx);
               a.pieces.push_back(d);
               a.body += d;
             },
             [&](const http_error&) { done.set_value(); }});
  done.get_future().wait();
  std::lock_guard<std::mutex> g(mtx);
  return a;
}

std::string long_prompt(const std::string& topic) {
  std::string p = "System: you answer questions about " + topic + ". ";
  while (p.size() < 4000)
    p += "Here is a long document paragraph about " + topic + " that the user pastes. ";
  return p;
}

} // namespace

TEST(local_cluster, routes_exactly_streams_in_order_and_survives_a_killed_engine) {
  local_cluster c;
  http_client http;
  // A long prompt, twice: the second time on the same replica, by tier 2,
  // and the engine reports the prefix as cached.
  json::object body{{"model", "llmgw-demo"}, {"prompt", long_prompt("tides")}, {"max_tokens", 4}};
  // The sample's engines have render endpoints (--enable-scale-out): a
  // prompt not seen before is tokenized by the engine's render.
  auto dry = post(http, c.gateway, "/v1/route", body);
  ASSERT_EQ(dry.status, 200) << dry.body;
  EXPECT_EQ(json::parse(dry.body).at("tokens_from"), "render") << dry.body;
  auto first = post(http, c.gateway, "/v1/completions", body);
  ASSERT_EQ(first.status, 200) << first.body;
  auto replica = first.headers["x-llmgw-replica"];
  ASSERT_FALSE(replica.empty());
  // The engine's events reach the router (100 ms flushes): a dry run routes
  // the prompt by tier kv once they have.
  EXPECT_TRUE(test::eventually(
    [&] {
      auto route = post(http, c.gateway, "/v1/route", body);
      return route.status == 200 && json::parse(route.body).at("tier") == "kv";
    },
    10s, 20ms))
    << "the prompt's blocks never reached the router";
  auto second = post(http, c.gateway, "/v1/completions", body);
  ASSERT_EQ(second.status, 200) << second.body;
  EXPECT_EQ(second.headers["x-llmgw-replica"], replica);
  EXPECT_EQ(second.headers["x-llmgw-tier"], "kv");
  auto usage = json::parse(second.body).at("usage");
  EXPECT_GT(usage.at("prompt_tokens_details").at("cached_tokens").as_int64(), 900)
    << "the ~1000-token prompt was served from the engine's cache";

  // A streamed chat answer: every event in order, then [DONE].
  json::object chat{{"model", "llmgw-demo"},
                    {"stream", true},
                    {"max_tokens", 6},
                    {"messages", json::array{json::object{{"role", "user"}, {"content", "Hi"}}}}};
  auto streamed = post(http, c.gateway, "/v1/chat/completions", chat);
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.headers["content-type"].rfind("text/event-stream", 0), 0u);
  std::vector<std::string> events;
  for (std::size_t at = 0; (at = streamed.body.find("data: ", at)) != std::string::npos;) {
    auto end = streamed.body.find("\n\n", at);
    events.push_back(streamed.body.substr(at + 6, end - at - 6));
    at = end;
  }
  ASSERT_EQ(events.size(), 7u) << streamed.body;
  EXPECT_EQ(events.back(), "[DONE]");
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    auto e = json::parse(events[i]);
    EXPECT_EQ(e.at("choices").at(0).at("finish_reason").is_null(), i + 2 < events.size())
      << "only the last content event finishes";
  }
  EXPECT_GT(streamed.pieces.size(), 1u) << "relayed as it came, not in one piece";

  // An operator's view: every replica, each with its KV state, and ready.
  test::child_process status({LLMGW_BINARY, "status", "--config", c.dir + "/cluster.toml"});
  auto table = status.read_stdout_all(10s);
  EXPECT_EQ(status.wait(10s), std::optional<int>(0)) << table;
  EXPECT_NE(table.find(": ready\n"), std::string::npos) << table;
  for (const char* r : {"a0 ", "a1 ", "b0 ", "b1 "}) {
    auto at = table.find("\n" + std::string(r));
    ASSERT_NE(at, std::string::npos) << r << "in:\n" << table;
    auto line = table.substr(at + 1, table.find('\n', at + 1) - at - 1);
    EXPECT_NE(line.find(" passed "), std::string::npos) << "its canary passed: " << line;
  }
  EXPECT_NE(table.find("node agent-a (agent): health not known (no admin address); 2 of 2 "
                       "replicas with KV state"),
            std::string::npos)
    << table;
  EXPECT_NE(table.find("node control-1 (control): up\n"), std::string::npos) << table;

  // Kill the engine that holds the long prompt: its traffic goes elsewhere.
  auto port = c.engine_ports.at(static_cast<std::size_t>(replica[0] == 'a' ? 0 : 2)
                                + static_cast<std::size_t>(replica[1] - '0'));
  auto pids = processes_with("--port " + std::to_string(port) + " ");
  ASSERT_EQ(pids.size(), 1u) << "one llmgw-sim listens on " << port;
  ::kill(pids[0], SIGKILL);
  auto after = post(http, c.gateway, "/v1/completions", body);
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_NE(after.headers["x-llmgw-replica"], replica);

  // Its agent restarts it: a new engine process gets a canary of its own.
  json::value canary;
  EXPECT_TRUE(test::eventually(
    [&] {
      std::promise<http_response> p;
      http.request("GET", c.gateway, "/v1/kv/replicas", "", 5s,
                   [&p](http_response r) { p.set_value(std::move(r)); });
      auto doc = json::parse(p.get_future().get().body);
      for (const auto& r : doc.at("replicas").as_array())
        if (r.at("replica") == replica.c_str())
          canary = r.at("canary");
      return canary.is_object() && canary.at("state") == "passed"
             && canary.at("passes").to_number<int>() == 2;
    },
    30s, 50ms))
    << "the restarted engine's canary: " << canary;
}

// Two engines whose events endpoints are swapped in the topology: each
// replica's events are the other engine's. Every block would look right to
// the agent (its keys are the cluster's), so only the canary can tell:
// each fails, naming the replica whose events showed its prompt, and
// `llmgw up` says so instead of calling the cluster up.
TEST(local_cluster, swapped_events_endpoints_fail_the_canary_naming_the_other_replica) {
  local_cluster c(false, false, engines::vllm_defaults);
  auto path = c.dir + "/cluster.toml";
  auto text = read(path);
  std::vector<std::string> endpoints;
  for (auto at = text.find("events = \""); at != std::string::npos;
       at = text.find("events = \"", at + 1))
    endpoints.push_back(text.substr(at, text.find('\n', at) - at));
  ASSERT_EQ(endpoints.size(), 4u) << text;
  // a0's and a1's (both on agent-a, so its ownership checks still hold).
  replace_all(text, endpoints[0], "{a0}");
  replace_all(text, endpoints[1], endpoints[0]);
  replace_all(text, "{a0}", endpoints[1]);
  replace_all(text, "[router]\n", "[router]\ncanary_timeout_ms = 2000\n");
  std::ofstream(path) << text;
  test::child_process up(
    {LLMGW_BINARY, "up", "--config", path, "--logs", c.dir + "/logs", "--ready-timeout", "12"});
  auto out = up.read_stdout_all(60s);
  auto err = up.read_stderr_all(1s);
  EXPECT_EQ(up.wait(30s), std::optional<int>(1)) << out << err;
  EXPECT_EQ(out.find("is up"), std::string::npos) << out;
  EXPECT_NE(err.find("not every replica is routed on its KV state (its canary passed)"),
            std::string::npos)
    << err;
  for (const auto& [mine, other] : {std::pair{"a0", "a1"}, {"a1", "a0"}})
    EXPECT_NE(err.find(std::string(mine)
                       + ": canary failed: the canary prompt's blocks appeared "
                         "in replica "
                       + other + "'s events"),
              std::string::npos)
      << err;
  EXPECT_EQ(err.find("b0: canary"), std::string::npos) << "b0 and b1 passed: " << err;
  EXPECT_EQ(err.find("b1: canary"), std::string::npos) << err;
}

/// What a fleet of attached engines whose hashes are their own must show:
/// a prompt's blocks keyed by translation, trusted, and routed by tier kv to
/// the engine that then finds them cached.
void expect_routed_by_translated_events(local_cluster& c) {
  ASSERT_EQ(c.attached.size(), 4u);
  http_client http;
  json::object body{
    {"model", "llmgw-demo"}, {"prompt", long_prompt("glaciers")}, {"max_tokens", 4}};
  auto first = post(http, c.gateway, "/v1/completions", body);
  // Without --enable-scale-out vLLM has no render endpoint (404): the
  // engine's /tokenize is asked instead.
  json::object fresh{{"model", "llmgw-demo"}, {"prompt", long_prompt("dunes")}};
  auto dry = post(http, c.gateway, "/v1/route", fresh);
  ASSERT_EQ(dry.status, 200) << dry.body;
  EXPECT_EQ(json::parse(dry.body).at("tokens_from"), "tokenize") << dry.body;
  ASSERT_EQ(first.status, 200) << first.body;
  auto replica = first.headers["x-llmgw-replica"];
  // The router enters a routed prompt's blocks speculatively at once; what
  // proves the engine's own events count is its rank, trusted, holding
  // blocks the agent keyed by translation.
  auto rank_of = [&] {
    std::promise<http_response> p;
    http.request("GET", c.gateway, "/v1/kv/replicas", "", 5s,
                 [&p](http_response r) { p.set_value(std::move(r)); });
    auto doc = json::parse(p.get_future().get().body);
    for (const auto& r : doc.at("replicas").as_array())
      if (r.at("replica") == replica.c_str())
        return r.at("ranks").at(0);
    return json::value{};
  };
  json::value rank;
  EXPECT_TRUE(test::eventually(
    [&] {
      rank = rank_of();
      return rank.is_object() && rank.at("parity") == "translated" && rank.at("trusted") == true
             && rank.at("agent").at("translated_blocks").to_number<double>() >= 60;
    },
    10s, 20ms))
    << "the ~62 blocks of the prompt, keyed by the cluster's hash: " << rank;
  auto route = post(http, c.gateway, "/v1/route", body);
  ASSERT_EQ(route.status, 200) << route.body;
  EXPECT_EQ(json::parse(route.body).at("tier"), "kv") << route.body;
  auto second = post(http, c.gateway, "/v1/completions", body);
  ASSERT_EQ(second.status, 200) << second.body;
  EXPECT_EQ(second.headers["x-llmgw-replica"], replica);
  EXPECT_EQ(second.headers["x-llmgw-tier"], "kv");
  auto cached =
    json::parse(second.body).at("usage").at("prompt_tokens_details").at("cached_tokens");
  EXPECT_GT(cached.as_int64(), 900) << "the engine found the prefix the index predicted";
  rank = rank_of();
  EXPECT_EQ(rank.at("agent").at("untranslated_blocks"), 0) << rank;
  std::promise<http_response> m;
  http.request("GET", c.gateway, "/metrics", "", 5s,
               [&m](http_response r) { m.set_value(std::move(r)); });
  auto metrics = m.get_future().get().body;
  auto labels = "{replica=\"" + replica + "\",dp_rank=\"0\"}";
  EXPECT_NE(metrics.find("llmgw_kv_keys_translated" + labels + " 1\n"), std::string::npos)
    << metrics;
  EXPECT_NE(metrics.find("llmgw_kv_hash_mismatch" + labels + " 0\n"), std::string::npos);
  EXPECT_NE(metrics.find("llmgw_kv_blocks_translated_total" + labels + " "), std::string::npos);
}

// A fleet as operators run vLLM: every engine started by the operator at
// vLLM's defaults (its publisher binds, it hashes with sha256 over pickle),
// the agents connecting to them. Routing by KV events works as for
// launched engines: the agents key the blocks by the cluster's hash.
TEST(local_cluster, engines_at_vllms_defaults_are_routed_by_their_kv_events) {
  local_cluster c(true, false, engines::vllm_defaults);
  expect_routed_by_translated_events(c);

  // llmgw check says how each engine is reached.
  test::child_process check({LLMGW_BINARY, "check", "--config", c.dir + "/cluster.toml"});
  auto out = check.read_stdout_all(10s);
  EXPECT_EQ(check.wait(10s), std::optional<int>(0)) << out;
  EXPECT_NE(out.find("kv events: the agent connects to tcp://127.0.0.1:"), std::string::npos)
    << out;
}

// SGLang engines attached as deployed: their publishers bind, their pages
// carry SGLang's own ids, one event a page. The agents decode SGLang's
// stream and key the pages by the cluster's hash, so they are routed by
// their KV events as vLLM's are.
TEST(local_cluster, sglang_engines_are_routed_by_their_kv_events) {
  local_cluster c(true, false, engines::sglang);
  expect_routed_by_translated_events(c);
  test::child_process check({LLMGW_BINARY, "check", "--config", c.dir + "/cluster.toml"});
  auto out = check.read_stdout_all(10s);
  EXPECT_EQ(check.wait(10s), std::optional<int>(0)) << out;
  EXPECT_NE(out.find("SGLang must bind there"), std::string::npos) << out;
}

TEST(local_cluster, comes_up_when_the_control_node_has_an_admin_listener) {
  // The gateway's port then no longer serves /v1/kv/replicas: llmgw up
  // must ask the admin listener whether the replicas sent their state.
  local_cluster c(true, true);
  ASSERT_TRUE(c.up);
  http_client http;
  std::promise<http_response> p;
  http.request("GET", c.gateway, "/v1/kv/replicas", "", 5s,
               [&p](http_response r) { p.set_value(std::move(r)); });
  EXPECT_EQ(p.get_future().get().status, 404) << "served by the admin listener only";
}

TEST(llmgw_status, says_when_the_control_node_does_not_answer) {
  local_cluster c(false); // written, not started
  test::child_process status({LLMGW_BINARY, "status", "--config", c.dir + "/cluster.toml"});
  std::string err;
  while (auto line = status.read_stderr_line(10s))
    err += *line + "\n";
  EXPECT_EQ(status.wait(10s), std::optional<int>(2));
  EXPECT_NE(err.find("did not answer /v1/kv/replicas"), std::string::npos) << err;
}

TEST(local_cluster, ctrl_c_leaves_nothing_running_and_the_demo_runs) {
  std::string marker;
  {
    local_cluster c;
    marker = c.dir;
    EXPECT_EQ(processes_with(c.dir + "/cluster.toml").size(), 4u) << "llmgw up and three nodes";
    EXPECT_EQ(
      processes_with("llmgw-sim serve llmgw-demo --port " + std::to_string(c.engine_ports[0]))
        .size(),
      1u);
  }
  EXPECT_TRUE(processes_with(marker).empty()) << "no node left";

  local_cluster ports(false); // the demo starts the cluster itself
  test::child_process demo({LLMGW_BINARY, "up", "--config", ports.dir + "/cluster.toml", "--demo",
                            "--exit-after-demo", "--logs", ports.dir + "/demo-logs"});
  auto out = demo.read_stdout_all(120s);
  auto err = demo.read_stderr_all(1s);
  EXPECT_EQ(demo.wait(30s), std::optional<int>(0)) << out << err;
  EXPECT_NE(out.find("through llmgw:"), std::string::npos) << out;
  EXPECT_NE(out.find("round-robin straight to the engines"), std::string::npos);
  EXPECT_NE(out.find("llmgw served"), std::string::npos);
  for (auto port : ports.engine_ports)
    EXPECT_TRUE(processes_with("--port " + std::to_string(port) + " ").empty());
}

TEST(local_cluster, an_engine_that_cannot_listen_is_named_not_called_up) {
  local_cluster c(false);
  // Something else holds b1's port (listening, never answering).
  int squatter = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(c.engine_ports[3]);
  ASSERT_EQ(::bind(squatter, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(squatter, 8), 0);
  test::child_process up({LLMGW_BINARY, "up", "--config", c.dir + "/cluster.toml", "--logs",
                          c.dir + "/logs", "--ready-timeout", "20"});
  auto out = up.read_stdout_all(60s);
  auto err = up.read_stderr_all(1s);
  EXPECT_EQ(up.wait(30s), std::optional<int>(1)) << out << err;
  EXPECT_EQ(out.find("is up"), std::string::npos) << out;
  auto url = "http://127.0.0.1:" + std::to_string(c.engine_ports[3]);
  EXPECT_NE(err.find("engine b1 at " + url + " is not answering"), std::string::npos) << err;
  EXPECT_NE(err.find("Address already in use"), std::string::npos)
    << "the node log's reason is quoted: " << err;
  EXPECT_TRUE(processes_with(c.dir + "/cluster.toml").empty()) << "no node left";
  ::close(squatter);
}
