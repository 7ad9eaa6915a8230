// What the router actor's update handler (apply_update) tells the canary:
// a restart in a rank's totals sends it again; a rank seen for the first
// time, whatever its counts, does not.
#include "actors/router.hpp"
#include "routing/router_report.hpp"

#include <gtest/gtest.h>

using namespace llmgw;
using namespace std::chrono_literals;

namespace {

config::topology one_replica() {
  config::topology t;
  t.block_size = 4;
  config::node_spec n;
  n.name = "agent";
  n.roles.agent = true;
  config::engine_spec e;
  e.replica = "r";
  e.model = "m";
  e.url = "http://127.0.0.1:9";
  e.kv_events = true;
  e.dp_size = 2;
  n.engines.push_back(e);
  t.nodes.push_back(n);
  return t;
}

replica_update update(std::uint32_t rank, bool reset, std::uint64_t restarts) {
  replica_update u;
  u.node = "agent";
  u.replica = "r";
  u.dp_rank = rank;
  u.epoch = 1;
  u.reset = reset;
  u.parity = static_cast<std::uint8_t>(kv::parity_state::translated);
  u.totals.resets[static_cast<std::size_t>(kv::reset_reason::restart)] = restarts;
  return u;
}

routing::canary_state state_of(const routing::router_core& core) {
  return core.replicas().at(0).canary.state;
}

} // namespace

TEST(router_update, a_restart_in_the_totals_sends_the_canary_again_a_late_rank_does_not) {
  routing::router_core core(one_replica());
  routing::router_stats stats;
  auto now = std::chrono::steady_clock::now();
  // An agent that has run for a while: its engine restarted 3 times before.
  apply_update(core, stats, update(0, true, 3), now);
  ASSERT_EQ(core.canary_tick(now).size(), 1u);
  EXPECT_EQ(state_of(core), routing::canary_state::sent);
  // Rank 1 arrives later with its own history: no restart now.
  apply_update(core, stats, update(1, true, 5), now);
  EXPECT_EQ(state_of(core), routing::canary_state::sent) << "the round goes on";
  apply_update(core, stats, update(0, false, 3), now);
  EXPECT_EQ(state_of(core), routing::canary_state::sent) << "same count: no restart";
  // The engine restarts: the count goes up.
  auto restarted = update(0, true, 4);
  restarted.epoch = 2; // the mirror's reset
  apply_update(core, stats, restarted, now);
  EXPECT_EQ(state_of(core), routing::canary_state::waiting);
}
