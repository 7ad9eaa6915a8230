// llmgw-sim's paged KV cache: what one engine rank holds, and the events
// vLLM publishes for it. Pure code, one owner (the simulator's engine thread).
//
// The rules follow vLLM's block pool (golden/vllm-captures/README.md):
// - Only full blocks are hashed (vLLM's sha256_cbor chain, the engine's
//   PYTHONHASHSEED, the request's LoRA name and cache salt).
// - A lookup never covers the last prompt token: a fully cached,
//   block-aligned prompt still recomputes its last block.
// - Free blocks are handed out least recently freed first; a finished
//   request frees its blocks tail first. Reusing a cached free block evicts
//   it: a BlockRemoved with exactly its hash.
// - A prefill stores all its new full blocks in one BlockStored whose parent
//   is the last block already cached; a block filled during decode is a
//   BlockStored of its own.
// - reset() (POST /reset_prefix_cache) works only with no request running,
//   and publishes AllBlocksCleared.
#pragma once

#include "wire/block_hash.hpp"
#include "wire/kv_events.hpp"

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmgw::sim {

struct cache_config {
  std::size_t blocks = 4096;
  std::size_t block_size = 16;
  std::string seed;               ///< PYTHONHASHSEED; empty: random, as vLLM does without it
  bool int_hashes = true;         ///< VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (default 1)
  bool publish_extra_keys = true; ///< events carry extra_keys (vLLM >= 2026-02)
};

/// The cached leading blocks of a request's tokens (kv_cache::lookup).
struct prefix_hit {
  std::vector<std::uint32_t> blocks; ///< block ids, in order
  wire::digest last{};               ///< digest of the last of them
};

/// One request's hold on the cache.
struct allocation {
  std::vector<std::uint32_t> blocks; ///< block ids, in order
  std::vector<std::uint32_t> tokens; ///< prompt and generated tokens so far
  std::size_t prompt_tokens = 0;
  std::size_t cached_tokens = 0; ///< prompt tokens found in the cache
  std::size_t hashed = 0;        ///< leading blocks that are full and stored
  wire::digest last{};           ///< digest of block hashed-1 (chain parent)
  wire::extra_key_recipe extras;
  std::optional<std::int64_t> lora_id;
};

class kv_cache {
public:
  explicit kv_cache(cache_config cfg);

  /// A request for `prompt` that holds no blocks yet.
  static allocation start(const std::vector<std::uint32_t>& prompt,
                          const wire::extra_key_recipe& extras,
                          std::optional<std::int64_t> lora_id);

  /// The cached leading full blocks of `a.tokens`, never covering its last
  /// token (that one is always computed). Takes nothing.
  prefix_hit lookup(const allocation& a);

  /// Makes `a` hold blocks for its first `upto` tokens: when it holds none
  /// yet, the `hit` blocks first (counted as prefix cache queries and hits),
  /// then fresh blocks as needed, least recently freed first (reusing a
  /// cached one evicts it: a BlockRemoved to `out`). False, and nothing
  /// changes, when the free blocks do not suffice.
  bool allocate(allocation& a, const prefix_hit& hit, std::size_t upto,
                std::vector<wire::kv_event>& out);

  /// Hashes and stores the full blocks among `a`'s first `upto` tokens that
  /// are not stored yet (one BlockStored for all of them, as vLLM does).
  void commit(allocation& a, std::size_t upto, std::vector<wire::kv_event>& out);

  /// Blocks `a` needs beyond those it holds to hold `upto` tokens.
  std::size_t blocks_needed(const allocation& a, std::size_t upto) const noexcept;
  std::size_t free_blocks() const noexcept { return free_.size(); }

  /// Admits a request for `prompt` plus up to `max_new` generated tokens in
  /// one go: lookup, allocate, commit the prompt. Nullopt when the free
  /// blocks do not suffice (nothing changes then).
  std::optional<allocation> admit(const std::vector<std::uint32_t>& prompt,
                                  const wire::extra_key_recipe& extras,
                                  std::optional<std::int64_t> lora_id, std::size_t max_new,
                                  std::vector<wire::kv_event>& out);

  /// Adds a generated token; a block it fills is hashed and stored.
  void append(allocation& a, std::uint32_t token, std::vector<wire::kv_event>& out);

  /// Gives the request's blocks back, tail first; `a` can allocate again
  /// (a preempted request starts over).
  void release(allocation& a);

  /// Forgets every cached block; false (and nothing published) while any
  /// request holds blocks.
  bool reset(std::vector<wire::kv_event>& out);

  /// Every key some block holds now, sorted (what a mirror must hold).
  std::vector<wire::block_key> hashed_keys() const;

  std::size_t total_blocks() const noexcept { return blocks_.size(); }
  std::size_t used_blocks() const noexcept { return used_; }
  std::size_t cached_blocks() const noexcept { return cached_.size(); }
  std::uint64_t queried_tokens() const noexcept { return queried_; }
  std::uint64_t hit_tokens() const noexcept { return hits_; }
  std::size_t block_size() const noexcept { return cfg_.block_size; }
  /// The chain root of this engine's hashes (its seed's NONE_HASH).
  const wire::digest& root() const noexcept { return hasher_.root(); }

private:
  struct block {
    std::uint32_t refs = 0;
    bool hashed = false;
    wire::block_key key = 0;
    wire::digest digest{};
    bool in_free = false;
    std::list<std::uint32_t>::iterator free_at;
  };

  wire::block_hash wire_hash(const wire::digest& d) const;
  void take_from_free(std::uint32_t id);
  std::uint32_t take_fresh(std::vector<wire::kv_event>& out);
  void store(allocation& a, std::size_t first, std::size_t count, std::vector<wire::kv_event>& out);

  cache_config cfg_;
  wire::block_hasher hasher_;
  std::vector<block> blocks_;
  std::list<std::uint32_t> free_; ///< front: evicted first
  std::unordered_map<wire::block_key, std::uint32_t> cached_;
  std::vector<wire::hashed_block> chain_; ///< lookup()'s, kept for its capacity
  std::size_t used_ = 0;
  std::uint64_t queried_ = 0;
  std::uint64_t hits_ = 0;
};

/// A random PYTHONHASHSEED-like string (what vLLM does without one:
/// unmatchable hashes).
std::string random_seed();

} // namespace llmgw::sim
