// The router: one per control node. Holds the block index, the tier-1 tree
// and replica load (wire::router_core) and the router's statistics
// (wire::router_stats); applies the agents' checked changes, decides where
// requests go, and reports. A thin shell: each handler calls plain code.
#pragma once

#include "actors/interfaces.hpp"
#include "wire/router_report.hpp"

#include <memory>

namespace llmgw {

struct router_state {
  std::unique_ptr<wire::router_core> core;
  wire::router_stats stats;
  static inline const char* name = "router";
};

router_actor::behavior_type router(router_actor::stateful_pointer<router_state> self,
                                   const wire::topology& topo);

/// Applies one checked change to the router's state (what the router's
/// replica_update handler does; exposed for tests and benchmarks).
void apply_update(router_state& st, const replica_update& u,
                  std::chrono::steady_clock::time_point now);

} // namespace llmgw
