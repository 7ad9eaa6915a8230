// The router's tier-2 index: for every block key, which holders (a replica's
// data-parallel rank) hold it and on which medium. Pure code.
//
// Layout, for memory: one open-addressing table (Robin Hood, linear probing,
// growth by 1.5 at 85% load, so the load stays between 57% and 85%) of 16-byte
// slots: the key, a holder count, and up to three holders inline, each two
// bytes (holder id << 2 | medium). A key held by more than three holders
// keeps them in a side pool instead. A (block, holder) entry thus costs 19 to
// 28 bytes when keys are held once, less when they are shared.
//
// The prompt walk looks each of the prompt's block keys up once, for every
// candidate at the same time, and stops as soon as no candidate holds the
// current block: a holder's score is the weighted count of the leading blocks
// it holds, without a gap.
#pragma once

#include "kv/block_table.hpp"

#include <array>
#include <cstdint>
#include <vector>

namespace llmgw::routing {

/// A replica's data-parallel rank in the index; small and dense.
using holder_id = std::uint16_t;

/// The largest holder id plus one (14 bits; 2 bits are the medium).
inline constexpr std::size_t max_holders = 1u << 14;

/// What a prompt walk found for one candidate.
struct walk_score {
  holder_id holder = 0;
  std::uint32_t blocks = 0; ///< leading blocks held, on any medium
  double weighted = 0;      ///< the same, each weighted by its medium
};

class block_index {
public:
  block_index();

  /// Records that `h` holds `key` on `m`; false if it was recorded already.
  bool add(wire::block_key key, holder_id h, kv::medium m);

  /// Forgets that `h` holds `key` on `m`; false if it was not recorded.
  bool remove(wire::block_key key, holder_id h, kv::medium m);

  /// Forgets everything `h` holds: one pass over the table, skipped when the
  /// holder holds nothing.
  void drop(holder_id h);

  /// True when `h` holds `key` on `m`.
  bool holds(wire::block_key key, holder_id h, kv::medium m) const;

  /// Walks `keys` (a prompt's blocks, in order) for `candidates`, weighting a
  /// block by the best medium a candidate holds it on (`weights` by medium).
  /// `out` gets one score per candidate, in the candidates' order.
  void walk(const wire::block_key* keys, std::size_t count,
            const std::vector<holder_id>& candidates, const std::array<double, 3>& weights,
            std::vector<walk_score>& out);

  /// The weighted count of `keys`' first `count` blocks for `h`: each by
  /// the best medium `h` holds it on, 0 where it holds none.
  double weigh(const wire::block_key* keys, std::size_t count, holder_id h,
               const std::array<double, 3>& weights) const;

  /// Blocks (key, medium) held by `h`, sorted: for tests and diagnostics
  /// (one pass over the table).
  std::vector<kv::block_ref> blocks_of(holder_id h) const;

  /// (block, holder, medium) entries recorded for `h`.
  std::size_t count(holder_id h) const { return h < counts_.size() ? counts_[h] : 0; }

  /// (block, holder, medium) entries in all.
  std::size_t entries() const noexcept { return entries_; }

  /// Distinct keys.
  std::size_t keys() const noexcept { return used_; }

  /// Bytes the index holds on the heap (slots, pool, counters).
  std::size_t memory_bytes() const noexcept;

private:
  struct slot {
    wire::block_key key;
    std::uint16_t count; ///< 0: empty
    std::uint16_t inline_entries[3];
  };
  static_assert(sizeof(slot) == 16, "slots are 16 bytes");

  using entry = std::uint16_t; ///< holder << 2 | medium

  std::size_t home(wire::block_key key) const noexcept;
  std::size_t distance(std::size_t pos, wire::block_key key) const noexcept;
  slot* find(wire::block_key key);
  const slot* find(wire::block_key key) const;
  slot& insert_key(wire::block_key key);
  void erase_at(std::size_t pos);
  void grow();
  std::uint32_t pool_index(const slot& s) const noexcept;
  void set_pool_index(slot& s, std::uint32_t index) noexcept;
  /// The entries of a slot, wherever they are.
  const entry* entries_of(const slot& s) const noexcept;
  bool add_entry(slot& s, entry e);
  bool remove_entry(slot& s, entry e);
  void count_change(holder_id h, int delta);

  std::vector<slot> slots_;
  std::size_t used_ = 0;
  std::size_t entries_ = 0;
  std::vector<std::vector<entry>> pool_; ///< holders of keys held more than three times
  std::vector<std::uint32_t> free_pool_;
  std::vector<std::uint64_t> counts_; ///< entries per holder

  // Walk scratch, reused: per holder, the stamp of the block it was last
  // seen in and the best weight it had there.
  std::vector<std::uint32_t> seen_stamp_;
  std::vector<double> seen_weight_;
  std::uint32_t stamp_ = 0;
  std::vector<std::uint32_t> alive_;
};

} // namespace llmgw::routing
