// Real `llmgw node` processes on loopback, over mutual TLS: control nodes'
// indexes against what the agents' engines published, ownership, an agent
// killed, a control node restarted, two control nodes side by side, and an
// agent connecting from an address that is not its host's.
#include "actors/control_connector.hpp"
#include "actors/forwarder.hpp"
#include "actors/mirror.hpp"
#include "actors/registration.hpp"
#include "config/pki.hpp"
#include "net/http_server.hpp"
#include "tests/integration/test_cluster.hpp"
#include "tests/support/captures.hpp"

#include <boost/json.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <memory>
#include <signal.h>
#include <thread>

using namespace std::chrono_literals;
using llmgw::test::expected_fingerprint;
using llmgw::test::test_cluster;
using llmgw::test::test_node_spec;
namespace json = boost::json;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr auto slow_factor = 4;
#else
constexpr auto slow_factor = 1;
#endif

/// rank 0 of `replica` in a /v1/kv/replicas answer, or null.
const json::object* rank0(const json::value& doc, const std::string& replica) {
  if (!doc.is_object())
    return nullptr;
  for (const auto& r : doc.at("replicas").as_array())
    if (r.at("replica").as_string() == replica.c_str()) {
      const auto& ranks = r.at("ranks").as_array();
      return ranks.empty() ? nullptr : &ranks[0].as_object();
    }
  return nullptr;
}

/// True when the control node holds exactly the capture's final blocks for
/// `replica`, trusted.
bool holds(test_cluster& c, const std::string& control, const std::string& replica,
           const std::string& capture) {
  auto doc = c.replicas(control);
  const auto* r = rank0(doc, replica);
  return r && r->at("trusted").as_bool()
         && r->at("fingerprint").as_string() == expected_fingerprint(capture).c_str();
}

bool has_state(test_cluster& c, const std::string& control, const std::string& replica) {
  auto doc = c.replicas(control);
  const auto* r = rank0(doc, replica);
  return r && r->at("has_state").as_bool();
}

/// Starts control-1, waits for its gateway, then starts both agents.
void start_control_and_agents(test_cluster& c) {
  c.start("control-1");
  ASSERT_TRUE(c.wait_ready("control-1", 10s)) << c.log_of("control-1");
  c.start("agent-a");
  c.start("agent-b");
}

std::vector<test_node_spec> one_control_two_agents() {
  return {
    {"control-1", true, false, "127.0.0.1", {}},
    {"agent-a",
     false,
     true,
     "127.0.0.1",
     {{"a0", "S1_basic.map.int.json"}, {"a1", "S3_lora_salt.array.bytes.json"}}},
    {"agent-b",
     false,
     true,
     "127.0.0.1",
     {{"b0", "S2_churn.map.int.json"}, {"b1", "S4_clear.map.int.json", "m", false}}},
  };
}

} // namespace

TEST(cluster, the_control_nodes_index_equals_the_agents_mirrors) {
  test_cluster c(one_control_two_agents());
  start_control_and_agents(c);
  EXPECT_TRUE(test_cluster::eventually(
    [&] {
      return holds(c, "control-1", "a0", "S1_basic.map.int.json")
             && holds(c, "control-1", "a1", "S3_lora_salt.array.bytes.json")
             && holds(c, "control-1", "b0", "S2_churn.map.int.json");
    },
    10s * slow_factor))
    << json::serialize(c.replicas("control-1")) << c.log_of("agent-b");
  EXPECT_FALSE(has_state(c, "control-1", "b1")) << "kv_events = false: tier 1 only";
  EXPECT_EQ(c.metric("control-1", "llmgw_agent_connected{node=\"agent-a\"}"), 1);
  EXPECT_EQ(c.metric("control-1", "llmgw_agent_connected{node=\"agent-b\"}"), 1);
  EXPECT_GT(
    c.metric("control-1", "llmgw_kv_events_total{replica=\"b0\",dp_rank=\"0\",kind=\"removed\"}"),
    0)
    << "the agent's counts reach the control node's /metrics";
  // A prompt the engine of a0 cached routes there, exactly.
  auto capture = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.int.json"));
  const auto& req = capture.at("requests").as_array()[0].as_object();
  json::array prompt;
  for (std::int64_t i = 0; i < req.at("prompt_len").as_int64(); ++i)
    prompt.push_back(req.at("tokens").as_array()[static_cast<std::size_t>(i)]);
  json::object body{{"model", "m"}, {"prompt", prompt}};
  auto route = c.post("control-1", "/v1/route", json::serialize(body));
  ASSERT_EQ(route.status, 200) << route.body;
  auto d = json::parse(route.body);
  EXPECT_EQ(d.at("replica"), "a0");
  EXPECT_EQ(d.at("tier"), "kv");
  EXPECT_EQ(d.at("score").to_number<double>(), 1.0);
  EXPECT_EQ(c.stop("agent-a", SIGTERM), std::optional<int>(0)) << "SIGTERM stops cleanly";
  EXPECT_EQ(c.stop("control-1", SIGTERM), std::optional<int>(0));
}

