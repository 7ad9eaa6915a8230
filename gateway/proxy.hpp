// The gateway's proxy: one OpenAI request (/v1/completions or
// /v1/chat/completions) to the replica the router chooses.
//
// - The request body goes upstream byte for byte, with the client's headers
//   (hop-by-hop ones dropped, with those the Connection header names, and
//   Expect, which the gateway's server answers itself); for a prefix held by one data-parallel
//   rank, X-data-parallel-rank names it (vLLM honours it).
// - The answer comes back with its status and headers, plus x-llmgw-replica
//   and x-llmgw-tier. An event stream (or any chunked body) is relayed piece
//   by piece as it arrives; a body of known length is relayed whole.
// - A replica that refuses the connection or fails before any byte came back
//   is marked down for a while and the next best is tried, up to
//   max_attempts in all; the failure is counted. Once bytes were relayed, a
//   failure ends the response where it is (nothing can be taken back).
// - A client that leaves cancels the upstream request.
// - Every routed request is reported finished to the router (its load).
#pragma once

#include "actors/control_plane.hpp"
#include "base/burst_log.hpp"
#include "net/http_client.hpp"
#include "net/http_server.hpp"
#include "wire/metrics_text.hpp"
#include "wire/openai_request.hpp"

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>

namespace llmgw {

/// What the proxy counts (read by /metrics).
struct proxy_stats {
  proxy_stats();
  mutable std::mutex mtx;
  std::map<std::pair<std::string, int>, std::uint64_t> responses;        ///< (endpoint, status)
  std::map<std::pair<std::string, std::string>, std::uint64_t> failures; ///< (replica, reason)
  std::uint64_t retries = 0;
  std::uint64_t client_disconnects = 0;
  std::uint64_t cut_at_stop = 0;      ///< requests ended by cut_in_flight
  bool stopping = false;              ///< cut_in_flight was called: nothing more is sent
  wire::histogram first_byte_seconds; ///< request in -> first upstream byte out
  wire::histogram total_seconds;      ///< request in -> response done
  /// The index's accuracy on live traffic, per replica, from tier-kv answers
  /// that report their cached prompt tokens: what the index predicted, what
  /// the engine found, and how often it found less.
  struct cache_accuracy {
    std::uint64_t answers = 0;
    std::uint64_t predicted = 0;
    std::uint64_t reported = 0;
    std::uint64_t shortfalls = 0;
  };
  std::map<std::string, cache_accuracy> accuracy;
  burst_log failure_log; ///< replica failures are logged once per burst
  /// Proxied requests not done yet (from the parsed request to the end of
  /// its last attempt); `idle` is notified when none are left.
  std::size_t in_flight = 0;
  std::condition_variable idle;
  /// Attempts waiting on a replica, by id: the replica, and how to abandon
  /// the attempt (abandon_attempts).
  std::map<std::uint64_t, std::pair<std::string, std::function<void()>>> attempts;
  std::uint64_t next_attempt = 1;
  /// Per replica, its newest entry (incarnation) that answered server errors
  /// (5xx) since its last other answer, and how many: at
  /// server_errors_to_mark_down it is marked down. Incarnations only grow.
  std::map<std::string, std::pair<std::uint64_t, std::uint32_t>> server_errors_in_row;

  void append(wire::metrics_text& m) const;
};

/// Everything a proxied request needs, shared by the gateway's requests. A
/// request may outlive the gateway (an answer arriving during shutdown): the
/// stats are shared, the upstream client is held weakly and locked only on
/// an actor's thread (never on the client's own, which it would then join).
struct proxy_context {
  caf::actor_system& sys;
  control_plane plane;
  std::shared_ptr<const config::topology> topo;
  std::weak_ptr<http_client> upstream;
  std::shared_ptr<proxy_stats> stats;
};

/// Abandons every attempt waiting on `replica` (its health probes failed):
/// those that relayed nothing go to another replica, streams under way end
/// as failed (llmgw_upstream_failures_total{reason="replica_down"}).
void abandon_attempts(proxy_stats& stats, const std::string& replica);

/// The gateway stops with requests in flight (its drain deadline passed):
/// every attempt is ended, streams under way with an error event and no
/// last chunk, the others with a 503; requests not yet sent are not sent.
void cut_in_flight(proxy_stats& stats);

/// Proxies one request to /v1/completions or /v1/chat/completions (`path`).
void proxy_request(const proxy_context& ctx, http_request&& req, http_responder respond,
                   const std::string& path, wire::request_kind kind);

} // namespace llmgw
