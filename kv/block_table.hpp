// One engine's KV cache blocks as its event stream describes them, and the
// net changes each subscriber has not seen yet. Pure code: the mirror actor
// owns one and is a thin shell around it.
//
// Rules (docs/vllm.md):
// - vLLM can store one hash in several physical blocks and removes it once
//   per copy, so a block is held while its reference count, per (key,
//   medium, group), is above zero; a batch may remove a hash and store it
//   again. A remove of an unknown key is counted, not an error: a subscriber
//   that joined late sees those.
// - Subscribers see blocks per (key, medium): held by any full-attention
//   group or not (every group of a model that is not hybrid).
// - Hybrid models (vLLM's HybridKVCacheCoordinator): a prefix of k blocks
//   is a hit when the full-attention groups hold its k blocks and every
//   other group accepts k as an end: a sliding-window group of window W
//   holds the last ceil((W - 1) / block size) of them (all of them when the
//   prefix is shorter), a Mamba group holds block k - 1 (its state there).
//   Other groups' blocks are therefore not blocks a prefix can be walked
//   on; instead, for every GPU block at which every other group accepts an
//   end, subscribers see one more GPU entry, its end marker
//   (end_marker_of()), and the router takes the longest prefix it walks
//   back to the last block that has one. The table learns the chain (each
//   block's parent and depth) from the full-attention groups' stores.
//   Groups of other kinds (chunked local attention, cross attention,
//   unknown), and engines without a full-attention group, mark the table
//   untranslatable: no prefix of theirs can be predicted.
// - Each subscriber gets a snapshot when it subscribes, then net changes:
//   what changed since its last drain, with stored-then-removed cancelled
//   out. A block held at the last drain and stored again since (removed and
//   stored, or stored while held: a prefill that recomputed a block the
//   engine had lost, its removal perhaps lost) is sent as added: a
//   renewal, which tells the router the engine holds it now (the router's
//   check of an answer that lacked it depends on that). The memory this
//   takes is bounded by the table's size, not by the event rate.
// - A reset (gap, restart, AllBlocksCleared, engine exit) empties the table
//   and bumps the epoch; every subscriber's next drain says "reset, epoch N"
//   before any later change.
// - Hash parity (parity_config, translate = false): stored GPU blocks whose
//   parent digest is known (a first block, or one chained from a block
//   checked here) are hashed again from the event's tokens and extra keys;
//   one mismatch marks the table's blocks untrusted until the next reset.
// - Key translation (translate = true): every stored GPU block is keyed by
//   the cluster's own hash (sha256_cbor under the cluster's seed, as the
//   router hashes prompts) of the event's tokens, its parent's cluster
//   digest and its extra keys, whatever the engine hashes with; the table
//   keeps engine key -> cluster digest while the block is held, so removals,
//   copies on other media and children's parent links resolve. A block
//   whose cluster hash equals the engine's is the identity ("verified").
//   A block that cannot be keyed (its parent unknown: stored before the
//   subscriber joined or before a gap; a copy on another medium of a block
//   never seen on the GPU) is left out and counted, except while every
//   block so far proved the engine hashes the cluster's way, when its own
//   key is used as today; should a later block prove otherwise, those
//   blocks are dropped (the table is then partial). What makes a whole
//   engine untranslatable
//   (another block size, no token ids, no extra keys while hashing another
//   way) marks it so until the next reset: not routed on its blocks.
#pragma once

#include "wire/block_hash.hpp"
#include "wire/kv_events.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace llmgw::kv {

/// Where a block lives. vLLM's storage tier names beyond GPU and CPU are
/// folded into `storage`.
enum class medium : std::uint8_t { gpu, cpu, storage };
/// The last medium: values from the network above it are refused.
inline constexpr medium last_medium = medium::storage;

/// The medium an event names; nil means GPU.
medium medium_of(std::string_view name) noexcept;

/// A stable lowercase name of a medium.
const char* to_string(medium m) noexcept;