TEST(cluster, a_node_claiming_another_nodes_replica_is_refused) {
  auto nodes = one_control_two_agents();
  test_cluster c(nodes);
  // agent-b runs with a topology of its own that gives it a replica "a0".
  auto rogue = nodes;
  rogue[2].engines = {{"a0", "S4_clear.map.int.json"}};
  rogue[1].engines.clear();
  auto rogue_file = c.write_topology(rogue, "rogue.toml");
  c.start("control-1");
  ASSERT_TRUE(c.wait_ready("control-1", 10s));
  c.start("agent-a");
  ASSERT_TRUE(test_cluster::eventually(
    [&] { return holds(c, "control-1", "a0", "S1_basic.map.int.json"); }, 10s * slow_factor));
  c.start("agent-b", rogue_file);
  EXPECT_TRUE(test_cluster::eventually(
    [&] {
      return c.metric("control-1",
                      "llmgw_kv_updates_refused_total{node=\"agent-b\",reason=\"not_owner\"}")
             >= 1;
    },
    10s * slow_factor))
    << c.admin_get("control-1", "/metrics").body;
  EXPECT_TRUE(holds(c, "control-1", "a0", "S1_basic.map.int.json"))
    << "a0 still holds what its owner sent";
  EXPECT_NE(c.log_of("control-1")
              .find("refused update from node 'agent-b' for replica 'a0' "
                    "(not_owner): the topology gives it to node 'agent-a'"),
            std::string::npos)
    << c.log_of("control-1");
}

TEST(cluster, a_killed_agent_loses_its_replicas_at_once) {
  test_cluster c(one_control_two_agents());
  start_control_and_agents(c);
  ASSERT_TRUE(test_cluster::eventually(
    [&] {
      return holds(c, "control-1", "a0", "S1_basic.map.int.json")
             && holds(c, "control-1", "b0", "S2_churn.map.int.json");
    },
    10s * slow_factor));
  c.stop("agent-b", SIGKILL);
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(
    test_cluster::eventually([&] { return !has_state(c, "control-1", "b0"); }, 5s * slow_factor));
  auto took = std::chrono::steady_clock::now() - start;
  std::fprintf(stderr, "b0 dropped %.0f ms after agent-b was killed\n",
               std::chrono::duration<double, std::milli>(took).count());
  EXPECT_TRUE(holds(c, "control-1", "a0", "S1_basic.map.int.json")) << "agent-a is untouched";
  EXPECT_EQ(c.metric("control-1", "llmgw_kv_resets_total{replica=\"b0\",reason=\"node_down\"}"), 1);
  EXPECT_EQ(c.metric("control-1", "llmgw_agent_connected{node=\"agent-b\"}"), 0);
}

TEST(cluster, a_killed_agent_takes_its_engines_with_it) {
  test_cluster c(one_control_two_agents());
  start_control_and_agents(c);
  pid_t b0 = 0, b1 = 0;
  ASSERT_TRUE(test_cluster::eventually(
    [&] {
      b0 = c.engine_pid("b0");
      b1 = c.engine_pid("b1");
      return b0 > 0 && b1 > 0;
    },
    10s * slow_factor));
  EXPECT_EQ(::kill(b0, 0), 0) << "b0's engine runs";
  c.stop("agent-b", SIGKILL); // no chance to stop its engines itself
  EXPECT_TRUE(test_cluster::eventually([&] { return ::kill(b0, 0) != 0 && ::kill(b1, 0) != 0; },
                                       5s * slow_factor))
    << "engines of a dead agent must not keep running (GPUs, ports, a second launch on restart)";
  EXPECT_EQ(::kill(c.engine_pid("a0"), 0), 0) << "agent-a's engines are untouched";
}

