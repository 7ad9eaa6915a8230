// The forwarder under the deterministic coordinator, with real mirrors and a
// fake control node that records what it receives.
#include "actors/forwarder.hpp"
#include "actors/mirror.hpp"
#include "tests/actors/deterministic.hpp"
#include "tests/support/credentials.hpp"
#include "tests/support/fake_control.hpp"

#include <set>

using namespace llmgw;
using namespace std::chrono_literals;

namespace {

struct forwarder_test : llmgw::test::deterministic {
  std::shared_ptr<llmgw::test::control_record> log =
    std::make_shared<llmgw::test::control_record>();
  control_actor control = stop_at_end(sys.spawn(llmgw::test::recording_control, log));
  mirror_actor m0 = stop_at_end(sys.spawn(mirror, std::string("r0"), std::uint32_t{0},
                                          std::optional<kv::parity_config>{}, nullptr));
  mirror_actor m1 = stop_at_end(sys.spawn(mirror, std::string("r1"), std::uint32_t{0},
                                          std::optional<kv::parity_config>{}, nullptr));
  std::vector<test::batch_ptr> s1 = capture("S1_basic.map.int.json");
  std::vector<test::batch_ptr> s3 = capture("S3_lora_salt.map.int.json");
  int connect_calls = 0;
  bool reachable = true;

  forwarder_actor start(std::uint64_t window = 64,
                        std::shared_ptr<const config::node_identity> identity = nullptr,
                        std::shared_ptr<const engine_loads> loads = nullptr,
                        std::chrono::milliseconds heartbeat = 1h) {
    forwarder_options opts;
    opts.node = "agent-a";
    opts.control = "control-1";
    opts.window = window;
    opts.identity = std::move(identity);
    opts.loads = std::move(loads);
    opts.load_heartbeat = heartbeat;
    auto connect = [this](const forwarder_actor& f) {
      ++connect_calls;
      caf::send_as(f, f, connected_atom::value,
                   reachable ? caf::actor_cast<caf::strong_actor_ptr>(control)
                             : caf::strong_actor_ptr{});
    };
    auto f = sys.spawn(forwarder, opts, std::vector<mirror_entry>{{"r0", m0}, {"r1", m1}},
                       connect_function(connect));
    sched.run();
    return stop_at_end(f);
  }

  void flush() {
    sched.advance_time(250ms);
    sched.run();
  }

  void apply(const mirror_actor& m, const test::batch_ptr& b) {
    caf::anon_send(m, apply_atom::value, test::one_batch(b));
    sched.run();
  }
};

std::set<kv::block_ref> replay_into_copy(const std::vector<replica_update>& updates,
                                         const std::string& replica) {
  std::set<kv::block_ref> copy;
  for (const auto& u : updates) {
    if (u.replica != replica)
      continue;
    if (u.reset)
      copy.clear();
    for (const auto& r : u.removed)
      copy.erase(r);
    for (const auto& r : u.added)
      copy.insert(r);
  }
  return copy;
}

} // namespace

TEST_F(forwarder_test, a_session_starts_with_hello_and_a_full_copy) {
  apply(m0, s1[0]);
  apply(m1, s3[0]);
  start();
  ASSERT_EQ(log->hellos.size(), 1u);
  EXPECT_EQ(log->hellos[0].node, "agent-a");
  EXPECT_EQ(log->hellos[0].replicas, (std::vector<std::string>{"r0", "r1"}));
  ASSERT_EQ(log->updates.size(), 2u);
  for (const auto& u : log->updates) {
    EXPECT_TRUE(u.reset) << "the first update of each replica is its full state";
    EXPECT_EQ(u.node, "agent-a");
    EXPECT_EQ(u.session, log->hellos[0].session);
    EXPECT_FALSE(u.added.empty());
  }
  EXPECT_EQ(log->updates[0].seq + log->updates[1].seq, 3u) << "numbered 1 and 2";
  EXPECT_EQ(log->bad_macs, 0u) << "each carries the MAC of the session's key";
}