/// A block as subscribers see it.
struct block_ref {
  wire::block_key key = 0;
  medium where = medium::gpu;
  bool operator==(const block_ref& other) const noexcept {
    return key == other.key && where == other.where;
  }
  bool operator<(const block_ref& other) const noexcept {
    return key != other.key ? key < other.key : where < other.where;
  }
};

struct block_ref_hash {
  std::size_t operator()(const block_ref& r) const noexcept {
    return static_cast<std::size_t>(r.key * 0x9E3779B97F4A7C15u)
           ^ static_cast<std::size_t>(r.where);
  }
};

/// One block's contribution to a fingerprint: a digest of a set of blocks
/// is the sum of its blocks' (mod 2^64), so a mirror and every copy of it
/// keep theirs by adding and subtracting as blocks come and go, and equal
/// sets have equal fingerprints. Sums of these collide only by chance.
std::uint64_t fingerprint_of(const block_ref& b) noexcept;

/// How a KV cache group decides whether a prefix is a hit: vLLM's
/// KVCacheSpecKind names, folded by the rule their manager applies.
enum class group_kind : std::uint8_t {
  full,   ///< every block of the prefix (full_attention, mla_attention, sink_full_attention)
  window, ///< the last blocks of the prefix, a window's worth (sliding_window, sliding_window_mla)
  mamba,  ///< the prefix's last block (mamba)
  unsupported, ///< a rule llmgw does not follow (chunked local attention, cross attention, ...)
};

/// The kind a stored event's `kv_cache_spec_kind` names; an event without
/// one (vLLM before 2026-05) is full attention.
group_kind group_kind_of(const std::optional<std::string>& kv_cache_spec_kind) noexcept;

/// The key of the entry that says "a prefix ending at block `key` is a hit
/// for every group that is not full attention" (see the top). A fixed mix
/// of the key, so the router finds it from the prompt's own keys; it is
/// another 64-bit key, as likely to collide with a block's as any two are.
wire::block_key end_marker_of(wire::block_key key) noexcept;

/// What a subscriber must apply to its copy to equal the table.
struct table_delta {
  std::uint64_t epoch = 0;
  bool reset = false;             ///< drop everything held for this replica first
  std::vector<block_ref> added;   ///< held now, not at the last drain
  std::vector<block_ref> removed; ///< held at the last drain, not now
  bool empty() const noexcept { return !reset && added.empty() && removed.empty(); }
};

/// Why a table was reset; a metric label.
enum class reset_reason : std::uint8_t { gap, restart, clear, engine_exit, decode_error };
/// How many reset reasons there are: the size of every per-reason array.
inline constexpr std::size_t reset_reason_count = 5;
static_assert(static_cast<std::size_t>(reset_reason::decode_error) + 1 == reset_reason_count,
              "reset_reason_count counts every reset_reason");
const char* to_string(reset_reason r) noexcept;

/// Whether the engine's hashes are what llmgw computes, or are translated
/// into what it computes. The values are sent between nodes: new ones go
/// at the end.
enum class parity_state : std::uint8_t {
  unknown,        ///< no block could be checked yet
  verified,       ///< blocks were checked, every one matched
  mismatch,       ///< a block did not match (translate = false): do not route on this table
  translated,     ///< the engine hashes another way; blocks are keyed by the cluster's hash
  untranslatable, ///< blocks cannot be keyed the cluster's way: do not route on this table
};
/// The last parity state: values from the network above it are refused.
inline constexpr parity_state last_parity_state = parity_state::untranslatable;
const char* to_string(parity_state p) noexcept;

/// Whether a table in state `p` may be routed on.
inline bool routable(parity_state p) noexcept {
  return p != parity_state::mismatch && p != parity_state::untranslatable;
}