TEST(cluster, a_restarted_control_node_gets_full_copies_within_a_second) {
  test_cluster c(one_control_two_agents());
  start_control_and_agents(c);
  auto all_held = [&] {
    return holds(c, "control-1", "a0", "S1_basic.map.int.json")
           && holds(c, "control-1", "a1", "S3_lora_salt.array.bytes.json")
           && holds(c, "control-1", "b0", "S2_churn.map.int.json");
  };
  ASSERT_TRUE(test_cluster::eventually(all_held, 10s * slow_factor));
  c.stop("control-1", SIGKILL);
  std::this_thread::sleep_for(1500ms); // the agents' reconnect attempts back off meanwhile
  c.start("control-1");
  ASSERT_TRUE(c.wait_ready("control-1", 10s));
  auto ready = std::chrono::steady_clock::now();
  EXPECT_TRUE(test_cluster::eventually(all_held, 1000ms * slow_factor))
    << json::serialize(c.replicas("control-1"));
  std::fprintf(
    stderr, "full copies from both agents %.0f ms after the control node was ready\n",
    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ready).count());
}

TEST(cluster, two_control_nodes_hold_identical_indexes) {
  auto nodes = one_control_two_agents();
  nodes.insert(nodes.begin() + 1, test_node_spec{"control-2", true, false, "127.0.0.1", {}});
  test_cluster c(nodes);
  c.start("control-1");
  c.start("control-2");
  ASSERT_TRUE(c.wait_ready("control-1", 10s));
  ASSERT_TRUE(c.wait_ready("control-2", 10s));
  c.start("agent-a");
  c.start("agent-b");
  for (const char* ctl : {"control-1", "control-2"})
    EXPECT_TRUE(test_cluster::eventually(
      [&] {
        return holds(c, ctl, "a0", "S1_basic.map.int.json")
               && holds(c, ctl, "a1", "S3_lora_salt.array.bytes.json")
               && holds(c, ctl, "b0", "S2_churn.map.int.json");
      },
      10s * slow_factor))
      << ctl;
  auto one = c.replicas("control-1");
  auto two = c.replicas("control-2");
  for (const char* r : {"a0", "a1", "b0"}) {
    ASSERT_TRUE(rank0(one, r) && rank0(two, r));
    EXPECT_EQ(rank0(one, r)->at("fingerprint"), rank0(two, r)->at("fingerprint")) << r;
    EXPECT_EQ(rank0(one, r)->at("blocks"), rank0(two, r)->at("blocks")) << r;
  }
  // Losing one control node loses nothing: the other still routes exactly.
  c.stop("control-1", SIGKILL);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(holds(c, "control-2", "b0", "S2_churn.map.int.json"));
}

TEST(cluster, an_agent_must_connect_from_its_own_host) {
  auto nodes = one_control_two_agents();
  nodes[2].host = "127.0.0.2"; // agent-b's host; its connection comes from 127.0.0.1
  test_cluster c(nodes);
  start_control_and_agents(c);
  EXPECT_TRUE(test_cluster::eventually(
    [&] {
      return c.metric("control-1", "llmgw_agent_sessions_refused_total{reason=\"address\"}") >= 1;
    },
    10s * slow_factor));
  EXPECT_TRUE(test_cluster::eventually(
    [&] { return holds(c, "control-1", "a0", "S1_basic.map.int.json"); }, 10s * slow_factor));
  EXPECT_FALSE(has_state(c, "control-1", "b0"));
  EXPECT_TRUE(test_cluster::eventually(
    [&] {
      return c.log_of("agent-b").find("the control node refused this node's session: the "
                                      "connection comes from '127.0.0.1', not from node "
                                      "'agent-b''s host")
             != std::string::npos;
    },
    5s))
    << c.log_of("agent-b");
}

