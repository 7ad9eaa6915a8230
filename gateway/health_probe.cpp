#include "gateway/health_probe.hpp"

#include "base/log.hpp"
#include "net/http_client.hpp"
#include "routing/shared_router.hpp"
#include "wire/metrics_text.hpp"

#include <algorithm>
#include <vector>

namespace llmgw {

struct health_prober::state {
  std::shared_ptr<const config::topology> topo;
  /// Weak: a probe's pending callback holds this state, and the client's
  /// loop holds the callback; a strong reference back would be a cycle.
  std::weak_ptr<http_client> client;
  std::shared_ptr<routing::shared_router> router;
  std::function<void(const std::string&)> on_down; ///< a replica just went down
  std::mutex mtx;
  std::condition_variable wake;
  bool stopping = false;
  struct target {
    std::string replica;
    std::string url;
    bool in_flight = false;
    std::uint64_t ok = 0;
    std::uint64_t failed = 0;
    std::uint64_t& ok_count(bool answered_ok) { return answered_ok ? ok : failed; }
  };
  std::vector<target> targets; ///< guarded by mtx

  /// One probe's outcome, on the client's loop.
  void answered(const std::string& replica, const std::string& url, const http_response& r) {
    bool ok = r.status == 200;
    {
      std::lock_guard<std::mutex> g(mtx);
      auto t = std::find_if(targets.begin(), targets.end(),
                            [&](const target& x) { return x.replica == replica && x.url == url; });
      if (t == targets.end() || stopping)
        return; // a reload removed or moved it meanwhile
      t->in_flight = false;
      ++(t->ok_count(ok));
    }
    if (!router->probe_result(replica, ok))
      return;
    if (ok) {
      LLMGW_LOG(info, "gateway", "replica {} answers its health probe again: routed to", replica);
      return;
    }
    LLMGW_LOG(warning, "gateway",
              "replica {} failed its health probes ({}): avoided until one succeeds; the "
              "requests waiting on it go elsewhere",
              replica,
              log::printable(r.status != 0 ? "status " + std::to_string(r.status) : r.error));
    if (on_down)
      on_down(replica);
  }
};

health_prober::health_prober(std::shared_ptr<const config::topology> topo,
                             const std::shared_ptr<http_client>& client,
                             std::shared_ptr<routing::shared_router> router,
                             std::function<void(const std::string&)> on_down)
  : state_(std::make_shared<state>()) {
  state_->on_down = std::move(on_down);
  state_->topo = std::move(topo);
  state_->client = client;
  state_->router = std::move(router);
  set_targets(*state_->topo);
  if (state_->topo->gateway.health_interval.count() > 0)
    thread_ = std::thread([this] { run(); });
}

void health_prober::set_targets(const config::topology& topo) {
  std::vector<state::target> fresh;
  std::lock_guard<std::mutex> g(state_->mtx);
  for (const auto& n : topo.nodes)
    for (const auto& e : n.engines) {
      state::target t{e.replica, e.url};
      for (const auto& old : state_->targets)
        if (old.replica == t.replica && old.url == t.url)
          t = old; // its counts, and a probe in flight
      fresh.push_back(std::move(t));
    }
  state_->targets = std::move(fresh);
}

health_prober::~health_prober() {
  stop();
}

void health_prober::stop() {
  {
    std::lock_guard<std::mutex> g(state_->mtx);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (thread_.joinable())
    thread_.join();
}

void health_prober::run() {
  auto st = state_;
  const auto& gw = st->topo->gateway;
  std::unique_lock<std::mutex> g(st->mtx);
  while (!st->stopping) {
    for (std::size_t i = 0; i < st->targets.size(); ++i) {
      auto& t = st->targets[i];
      if (t.in_flight)
        continue; // the last one has not ended yet (its timeout is near)
      auto client = st->client.lock();
      if (!client)
        return; // the gateway is gone
      t.in_flight = true;
      auto url = t.url;
      auto replica = t.replica;
      g.unlock();
      // The answer holds the state, not the prober: it may come after stop().
      client->request(
        "GET", url, "/health", {}, gw.health_timeout,
        [st, replica, url](const http_response& r) { st->answered(replica, url, r); });
      client.reset();
      g.lock();
      if (st->stopping)
        return;
    }
    st->wake.wait_for(g, gw.health_interval, [&] { return st->stopping; });
  }
}

void health_prober::append_metrics(wire::metrics_text& m) const {
  if (state_->topo->gateway.health_interval.count() == 0)
    return;
  std::lock_guard<std::mutex> g(state_->mtx);
  for (const auto& t : state_->targets) {
    m.counter("llmgw_health_probes_total",
              "Health probes (GET /health) of each replica, by outcome.", static_cast<double>(t.ok),
              {{"replica", t.replica}, {"outcome", "ok"}});
    m.counter("llmgw_health_probes_total",
              "Health probes (GET /health) of each replica, by outcome.",
              static_cast<double>(t.failed), {{"replica", t.replica}, {"outcome", "failed"}});
  }
}

} // namespace llmgw
