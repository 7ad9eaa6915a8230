#include "routing/prefix_tree.hpp"

#include <xxhash.h>

#include <algorithm>

namespace llmgw::routing {

std::vector<std::uint64_t> chunk_hashes(std::string_view text, std::size_t chunk_bytes) {
  std::vector<std::uint64_t> out;
  if (chunk_bytes == 0)
    return out;
  out.reserve(text.size() / chunk_bytes);
  std::uint64_t parent = 0x6c6c6d67772d7431ull; // "llmgw-t1": the root
  for (std::size_t at = 0; at + chunk_bytes <= text.size(); at += chunk_bytes) {
    parent = XXH3_64bits_withSeed(text.data() + at, chunk_bytes, parent);
    out.push_back(parent);
  }
  return out;
}

prefix_tree::prefix_tree(std::size_t capacity_per_replica, std::chrono::seconds ttl)
  : capacity_(std::max<std::size_t>(capacity_per_replica, 1)), ttl_(ttl), start_(clock::now()) {}

std::uint32_t prefix_tree::seconds(clock::time_point t) const {
  if (t <= start_)
    return 0;
  return static_cast<std::uint32_t>(
    std::chrono::duration_cast<std::chrono::seconds>(t - start_).count());
}

prefix_tree::holder* prefix_tree::find_holder(std::uint64_t node, tree_replica r) {
  auto it = nodes_.find(node);
  if (it == nodes_.end())
    return nullptr;
  for (auto& h : it->second)
    if (h.replica == r)
      return &h;
  return nullptr;
}

void prefix_tree::erase_holder(std::uint64_t node, tree_replica r) {
  auto it = nodes_.find(node);
  if (it == nodes_.end())
    return;
  auto& list = it->second;
  for (auto& h : list)
    if (h.replica == r) {
      h = list.back();
      list.pop_back();
      break;
    }
  if (list.empty())
    nodes_.erase(it);
}

bool prefix_tree::evict_front(replica_state& st, tree_replica r, bool only_expired,
                              std::uint32_t cutoff) {
  while (!st.lru.empty()) {
    const auto rec = st.lru.front();
    auto* h = find_holder(rec.node, r);
    if (!h || h->touch != rec.touch) {
      st.lru.pop_front(); // stale: touched again later, or gone
      continue;
    }
    if (only_expired && rec.at >= cutoff)
      return false;
    st.lru.pop_front();
    erase_holder(rec.node, r);
    --st.count;
    return true;
  }
  return false;
}

void prefix_tree::compact(replica_state& st, tree_replica r) {
  std::deque<record> live;
  for (const auto& rec : st.lru) {
    auto* h = find_holder(rec.node, r);
    if (h && h->touch == rec.touch)
      live.push_back(rec);
  }
  st.lru.swap(live);
}

void prefix_tree::insert(tree_replica r, const std::vector<std::uint64_t>& chunks,
                         clock::time_point now) {
  if (r >= replicas_.size())
    replicas_.resize(static_cast<std::size_t>(r) + 1);
  auto at = seconds(now);
  auto& st = replicas_[r];
  for (auto node : chunks) {
    auto touch = ++st.touches;
    if (auto* h = find_holder(node, r))
      h->touch = touch;
    else {
      nodes_[node].push_back({r, touch});
      ++st.count;
    }
    st.lru.push_back({node, touch, at});
  }
  while (st.count > capacity_ && evict_front(st, r, false, 0)) {
  }
  if (st.lru.size() > 2 * st.count + 64)
    compact(st, r);
  expire(now);
}

void prefix_tree::expire(clock::time_point now) {
  auto at = seconds(now);
  auto ttl = static_cast<std::uint32_t>(ttl_.count());
  if (at < ttl)
    return;
  auto cutoff = at - ttl;
  for (std::size_t r = 0; r < replicas_.size(); ++r)
    while (evict_front(replicas_[r], static_cast<tree_replica>(r), true, cutoff)) {
    }
}

void prefix_tree::forget(tree_replica r) {
  if (r >= replicas_.size())
    return;
  auto& st = replicas_[r];
  for (const auto& rec : st.lru)
    erase_holder(rec.node, r);
  st = replica_state{};
}

void prefix_tree::walk(const std::vector<std::uint64_t>& chunks,
                       const std::vector<tree_replica>& candidates,
                       std::vector<std::uint32_t>& matched) const {
  matched.assign(candidates.size(), 0);
  if (seen_.size() < replicas_.size())
    seen_.resize(replicas_.size(), 0);
  std::fill(seen_.begin(), seen_.end(), 0);
  alive_.clear();
  for (std::uint32_t c = 0; c < candidates.size(); ++c)
    if (candidates[c] < replicas_.size())
      alive_.push_back(c);
  for (std::size_t i = 0; i < chunks.size() && !alive_.empty(); ++i) {
    auto it = nodes_.find(chunks[i]);
    if (it == nodes_.end())
      break;
    auto mark = static_cast<std::uint32_t>(i + 1);
    for (const auto& h : it->second)
      seen_[h.replica] = mark;
    std::size_t kept = 0;
    for (auto c : alive_)
      if (seen_[candidates[c]] == mark) {
        ++matched[c];
        alive_[kept++] = c;
      }
    alive_.resize(kept);
  }
}

} // namespace llmgw::routing