TEST(cluster, an_agent_shows_its_sessions_and_what_it_refused_on_its_admin_listener) {
  test_cluster c(one_control_two_agents());
  start_control_and_agents(c);
  auto up = [&] {
    auto m = c.admin_get("agent-a", "/metrics");
    return m.status == 200
           && m.body.find("llmgw_agent_session_up{control=\"control-1\"} 1\n") != std::string::npos;
  };
  ASSERT_TRUE(test_cluster::eventually(up, 10s * slow_factor))
    << c.admin_get("agent-a", "/metrics").body;
  auto text = c.admin_get("agent-a", "/metrics").body;
  EXPECT_NE(
    text.find("llmgw_agent_sessions_ended_total{control=\"control-1\",reason=\"unproven\"} 0\n"),
    std::string::npos)
    << text;
  EXPECT_NE(text.find("llmgw_agent_event_messages_refused_total{replica=\"a0\",dp_rank=\"0\","
                      "reason=\"bad_frame\"} 0\n"),
            std::string::npos)
    << text;
  EXPECT_NE(text.find("llmgw_agent_event_gaps_filled_total{replica=\"a0\",dp_rank=\"0\"} 0\n"),
            std::string::npos)
    << text;
  EXPECT_EQ(c.admin_get("agent-a", "/healthz").status, 200);
  EXPECT_EQ(c.admin_get("control-1", "/healthz").status, 200) << "a control node's admin too";
  EXPECT_EQ(c.admin_get("agent-a", "/v1/kv/replicas").status, 404) << "an agent has no index";
}

TEST(cluster, a_node_with_both_roles_shows_its_mirrors_beside_its_index) {
  test_cluster c({{"solo", true, true, "127.0.0.1", {{"s0", "S1_basic.map.int.json"}}}});
  c.start("solo");
  ASSERT_TRUE(c.wait_ready("solo", 10s)) << c.log_of("solo");
  ASSERT_TRUE(test_cluster::eventually(
    [&] { return holds(c, "solo", "s0", "S1_basic.map.int.json"); }, 10s * slow_factor))
    << json::serialize(c.replicas("solo"));
  auto mirrors = c.mirrors("solo");
  ASSERT_TRUE(mirrors.is_object()) << c.admin_get("solo", "/v1/kv/mirrors").body;
  const auto& list = mirrors.at("mirrors").as_array();
  ASSERT_EQ(list.size(), 1u) << json::serialize(mirrors);
  EXPECT_EQ(list[0].at("replica"), "s0");
  EXPECT_EQ(list[0].at("fingerprint"), rank0(c.replicas("solo"), "s0")->at("fingerprint"))
    << "the node's own mirror equals its own index";
  auto text = c.admin_get("solo", "/metrics").body;
  EXPECT_NE(text.find("llmgw_agent_flushes_skipped_total{control=\"solo\"} "), std::string::npos)
    << text;
  EXPECT_EQ(c.admin_get("solo", "/v1/kv/mirrors?x=1").status, 200);
  auto wrong = c.admin_get("solo", "/v1/kv/nothing");
  EXPECT_EQ(wrong.status, 404);
  EXPECT_NE(wrong.body.find("/v1/kv/mirrors"), std::string::npos) << wrong.body;
}

