// The router: one per control node. Its state (routing::shared_router: the
// block index, the tier-1 tree, replica load and the router's statistics) is
// shared with the node's gateway, which decides and reads the router's
// metrics and /v1/kv/replicas on its own HTTP thread. The actor applies the
// agents' checked changes and drops; it takes no route queries. A thin
// shell: each handler calls plain code.
#pragma once

#include "actors/interfaces.hpp"
#include "routing/shared_router.hpp"

#include <memory>

namespace llmgw {

struct router_state {
  std::shared_ptr<routing::shared_router> shared;
  static inline const char* name = "router";
};

/// A router over `shared` (the gateway of the same node holds it too).
router_actor::behavior_type router(router_actor::stateful_pointer<router_state> self,
                                   std::shared_ptr<routing::shared_router> shared);

/// Applies one checked change to the router's state (what the router's
/// replica_update handler does; exposed for tests and benchmarks).
void apply_update(routing::router_core& core, routing::router_stats& stats, const replica_update& u,
                  std::chrono::steady_clock::time_point now);

} // namespace llmgw
