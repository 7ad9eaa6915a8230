// Routing one request, as the gateway and its proxy do it: take the prompt's
// token ids, or its tokens from the token cache, or ask the tokenizer actor;
// hash the blocks (vLLM's hashes, with the request's LoRA adapter and cache
// salt) and the tier-1 chunks on the calling thread; decide and record
// against the router's shared state in one hold of its lock.
#pragma once

#include "actors/control_plane.hpp"
#include "routing/router_core.hpp"
#include "wire/openai_request.hpp"

#include <caf/fwd.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace llmgw {

/// Routes one parsed request, leaving out the replicas in `exclude`; `done`
/// gets the decision: on the calling thread when no tokenizing is needed,
/// else from an actor's thread. A failed or timed-out tokenization is not
/// an error: tier 1 decides alone.
/// The request and `exclude` are copied only when the tokenizer is asked.
void route_request(caf::actor_system& sys, const control_plane& plane,
                   const std::shared_ptr<const config::topology>& topo,
                   const wire::routing_request& req, bool dry_run,
                   std::function<void(const routing::route_decision&)> done,
                   const std::vector<std::string>& exclude = {});

} // namespace llmgw