TEST_F(forwarder_test, flushes_send_only_what_changed) {
  start();
  auto after_start = log->updates.size();
  flush();
  EXPECT_EQ(log->updates.size(), after_start) << "nothing changed: nothing sent";
  for (const auto& b : s1)
    apply(m0, b);
  EXPECT_EQ(log->updates.size(), after_start) << "nothing is sent before the flush timer";
  flush();
  ASSERT_EQ(log->updates.size(), after_start + 1) << "one message for the one replica that changed";
  EXPECT_EQ(log->updates.back().replica, "r0");
  auto copy = replay_into_copy(log->updates, "r0");
  auto want_doc = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.int.json"));
  EXPECT_EQ(copy.size(),
            static_cast<std::size_t>(want_doc.at("expected").at("final_size").as_int64()));
}

TEST_F(forwarder_test, engine_loads_go_out_when_they_change_and_as_a_heartbeat) {
  auto loads = std::make_shared<engine_loads>(std::vector<std::string>{"r0", "r1", "r2"});
  auto now = engine_loads::clock::now();
  loads->read("r0", {3, 1, 0.5, 1}, now);
  loads->read("r2", {9, 9, 0.9, 1}, now - 5s); // the engine stopped answering
  start(64, nullptr, loads);
  flush();
  ASSERT_EQ(log->load_reports.size(), 1u);
  const auto& first = log->load_reports[0];
  ASSERT_EQ(first.loads.size(), 1u) << "r1 was never read, r2's reading is too old";
  EXPECT_EQ(first.loads[0].replica, "r0");
  EXPECT_EQ(first.loads[0].running, 3u);
  EXPECT_EQ(first.loads[0].waiting, 1u);
  EXPECT_EQ(first.loads[0].kv_usage_permille, 500);
  EXPECT_EQ(first.session, log->hellos[0].session);
  EXPECT_GT(first.seq, log->updates.back().seq) << "after the full copies, in the same seq space";
  flush();
  EXPECT_EQ(log->load_reports.size(), 1u) << "unchanged: not sent again before the heartbeat";
  loads->read("r0", {4, 1, 0.5, 1}, engine_loads::clock::now());
  flush();
  ASSERT_EQ(log->load_reports.size(), 2u);
  EXPECT_EQ(log->load_reports[1].loads.at(0).running, 4u);
  EXPECT_EQ(log->bad_macs, 0u);
}

TEST_F(forwarder_test, an_unchanged_load_is_sent_again_after_the_heartbeat) {
  auto loads = std::make_shared<engine_loads>(std::vector<std::string>{"r0"});
  loads->read("r0", {1, 0, -1, 1}, engine_loads::clock::now());
  start(64, nullptr, loads, 0ms);
  flush();
  flush();
  ASSERT_EQ(log->load_reports.size(), 2u);
  EXPECT_EQ(log->load_reports[1].loads.at(0).kv_usage_permille, -1) << "not reported";
}

TEST_F(forwarder_test, a_full_window_stops_draining_until_acked) {
  log->ack = false;
  auto f = start(/*window=*/2);
  EXPECT_EQ(log->updates.size(), 2u) << "the two full copies fill the window";
  apply(m0, s1[0]);
  flush();
  flush();
  EXPECT_EQ(log->updates.size(), 2u) << "window full: the change waits in the mirror";
  auto session = log->updates.back().session;
  caf::send_as(control, f, session_ack{session + 1, 2}); // another session's ack: ignored
  flush();
  EXPECT_EQ(log->updates.size(), 2u);
  caf::anon_send(f, session_ack{session, 2}); // not from the control node: ignored
  flush();
  EXPECT_EQ(log->updates.size(), 2u);
  caf::send_as(control, f, session_ack{session, 2});
  flush();
  ASSERT_EQ(log->updates.size(), 3u) << "room again: the waiting change goes out";
  EXPECT_EQ(log->updates.back().replica, "r0");
  EXPECT_EQ(log->updates.back().seq, 3u);
  EXPECT_EQ(log->updates.back().added.size(), s1[0]->events[0].block_hashes.size());
}

