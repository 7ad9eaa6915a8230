// The control actor and the router under the deterministic coordinator:
// sessions and their handshake (a node is only what its certificate says),
// the ownership checks, and what a node going away does.
#include "actors/control.hpp"
#include "actors/router.hpp"
#include "routing/router_report.hpp"
#include "tests/actors/deterministic.hpp"
#include "tests/support/credentials.hpp"

using namespace llmgw;

namespace {

/// What a stand-in forwarder was told.
struct forwarder_log {
  std::vector<session_ack> acks;
  std::vector<std::string> refusals;
  std::vector<control_proof> proofs;
  std::vector<std::string> resyncs; ///< replicas asked for again
};

forwarder_actor::behavior_type fake_forwarder(forwarder_actor::pointer,
                                              std::shared_ptr<forwarder_log> log) {
  return {
    [](connected_atom, const caf::strong_actor_ptr&) {},
    [](connect_atom) {},
    [](flush_atom) {},
    [log](const control_proof& p) { log->proofs.push_back(p); },
    [](timeout_atom, std::uint64_t) {},
    [log](const session_ack& ack) { log->acks.push_back(ack); },
    [log](refused_atom, std::uint64_t, const std::string& why) { log->refusals.push_back(why); },
    [log](resync_atom, std::uint64_t, const std::string& replica) {
      log->resyncs.push_back(replica);
    },
    [](attach_atom, const std::string&, const caf::actor&) {},
    [](detach_atom, const std::string&) {},
  };
}

config::topology cluster() {
  config::topology t;
  t.seed = "0";
  t.plaintext = true;
  config::node_spec c;
  c.name = "control-1";
  c.roles.control = true;
  t.nodes.push_back(c);
  for (const char* name : {"agent-a", "agent-b"}) {
    config::node_spec a;
    a.name = name;
    a.roles.agent = true;
    config::engine_spec e;
    e.replica = std::string(name) == "agent-a" ? "a0" : "b0";
    e.model = "m";
    e.kv_events = true;
    e.canary = false; // its engines do not answer completions here
    e.dp_size = 2;
    a.engines.push_back(e);
    if (std::string(name) == "agent-a") {
      config::engine_spec quiet; // no KV events: tier 1 only
      quiet.replica = "a1";
      quiet.model = "m";
      a.engines.push_back(quiet);
    }
    t.nodes.push_back(a);
  }
  return t;
}

/// The same cluster with certificates: the control node proves to be
/// control-1, each agent must prove its name.
config::topology tls_cluster() {
  auto t = cluster();
  t.plaintext = false;
  t.ca = test::test_credentials().ca();
  return t;
}

struct control_test : llmgw::test::deterministic {
  std::shared_ptr<routing::shared_router> shared;
  router_actor rt;
  control_actor ctl;

  void SetUp() override { start(cluster(), nullptr); }

  void start(const config::topology& t, std::shared_ptr<const config::node_identity> id) {
    shared = std::make_shared<routing::shared_router>(t);
    rt = stop_at_end(sys.spawn(router, shared));
    control_options opts;
    opts.node = "control-1";
    opts.topo = std::make_shared<const config::topology>(t);
    opts.identity = std::move(id);
    opts.pending_limit = 4;
    opts.max_attempts = 3;
    ctl = stop_at_end(sys.spawn(control, opts, rt));
  }

  // The router's state, read between steps of the deterministic scheduler
  // (no other thread touches it then).
  routing::router_core& core() {
    return shared->with(
      [](routing::router_core& c, routing::router_stats&) -> routing::router_core& { return c; });
  }
  routing::router_stats& stats() {
    return shared->with(
      [](routing::router_core&, routing::router_stats& s) -> routing::router_stats& { return s; });
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
    std::string key; ///< the session key, once the control node's proof came
  };

  /// A stand-in forwarder.
  agent forwarder_for(const std::string& node, std::uint64_t session) {
    auto log = std::make_shared<forwarder_log>();
    auto fwd = stop_at_end(sys.spawn(fake_forwarder, log));
    return {fwd, log, node, session, 0, {}};
  }

