// What the router tells operators, as pure code: the JSON of /v1/kv/replicas
// and /v1/route, and the router's Prometheus metrics. routing::shared_router
// keeps a router_stats beside its router_core and calls these.
#pragma once

#include "kv/block_table.hpp"
#include "routing/router_core.hpp"
#include "wire/metrics_text.hpp"

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace llmgw::routing {

/// Why the router dropped a replica's KV state (besides the agent's own
/// resets, which arrive in mirror_totals).
enum class drop_reason : std::uint8_t { session, node_down };
const char* to_string(drop_reason r) noexcept;

/// What the router counts besides router_core's decisions.
struct router_stats {
  router_stats();

  std::vector<kv::mirror_totals> totals; ///< the agents' latest totals, by holder id
  std::map<std::pair<std::string, drop_reason>, std::uint64_t> drops; ///< (replica, why)
  std::map<std::string, std::uint64_t> mismatches; ///< times a replica turned "hash mismatch"
  std::uint64_t stale_updates = 0;                 ///< changes from an older epoch, ignored
  std::uint64_t unexpected_updates = 0;            ///< changes before a full copy, ignored
  std::uint64_t removed_updates = 0; ///< changes for a replica removed by a reload, ignored
  std::uint64_t tokenize_failures = 0;
  wire::histogram tokenize_seconds;
  wire::histogram decision_seconds; ///< hashing the prompt plus deciding
  wire::histogram matched_share_kv;
  wire::histogram matched_share_approx;
};

/// /v1/kv/replicas: every configured replica with, per data-parallel rank the
/// index has seen, blocks, epoch, trusted, parity, seconds since the last
/// update, updates, resets and the fingerprint (hex).
std::string kv_replicas_json(const router_core& core, const router_stats& stats,
                             std::chrono::steady_clock::time_point now);

/// /v1/route: the decision with every candidate's scores.
std::string decision_json(const route_decision& d);

/// Appends the router's metrics.
void append_router_metrics(wire::metrics_text& out, const router_core& core,
                           const router_stats& stats, std::chrono::steady_clock::time_point now);

} // namespace llmgw::routing