TEST_F(forwarder_test, a_lost_control_node_gets_a_new_session_with_a_full_copy) {
  apply(m0, s1[0]);
  start();
  ASSERT_EQ(log->hellos.size(), 1u);
  auto first_session = log->hellos[0].session;
  reachable = false;
  caf::anon_send_exit(control, caf::exit_reason::kill);
  sched.run();
  apply(m0, s1[1]);
  sched.advance_time(100ms); // first backoff step: the control node is still away
  sched.run();
  EXPECT_EQ(connect_calls, 2);
  EXPECT_EQ(log->hellos.size(), 1u);
  // The control node is back (a new process, a new actor).
  control = stop_at_end(sys.spawn(llmgw::test::recording_control, log));
  reachable = true;
  sched.advance_time(200ms); // the backoff doubled
  sched.run();
  ASSERT_EQ(log->hellos.size(), 2u);
  EXPECT_NE(log->hellos[1].session, first_session);
  std::vector<replica_update> second;
  for (const auto& u : log->updates)
    if (u.session == log->hellos[1].session)
      second.push_back(u);
  ASSERT_EQ(second.size(), 2u) << "a full copy of each replica";
  std::set<std::uint64_t> seqs{second[0].seq, second[1].seq};
  EXPECT_EQ(seqs, (std::set<std::uint64_t>{1, 2})) << "numbering restarts per session";
  const auto& full = second[0].replica == "r0" ? second[0] : second[1];
  EXPECT_TRUE(full.reset);
  EXPECT_EQ(full.added.size(),
            s1[0]->events[0].block_hashes.size() + s1[1]->events[0].block_hashes.size())
    << "the full copy includes what changed while disconnected";
}

TEST_F(forwarder_test, a_first_connect_that_fails_is_tried_again) {
  reachable = false; // the control node is not up yet, or the handshake timed out
  start();
  EXPECT_EQ(connect_calls, 1);
  sched.advance_time(100ms);
  sched.run();
  EXPECT_EQ(connect_calls, 2) << "the first attempt is covered by the backoff like any other";
  reachable = true;
  sched.advance_time(200ms);
  sched.run();
  EXPECT_EQ(connect_calls, 3);
  ASSERT_EQ(log->hellos.size(), 1u);
  sched.advance_time(1000ms);
  sched.run();
  EXPECT_EQ(connect_calls, 3) << "connected: no more attempts";
}

namespace {

/// A control node that answers hellos with a proof signed by `id` (as
/// control-1, whatever its certificate says), and records what follows.
control_actor::behavior_type proving_control(control_actor::pointer self,
                                             std::shared_ptr<const config::node_identity> id,
                                             std::shared_ptr<llmgw::test::control_record> rec) {
  return {
    [self, id, rec](const agent_hello& h, const forwarder_actor& f) {
      {
        std::lock_guard<std::mutex> g(rec->mtx);
        rec->hellos.push_back(h);
      }
      auto share = config::key_share::make();
      config::session_transcript t{h.node,      "control-1",    h.session,          h.nonce,
                                   h.key_share, share->nonce(), share->public_key()};
      self->send(f, control_proof{h.session, "control-1", share->nonce(), share->public_key(),
                                  id->certificate(),
                                  id->sign(config::proof_input(config::proof_role::control, t))});
    },
    [](const agent_proof&) {},
    [](timeout_atom, std::uint64_t) {},
    [rec](const replica_update& u) {
      std::lock_guard<std::mutex> g(rec->mtx);
      rec->updates.push_back(u);
    },
    [](const load_report&) {},
    [](const topology_reload&) {},
    [](metrics_atom) { return std::string{}; },
  };
}

forwarder_state& state_of(const forwarder_actor& f) {
  auto* ptr = caf::actor_cast<caf::abstract_actor*>(f);
  return dynamic_cast<forwarder_actor::stateful_pointer<forwarder_state>>(ptr)->state;
}

} // namespace

