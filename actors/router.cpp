#include "actors/router.hpp"

#include "wire/log.hpp"

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

namespace llmgw {

void apply_update(router_state& st, const replica_update& u,
                  std::chrono::steady_clock::time_point now) {
  auto& kv = st.core->kv();
  auto before = kv.find(u.replica, u.dp_rank);
  auto was = before ? kv.info(*before).parity : wire::parity_state::unknown;
  wire::kv_change change{
    u.replica, u.dp_rank, u.epoch, u.reset, static_cast<wire::parity_state>(u.parity),
    &u.added,  &u.removed};
  switch (kv.apply(change, now)) {
  case wire::apply_outcome::applied:
    break;
  case wire::apply_outcome::stale_epoch:
    ++st.stats.stale_updates;
    return;
  case wire::apply_outcome::needs_reset:
    ++st.stats.unexpected_updates;
    return;
  }
  auto h = *kv.find(u.replica, u.dp_rank);
  if (st.stats.totals.size() <= h)
    st.stats.totals.resize(static_cast<std::size_t>(h) + 1);
  st.stats.totals[h] = u.totals;
  if (was != wire::parity_state::mismatch && kv.info(h).parity == wire::parity_state::mismatch) {
    ++st.stats.mismatches[u.replica];
    LLMGW_LOG(error, "router",
              "replica {} rank {} hashes blocks differently from llmgw: not "
              "routed on its KV state (the agent's log says which flags and seed it needs)",
              u.replica, u.dp_rank);
  }
}

/// Decides, answers through `answer`, then does what need not delay the
/// answer (remembering the prompt for tier 1) and counts.
template <class Answer>
void decide(router_state& st, const wire::route_query& q, Answer answer) {
  auto start = std::chrono::steady_clock::now();
  auto d = st.core->decide(q, start);
  std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  answer(d);
  if (q.dry_run)
    return;
  st.core->remember(d, q.chunks, start);
  st.stats.decision_seconds.observe(q.hash_seconds + took.count());
  if (q.tokenize_seconds >= 0)
    st.stats.tokenize_seconds.observe(q.tokenize_seconds);
  if (q.tokenize_seconds >= 0 && !q.tokenized)
    ++st.stats.tokenize_failures;
  if (d.tier == wire::route_tier::kv)
    st.stats.matched_share_kv.observe(d.score);
  else if (d.tier == wire::route_tier::approx)
    st.stats.matched_share_approx.observe(d.score);
}

router_actor::behavior_type router(router_actor::stateful_pointer<router_state> self,
                                   const wire::topology& topo) {
  self->state.core = std::make_unique<wire::router_core>(topo);
  return {
    [self](const replica_update& u) {
      apply_update(self->state, u, std::chrono::steady_clock::now());
    },
    [self](drop_atom, const std::string& replica, std::uint8_t reason) {
      auto& st = self->state;
      auto& kv = st.core->kv();
      bool had = false;
      for (auto h : kv.holders_of(replica))
        had = had || kv.info(h).has_state;
      kv.drop_replica(replica);
      if (had)
        ++st.stats.drops[{replica, static_cast<wire::drop_reason>(reason & 1)}];
    },
    [self](route_atom, const wire::route_query& q) -> caf::result<wire::route_decision> {
      auto rp = self->make_response_promise<wire::route_decision>();
      decide(self->state, q, [&rp](const wire::route_decision& d) { rp.deliver(d); });
      return rp;
    },
    [self](route_atom, const wire::route_query& q, const route_callback& cb) {
      decide(self->state, q, [&cb](const wire::route_decision& d) { (*cb)(d); });
    },
    [self](done_atom, const std::string& replica) { self->state.core->finished(replica); },
    [self](mark_down_atom, const std::string& replica, std::uint32_t ms) {
      self->state.core->mark_down(replica,
                                  std::chrono::steady_clock::now() + std::chrono::milliseconds(ms));
    },
    [self](metrics_atom) {
      wire::metrics_text m;
      wire::append_router_metrics(m, *self->state.core, self->state.stats,
                                  std::chrono::steady_clock::now());
      return m.str();
    },
    [self](kv_atom) {
      return wire::kv_replicas_json(*self->state.core, self->state.stats,
                                    std::chrono::steady_clock::now());
    },
  };
}

} // namespace llmgw
