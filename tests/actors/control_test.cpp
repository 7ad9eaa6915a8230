// The control actor and the router under the deterministic coordinator:
// sessions, the ownership checks, and what a node going away does.
#include "actors/control.hpp"
#include "actors/router.hpp"
#include "tests/actors/deterministic.hpp"

using namespace llmgw;

namespace {

/// What a stand-in forwarder was told.
struct forwarder_log {
  std::vector<session_ack> acks;
  std::vector<std::string> refusals;
};

forwarder_actor::behavior_type fake_forwarder(forwarder_actor::pointer,
                                              std::shared_ptr<forwarder_log> log) {
  return {
    [](connected_atom, const caf::strong_actor_ptr&) {},
    [](connect_atom) {},
    [](flush_atom) {},
    [log](const session_ack& ack) { log->acks.push_back(ack); },
    [log](refused_atom, std::uint64_t, const std::string& why) { log->refusals.push_back(why); },
  };
}

wire::topology cluster() {
  wire::topology t;
  t.seed = "0";
  t.plaintext = true;
  wire::node_spec c;
  c.name = "control-1";
  c.roles.control = true;
  t.nodes.push_back(c);
  for (const char* name : {"agent-a", "agent-b"}) {
    wire::node_spec a;
    a.name = name;
    a.roles.agent = true;
    wire::engine_spec e;
    e.replica = std::string(name) == "agent-a" ? "a0" : "b0";
    e.model = "m";
    e.kv_events = true;
    e.dp_size = 2;
    a.engines.push_back(e);
    if (std::string(name) == "agent-a") {
      wire::engine_spec quiet; // no KV events: tier 1 only
      quiet.replica = "a1";
      quiet.model = "m";
      a.engines.push_back(quiet);
    }
    t.nodes.push_back(a);
  }
  return t;
}

struct control_test : llmgw::test::deterministic {
  std::shared_ptr<wire::locked_router> shared = std::make_shared<wire::locked_router>(cluster());
  router_actor rt = stop_at_end(sys.spawn(router, shared));
  control_actor ctl = stop_at_end(sys.spawn(
    control, control_options{"control-1", std::make_shared<const wire::topology>(cluster()), {}, 4},
    rt));

  // The router's state, read between steps of the deterministic scheduler
  // (no other thread touches it then).
  wire::router_core& core() {
    return shared->with(
      [](wire::router_core& c, wire::router_stats&) -> wire::router_core& { return c; });
  }
  wire::router_stats& stats() {
    return shared->with(
      [](wire::router_core&, wire::router_stats& s) -> wire::router_stats& { return s; });
  }

  control_state& control_st() {
    auto* ptr = caf::actor_cast<caf::abstract_actor*>(ctl);
    return dynamic_cast<control_actor::stateful_pointer<control_state>>(ptr)->state;
  }

  struct agent {
    forwarder_actor fwd;
    std::shared_ptr<forwarder_log> log;
    std::string node;
    std::uint64_t session = 0;
    std::uint64_t seq = 0;
  };

  agent connect(const std::string& node, std::uint64_t session) {
    auto log = std::make_shared<forwarder_log>();
    auto fwd = stop_at_end(sys.spawn(fake_forwarder, log));
    caf::send_as(fwd, ctl, agent_hello{node, session, {}}, fwd);
    sched.run();
    return {fwd, log, node, session, 0};
  }

  /// Sends an update as `from`'s forwarder.
  void send(agent& from, const std::string& replica, std::vector<wire::block_key> keys,
            bool reset = true, std::uint32_t rank = 0, std::string node = {}) {
    replica_update u;
    u.node = node.empty() ? from.node : node;
    u.replica = replica;
    u.dp_rank = rank;
    u.session = from.session;
    u.seq = ++from.seq;
    u.reset = reset;
    for (auto k : keys)
      u.added.push_back({k, wire::medium::gpu});
    caf::send_as(from.fwd, ctl, std::move(u));
    sched.run();
  }

  std::size_t blocks_of(const std::string& replica, std::uint32_t rank = 0) {
    auto h = core().kv().find(replica, rank);
    return h ? core().kv().blocks().count(*h) : 0;
  }

  bool trusted(const std::string& replica) {
    std::vector<wire::holder_id> hs;
    core().kv().trusted_holders(replica, hs);
    return !hs.empty();
  }

  std::string ask_metrics() {
    std::string text;
    auto client = sys.spawn([&](caf::event_based_actor* self) {
      self->request(ctl, caf::infinite, metrics_atom::value).then([&](const std::string& t) {
        text = t;
      });
    });
    sched.run();
    return text;
  }

  std::uint64_t refused(const std::string& node, const std::string& reason) {
    auto& r = control_st().refused;
    auto it = r.find({node, reason});
    return it == r.end() ? 0 : it->second;
  }
};

} // namespace

TEST_F(control_test, updates_of_a_nodes_own_replicas_reach_the_router_and_are_acked) {
  auto a = connect("agent-a", 11);
  send(a, "a0", {1, 2, 3});
  send(a, "a0", {4}, false, 1); // rank 1 needs a full copy first
  send(a, "a0", {5, 6}, true, 1);
  EXPECT_EQ(blocks_of("a0"), 3u);
  EXPECT_EQ(blocks_of("a0", 1), 2u);
  EXPECT_TRUE(trusted("a0"));
  ASSERT_EQ(a.log->acks.size(), 3u);
  EXPECT_EQ(a.log->acks.back().session, 11u);
  EXPECT_EQ(a.log->acks.back().seq, 3u);
  EXPECT_EQ(stats().unexpected_updates, 1u) << "rank 1's change before its full copy";
}

