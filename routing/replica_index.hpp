// What the router knows of every replica's KV cache: the block index plus, per
// holder (a replica's data-parallel rank), its epoch, whether its hashes are
// trusted, where its state came from and when it last changed. Pure code; the
// router actor applies the agents' net changes through it.
//
// Rules:
// - A change with reset = true replaces everything held for the holder (a
//   session's full copy, or the mirror's reset with a new epoch).
// - A change for an epoch older than the holder's is stale (a late message
//   from before a reset) and is ignored.
// - A replica is trusted for routing while its parity is routable (not
//   "mismatch", not "untranslatable") and it has KV state at all (a full copy arrived and was not
//   dropped since).
// - Dropping a replica (its node went down) forgets its blocks; it is not
//   trusted again until a new full copy arrives.
// - Speculative entries: when a request is routed, its prompt's blocks are
//   entered for the chosen holder at once (speculate()), so the next
//   requests see them before the engine's events can arrive. The engine's
//   own store of such a block confirms it; a removal deletes it whatever
//   its state; a full copy replaces them with the engine's truth; one that
//   nothing confirmed by its expiry is deleted then (expire()). They never
//   count in a holder's fingerprint, which stays comparable with the
//   agent's mirror.
// - Watched predictions: when a request is routed by what the engine's
//   events say a holder holds, those blocks are watched (watch()) until the
//   engine's answer says how many it really found (settle()). The watched
//   blocks it did not find, and did not store again since (its own prefill
//   recomputes them, and its events then say so), are forgotten at once:
//   the claim was stale (evicted before the event arrived, or the event was
//   lost). A dropped block no longer counts for routing, but it stays in
//   the holder's fingerprint (suppressed) until the engine's own events
//   remove or store it: the fingerprint remains a digest of what the
//   events said, comparable with the mirror's and other control nodes'.
#pragma once

