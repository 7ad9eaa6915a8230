#include "routing/shared_router.hpp"

namespace llmgw::routing {

shared_router::shared_router(const config::topology& topo) : core_(topo) {}

void shared_router::apply_topology(const config::topology& topo) {
  std::lock_guard<std::mutex> g(mtx_);
  core_.apply_topology(topo);
}

route_decision shared_router::decide(const route_query& q) {
  std::lock_guard<std::mutex> g(mtx_);
  return decide_locked(q);
}

route_decision shared_router::decide_locked(const route_query& q) {
  auto start = std::chrono::steady_clock::now();
  auto d = core_.decide(q, start);
  d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return d;
}

route_decision shared_router::decide_and_record(const route_query& q) {
  std::lock_guard<std::mutex> g(mtx_);
  auto d = decide_locked(q);
  if (!q.dry_run)
    record_locked(q, d);
  return d;
}

void shared_router::record(const route_query& q, const route_decision& d) {
  if (q.dry_run)
    return;
  std::lock_guard<std::mutex> g(mtx_);
  record_locked(q, d);
}

void shared_router::record_locked(const route_query& q, const route_decision& d) {
  core_.remember(d, q.chunks, std::chrono::steady_clock::now());
  stats_.decision_seconds.observe(q.hash_seconds + d.seconds);
  if (q.tokenize_seconds >= 0)
    stats_.tokenize_seconds.observe(q.tokenize_seconds);
  if (q.tokenize_seconds >= 0 && !q.tokenized)
    ++stats_.tokenize_failures;
  if (d.tier == route_tier::kv)
    stats_.matched_share_kv.observe(d.score);
  else if (d.tier == route_tier::approx)
    stats_.matched_share_approx.observe(d.score);
}

void shared_router::first_token(const request_progress& p, double observed_ms) {
  std::lock_guard<std::mutex> g(mtx_);
  core_.first_token(p, observed_ms);
}

void shared_router::finished(const request_progress& p, bool started,
                             std::optional<std::uint64_t> reported_cached) {
  std::lock_guard<std::mutex> g(mtx_);
  core_.finished(p, started, reported_cached);
}

std::string shared_router::unready_reason() {
  std::lock_guard<std::mutex> g(mtx_);
  return core_.unready_reason(std::chrono::steady_clock::now());
}

bool shared_router::probe_result(const std::string& replica, bool ok) {
  std::lock_guard<std::mutex> g(mtx_);
  return core_.probe_result(replica, ok);
}

void shared_router::mark_down(const std::string& replica, std::chrono::milliseconds how_long,
                              bool unreachable, std::uint64_t incarnation) {
  std::lock_guard<std::mutex> g(mtx_);
  core_.mark_down(replica, std::chrono::steady_clock::now() + how_long, unreachable, incarnation);
}

void shared_router::append_metrics(wire::metrics_text& out) {
  std::lock_guard<std::mutex> g(mtx_);
  append_router_metrics(out, core_, stats_, std::chrono::steady_clock::now());
}

std::string shared_router::kv_replicas_json() {
  std::lock_guard<std::mutex> g(mtx_);
  return routing::kv_replicas_json(core_, stats_, std::chrono::steady_clock::now());
}

} // namespace llmgw::routing