  /// The transcript of `a`'s session after the control node's proof.
  static config::session_transcript transcript(const agent& a, const config::key_share& share,
                                               const control_proof& p) {
    return {a.node,  "control-1", a.session, share.nonce(), share.public_key(),
            p.nonce, p.key_share};
  }

  /// Says hello as `node` and, when the control node answers, proves the
  /// name with `id` (null: a plaintext cluster's empty proof).
  agent connect(const std::string& node, std::uint64_t session,
                const std::shared_ptr<const config::node_identity>& id = nullptr) {
    auto a = forwarder_for(node, session);
    auto share = config::key_share::make();
    caf::send_as(a.fwd, ctl, agent_hello{node, session, {}, share->nonce(), share->public_key()},
                 a.fwd);
    sched.run();
    if (a.log->proofs.empty())
      return a; // refused at hello
    auto t = transcript(a, *share, a.log->proofs.back());
    a.key = *share->session_key(a.log->proofs.back().key_share, t);
    agent_proof mine{session, {}, {}};
    if (id) {
      mine.certificate = id->certificate();
      mine.signature = id->sign(config::proof_input(config::proof_role::agent, t));
    }
    caf::send_as(a.fwd, ctl, std::move(mine));
    sched.run();
    return a;
  }

  /// An update as `from`'s forwarder would make it (node, session and MAC
  /// its own unless changed before sending).
  replica_update update(agent& from, const std::string& replica, std::vector<wire::block_key> keys,
                        bool reset = true, std::uint32_t rank = 0) {
    replica_update u;
    u.node = from.node;
    u.replica = replica;
    u.dp_rank = rank;
    u.session = from.session;
    u.seq = ++from.seq;
    u.reset = reset;
    for (auto k : keys)
      u.added.push_back({k, kv::medium::gpu});
    u.mac = update_mac(from.key, u);
    return u;
  }

  /// Sends an update as `from`'s forwarder.
  void send(agent& from, const std::string& replica, std::vector<wire::block_key> keys,
            bool reset = true, std::uint32_t rank = 0) {
    send_raw(from, update(from, replica, std::move(keys), reset, rank));
  }

  void send_raw(const agent& from, replica_update u) {
    caf::send_as(from.fwd, ctl, std::move(u));
    sched.run();
  }

  /// A load report as `from`'s forwarder would make it.
  load_report loads(agent& from, std::vector<engine_load> entries) {
    load_report r;
    r.node = from.node;
    r.session = from.session;
    r.seq = ++from.seq;
    r.loads = std::move(entries);
    r.mac = load_report_mac(from.key, r);
    return r;
  }

  void send_loads(const agent& from, load_report r) {
    caf::send_as(from.fwd, ctl, std::move(r));
    sched.run();
  }

  /// The engine load the router holds for `replica`: (running, waiting), or
  /// (-1, -1) when it holds none.
  std::pair<long, long> engine_load_of(const std::string& replica) {
    for (const auto& r : core().replicas())
      if (r.name == replica && r.engine_load_known)
        return {r.engine_running, r.engine_waiting};
    return {-1, -1};
  }

  std::size_t blocks_of(const std::string& replica, std::uint32_t rank = 0) {
    auto h = core().kv().find(replica, rank);
    return h ? core().kv().blocks().count(*h) : 0;
  }

