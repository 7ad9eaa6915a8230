// Tier 1: an approximate prefix tree of the prompt text the router sent to
// each replica, for replicas whose KV cache llmgw cannot see. Pure code.
//
// The text is cut into fixed-size chunks; a tree node is named by the hash
// of its whole path, h_i = XXH3(chunk_i, seed = h_{i-1}), so the tree is a
// hash map from node to the replicas that were sent that prefix. One lookup
// per chunk serves every replica, and the walk stops at the first chunk no
// candidate was sent. Only full chunks count (like vLLM's full blocks).
//
// Bounded: each replica keeps at most `capacity` nodes, evicting its least
// recently used, and nodes unused for `ttl` age out. Eviction is an LRU queue
// per replica with lazy deletion (a touch appends a record; records made
// stale by a later touch are skipped when they reach the front), compacted
// when it grows past twice the replica's node count.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llmgw::routing {

/// A replica's number in the tier-1 tree.
using tree_replica = std::uint16_t;

/// The chained chunk hashes of a text (full chunks only).
std::vector<std::uint64_t> chunk_hashes(std::string_view text, std::size_t chunk_bytes);

class prefix_tree {
public:
  using clock = std::chrono::steady_clock;

  prefix_tree(std::size_t capacity_per_replica, std::chrono::seconds ttl);

  /// Records that `r` was sent the prefix `chunks` (touching nodes it had).
  void insert(tree_replica r, const std::vector<std::uint64_t>& chunks, clock::time_point now);

  /// For each candidate (in order), how many leading chunks it was sent.
  void walk(const std::vector<std::uint64_t>& chunks, const std::vector<tree_replica>& candidates,
            std::vector<std::uint32_t>& matched) const;

  /// Drops nodes older than the TTL (call now and then; insert does it too).
  void expire(clock::time_point now);

  /// Forgets everything of `r` (a replica removed from service).
  void forget(tree_replica r);

  /// Nodes held for `r`.
  std::size_t size(tree_replica r) const { return r < replicas_.size() ? replicas_[r].count : 0; }

  /// Records in `r`'s LRU queue, stale ones included (for tests of the bound).
  std::size_t queue_size(tree_replica r) const {
    return r < replicas_.size() ? replicas_[r].lru.size() : 0;
  }

  /// Distinct nodes in all.
  std::size_t nodes() const noexcept { return nodes_.size(); }

private:
  struct holder {
    tree_replica replica;
    std::uint32_t touch; ///< the replica's touch number when last used
  };
  struct record {
    std::uint64_t node;
    std::uint32_t touch;
    std::uint32_t at; ///< seconds since the tree's start
  };
  struct replica_state {
    std::size_t count = 0;
    std::uint32_t touches = 0;
    std::deque<record> lru; ///< oldest first, with stale records
  };

  std::uint32_t seconds(clock::time_point t) const;
  bool evict_front(replica_state& st, tree_replica r, bool only_expired, std::uint32_t cutoff);
  void compact(replica_state& st, tree_replica r);
  void erase_holder(std::uint64_t node, tree_replica r);
  holder* find_holder(std::uint64_t node, tree_replica r);

  std::size_t capacity_;
  std::chrono::seconds ttl_;
  clock::time_point start_;
  std::unordered_map<std::uint64_t, std::vector<holder>> nodes_;
  std::vector<replica_state> replicas_;
  mutable std::vector<std::uint32_t> seen_; ///< walk scratch: per replica, last chunk seen + 1
  mutable std::vector<std::uint32_t> alive_;
};

} // namespace llmgw::routing
