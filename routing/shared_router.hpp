// The router's state where two threads reach it: the router actor applies
// the agents' changes, and the gateway of the same node decides and reports
// on its HTTP thread. Before this, every request crossed to the
// router actor's thread and back (and again to report it finished); those
// hand-offs were most of what the gateway added to a request's latency
// (BENCHMARKS.md). Every access holds one mutex, for microseconds.
#pragma once

#include "routing/router_core.hpp"
#include "routing/router_report.hpp"

#include <chrono>
#include <mutex>
#include <string>

namespace llmgw::routing {

class shared_router {
public:
  explicit shared_router(const config::topology& topo);

  /// The decision for `q` (the chosen replica counts one more request
  /// outstanding). Call record() afterwards, once the request is on its way.
  route_decision decide(const route_query& q);

  /// Unless `q` was a dry run: remembers the prompt's chunks on the chosen
  /// replica (tier 1) and counts the decision, its time and score.
  void record(const route_query& q, const route_decision& d);

  /// decide() and record() under one hold of the lock: with several
  /// gateway threads, each taking of a contended lock can cost a sleep.
  route_decision decide_and_record(const route_query& q);

  /// A request's first token came back after `observed_ms` (router_core).
  void first_token(const request_progress& p, double observed_ms);

  /// A request finished (answered or failed); `started` if first_token()
  /// was called for it; `reported_cached` as its engine said (router_core).
  void finished(const request_progress& p, bool started,
                std::optional<std::uint64_t> reported_cached = std::nullopt);

  /// Empty when the router can route well, else why not (router_core).
  std::string unready_reason();

  /// A health probe of `replica` succeeded or failed (router_core).
  bool probe_result(const std::string& replica, bool ok);

  /// Avoid `replica` (that entry of it, with an incarnation) for
  /// `how_long`: it refused or failed a request.
  void mark_down(const std::string& replica, std::chrono::milliseconds how_long,
                 bool unreachable = true, std::uint64_t incarnation = 0);

  /// Puts a reloaded topology's replicas in force (router_core).
  void apply_topology(const config::topology& topo);

  /// Appends the router's metrics (append_router_metrics), holding the lock.
  void append_metrics(wire::metrics_text& out);

  /// /v1/kv/replicas (kv_replicas_json), holding the lock.
  std::string kv_replicas_json();

  /// Runs `f(core, stats)` holding the lock; for updates.
  template <class F>
  decltype(auto) with(F&& f) {
    std::lock_guard<std::mutex> g(mtx_);
    return f(core_, stats_);
  }

private:
  route_decision decide_locked(const route_query& q);
  void record_locked(const route_query& q, const route_decision& d);

  std::mutex mtx_;
  router_core core_;
  router_stats stats_;
};

} // namespace llmgw::routing
