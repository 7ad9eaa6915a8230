// The mirror: one per engine, the only owner of that engine's block table.
// A thin shell: each handler unpacks its message and calls kv::block_table.
#pragma once

#include "actors/interfaces.hpp"
#include "kv/block_table.hpp"

#include <atomic>
#include <memory>
#include <optional>
#include <string>

namespace llmgw {

/// What a mirror holds, written by the mirror after every change and read by
/// the agent's admin listener (its /v1/kv/mirrors and /metrics) on another
/// thread. Each field is current on its own; read together they may be one
/// change apart, which a reader comparing with a control node's view polls
/// through anyway.
struct mirror_view {
  std::atomic<std::uint64_t> blocks{0};
  std::atomic<std::uint64_t> epoch{0};
  std::atomic<std::uint64_t> fingerprint{0}; ///< kv::block_table::fingerprint()
  std::atomic<bool> partial{false};
  std::atomic<std::uint8_t> parity{0}; ///< a kv::parity_state
  std::atomic<std::uint64_t> resets[kv::reset_reason_count] = {};
};

struct mirror_state {
  std::string replica;
  std::uint32_t dp_rank = 0;
  kv::block_table table;
  kv::mirror_totals counters;        ///< sent along with every update
  std::shared_ptr<mirror_view> view; ///< may be null
  static inline const char* name = "mirror";
};

/// Spawned once per engine and data-parallel rank (each rank has its own
/// stream and KV cache); `parity` is nullopt when hashes are not checked;
/// `view` (may be null) is kept current.
mirror_actor::behavior_type mirror(mirror_actor::stateful_pointer<mirror_state> self,
                                   std::string replica, std::uint32_t dp_rank,
                                   std::optional<kv::parity_config> parity,
                                   std::shared_ptr<mirror_view> view);

/// The update a mirror answers with, from a table delta.
replica_update to_update(const mirror_state& st, const kv::table_delta& delta);

} // namespace llmgw
