// The mirror: one per engine, the only owner of that engine's block table.
// A thin shell: each handler unpacks its message and calls kv::block_table.
#pragma once

#include "actors/interfaces.hpp"
#include "kv/block_table.hpp"

#include <optional>
#include <string>

namespace llmgw {

struct mirror_state {
  std::string replica;
  std::uint32_t dp_rank = 0;
  kv::block_table table;
  kv::mirror_totals counters; ///< sent along with every update
  static inline const char* name = "mirror";
};

/// Spawned once per engine and data-parallel rank (each rank has its own
/// stream and KV cache); `parity` is nullopt when hashes are not checked.
mirror_actor::behavior_type mirror(mirror_actor::stateful_pointer<mirror_state> self,
                                   std::string replica, std::uint32_t dp_rank,
                                   std::optional<kv::parity_config> parity);

/// The update a mirror answers with, from a table delta.
replica_update to_update(const mirror_state& st, const kv::table_delta& delta);

} // namespace llmgw