TEST(cluster, a_node_holding_another_nodes_certificate_cannot_take_its_place) {
  test_cluster c(one_control_two_agents());
  start_control_and_agents(c);
  ASSERT_TRUE(test_cluster::eventually(
    [&] { return holds(c, "control-1", "b0", "S2_churn.map.int.json"); }, 10s * slow_factor));
  // A node with agent-a's certificate and key (TLS accepts it: the CA signed
  // it) runs a forwarder that says it is agent-b, with an empty b0.
  struct tls_config : caf::actor_system_config {
    explicit tls_config(const std::string& dir) {
      load<caf::io::middleman>();
      load<caf::openssl::manager>();
      auto files = llmgw::config::credentials_in(dir, "agent-a");
      openssl_certificate = files.cert;
      openssl_key = files.key;
      openssl_cafile = dir + "/ca.pem";
      llmgw::register_message_types(*this);
      set("scheduler.max-threads", 2);
    }
  };
  tls_config cfg(c.dir());
  {
    caf::actor_system sys{cfg};
    auto files = llmgw::config::credentials_in(c.dir(), "agent-a");
    auto id =
      llmgw::config::node_identity::load("agent-a", files.cert, files.key, c.dir() + "/ca.pem");
    ASSERT_TRUE(id);
    auto empty = sys.spawn(llmgw::mirror, std::string("b0"), std::uint32_t{0},
                           std::optional<llmgw::kv::parity_config>{}, nullptr);
    llmgw::forwarder_options fo;
    fo.node = "agent-b";
    fo.control = "control-1";
    fo.identity = *id;
    auto f = sys.spawn(llmgw::forwarder, fo, std::vector<llmgw::mirror_entry>{{"b0", empty}},
                       llmgw::middleman_connector("127.0.0.1", c.caf_port("control-1"), 5s));
    EXPECT_TRUE(test_cluster::eventually(
      [&] {
        return c.metric("control-1", "llmgw_agent_sessions_refused_total{reason=\"name\"}") >= 2;
      },
      10s * slow_factor))
      << "refused, and refused again when it retries: " << c.log_of("control-1");
    caf::anon_send_exit(f, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(empty, caf::exit_reason::user_shutdown);
  }
  EXPECT_TRUE(holds(c, "control-1", "b0", "S2_churn.map.int.json"))
    << "b0 keeps what the genuine agent-b sent";
  EXPECT_EQ(c.metric("control-1", "llmgw_agent_connected{node=\"agent-b\"}"), 1);
  EXPECT_NE(c.log_of("control-1").find("the certificate does not name node 'agent-b'"),
            std::string::npos);
}

TEST(cluster, a_frozen_agent_is_found_by_heartbeats_and_comes_back) {
  test_cluster c(one_control_two_agents()); // heartbeat 200 ms, connection timeout 1 s
  start_control_and_agents(c);
  ASSERT_TRUE(test_cluster::eventually(
    [&] { return holds(c, "control-1", "b0", "S2_churn.map.int.json"); }, 10s * slow_factor));
  c.signal("agent-b", SIGSTOP); // alive, connected, silent
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(
    test_cluster::eventually([&] { return !has_state(c, "control-1", "b0"); }, 5s * slow_factor))
    << "a frozen agent must not be trusted forever";
  std::fprintf(
    stderr, "frozen agent-b dropped after %.0f ms\n",
    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  EXPECT_TRUE(holds(c, "control-1", "a0", "S1_basic.map.int.json")) << "agent-a is untouched";
  c.signal("agent-b", SIGCONT);
  EXPECT_TRUE(test_cluster::eventually(
    [&] { return holds(c, "control-1", "b0", "S2_churn.map.int.json"); }, 10s * slow_factor))
    << "thawed, it reconnects and sends a full copy";
}

namespace {

/// A stand-in for the engines' /tokenize: "request N" (as a completion
/// prompt, or as a chat's only user message) is the prompt of the capture's
/// request N, token for token. Counts chat bodies that lack the template
/// options a chat must be tokenized with.
struct capture_tokenizer {
  json::value capture;
  std::atomic<int> calls{0};
  std::atomic<int> bad_chat_bodies{0};
  std::unique_ptr<llmgw::http_server> server;

  explicit capture_tokenizer(const std::string& name)
    : capture(llmgw::test::read_json(llmgw::test::capture_path(name))) {
    server = std::make_unique<llmgw::http_server>(
      "127.0.0.1", 0, 1, llmgw::http_server_limits{},
      [this](llmgw::http_request&& req, llmgw::http_responder respond) {
        if (req.method == "GET" && req.target == "/metrics") // the agent reads the engine's load
          return respond(llmgw::http_reply{200,
                                           "text/plain; version=0.0.4",
                                           "vllm:num_requests_running{engine=\"0\"} 3\n"
                                           "vllm:num_requests_waiting{engine=\"0\"} 2\n",
                                           {}});
        if (req.method == "GET" && req.target == "/health") // the gateway's probe
          return respond(llmgw::http_reply{200, "application/json", "{}", {}});
        if (req.target != "/tokenize") // vLLM without --enable-scale-out has no render
          return respond(
            llmgw::http_reply{404, "application/json", R"({"detail":"Not Found"})", {}});
        ++calls;
        auto body = json::parse(req.body).as_object();
        std::string text;
        if (body.contains("messages")) {
          text = json::value_to<std::string>(body.at("messages").at(0).at("content"));
          if (body.at("add_generation_prompt") != true || body.at("add_special_tokens") != false)
            ++bad_chat_bodies;
        } else {
          text = json::value_to<std::string>(body.at("prompt"));
        }
        auto n = std::stoul(text.substr(text.rfind(' ') + 1));
        const auto& r = capture.at("requests").as_array().at(n).as_object();
        json::array tokens;
        for (std::int64_t i = 0; i < r.at("prompt_len").as_int64(); ++i)
          tokens.push_back(r.at("tokens").as_array()[static_cast<std::size_t>(i)]);
        json::object out{{"count", tokens.size()}, {"max_model_len", 8192}, {"tokens", tokens}};
        respond(llmgw::http_reply{200, "application/json", json::serialize(out), {}});
      });
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server->port()); }

  /// The share of request n's prompt blocks, from the first, that the
  /// capture's engine still holds at the end: what an exact router scores.
  double expected_share(std::size_t n) const {
    auto held = llmgw::test::capture_final_blocks(capture);
    const auto& r = capture.at("requests").as_array().at(n).as_object();
    auto full_blocks = static_cast<std::size_t>(r.at("prompt_len").as_int64()) / 16;
    std::size_t leading = 0;
    for (; leading < full_blocks; ++leading) {
      auto key = json::value_to<std::uint64_t>(r.at("block_hashes_u64").as_array()[leading]);
      if (!held.count({key, llmgw::kv::medium::gpu}))
        break;
    }
    return static_cast<double>(leading) / static_cast<double>(full_blocks);
  }
};

} // namespace

TEST(cluster, text_prompts_route_exactly_through_tokenize_lora_and_salt) {
  capture_tokenizer tok("S3_lora_salt.map.int.json");
  llmgw::test::test_engine_spec lora_engine{"a0",      "S3_lora_salt.map.int.json", "m", true,
                                            tok.url(), {"sql-lora", "chat-lora"}};
  llmgw::test::test_engine_spec plain_engine{"a1", "S1_basic.map.int.json", "m", true, tok.url()};
  test_cluster c({{"control-1", true, false, "127.0.0.1", {}},
                  {"agent-a", false, true, "127.0.0.1", {lora_engine, plain_engine}}});
  c.start("control-1");
  ASSERT_TRUE(c.wait_ready("control-1", 10s));
  c.start("agent-a");
  ASSERT_TRUE(test_cluster::eventually(
    [&] { return holds(c, "control-1", "a0", "S3_lora_salt.map.int.json"); }, 10s * slow_factor));
  std::size_t checked = 0;
  const auto& requests = tok.capture.at("requests").as_array();
  for (std::size_t n = 0; n < requests.size(); ++n) {
    const auto& r = requests[n].as_object();
    auto share = tok.expected_share(n);
    for (bool chat : {false, true}) {
      json::object body{
        {"model", r.at("lora_name").is_null() ? json::value("m") : r.at("lora_name")}};
      if (chat)
        body["messages"] =
          json::array{json::object{{"role", "user"}, {"content", "request " + std::to_string(n)}}};
      else
        body["prompt"] = "request " + std::to_string(n);
      if (!r.at("cache_salt").is_null())
        body["cache_salt"] = r.at("cache_salt");
      auto res = c.post("control-1", "/v1/route", json::serialize(body));
      ASSERT_EQ(res.status, 200) << res.body;
      auto d = json::parse(res.body);
      SCOPED_TRACE(json::value_to<std::string>(r.at("id")) + (chat ? " (chat)" : ""));
      if (share > 0) {
        EXPECT_EQ(d.at("replica"), "a0") << res.body;
        EXPECT_EQ(d.at("tier"), "kv") << res.body;
        EXPECT_NEAR(d.at("score").to_number<double>(), share, 1e-9) << res.body;
        ++checked;
      } else {
        EXPECT_NE(d.at("tier"), "kv") << "nothing of this prompt is cached: " << res.body;
      }
    }
  }
  EXPECT_GE(checked, 10u) << "most requests of the capture still have cached blocks";
  EXPECT_EQ(tok.bad_chat_bodies.load(), 0);
  EXPECT_LE(tok.calls.load(), static_cast<int>(2 * requests.size()))
    << "each distinct body is tokenized once";
  // The agent reads each engine's /metrics and forwards its load: the
  // control node's index shows it beside the KV state.
  std::string last;
  EXPECT_TRUE(test_cluster::eventually(
    [&] {
      auto doc = c.replicas("control-1");
      last = json::serialize(doc);
      if (!doc.is_object())
        return false;
      for (const auto& r : doc.at("replicas").as_array())
        if (r.at("replica") == "a1" && r.as_object().contains("engine_load"))
          return r.at("engine_load").at("running") == 3 && r.at("engine_load").at("waiting") == 2;
      return false;
    },
    10s * slow_factor))
    << last;
}