/// Counts from applying one batch.
struct apply_counts {
  std::size_t stored = 0;          ///< hashes stored
  std::size_t removed = 0;         ///< hashes removed
  std::size_t ignored_removes = 0; ///< removes of keys not held
  std::size_t clears = 0;          ///< AllBlocksCleared events (each a reset)
  std::size_t verified = 0;        ///< blocks whose hash was recomputed and matched
  std::size_t translated = 0;      ///< blocks keyed by the cluster's hash, not the engine's
  std::size_t untranslated = 0;    ///< stored blocks left out: no cluster key could be made
  bool mismatch_found = false;     ///< this batch made parity mismatch or untranslatable
};

/// A mirror's running totals since the agent started. Every update carries
/// them, so the control node exports the agent's counts as its own metrics.
struct mirror_totals {
  std::uint64_t batches = 0;                     ///< event batches applied
  std::uint64_t stored = 0;                      ///< block hashes stored
  std::uint64_t removed = 0;                     ///< block hashes removed
  std::uint64_t ignored_removes = 0;             ///< removes of blocks not held
  std::uint64_t verified_blocks = 0;             ///< blocks whose hash was recomputed and matched
  std::uint64_t translated_blocks = 0;           ///< blocks keyed by translation
  std::uint64_t untranslated_blocks = 0;         ///< stored blocks that could not be keyed
  std::uint64_t resets[reset_reason_count] = {}; ///< by reset_reason
};

/// How often the engine's cache was emptied: clears, restarts and exits.
inline std::uint64_t emptied(const mirror_totals& t) noexcept {
  return t.resets[static_cast<std::size_t>(reset_reason::clear)]
         + t.resets[static_cast<std::size_t>(reset_reason::restart)]
         + t.resets[static_cast<std::size_t>(reset_reason::engine_exit)];
}

/// How often the engine process was replaced: restarts and exits.
inline std::uint64_t restarts(const mirror_totals& t) noexcept {
  return t.resets[static_cast<std::size_t>(reset_reason::restart)]
         + t.resets[static_cast<std::size_t>(reset_reason::engine_exit)];
}

/// Identifies a subscriber of a table.
using peer_id = std::uint64_t;

/// Parameters of hash parity: the cluster's seed and block size, and
/// whether to translate the engine's keys into the cluster's.
struct parity_config {
  std::string seed;            ///< the cluster's hash_seed (the router's NONE_HASH)
  std::size_t block_size = 16; ///< the cluster's block size
  bool translate = false;      ///< key blocks by the cluster's hash (see the top)
  std::string block_size_flag = "--block-size"; ///< what sets the engine's, for messages
};

class block_table {
public:
  /// Without a parity config, hashes are not checked (parity stays unknown).
  explicit block_table(std::optional<parity_config> parity = std::nullopt);

  /// Applies a batch's events in order. A clear resets the table first.
  apply_counts apply(const wire::event_batch& batch);

  /// Empties the table and bumps the epoch; parity starts over. After a gap
  /// or an undecodable payload the table is partial (see partial()).
  void reset(reset_reason why);

  /// Starts tracking `peer`; its first delta is the snapshot (reset + every
  /// held block). Subscribing again restarts with a snapshot.
  table_delta subscribe(peer_id peer);

  /// What `peer` has not seen; afterwards it has seen everything.
  table_delta drain(peer_id peer);

  /// Stops tracking `peer`.
  void unsubscribe(peer_id peer);

  /// Every held block, sorted: what a subscriber's copy must equal.
  std::vector<block_ref> held() const;

  /// True while `ref` is held by a full-attention group, or is an end
  /// marker the table publishes.
  bool holds(const block_ref& ref) const {
    return presence_.count(ref) != 0 || (ref.where == medium::gpu && markers_.count(ref.key) != 0);
  }

  /// Entries subscribers see: blocks and end markers.
  std::size_t size() const noexcept { return presence_.size() + markers_.size(); }

  /// True when the engine has KV cache groups that are not full attention:
  /// its prefixes end only where an end marker says so.
  bool hybrid() const noexcept { return other_groups_ > 0; }

  /// End markers published now.
  std::size_t markers() const noexcept { return markers_.size(); }

