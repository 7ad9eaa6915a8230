#include "routing/replica_index.hpp"

#include <algorithm>
#include <stdexcept>

namespace llmgw::routing {

std::uint64_t fingerprint_of(const std::vector<kv::block_ref>& blocks) noexcept {
  std::uint64_t sum = 0;
  for (const auto& b : blocks)
    sum += fingerprint_of(b);
  return sum;
}

holder_id replica_index::holder_for(std::string_view replica, std::uint32_t dp_rank) {
  if (auto h = find(replica, dp_rank))
    return *h;
  if (holders_.size() >= max_holders)
    throw std::length_error("more replica ranks than the block index can number");
  auto h = static_cast<holder_id>(holders_.size());
  holder_info info;
  info.replica = std::string(replica);
  info.dp_rank = dp_rank;
  holders_.push_back(std::move(info));
  spec_.emplace_back();
  watched_.emplace_back();
  suppressed_.emplace_back();
  by_replica_[std::string(replica)].push_back(h);
  return h;
}

std::optional<holder_id> replica_index::find(std::string_view replica,
                                             std::uint32_t dp_rank) const {
  auto it = by_replica_.find(std::string(replica));
  if (it == by_replica_.end())
    return std::nullopt;
  for (auto h : it->second)
    if (holders_[h].dp_rank == dp_rank)
      return h;
  return std::nullopt;
}

apply_outcome replica_index::apply(const kv_change& change,
                                   std::chrono::steady_clock::time_point now) {
  auto h = holder_for(change.replica, change.dp_rank);
  auto& info = holders_[h];
  if (!change.reset) {
    if (!info.has_state)
      return apply_outcome::needs_reset;
    if (change.epoch < info.epoch)
      return apply_outcome::stale_epoch;
  }
  if (change.reset) {
    index_.drop(h);
    forget_speculative(h);
    forget_suppressed(h);
    info.has_state = true;
    info.fingerprint = 0;
    ++info.resets;
  }
  info.epoch = change.epoch;
  auto& spec = spec_[h];
  // Whether `b` is one of h's speculative entries; it stops being one.
  auto was_speculative = [&](const kv::block_ref& b) {
    if (spec.empty() || b.where != kv::medium::gpu)
      return false;
    auto it = spec.find(b.key);
    if (it == spec.end())
      return false;
    spec.erase(it);
    --info.speculative;
    return true;
  };
  auto& suppressed = suppressed_[h];
  if (change.removed)
    for (const auto& b : *change.removed) {
      if (was_speculative(b))
        index_.remove(b.key, h, b.where); // never in the fingerprint
      else if (index_.remove(b.key, h, b.where))
        info.fingerprint -= fingerprint_of(b);
      if (!suppressed.empty() && unsuppress(h, b))
        info.fingerprint -= fingerprint_of(b); // dropped already; the events agree now
    }
  auto& watched = watched_[h];
  if (change.added)
    for (const auto& b : *change.added) {
      if (!watched.empty()) {
        // The engine stored it (again): a watched claim of it is current.
        auto w = watched.find(b.key);
        if (w != watched.end())
          w->second.stored = ++store_clock_;
      }
      if (!suppressed.empty() && unsuppress(h, b)) {
        // Dropped on an answer, stored again: held, and in the fingerprint
        // all along.
        if (was_speculative(b))
          ++info.speculative_confirmed;
        else
          index_.add(b.key, h, b.where);
        continue;
      }
      if (was_speculative(b)) {
        ++info.speculative_confirmed; // held already: it now counts as the engine's
        info.fingerprint += fingerprint_of(b);
      } else if (index_.add(b.key, h, b.where)) {
        info.fingerprint += fingerprint_of(b);
      }
    }
  info.parity = change.parity;
  info.parity_reason.assign(change.parity_reason.data(), change.parity_reason.size());
  info.partial = change.partial;
  info.hybrid = change.hybrid;
  info.last_update = now;
  ++info.updates;
  return apply_outcome::applied;
}

void replica_index::drop_replica(std::string_view replica) {
  auto it = by_replica_.find(std::string(replica));
  if (it == by_replica_.end())
    return;
  for (auto h : it->second) {
    index_.drop(h);
    forget_speculative(h);
    forget_suppressed(h);
    holders_[h].fingerprint = 0;
    holders_[h].has_state = false;
    holders_[h].parity = kv::parity_state::unknown;
    holders_[h].parity_reason.clear();
  }
}

bool replica_index::unsuppress(holder_id h, const kv::block_ref& b) {
  auto& suppressed = suppressed_[h];
  auto it = suppressed.find(b.key);
  auto bit = static_cast<std::uint8_t>(1u << static_cast<unsigned>(b.where));
  if (it == suppressed.end() || (it->second & bit) == 0)
    return false;
  it->second &= static_cast<std::uint8_t>(~bit);
  if (it->second == 0)
    suppressed.erase(it);
  --holders_[h].suppressed;
  return true;
}

void replica_index::forget_suppressed(holder_id h) {
  suppressed_[h].clear();
  holders_[h].suppressed = 0;
}

void replica_index::forget_speculative(holder_id h) {
  spec_[h].clear(); // their records in spec_order_ find nothing when they come up
  holders_[h].speculative = 0;
}

void replica_index::speculate(holder_id h, const wire::block_key* keys, std::size_t count,
                              std::chrono::steady_clock::time_point expires) {
  auto& spec = spec_[h];
  for (std::size_t i = 0; i < count; ++i) {
    auto it = spec.find(keys[i]);
    if (it != spec.end()) {
      it->second = expires;
    } else if (index_.add(keys[i], h, kv::medium::gpu)) {
      spec.emplace(keys[i], expires);
      ++holders_[h].speculative;
    } else {
      continue; // the engine holds it already
    }
    spec_order_.push_back({expires, h, keys[i]});
  }
}

void replica_index::expire(std::chrono::steady_clock::time_point now) {
  while (!spec_order_.empty() && spec_order_.front().expires <= now) {
    auto s = spec_order_.front();
    spec_order_.pop_front();
    auto& spec = spec_[s.holder];
    auto it = spec.find(s.key);
    if (it == spec.end() || it->second != s.expires)
      continue; // confirmed, removed, forgotten, or refreshed since
    spec.erase(it);
    index_.remove(s.key, s.holder, kv::medium::gpu);
    --holders_[s.holder].speculative;
    ++holders_[s.holder].speculative_expired;
  }
}

std::size_t replica_index::leading_confirmed(holder_id h, const wire::block_key* keys,
                                             std::size_t count) const {
  const auto& spec = spec_[h];
  std::size_t n = 0;
  for (; n < count; ++n) {
    auto k = keys[n];
    // A GPU entry may be the router's guess; CPU and storage ones never are.
    bool held = (index_.holds(k, h, kv::medium::gpu) && spec.count(k) == 0)
                || index_.holds(k, h, kv::medium::cpu) || index_.holds(k, h, kv::medium::storage);
    if (!held)
      break;
  }
  if (holders_[h].hybrid) // back to the last end the engine's own events mark
    while (n > 0) {
      auto marker = kv::end_marker_of(keys[n - 1]);
      if (index_.holds(marker, h, kv::medium::gpu) && spec.count(marker) == 0)
        break;
      --n;
    }
  return n;
}

std::size_t replica_index::hit_blocks(holder_id h, const wire::block_key* keys,
                                      std::size_t count) const {
  if (!holders_[h].hybrid)
    return count;
  while (count > 0 && !index_.holds(kv::end_marker_of(keys[count - 1]), h, kv::medium::gpu))
    --count;
  return count;
}

watch_id replica_index::watch(holder_id h, const wire::block_key* keys, std::size_t count) {
  if (count == 0)
    return 0;
  // Every routed request holds one until it is answered; the bound keeps a
  // gateway whose answers never come (a bug) from growing without end.
  if (watches_.size() >= 65536) {
    ++watch_refusals_;
    return 0;
  }
  auto id = next_watch_++;
  watch_record w{h, holders_[h].epoch, holders_[h].resets, store_clock_,
                 std::vector<wire::block_key>(keys, keys + count)};
  auto& watched = watched_[h];
  for (auto k : w.keys)
    ++watched[k].watches;
  watches_.emplace(id, std::move(w));
  return id;
}

void replica_index::release(const watch_record& w) {
  auto& watched = watched_[w.holder];
  for (auto k : w.keys) {
    auto it = watched.find(k);
    if (it != watched.end() && --it->second.watches == 0)
      watched.erase(it);
  }
}

std::optional<std::size_t> replica_index::settle(watch_id id, std::size_t found) {
  auto it = watches_.find(id);
  if (it == watches_.end())
    return std::nullopt;
  auto w = std::move(it->second);
  watches_.erase(it);
  auto& info = holders_[w.holder];
  if (!info.has_state || info.epoch != w.epoch || info.resets != w.resets) {
    release(w);
    return std::nullopt;
  }
  std::size_t dropped = 0;
  const auto& watched = watched_[w.holder];
  auto& suppressed = suppressed_[w.holder];
  for (std::size_t i = found; i < w.keys.size(); ++i) {
    auto k = w.keys[i];
    auto entry = watched.find(k);
    if (entry != watched.end() && entry->second.stored > w.since)
      continue; // stored again since the decision: the engine holds it now
    for (auto m : {kv::medium::gpu, kv::medium::cpu, kv::medium::storage}) {
      if (m == kv::medium::gpu && spec_[w.holder].count(k) != 0)
        continue; // a speculative entry: the prefill that lacked it computes it
      if (index_.remove(k, w.holder, m)) {
        // Out of routing, still in the fingerprint (see the header).
        suppressed[k] |= static_cast<std::uint8_t>(1u << static_cast<unsigned>(m));
        ++info.suppressed;
        ++dropped;
      }
    }
  }
  info.shortfall_drops += dropped;
  release(w);
  return dropped;
}

void replica_index::unwatch(watch_id id) {
  auto it = watches_.find(id);
  if (it == watches_.end())
    return;
  release(it->second);
  watches_.erase(it);
}

std::vector<holder_id> replica_index::holders_of(std::string_view replica) const {
  auto it = by_replica_.find(std::string(replica));
  if (it == by_replica_.end())
    return {};
  auto out = it->second;
  std::sort(out.begin(), out.end(),
            [this](holder_id a, holder_id b) { return holders_[a].dp_rank < holders_[b].dp_rank; });
  return out;
}

bool replica_index::trusted(holder_id h) const {
  const auto& info = holders_[h];
  return info.has_state && kv::routable(info.parity);
}

void replica_index::trusted_holders(std::string_view replica, std::vector<holder_id>& out) const {
  auto it = by_replica_.find(std::string(replica));
  if (it == by_replica_.end())
    return;
  for (auto h : it->second)
    if (trusted(h))
      out.push_back(h);
}

} // namespace llmgw::routing