TEST_F(control_test, a_node_cannot_speak_for_another_nodes_replicas) {
  auto a = connect("agent-a", 1);
  auto b = connect("agent-b", 2);
  send(b, "b0", {9});
  send(a, "b0", {1, 2}); // agent-a, honestly named, claims agent-b's replica
  EXPECT_EQ(blocks_of("b0"), 1u) << "b0 keeps what agent-b sent";
  EXPECT_EQ(refused("agent-a", "not_owner"), 1u);
  EXPECT_EQ(a.log->acks.size(), 1u) << "refused updates are acked: the window must not stall";
  send(a, "b0", {1, 2}, true, 0, "agent-b"); // ... and now naming itself agent-b
  EXPECT_EQ(blocks_of("b0"), 1u);
  EXPECT_EQ(refused("agent-b", "impostor"), 1u);
  EXPECT_EQ(a.log->acks.size(), 1u) << "no ack on another node's behalf";
  send(a, "zz", {1});
  EXPECT_EQ(refused("agent-a", "not_owner"), 2u) << "a replica the topology does not know";
  send(a, "a1", {1});
  EXPECT_EQ(refused("agent-a", "no_kv_events"), 1u);
  EXPECT_FALSE(trusted("a1")) << "a replica without KV events stays on tier 1";
  send(a, "a0", {1}, true, 2);
  EXPECT_EQ(refused("agent-a", "bad_rank"), 1u) << "dp_size is 2";
  auto text = ask_metrics();
  EXPECT_NE(text.find("llmgw_kv_updates_refused_total{node=\"agent-a\",reason=\"not_owner\"} 2\n"),
            std::string::npos)
    << text;
  EXPECT_NE(text.find("llmgw_kv_updates_refused_total{node=\"agent-b\",reason=\"impostor\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("llmgw_agent_connected{node=\"agent-a\"} 1\n"), std::string::npos);
}

TEST_F(control_test, unknown_nodes_are_refused_and_told_why) {
  auto x = connect("agent-x", 5);
  ASSERT_EQ(x.log->refusals.size(), 1u);
  EXPECT_EQ(x.log->refusals[0], "no node 'agent-x' in the topology");
  auto c = connect("control-1", 6);
  ASSERT_EQ(c.log->refusals.size(), 1u);
  EXPECT_EQ(c.log->refusals[0], "node 'control-1' does not have the agent role");
  send(x, "a0", {1});
  EXPECT_EQ(refused("agent-x", "no_session"), 1u);
  EXPECT_EQ(blocks_of("a0"), 0u);
  EXPECT_EQ(control_st().sessions_refused["unknown_node"], 2u);
}

TEST_F(control_test, a_new_session_replaces_the_old_one) {
  auto a = connect("agent-a", 1);
  send(a, "a0", {1, 2, 3});
  auto old = a;
  auto again = connect("agent-a", 2);
  EXPECT_EQ(blocks_of("a0"), 0u) << "the node's replicas are dropped; full copies follow";
  EXPECT_FALSE(trusted("a0"));
  send(old, "a0", {7}, false);
  EXPECT_EQ(refused("agent-a", "impostor"), 1u) << "the old forwarder no longer speaks for it";
  send(again, "a0", {4, 5});
  EXPECT_EQ(blocks_of("a0"), 2u);
  auto& drops = stats().drops;
  EXPECT_EQ((drops[{"a0", wire::drop_reason::session}]), 1u);
}

TEST_F(control_test, an_agent_going_away_drops_its_replicas_at_once) {
  auto a = connect("agent-a", 1);
  auto b = connect("agent-b", 2);
  send(a, "a0", {1, 2});
  send(b, "b0", {3});
  caf::anon_send_exit(a.fwd, caf::exit_reason::kill);
  sched.run();
  EXPECT_EQ(blocks_of("a0"), 0u);
  EXPECT_FALSE(trusted("a0")) << "tier 1 routes it until a new session";
  EXPECT_EQ(blocks_of("b0"), 1u) << "other nodes are untouched";
  EXPECT_EQ(control_st().sessions.count("agent-a"), 0u);
  auto& drops = stats().drops;
  EXPECT_EQ((drops[{"a0", wire::drop_reason::node_down}]), 1u);
  auto back = connect("agent-a", 3);
  send(back, "a0", {1, 2, 9});
  EXPECT_EQ(blocks_of("a0"), 3u);
  EXPECT_TRUE(trusted("a0"));
}

TEST_F(control_test, the_router_answers_routes_from_what_the_agents_sent) {
  auto a = connect("agent-a", 1);
  auto b = connect("agent-b", 2);
  send(a, "a0", {10, 11, 12});
  send(b, "b0", {10});
  wire::route_query q;
  q.model = "m";
  q.tokenized = true;
  q.keys = {10, 11, 12, 13};
  std::optional<wire::route_decision> got;
  auto client = sys.spawn([&](caf::event_based_actor* self) {
    self->request(rt, caf::infinite, route_atom::value, q).then([&](const wire::route_decision& d) {
      got = d;
    });
  });
  sched.run();
  ASSERT_TRUE(got);
  EXPECT_EQ(got->replica, "a0");
  EXPECT_EQ(got->tier, wire::route_tier::kv);
  EXPECT_DOUBLE_EQ(got->score, 0.75);
  EXPECT_EQ(core().counters().decisions[0], 1u);
  EXPECT_EQ(stats().matched_share_kv.count(), 1u);
}