  /// Chain links kept for a hybrid model's blocks (for tests of the bound:
  /// none outlives what holds it).
  std::size_t chain_links() const noexcept { return links_.size(); }
  std::uint64_t epoch() const noexcept { return epoch_; }
  /// The sum of fingerprint_of over every held block: what a subscriber's
  /// copy has once it applied every delta.
  std::uint64_t fingerprint() const noexcept { return fingerprint_; }
  parity_state parity() const noexcept { return parity_; }

  /// True when the engine may hold blocks the table does not know: its last
  /// reset was a gap nobody could fill (or a payload that did not decode),
  /// and its cache has not been emptied since. After a clear, a restart or
  /// an engine exit the engine is truly empty: not partial.
  bool partial() const noexcept { return partial_; }

  /// Why parity is `mismatch` or `untranslatable`: which block, and what
  /// the engine needs.
  const std::string& parity_message() const noexcept { return parity_message_; }

  /// Engine keys whose cluster digest the table keeps (translate = true).
  std::size_t translations() const noexcept { return keyed_.size(); }

  /// Entries kept for `peer`'s pending changes (for tests of the bound).
  std::size_t pending_size(peer_id peer) const;

private:
  struct group_key {
    wire::block_key key;
    medium where;
    std::int64_t group;
    bool operator==(const group_key& o) const noexcept {
      return key == o.key && where == o.where && group == o.group;
    }
  };
  struct group_key_hash {
    std::size_t operator()(const group_key& k) const noexcept {
      return block_ref_hash{}({k.key, k.where}) ^ (static_cast<std::size_t>(k.group) * 31);
    }
  };
  /// What a peer is to be told of a block.
  enum class change : std::uint8_t { added, removed, renewed };
  struct peer_state {
    bool reset_pending = false;
    /// Blocks to send: those whose presence differs from the peer's last
    /// drain, and those stored again since.
    std::unordered_map<block_ref, change, block_ref_hash> changed;
  };

  void apply_event(const wire::kv_event& ev, apply_counts& counts);
  void store(const block_ref& ref, std::int64_t group);
  bool remove(const block_ref& ref, std::int64_t group);
  /// `group` no longer holds `g`'s block (its last reference went); true
  /// when the block left the set subscribers see.
  bool released(const group_key& g);

