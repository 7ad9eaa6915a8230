#include "actors/mirror.hpp"

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "base/log.hpp"

namespace llmgw {

namespace {

void apply_batch(mirror_state& st, const wire::event_batch& batch) {
  auto before = st.table.parity();
  auto counts = st.table.apply(batch);
  ++st.counters.batches;
  st.counters.stored += counts.stored;
  st.counters.removed += counts.removed;
  st.counters.ignored_removes += counts.ignored_removes;
  st.counters.verified_blocks += counts.verified;
  st.counters.translated_blocks += counts.translated;
  st.counters.untranslated_blocks += counts.untranslated;
  st.counters.resets[static_cast<int>(kv::reset_reason::clear)] += counts.clears;
  auto now = st.table.parity();
  if (kv::routable(before) && !kv::routable(now))
    LLMGW_LOG(warning, "mirror " + st.replica, "{}, blocks not trusted: {}",
              now == kv::parity_state::mismatch ? "hash mismatch" : "blocks cannot be keyed",
              st.table.parity_message());
  else if (before != now && now == kv::parity_state::translated)
    LLMGW_LOG(info, "mirror " + st.replica,
              "the engine hashes blocks its own way: they are keyed by the cluster's hash of "
              "their tokens");
}

/// Publishes the table's state to the view, if there is one.
void publish(const mirror_state& st) {
  if (!st.view)
    return;
  auto& v = *st.view;
  v.blocks.store(st.table.size(), std::memory_order_relaxed);
  v.epoch.store(st.table.epoch(), std::memory_order_relaxed);
  v.fingerprint.store(st.table.fingerprint(), std::memory_order_relaxed);
  v.partial.store(st.table.partial(), std::memory_order_relaxed);
  v.parity.store(static_cast<std::uint8_t>(st.table.parity()), std::memory_order_relaxed);
  for (std::size_t r = 0; r < kv::reset_reason_count; ++r)
    v.resets[r].store(st.counters.resets[r], std::memory_order_relaxed);
}

} // namespace

replica_update to_update(const mirror_state& st, const kv::table_delta& delta) {
  auto parity = st.table.parity();
  replica_update u;
  u.replica = st.replica;
  u.dp_rank = st.dp_rank;
  u.epoch = delta.epoch;
  u.reset = delta.reset;
  u.parity = static_cast<std::uint8_t>(parity);
  u.partial = st.table.partial();
  u.hybrid = st.table.hybrid();
  u.added = delta.added;
  u.removed = delta.removed;
  u.totals = st.counters;
  if (!kv::routable(parity))
    u.parity_reason = st.table.parity_message().substr(0, max_parity_reason);
  return u;
}

mirror_actor::behavior_type mirror(mirror_actor::stateful_pointer<mirror_state> self,
                                   std::string replica, std::uint32_t dp_rank,
                                   std::optional<kv::parity_config> parity,
                                   std::shared_ptr<mirror_view> view) {
  self->state.replica = std::move(replica);
  self->state.dp_rank = dp_rank;
  self->state.table = kv::block_table(std::move(parity));
  self->state.view = std::move(view);
  publish(self->state);
  return {
    [self](apply_atom, const batch_list& batches) {
      for (const auto& b : *batches)
        apply_batch(self->state, b);
      publish(self->state);
    },
    [self](reset_atom, kv::reset_reason reason) {
      self->state.table.reset(reason);
      ++self->state.counters.resets[static_cast<std::size_t>(reason)];
      publish(self->state);
    },
    [self](subscribe_atom, std::uint64_t peer) {
      auto& st = self->state;
      auto delta = st.table.subscribe(peer);
      return to_update(st, delta);
    },
    [self](drain_atom, std::uint64_t peer) {
      auto& st = self->state;
      auto delta = st.table.drain(peer);
      return to_update(st, delta);
    },
    [self](unsub_atom, std::uint64_t peer) { self->state.table.unsubscribe(peer); },
  };
}

} // namespace llmgw
