// The canary sender of a control node: every 100 ms it lets the shared
// router check the canaries sent and hand out the ones due
// (router_core::canary_tick), POSTs each to its engine's /v1/completions,
// and reports the answer (router_core::canary_answered). The decisions are
// the router's; this actor only carries the HTTP. routing/canary.hpp says
// what a canary is.
#pragma once

#include "actors/interfaces.hpp"
#include "net/http_client.hpp"

#include <chrono>
#include <memory>

namespace llmgw {

namespace routing {
class shared_router;
} // namespace routing

struct canary_state {
  std::shared_ptr<routing::shared_router> shared;
  std::chrono::milliseconds timeout{30000}; ///< an answer, at most ([router] canary_timeout_ms)
  std::unique_ptr<http_client> http;
  static inline const char* name = "canary";
};

/// How often the canary actor looks.
inline constexpr std::chrono::milliseconds canary_interval{100};

canary_actor::behavior_type canary(canary_actor::stateful_pointer<canary_state> self,
                                   std::shared_ptr<routing::shared_router> shared,
                                   std::chrono::milliseconds timeout);

} // namespace llmgw