  // Hybrid models (see the top).
  struct group_spec {
    group_kind kind = group_kind::full;
    std::uint32_t window_blocks = 0; ///< window: the blocks an end needs
  };
  /// Learns the groups a batch's stores name, before any event of it
  /// applies; flags kinds no prefix can be predicted for.
  void note_groups(const wire::event_batch& batch, apply_counts& counts);
  bool full_group(std::int64_t group) const;
  /// Why the groups learned so far let no prefix be predicted, or "".
  std::string groups_problem() const;
  /// False when linking `key` under `parent` would close a loop (a hostile
  /// publisher's parent links).
  bool acyclic(wire::block_key key, wire::block_key parent) const;
  /// Sets the depth of `key` (linked, depth unknown) and of its children
  /// that did not know theirs, and their markers.
  void set_depth(wire::block_key key, std::int32_t depth);
  /// A GPU block's place in its chain, learned from full-attention stores,
  /// kept while a group holds it or a child links to it.
  struct chain_link {
    wire::block_key parent = 0;
    bool linked = false;       ///< parent (or root) known
    bool root = false;         ///< the first block of a prompt
    std::int32_t depth = -1;   ///< blocks before it; -1: unknown
    std::uint32_t holders = 0; ///< (group) references on the GPU
    std::vector<wire::block_key> children;
  };
  /// Links a full-attention store's blocks (`keys`, 0 for ones left out)
  /// under `parent` (nullopt: the chain's root; `parent_known` false: a
  /// parent nobody can name).
  void link_chain(const std::vector<std::pair<wire::block_key, bool>>& keys,
                  std::optional<wire::block_key> parent, bool parent_known);
  /// A group's GPU reference to `key` came (+1) or went (-1).
  void gpu_holding(wire::block_key key, std::int64_t group, int delta);
  /// Drops `key`'s link if nothing holds it and no child links to it.
  void maybe_unlink(wire::block_key key);
  /// Recomputes the runs of window group `group` from `key` down its
  /// children while they change, and their markers.
  void update_runs(wire::block_key key, std::int64_t group);
  /// Publishes or withdraws `key`'s end marker as the groups now say.
  void eval_marker(wire::block_key key);
  std::uint32_t run_of(wire::block_key key, std::int64_t group) const;
  void presence_changed(const block_ref& ref, bool was);
  /// `ref`, held, was stored again.
  void renewed(const block_ref& ref);
  void check_parity(const wire::kv_event& ev, apply_counts& counts);
  void flag_mismatch(std::string message);
  void flag(parity_state state, std::string message, apply_counts& counts);
  bool translating() const noexcept { return parity_config_ && parity_config_->translate; }
  /// The cluster keys of a stored event's blocks into `keys_` (0 entries
  /// for blocks left out; see the top).
  void translate_stored(const wire::kv_event& ev, medium where, apply_counts& counts);
  /// A block that cannot be hashed here: its own key while the engine has
  /// proved to hash the cluster's way, else left out.
  void fallback(wire::block_key engine_key, apply_counts& counts);
  /// The cluster key for a removal of `engine_key`.
  wire::block_key cluster_key_of(wire::block_key engine_key) const;
  /// One held copy of `engine_key`'s translated block went away.
  void release(wire::block_key engine_key);
  /// The engine turned out not to hash the cluster's way after all: drops
  /// every block held under a key no cluster digest gave (kept by
  /// fallback() while parity was verified).
  void drop_own_keys(apply_counts& counts);

  std::unordered_map<group_key, std::uint32_t, group_key_hash> refs_;
  std::unordered_map<block_ref, std::uint32_t, block_ref_hash> presence_; ///< live groups
  std::unordered_map<peer_id, peer_state> peers_;
  std::unordered_map<std::int64_t, group_spec> groups_; ///< kept over clears and gaps
  std::string group_problem_; ///< the first group no prefix can be predicted for
  std::size_t full_groups_ = 0;
  std::size_t other_groups_ = 0;
  std::unordered_map<wire::block_key, chain_link> links_; ///< hybrid only
  /// Per (block, window group): consecutive blocks that group holds ending
  /// at the block, at most its window_blocks; absent: 0.
  struct run_key {
    wire::block_key key;
    std::int64_t group;
    bool operator==(const run_key& o) const noexcept { return key == o.key && group == o.group; }
  };
  struct run_key_hash {
    std::size_t operator()(const run_key& k) const noexcept {
      return static_cast<std::size_t>(k.key * 0x9E3779B97F4A7C15u)
             ^ static_cast<std::size_t>(k.group);
    }
  };
  std::unordered_map<run_key, std::uint32_t, run_key_hash> runs_;
  std::unordered_set<wire::block_key> markers_; ///< end markers published (their keys)
  std::vector<const wire::kv_event*> deferred_; ///< apply(): other groups' events, in order
  std::uint64_t epoch_ = 0;
  std::uint64_t fingerprint_ = 0;
  bool partial_ = false;

  std::optional<parity_config> parity_config_;
  std::optional<wire::block_hasher> hasher_;
  std::unordered_map<wire::block_key, wire::digest> digests_; ///< checked GPU blocks' full digests
  /// translate = true: what an engine key stands for while held.
  struct keyed_block {
    wire::digest cluster; ///< the cluster's digest of the block
    std::uint32_t copies; ///< stores not removed yet, over media and groups
  };
  std::unordered_map<wire::block_key, keyed_block> keyed_;
  std::vector<std::pair<wire::block_key, bool>> keys_; ///< translate_stored's output: key, kept
  parity_state parity_ = parity_state::unknown;
  std::string parity_message_;
};

} // namespace llmgw::kv