TEST_F(forwarder_test, a_control_node_that_cannot_prove_its_name_gets_nothing) {
  auto& creds = llmgw::test::test_credentials();
  apply(m0, s1[0]);
  // control-2's certificate and key, answering as if it were control-1.
  control = stop_at_end(sys.spawn(proving_control, creds.of("control-2"), log));
  auto f = start(64, creds.of("agent-a"));
  ASSERT_EQ(log->hellos.size(), 1u);
  EXPECT_TRUE(log->updates.empty()) << "no block state goes to an unproven control node";
  EXPECT_EQ(state_of(f).counts->proofs_refused, 1u);
  flush();
  EXPECT_TRUE(log->updates.empty());
  sched.advance_time(500ms); // backoff_max
  sched.run();
  EXPECT_EQ(connect_calls, 2) << "it tries again";
  // The genuine control-1 is reachable again: the session starts.
  control = stop_at_end(sys.spawn(proving_control, creds.of("control-1"), log));
  sched.advance_time(500ms);
  sched.run();
  EXPECT_EQ(state_of(f).counts->proofs_refused, 2u) << "the one before was control-2 again";
  EXPECT_FALSE(state_of(f).key.empty()) << "control-1's proof checked out";
  EXPECT_EQ(log->updates.size(), 2u) << "full copies";
}

TEST_F(forwarder_test, a_control_node_that_knows_no_session_makes_it_start_over) {
  auto f = start();
  ASSERT_EQ(log->hellos.size(), 1u);
  auto first = log->hellos[0].session;
  caf::send_as(control, f, refused_atom::value, first + 1, std::string("not yours"));
  sched.run();
  sched.advance_time(500ms);
  sched.run();
  EXPECT_EQ(log->hellos.size(), 1u) << "a refusal of another session changes nothing";
  caf::anon_send(f, refused_atom::value, first, std::string("forged"));
  sched.run();
  sched.advance_time(500ms);
  sched.run();
  EXPECT_EQ(log->hellos.size(), 1u) << "only the control node can end its session";
  caf::send_as(control, f, refused_atom::value, first,
               std::string("this control node knows no session of node 'agent-a'"));
  sched.run();
  sched.advance_time(500ms);
  sched.run();
  ASSERT_EQ(log->hellos.size(), 2u) << "a new session";
  EXPECT_NE(log->hellos[1].session, first);
  EXPECT_EQ(log->updates.back().session, log->hellos[1].session);
}

TEST_F(forwarder_test, a_handshake_that_never_finishes_is_given_up) {
  // A control node that never answers hellos.
  control = stop_at_end(sys.spawn([&](control_actor::pointer) -> control_actor::behavior_type {
    return {
      [&](const agent_hello& h, const forwarder_actor&) { log->hellos.push_back(h); },
      [](const agent_proof&) {},
      [](timeout_atom, std::uint64_t) {},
      [](const replica_update&) {},
      [](const load_report&) {},
      [](const topology_reload&) {},
      [](metrics_atom) { return std::string{}; },
    };
  }));
  auto f = start();
  ASSERT_EQ(log->hellos.size(), 1u);
  sched.advance_time(std::chrono::seconds(10));
  sched.run();
  EXPECT_FALSE(state_of(f).control) << "given up after handshake_timeout";
  sched.advance_time(500ms);
  sched.run();
  EXPECT_EQ(log->hellos.size(), 2u) << "and tried again";
}

TEST_F(forwarder_test, only_its_own_timers_drive_it) {
  apply(m0, s1[0]);
  auto f = start();
  auto sent = log->updates.size();
  auto timers = sched.clock().schedule().size();
  // A peer that has the forwarder's handle (every control node does) sends
  // it its own timer messages.
  for (int i = 0; i < 5; ++i)
    caf::send_as(control, f, flush_atom::value);
  caf::send_as(control, f, connect_atom::value);
  sched.run();
  EXPECT_EQ(sched.clock().schedule().size(), timers)
    << "each injected flush would have started a timer chain of its own";
  apply(m0, s1[1]);
  flush(); // the forwarder's own timer
  EXPECT_EQ(log->updates.size(), sent + 1) << "one drain per flush interval, as before";
  flush();
  EXPECT_EQ(log->updates.size(), sent + 1) << "no second timer chain was started";
  EXPECT_EQ(connect_calls, 1);
}