  bool trusted(const std::string& replica) {
    std::vector<routing::holder_id> hs;
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

TEST_F(control_test, an_engine_emptied_is_forgotten_by_tier1_too) {
  auto a = connect("agent-a", 1);
  send(a, "a0", {});
  routing::route_query q;
  q.model = "m";
  q.exclude = {"a1", "b0", "b1"};
  q.chunks = routing::chunk_hashes(std::string(256, 'x'), 64);
  auto sent = shared->decide_and_record(q); // tier 1 remembers a0 got this text
  ASSERT_EQ(sent.replica, "a0");
  shared->finished(routing::progress_of(sent), false);
  q.exclude.clear();
  q.dry_run = true;
  auto before = shared->decide_and_record(q);
  ASSERT_EQ(before.replica, "a0");
  ASSERT_EQ(before.tier, routing::route_tier::approx);
  // The engine restarts: the agent's totals count it, and its next update
  // (a full copy of its empty mirror) says so.
  auto u = update(a, "a0", {});
  u.totals.resets[static_cast<std::size_t>(kv::reset_reason::restart)] = 1;
  u.mac = update_mac(a.key, u);
  send_raw(a, u);
  auto after = shared->decide_and_record(q);
  EXPECT_EQ(after.tier, routing::route_tier::load) << "nothing of the text is remembered anywhere";
}

TEST_F(control_test, the_hybrid_flag_is_under_the_mac_and_reaches_the_index) {
  auto a = connect("agent-a", 1);
  send(a, "a0", {1, 2});
  // A relay that turns a hybrid engine into a dense one (or back) would
  // make the router predict prefixes the engine cannot reuse.
  auto flipped = update(a, "a0", {3}, false);
  flipped.hybrid = true; // after the MAC
  send_raw(a, flipped);
  EXPECT_EQ(refused("agent-a", "mac"), 1u);
  auto genuine = update(a, "a0", {3}, false);
  genuine.hybrid = true;
  genuine.mac = update_mac(a.key, genuine);
  send_raw(a, genuine);
  auto& kv = core().kv();
  auto h = kv.find("a0", 0);
  ASSERT_TRUE(h);
  EXPECT_TRUE(kv.info(*h).hybrid);
}

TEST_F(control_test, enum_values_out_of_range_are_refused_and_counted) {
  auto a = connect("agent-a", 1);
  send(a, "a0", {1, 2});
  // CAF decodes an enum as its integer: a peer can send any byte.
  auto bad_medium = update(a, "a0", {3}, false);
  bad_medium.added[0].where = static_cast<kv::medium>(7);
  bad_medium.mac = update_mac(a.key, bad_medium);
  send_raw(a, bad_medium);
  auto bad_parity = update(a, "a0", {4}, false);
  bad_parity.parity = static_cast<std::uint8_t>(kv::last_parity_state) + 1;
  bad_parity.mac = update_mac(a.key, bad_parity);
  send_raw(a, bad_parity);
  EXPECT_EQ(refused("agent-a", "malformed"), 2u);
  EXPECT_EQ(blocks_of("a0"), 2u) << "neither update touched the index";
  EXPECT_TRUE(trusted("a0")) << "the session goes on";
  send(a, "a0", {5}, false);
  EXPECT_EQ(blocks_of("a0"), 3u);
}

TEST_F(control_test, an_untranslatable_replica_is_distrusted_with_the_agents_reason) {
  auto a = connect("agent-a", 1);
  send(a, "a0", {1, 2});
  ASSERT_TRUE(trusted("a0"));
  auto u = update(a, "a0", {3}, false);
  u.parity = static_cast<std::uint8_t>(kv::parity_state::untranslatable);
  u.parity_reason = "the engine publishes block size 64, the cluster's is 16";
  u.mac = update_mac(a.key, u);
  send_raw(a, u);
  EXPECT_FALSE(trusted("a0")) << "routed by tier 1";
  auto h = core().kv().find("a0", 0);
  ASSERT_TRUE(h);
  EXPECT_EQ(core().kv().info(*h).parity_reason, u.parity_reason);
  auto report = routing::kv_replicas_json(core(), stats(), std::chrono::steady_clock::now());
  EXPECT_NE(report.find("\"parity\":\"untranslatable\",\"hash_mismatch\":true,"
                        "\"parity_reason\":\"the engine publishes block size 64"),
            std::string::npos)
    << report;
  EXPECT_EQ(stats().mismatches["a0"], 1u) << "counted";
  // A reason longer than any the agent writes is refused whole.
  auto huge = update(a, "a0", {4}, false);
  huge.parity_reason.assign(max_parity_reason + 1, 'x');
  huge.mac = update_mac(a.key, huge);
  send_raw(a, huge);
  EXPECT_EQ(refused("agent-a", "malformed"), 1u);
  EXPECT_EQ(blocks_of("a0"), 3u) << "the refused update touched nothing";
  // Translated again after a restart: trusted, the reason gone.
  auto back = update(a, "a0", {5}, true);
  back.parity = static_cast<std::uint8_t>(kv::parity_state::translated);
  back.mac = update_mac(a.key, back);
  send_raw(a, back);
  EXPECT_TRUE(trusted("a0"));
  EXPECT_TRUE(core().kv().info(*h).parity_reason.empty());
}

TEST_F(control_test, a_node_cannot_speak_for_another_nodes_replicas) {
  auto a = connect("agent-a", 1);
  auto b = connect("agent-b", 2);
  send(b, "b0", {9});
  send(a, "b0", {1, 2}); // agent-a, honestly named, claims agent-b's replica
  EXPECT_EQ(blocks_of("b0"), 1u) << "b0 keeps what agent-b sent";
  EXPECT_EQ(refused("agent-a", "not_owner"), 1u);
  EXPECT_EQ(a.log->acks.size(), 1u) << "refused updates are acked: the window must not stall";
  auto forged = update(a, "b0", {1, 2}); // ... and now naming itself agent-b, in b's session
  forged.node = "agent-b";
  forged.session = b.session;
  send_raw(a, forged);
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
  EXPECT_EQ(refused("unknown", "no_session"), 1u)
    << "a name outside the topology is no metric label (anyone can write one)";
  EXPECT_EQ(refused("agent-x", "no_session"), 0u);
  EXPECT_EQ(blocks_of("a0"), 0u);
  EXPECT_EQ(control_st().sessions_refused["unknown_node"], 2u);
  ASSERT_EQ(x.log->refusals.size(), 2u) << "an update without a session is answered";
  EXPECT_EQ(x.log->refusals[1], "this control node knows no session of node 'agent-x'");
}

TEST_F(control_test, a_new_session_replaces_the_old_one) {
  auto a = connect("agent-a", 1);
  send(a, "a0", {1, 2, 3});
  auto old = a;
  auto again = connect("agent-a", 2);
  EXPECT_EQ(blocks_of("a0"), 0u) << "the node's replicas are dropped; full copies follow";
  EXPECT_FALSE(trusted("a0"));
  ASSERT_EQ(old.log->refusals.size(), 1u) << "the displaced forwarder is told";
  EXPECT_EQ(old.log->refusals[0], "replaced by a newer session of this node");
  send(old, "a0", {7}, false);
  EXPECT_EQ(refused("agent-a", "old_session"), 1u) << "the old forwarder no longer speaks for it";
  EXPECT_EQ(old.log->refusals.size(), 2u) << "and told again, so it starts over";
  send(again, "a0", {4, 5});
  EXPECT_EQ(blocks_of("a0"), 2u);
  auto& drops = stats().drops;
  EXPECT_EQ((drops[{"a0", routing::drop_reason::session}]), 1u);
}

// An update the control node cannot hold is never acked: the agent would
// take it as applied and never send it again, leaving the index behind its
// mirror. The attempt ends instead, and the next session sends full copies.
TEST_F(control_test, updates_beyond_what_a_session_being_checked_holds_end_it_unacked) {
  auto a = forwarder_for("agent-a", 7);
  auto share = config::key_share::make();
  caf::send_as(a.fwd, ctl, agent_hello{a.node, a.session, {}, share->nonce(), share->public_key()},
               a.fwd);
  sched.run();
  ASSERT_EQ(a.log->proofs.size(), 1u);
  auto t = transcript(a, *share, a.log->proofs.back());
  a.key = *share->session_key(a.log->proofs.back().key_share, t);
  // Proven, not yet accepted: as while the control node asks where the
  // connection comes from (a real middleman answers that; none here).
  control_st().attempts.at(a.session).key = a.key;
  for (wire::block_key k = 1; k <= 5; ++k) // the limit is 4
    send(a, "a0", {k}, k == 1);
  EXPECT_TRUE(a.log->acks.empty()) << "nothing was applied, nothing is acked";
  ASSERT_EQ(a.log->refusals.size(), 1u) << "the forwarder is told, so it starts over";
  EXPECT_EQ(a.log->refusals[0], "4 updates arrived while the session was being checked");
  EXPECT_EQ(control_st().attempts.count(a.session), 0u) << "the attempt ends";
  EXPECT_EQ(control_st().sessions_refused["pending_full"], 1u);
  EXPECT_EQ(refused("agent-a", "pending_full"), 1u);
  EXPECT_EQ(blocks_of("a0"), 0u);
  auto again = connect("agent-a", 8);
  send(again, "a0", {1, 2, 3, 4, 5});
  EXPECT_EQ(blocks_of("a0"), 5u) << "the next session's full copy holds everything";
  ASSERT_FALSE(again.log->acks.empty());
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
  EXPECT_EQ((drops[{"a0", routing::drop_reason::node_down}]), 1u);
  auto back = connect("agent-a", 3);
  send(back, "a0", {1, 2, 9});
  EXPECT_EQ(blocks_of("a0"), 3u);
  EXPECT_TRUE(trusted("a0"));
}

TEST_F(control_test, engine_loads_of_a_nodes_own_engines_reach_the_router) {
  auto a = connect("agent-a", 1);
  send_loads(a, loads(a, {{"a0", 3, 2, 500, 10}, {"a1", 1, 0, -1, 10}}));
  EXPECT_EQ(engine_load_of("a0"), (std::pair<long, long>{3, 2}));
  EXPECT_EQ(engine_load_of("a1"), (std::pair<long, long>{1, 0}))
    << "an engine without KV events has a load too";
  ASSERT_EQ(a.log->acks.size(), 1u);
  EXPECT_EQ(a.log->acks.back().seq, 1u);
  EXPECT_EQ(control_st().load_reports_passed, 1u);
  send(a, "a0", {1}); // updates and load reports share the session's seq
  EXPECT_EQ(blocks_of("a0"), 1u);
  caf::anon_send_exit(a.fwd, caf::exit_reason::kill); // the agent goes away
  sched.run();
  EXPECT_EQ(engine_load_of("a0"), (std::pair<long, long>{-1, -1}));
}

TEST_F(control_test, a_load_report_that_is_not_the_nodes_or_out_of_range_changes_nothing) {
  auto a = connect("agent-a", 1);
  auto b = connect("agent-b", 2);
  send_loads(b, loads(b, {{"b0", 1, 1, 0, 0}}));
  // agent-a names agent-b's engine among its own: nothing of it is used.
  send_loads(a, loads(a, {{"a0", 5, 5, 0, 0}, {"b0", 50, 50, 0, 0}}));
  EXPECT_EQ(refused("agent-a", "not_owner"), 1u);
  EXPECT_EQ(engine_load_of("b0"), (std::pair<long, long>{1, 1}));
  EXPECT_EQ(engine_load_of("a0"), (std::pair<long, long>{-1, -1}));
  for (auto bad : {engine_load{"a0", 2000000, 0, 0, 0}, engine_load{"a0", 1, 1, 1001, 0},
                   engine_load{"a0", 1, 1, -2, 0}, engine_load{"a0", 1, 1, 0, 3600000}})
    send_loads(a, loads(a, {bad}));
  send_loads(a, loads(a, {{"a0", 1, 1, 0, 0}, {"a0", 2, 2, 0, 0}}));
  send_loads(a, loads(a, {{"a0", 1, 1, 0, 0}, {"a1", 1, 1, 0, 0}, {"a0", 1, 1, 0, 0}}));
  EXPECT_EQ(refused("agent-a", "malformed"), 6u) << "3 loads for 2 engines";
  auto forged = loads(a, {{"a0", 9, 9, 0, 0}});
  forged.loads[0].waiting = 10; // changed after the MAC
  send_loads(a, forged);
  EXPECT_EQ(refused("agent-a", "mac"), 1u);
  EXPECT_EQ(engine_load_of("a0"), (std::pair<long, long>{-1, -1}));
  EXPECT_EQ(a.log->acks.size(), 7u) << "refused reports of the session are acked";
  send_loads(a, loads(a, {{"a0", 4, 0, 0, 0}}));
  EXPECT_EQ(engine_load_of("a0"), (std::pair<long, long>{4, 0})) << "the session goes on";
}

TEST_F(control_test, the_router_answers_routes_from_what_the_agents_sent) {
  auto a = connect("agent-a", 1);
  auto b = connect("agent-b", 2);
  send(a, "a0", {10, 11, 12});
  send(b, "b0", {10});
  routing::route_query q;
  q.model = "m";
  q.tokenized = true;
  q.keys = {10, 11, 12, 13};
  // As the gateway decides: on its own thread, against the router's state.
  auto got = shared->decide_and_record(q);
  EXPECT_EQ(got.replica, "a0");
  EXPECT_EQ(got.tier, routing::route_tier::kv);
  EXPECT_DOUBLE_EQ(got.score, 0.75);
  EXPECT_EQ(core().counters().decisions[0], 1u);
  EXPECT_EQ(stats().matched_share_kv.count(), 1u);
}

namespace {

/// The control node holds control-1's certificate; agents must prove theirs.
struct identity_test : control_test {
  test::credentials& creds = test::test_credentials();

  void SetUp() override { start(tls_cluster(), creds.of("control-1")); }

  /// agent-b's genuine session, holding one block of b0.
  agent genuine_b() {
    auto b = connect("agent-b", 20, creds.of("agent-b"));
    send(b, "b0", {7});
    EXPECT_EQ(blocks_of("b0"), 1u);
    return b;
  }
};

} // namespace

TEST_F(identity_test, the_control_node_proves_its_own_name) {
  auto a = forwarder_for("agent-a", 1);
  auto share = config::key_share::make();
  caf::send_as(a.fwd, ctl, agent_hello{"agent-a", 1, {}, share->nonce(), share->public_key()},
               a.fwd);
  sched.run();
  ASSERT_EQ(a.log->proofs.size(), 1u);
  const auto& p = a.log->proofs[0];
  auto data = config::proof_input(config::proof_role::control, transcript(a, *share, p));
  auto me = creds.of("agent-a");
  EXPECT_TRUE(me->check_peer(p.certificate, "control-1", {}, data, p.signature));
  EXPECT_EQ(me->check_peer(p.certificate, "control-2", {}, data, p.signature).reason, "name")
    << "an agent configured for control-2 would refuse it";
  EXPECT_EQ(me->check_peer(p.certificate, "control-1", {},
                           config::proof_input(config::proof_role::agent, transcript(a, *share, p)),
                           p.signature)
              .reason,
            "signature")
    << "a control node's proof does not pass as an agent's";
}

TEST_F(identity_test, a_node_holding_another_nodes_certificate_cannot_claim_its_name) {
  auto b = genuine_b();
  // agent-a's certificate and key, claiming to be agent-b.
  auto impostor = connect("agent-b", 30, creds.of("agent-a"));
  ASSERT_EQ(impostor.log->refusals.size(), 1u);
  EXPECT_NE(impostor.log->refusals[0].find("does not name node 'agent-b'"), std::string::npos)
    << impostor.log->refusals[0];
  EXPECT_EQ(control_st().sessions_refused["name"], 1u);
  EXPECT_EQ(blocks_of("b0"), 1u) << "the refused attempt left agent-b's session alone";
  EXPECT_EQ(control_st().sessions.at("agent-b").id, b.session);
  send_raw(impostor, update(impostor, "b0", {1, 2, 3}));
  EXPECT_EQ(blocks_of("b0"), 1u) << "nothing the impostor sends is applied";
  send(b, "b0", {8}, false);
  EXPECT_EQ(blocks_of("b0"), 2u) << "the genuine agent is still heard";
  EXPECT_EQ(b.log->refusals.size(), 0u);
}

TEST_F(identity_test, a_certificate_of_another_ca_or_a_wrong_signature_is_refused) {
  auto b = genuine_b();
  auto files = config::credentials_in(creds.stranger, "agent-b");
  auto stranger =
    config::node_identity::load("agent-b", files.cert, files.key, creds.stranger + "/ca.pem");
  ASSERT_TRUE(stranger);
  auto foreign = connect("agent-b", 31, *stranger);
  ASSERT_EQ(foreign.log->refusals.size(), 1u);
  EXPECT_EQ(control_st().sessions_refused["certificate"], 1u);
  // agent-b's certificate, signed by agent-a's key.
  auto x = forwarder_for("agent-b", 32);
  auto share = config::key_share::make();
  caf::send_as(x.fwd, ctl, agent_hello{"agent-b", 32, {}, share->nonce(), share->public_key()},
               x.fwd);
  sched.run();
  ASSERT_EQ(x.log->proofs.size(), 1u);
  auto t = transcript(x, *share, x.log->proofs[0]);
  caf::send_as(
    x.fwd, ctl,
    agent_proof{32, creds.of("agent-b")->certificate(),
                creds.of("agent-a")->sign(config::proof_input(config::proof_role::agent, t))});
  sched.run();
  EXPECT_EQ(control_st().sessions_refused["signature"], 1u);
  EXPECT_EQ(blocks_of("b0"), 1u);
  EXPECT_EQ(control_st().sessions.at("agent-b").id, b.session);
}

TEST_F(identity_test, a_relay_of_a_genuine_handshake_gets_a_session_but_is_never_heard) {
  // The relay has its own valid certificate on both TLS connections and
  // passes the genuine agent-b's handshake through, message by message.
  auto relay = forwarder_for("agent-b", 40);
  auto share = config::key_share::make(); // genuine agent-b's
  caf::send_as(relay.fwd, ctl, agent_hello{"agent-b", 40, {}, share->nonce(), share->public_key()},
               relay.fwd);
  sched.run();
  ASSERT_EQ(relay.log->proofs.size(), 1u);
  // Genuine agent-b checks the control node's proof, which the relay passed
  // on, and proves its own name; the relay passes that on too.
  auto t = transcript(relay, *share, relay.log->proofs[0]);
  auto genuine_key = *share->session_key(relay.log->proofs[0].key_share, t);
  caf::send_as(
    relay.fwd, ctl,
    agent_proof{40, creds.of("agent-b")->certificate(),
                creds.of("agent-b")->sign(config::proof_input(config::proof_role::agent, t))});
  sched.run();
  ASSERT_EQ(control_st().sessions.at("agent-b").id, 40u) << "the relayed session is accepted";
  // What the relay makes itself has no valid MAC: it never learns the key.
  for (const auto& guess : {std::string(), std::string(32, '\0'), t.digest()}) {
    relay.key = guess;
    send_raw(relay, update(relay, "b0", {1, 2, 3}));
  }
  EXPECT_EQ(blocks_of("b0"), 0u);
  EXPECT_EQ(refused("agent-b", "mac"), 3u);
  EXPECT_TRUE(relay.log->acks.empty()) << "forged updates are not acknowledged";
  // Passing genuine updates on is all it can do.
  relay.key = genuine_key;
  send(relay, "b0", {9});
  EXPECT_EQ(blocks_of("b0"), 1u);
}

TEST_F(identity_test, a_revoked_certificate_is_refused) {
  auto t = tls_cluster();
  t.nodes[2].fingerprints = {config::fingerprint_of("another certificate")}; // agent-b
  start(t, creds.of("control-1"));
  auto b = connect("agent-b", 50, creds.of("agent-b"));
  ASSERT_EQ(b.log->refusals.size(), 1u);
  EXPECT_NE(b.log->refusals[0].find("is not among node 'agent-b''s fingerprints"),
            std::string::npos)
    << b.log->refusals[0];
  EXPECT_EQ(control_st().sessions_refused["fingerprint"], 1u);
  t.nodes[2].fingerprints = {creds.of("agent-b")->fingerprint()};
  start(t, creds.of("control-1"));
  auto listed = connect("agent-b", 51, creds.of("agent-b"));
  EXPECT_TRUE(listed.log->refusals.empty());
  EXPECT_EQ(control_st().sessions.at("agent-b").id, 51u);
}

TEST_F(identity_test, unfinished_attempts_are_bounded_and_forgotten) {
  auto b = genuine_b();
  std::vector<agent> waiting;
  for (std::uint64_t i = 0; i < 3; ++i) { // max_attempts
    waiting.push_back(forwarder_for("agent-b", 60 + i));
    auto share = config::key_share::make();
    caf::send_as(waiting.back().fwd, ctl,
                 agent_hello{"agent-b", 60 + i, {}, share->nonce(), share->public_key()},
                 waiting.back().fwd);
  }
  sched.run();
  auto over = connect("agent-b", 70, creds.of("agent-b"));
  ASSERT_EQ(over.log->refusals.size(), 1u);
  EXPECT_EQ(over.log->refusals[0], "3 session attempts are in progress");
  EXPECT_EQ(control_st().sessions_refused["busy"], 1u);
  sched.advance_time(std::chrono::seconds(11));
  sched.run();
  EXPECT_TRUE(control_st().attempts.empty());
  EXPECT_EQ(control_st().sessions_refused["timeout"], 3u);
  for (const auto& w : waiting)
    EXPECT_EQ(w.log->refusals.size(), 1u) << "each is told, and may start over";
  EXPECT_EQ(blocks_of("b0"), 1u) << "agent-b's session was never touched";
  auto again = connect("agent-b", 71, creds.of("agent-b"));
  EXPECT_TRUE(again.log->refusals.empty());
}

TEST_F(identity_test, a_hello_cannot_get_another_forwarder_told_its_session_ended) {
  auto b = genuine_b();
  // Another peer says hello with b's session id, naming b's forwarder.
  auto other = forwarder_for("zzz", b.session);
  auto share = config::key_share::make();
  caf::send_as(other.fwd, ctl,
               agent_hello{"zzz", b.session, {}, share->nonce(), share->public_key()}, b.fwd);
  sched.run();
  EXPECT_TRUE(b.log->refusals.empty()) << "the forwarder named is told nothing";
  ASSERT_EQ(other.log->refusals.size(), 1u) << "the sender is";
  EXPECT_EQ(other.log->refusals[0], "the hello names another forwarder than its sender");
  send(b, "b0", {8}, false);
  EXPECT_EQ(blocks_of("b0"), 2u) << "b's session goes on";
}

TEST_F(identity_test, a_relayed_update_passed_on_twice_is_refused) {
  auto b = genuine_b();
  auto u = update(b, "b0", {11}, false);
  send_raw(b, u);
  EXPECT_EQ(blocks_of("b0"), 2u);
  auto acks = b.log->acks.size();
  auto wipe = update(b, "b0", {}, true); // a full copy: "b0 holds nothing"
  send_raw(b, wipe);
  EXPECT_EQ(blocks_of("b0"), 0u);
  send(b, "b0", {12, 13});
  EXPECT_EQ(blocks_of("b0"), 2u);
  send_raw(b, wipe); // the old, genuine full copy again
  EXPECT_EQ(blocks_of("b0"), 2u) << "a replay does not revert the replica";
  EXPECT_EQ(refused("agent-b", "replay"), 1u);
  EXPECT_EQ(b.log->acks.size(), acks + 2) << "a replay is not acknowledged";
}

TEST_F(identity_test, one_peer_cannot_fill_the_attempts_table) {
  start(tls_cluster(), creds.of("control-1")); // max_attempts 3
  sched.run();                                 // the actor takes its options when it first runs
  control_st().opts.max_attempts_per_peer = 2;
  std::vector<agent> waiting;
  for (std::uint64_t i = 0; i < 2; ++i) {
    waiting.push_back(forwarder_for("agent-b", 80 + i));
    auto share = config::key_share::make();
    caf::send_as(waiting.back().fwd, ctl,
                 agent_hello{"agent-b", 80 + i, {}, share->nonce(), share->public_key()},
                 waiting.back().fwd);
  }
  sched.run();
  auto third = connect("agent-b", 82, creds.of("agent-b"));
  ASSERT_EQ(third.log->refusals.size(), 1u) << "all the actors here share one node";
  EXPECT_EQ(third.log->refusals[0], "2 session attempts of this peer are in progress");
  // Nobody but the control actor itself ends an attempt by its timer.
  ASSERT_EQ(control_st().attempts.count(80), 1u);
  auto stranger = forwarder_for("x", 0);
  caf::send_as(stranger.fwd, ctl, timeout_atom::value, std::uint64_t{80});
  sched.run();
  EXPECT_EQ(control_st().attempts.count(80), 1u);
}