#include "routing/block_index.hpp"

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llmgw::routing {

/// One replica's net change, as an agent sends it.
struct kv_change {
  std::string_view replica;
  std::uint32_t dp_rank = 0;
  std::uint64_t epoch = 0;
  bool reset = false;
  kv::parity_state parity = kv::parity_state::unknown;
  const std::vector<kv::block_ref>* added = nullptr;
  const std::vector<kv::block_ref>* removed = nullptr;
  bool partial = false;                ///< the engine may hold blocks the sender does not know
  std::string_view parity_reason = {}; ///< why parity is not routable, if it is not
  bool hybrid = false; ///< a hybrid model: its prefixes end at end markers (kv::end_marker_of)
};

/// What applying a change did.
enum class apply_outcome : std::uint8_t { applied, stale_epoch, needs_reset };

/// What the index holds for one holder.
struct holder_info {
  std::string replica;
  std::uint32_t dp_rank = 0;
  bool has_state = false; ///< a full copy arrived and was not dropped since
  std::uint64_t epoch = 0;
  kv::parity_state parity = kv::parity_state::unknown;
  std::string parity_reason; ///< the agent's words, when parity is not routable
  /// The agent's mirror may lack blocks the engine holds (an unfilled gap):
  /// the router scores it by the better of this index and tier 1.
  bool partial = false;
  /// A hybrid model (kv::block_table): a prefix it holds is a hit only up
  /// to the last block with an end marker.
  bool hybrid = false;
  std::chrono::steady_clock::time_point last_update{};
  std::uint64_t updates = 0; ///< changes applied
  std::uint64_t resets = 0;  ///< full copies and epoch resets applied
  /// Order-independent digest of the held (key, medium) set: equal sets give
  /// equal fingerprints, so two control nodes (or a router and a mirror) can
  /// be compared without listing blocks. Speculative entries do not count.
  std::uint64_t fingerprint = 0;
  std::uint64_t speculative = 0; ///< speculative entries held now
  std::uint64_t speculative_confirmed = 0;
  std::uint64_t speculative_expired = 0;
  /// Blocks forgotten because the engine's answer said it lacked them.
  std::uint64_t shortfall_drops = 0;
  std::uint64_t suppressed = 0; ///< of those, still in the fingerprint (see the top)
};

/// A watched prediction (0: none).
using watch_id = std::uint64_t;

using kv::fingerprint_of;

/// The fingerprint of a set of blocks (what a mirror holds, say).
std::uint64_t fingerprint_of(const std::vector<kv::block_ref>& blocks) noexcept;

class replica_index {
public:
  /// Applies one change at time `now`. A change without reset for a holder
  /// that has no state is refused (needs_reset): the sender must start with
  /// a full copy.
  apply_outcome apply(const kv_change& change, std::chrono::steady_clock::time_point now);

  /// Forgets every rank of `replica` (its node went down or its session
  /// ended): routed by tier 1 until a new full copy arrives.
  void drop_replica(std::string_view replica);

  /// Enters `keys` (a prompt just routed to `h`) as speculative GPU blocks
  /// until `expires`, where `h` does not hold them yet; refreshes the expiry
  /// of those already speculative.
  void speculate(holder_id h, const wire::block_key* keys, std::size_t count,
                 std::chrono::steady_clock::time_point expires);

  /// Deletes the speculative entries nothing confirmed by `now`.
  void expire(std::chrono::steady_clock::time_point now);

  /// How many of `keys`' leading blocks `h` holds by the engine's own
  /// events: on any medium, up to the first not held or only speculative.
  std::size_t leading_confirmed(holder_id h, const wire::block_key* keys, std::size_t count) const;

  /// Of `keys`' first `count` blocks (a prefix `h` holds), the longest
  /// prefix that is a hit: for a hybrid holder, the one ending at the last
  /// block with an end marker, speculative or not (vLLM's hybrid
  /// coordinator); `count` for any other.
  std::size_t hit_blocks(holder_id h, const wire::block_key* keys, std::size_t count) const;

  /// Watches a prediction that `h` holds `keys` (routed there): 0 when
  /// `count` is 0 or too many are watched already.
  watch_id watch(holder_id h, const wire::block_key* keys, std::size_t count);

  /// The engine found the first `found` watched blocks: forgets the others
  /// it did not store again since watch(), and ends the watch. Returns how
  /// many (block, medium) entries were forgotten, or nothing when the watch
  /// is unknown or void (the holder was reset or dropped since: the answer
  /// speaks of a state the index no longer holds).
  std::optional<std::size_t> settle(watch_id id, std::size_t found);

  /// Ends a watch without an answer (the request failed, or its engine
  /// does not report cached tokens).
  void unwatch(watch_id id);

  /// Predictions watched now.
  std::size_t watching() const noexcept { return watches_.size(); }

  /// Predictions not watched because too many were (a gateway whose answers
  /// never come back would hold them all).
  std::uint64_t watch_refusals() const noexcept { return watch_refusals_; }

  /// The holder id of (replica, rank), if the index has seen it.
  std::optional<holder_id> find(std::string_view replica, std::uint32_t dp_rank) const;

  /// Every holder (rank) of `replica` the index has seen, in rank order; ranks
  /// arrive in any order, so this is the way to visit them.
  std::vector<holder_id> holders_of(std::string_view replica) const;

  /// Every holder of `replica` that is trusted for routing now.
  void trusted_holders(std::string_view replica, std::vector<holder_id>& out) const;

  /// True when `h` is trusted for routing.
  bool trusted(holder_id h) const;

  const holder_info& info(holder_id h) const { return holders_[h]; }
  std::size_t holder_count() const noexcept { return holders_.size(); }
  const block_index& blocks() const noexcept { return index_; }
  block_index& blocks() noexcept { return index_; }

private:
  holder_id holder_for(std::string_view replica, std::uint32_t dp_rank);
  void forget_speculative(holder_id h);

  struct speculation {
    std::chrono::steady_clock::time_point expires;
    holder_id holder;
    wire::block_key key;
  };

  block_index index_;
  /// Per holder: its speculative keys and when each expires.
  std::vector<std::unordered_map<wire::block_key, std::chrono::steady_clock::time_point>> spec_;
  /// Every speculation in the order made (expiries only grow): a later
  /// refresh leaves an old record behind, skipped when it comes up.
  std::deque<speculation> spec_order_;
  std::vector<holder_info> holders_;
  std::unordered_map<std::string, std::vector<holder_id>> by_replica_;

  struct watch_record {
    holder_id holder;
    std::uint64_t epoch;  ///< the holder's, when watched
    std::uint64_t resets; ///< and its resets: a full copy since voids the watch
    std::uint64_t since;  ///< store_clock_ when watched
    std::vector<wire::block_key> keys;
  };
  /// A watched (holder, key): how many watches hold it, and store_clock_
  /// at the engine's last store of it.
  struct watched_key {
    std::uint32_t watches = 0;
    std::uint64_t stored = 0;
  };
  /// Forgets a watch's keys from watched_.
  void release(const watch_record& w);
  std::unordered_map<watch_id, watch_record> watches_;
  std::vector<std::unordered_map<wire::block_key, watched_key>> watched_; ///< by holder
  watch_id next_watch_ = 1;
  std::uint64_t store_clock_ = 0; ///< counts the stores applied to watched keys
  std::uint64_t watch_refusals_ = 0;
  /// By holder: dropped blocks still in its fingerprint, a bit per medium.
  std::vector<std::unordered_map<wire::block_key, std::uint8_t>> suppressed_;
  /// Ends the suppression of `b` for `h`; true if it was suppressed.
  bool unsuppress(holder_id h, const kv::block_ref& b);
  void forget_suppressed(holder_id h);
};

} // namespace llmgw::routing
