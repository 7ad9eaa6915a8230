// Active health checks: the gateway asks every replica's GET /health (vLLM
// answers 200 while its engine runs) every `health_interval_ms`, so a frozen
// or dead engine is avoided before clients find it, and a replica that
// answers again is routed to at once, not after `mark_down_ms`.
//
// Rules:
// - One probe per replica at a time; each gets `health_timeout_ms` (not more
//   than the interval). A 200 is a success; anything else (no connection, a
//   timeout, another status) a failure.
// - Two failures in a row mark the replica down until a probe succeeds; a
//   success ends that mark and any mark from failed requests
//   (routing::router_core::probe_result), and the requests waiting on it are
//   abandoned (`on_down`: the gateway sends them elsewhere) rather than left
//   to wait for request_timeout_ms.
// - Each outcome is counted (llmgw_health_probes_total); a replica going
//   down or coming back is logged.
#pragma once

#include "config/topology.hpp"

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace llmgw {

class http_client;

namespace routing {
class shared_router;
} // namespace routing

namespace wire {
class metrics_text;
} // namespace wire

/// Probes every replica of a topology from its own thread (see the top).
class health_prober {
public:
  /// Starts probing every replica of `topo` through `client` (its answers
  /// arrive on the client's loop), reporting to `router`. Probes nothing
  /// when the topology's health_interval is 0.
  health_prober(std::shared_ptr<const config::topology> topo,
                const std::shared_ptr<http_client>& client,
                std::shared_ptr<routing::shared_router> router,
                std::function<void(const std::string&)> on_down);
  ~health_prober();
  health_prober(const health_prober&) = delete;
  health_prober& operator=(const health_prober&) = delete;

  /// Stops probing (answers still on their way are ignored).
  void stop();

  /// Probes the replicas of `topo` from now on (a reload): one still there
  /// at the same url keeps its counts.
  void set_targets(const config::topology& topo);

  /// Appends llmgw_health_probes_total.
  void append_metrics(wire::metrics_text& m) const;

private:
  struct state;
  void run();

  std::shared_ptr<state> state_;
  std::thread thread_;
};

} // namespace llmgw
