#include "routing/replica_index.hpp"

#include <algorithm>
#include <stdexcept>

namespace llmgw::routing {

std::uint64_t fingerprint_of(const kv::block_ref& b) noexcept {
  // splitmix64 of the key and medium: sums of these collide only by chance.
  auto x = b.key ^ (static_cast<std::uint64_t>(b.where) + 1) * 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

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
    info.has_state = true;
    info.fingerprint = 0;
    ++info.resets;
  }
  info.epoch = change.epoch;
  if (change.removed)
    for (const auto& b : *change.removed)
      if (index_.remove(b.key, h, b.where))
        info.fingerprint -= fingerprint_of(b);
  if (change.added)
    for (const auto& b : *change.added)
      if (index_.add(b.key, h, b.where))
        info.fingerprint += fingerprint_of(b);
  info.parity = change.parity;
  info.partial = change.partial;
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
    holders_[h].fingerprint = 0;
    holders_[h].has_state = false;
    holders_[h].parity = kv::parity_state::unknown;
  }
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
  return info.has_state && info.parity != kv::parity_state::mismatch;
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
