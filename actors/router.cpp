#include "actors/router.hpp"

#include "base/log.hpp"
#include "config/topology.hpp"

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace llmgw {

void apply_update(routing::router_core& core, routing::router_stats& stats, const replica_update& u,
                  std::chrono::steady_clock::time_point now) {
  if (!core.configured(u.replica)) {
    // Checked against the topology in force when it arrived; the replica
    // was removed by a reload since. Its state must not come back.
    ++stats.removed_updates;
    return;
  }
  auto& kv = core.kv();
  auto before = kv.find(u.replica, u.dp_rank);
  auto was = before ? kv.info(*before).parity : kv::parity_state::unknown;
  routing::kv_change change{
    u.replica, u.dp_rank,  u.epoch,   u.reset,         static_cast<kv::parity_state>(u.parity),
    &u.added,  &u.removed, u.partial, u.parity_reason, u.hybrid};
  switch (kv.apply(change, now)) {
  case routing::apply_outcome::applied:
    break;
  case routing::apply_outcome::stale_epoch:
    ++stats.stale_updates;
    return;
  case routing::apply_outcome::needs_reset:
    ++stats.unexpected_updates;
    return;
  }
  auto h = *kv.find(u.replica, u.dp_rank);
  bool first = stats.totals.size() <= h; // no totals seen for this rank yet
  if (first)
    stats.totals.resize(static_cast<std::size_t>(h) + 1);
  // A clear, a restart or an exit emptied the engine's cache: what tier 1
  // remembers sending there is gone from it too. A count that went down is
  // a new agent, whose launched engines started with it.
  if (kv::emptied(u.totals) != kv::emptied(stats.totals[h]))
    core.forget_sent(u.replica);
  // A new engine process (or a new agent, whose counts start again) may
  // hash or publish differently from the one its canary checked. A rank
  // seen for the first time is no restart: its counts are history, and a
  // late rank must not start its replica's canary over.
  if (!first && kv::restarts(u.totals) != kv::restarts(stats.totals[h]))
    core.canary_again(u.replica);
  stats.totals[h] = u.totals;
  if (kv::routable(was) && !kv::routable(kv.info(h).parity)) {
    ++stats.mismatches[u.replica];
    LLMGW_LOG(error, "router",
              "replica {} rank {} is {}: not routed on its KV state (the agent's log says why "
              "and what the engine needs)",
              u.replica, u.dp_rank,
              kv.info(h).parity == kv::parity_state::mismatch
                ? "hashing blocks differently from llmgw"
                : "publishing blocks llmgw cannot key");
  }
}

router_actor::behavior_type router(router_actor::stateful_pointer<router_state> self,
                                   std::shared_ptr<routing::shared_router> shared) {
  self->state.shared = std::move(shared);
  auto& lr = *self->state.shared;
  return {
    [&lr](const replica_update& u) {
      lr.with([&](routing::router_core& core, routing::router_stats& stats) {
        apply_update(core, stats, u, std::chrono::steady_clock::now());
      });
    },
    [&lr](const load_report& r) {
      auto now = std::chrono::steady_clock::now();
      lr.with([&](routing::router_core& core, routing::router_stats&) {
        for (const auto& l : r.loads)
          core.engine_load(l.replica, l.running, l.waiting, l.kv_usage_permille,
                           now - std::chrono::milliseconds(l.age_ms));
      });
    },
    [&lr](drop_atom, const std::string& replica, routing::drop_reason reason) {
      lr.with([&](routing::router_core& core, routing::router_stats& stats) {
        core.forget_engine_load(replica);
        auto& kv = core.kv();
        bool had = false;
        for (auto h : kv.holders_of(replica))
          had = had || kv.info(h).has_state;
        kv.drop_replica(replica);
        core.canary_again(replica); // whatever comes back is checked again
        if (had)
          ++stats.drops[{replica, reason}];
      });
    },
    [self, &lr](const topology_reload& r) {
      auto sender = self->current_sender();
      if (!sender || sender->node() != self->node() || !r.topo)
        return;
      lr.apply_topology(*r.topo);
    },
  };
}

} // namespace llmgw
