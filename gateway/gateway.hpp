// The gateway: a control node's HTTP front (net/http_server). It decides
// on its own HTTP thread against the router's shared state
// (routing::shared_router) and looks prompts up in the tokenizer's shared cache
// (routing::token_cache): a request with token ids or a prompt seen before
// crosses no thread. It talks to the control and tokenizer actors without
// blocking any of them: a one-shot actor asks and hands the answer to the
// connection's responder.
//
// Endpoints:
//   GET  /healthz          the node is up (503 while draining)
//   GET  /readyz           this gateway can route well: some replica is up
//                          and its KV state known (503 and why not, else)
//   GET  /metrics          Prometheus text: router, control and HTTP counters
//   GET  /v1/models        models and LoRA adapters of the topology
//   GET  /v1/kv/replicas   what the index holds per replica
//   POST /v1/completions, /v1/chat/completions
//                          proxied to the chosen replica (gateway/proxy.hpp)
//   POST /v1/route         a completion or chat body: the decision and every
//                          replica's tier-1 and tier-2 score, nothing proxied
// It probes every replica's GET /health (gateway/health_probe.hpp).
// Errors the gateway makes itself are OpenAI-style JSON. With an admin
// address, a second listener with connections of its own serves /healthz,
// /metrics and /v1/kv/replicas (and the gateway's port no longer serves the
// last two): probes and scrapes get through however many connections
// clients hold on the gateway's port, and clients do not see the index.
//
// Routing a request: gateway/route.hpp.
#pragma once

#include "actors/control_plane.hpp"
#include "config/topology.hpp"
#include "config/topology_change.hpp"
#include "net/http_server.hpp"
#include "wire/openai_request.hpp"

#include <caf/fwd.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace llmgw {

class health_prober;
class http_client;
class io_loop;
struct proxy_stats;

namespace wire {
class metrics_text;
} // namespace wire

class gateway {
public:
  /// Listens on the control node's http address (port 0: any), and on its
  /// admin address when `admin_host` is not empty. On failure, error() says
  /// why and port() is 0.
  gateway(caf::actor_system& sys, const std::shared_ptr<const config::topology>& topo,
          const std::string& host, std::uint16_t port, control_plane plane,
          const std::string& admin_host = {}, std::uint16_t admin_port = 0);
  ~gateway();

  std::uint16_t port() const noexcept { return error_.empty() ? server_->port() : 0; }
  /// The admin listener's port (0 without one).
  std::uint16_t admin_port() const noexcept { return admin_ ? admin_->port() : 0; }
  const std::string& error() const noexcept { return error_; }

  /// Stops serving; requests in flight get no answer.
  void stop();

  /// Stops taking requests (new ones get 503; /healthz and /readyz say
  /// draining, so load balancers send elsewhere) and waits until those in
  /// flight are done, streams included: true. Or `timeout` passed: those
  /// still in flight are cut (cut_in_flight: a stream ends with an error
  /// event, not as if whole), then false. stop() afterwards.
  bool drain(std::chrono::milliseconds timeout);

  /// Puts a reloaded topology in force for requests that start from now
  /// on (those in flight keep theirs): /v1/models and the health probes
  /// follow it. The router and the control plane's actors are reloaded by
  /// reload_control_plane, first.
  void reload(std::shared_ptr<const config::topology> fresh);

  /// Adds what `f` writes to /metrics (an agent's counters on a node with
  /// both roles).
  void add_metrics(std::function<void(wire::metrics_text&)> f);

  /// Serves GET `path` with the JSON `f` returns, wherever /metrics is
  /// served (an agent's /v1/kv/mirrors on a node with both roles).
  void add_json(std::string path, std::function<std::string()> f);

private:
  void handle(http_request&& req, http_responder respond);
  /// The endpoints both listeners serve; false if `path` is none of them.
  bool handle_admin(const std::string& path, const http_request& req, http_responder& respond);
  /// /metrics: this node's own counters (local_metrics), then the control
  /// actor's, which come by message.
  void serve_metrics(const http_responder& respond);
  /// The router's, the proxy's, the HTTP listeners', the node port's, the
  /// token cache's and any added (add_metrics) counters, as Prometheus text.
  std::string local_metrics();
  /// The upstream client on the calling thread's loop.
  std::shared_ptr<http_client> upstream_here() const;
  std::string models_json() const;

  caf::actor_system& sys_;
  config::live_topology topo_;
  control_plane plane_;
  mutable std::mutex models_mtx_;
  std::string models_json_; ///< guarded by models_mtx_
  std::shared_ptr<proxy_stats> stats_;
  /// The upstream client of each loop (before server_: stopped after it).
  std::vector<std::pair<const io_loop*, std::shared_ptr<http_client>>> upstreams_;
  std::unique_ptr<http_server> server_;
  std::unique_ptr<http_server> admin_;
  std::unique_ptr<health_prober> prober_; ///< probes the replicas (gateway/health_probe.hpp)
  std::string error_;
  std::atomic<bool> draining_{false};
  std::mutex extra_mtx_;
  std::function<void(wire::metrics_text&)> extra_metrics_;
  std::map<std::string, std::function<std::string()>> extra_json_; ///< guarded by extra_mtx_
};

} // namespace llmgw
