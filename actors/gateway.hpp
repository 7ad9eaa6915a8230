// The gateway: a control node's HTTP front (actors/http_server), talking to
// the router, control and tokenizer actors without blocking any of them: for
// each request that needs an actor, a one-shot actor asks and hands the
// answer to the connection's responder.
//
// Endpoints:
//   GET  /healthz          the node is up
//   GET  /metrics          Prometheus text: router, control and HTTP counters
//   GET  /v1/models        models and LoRA adapters of the topology
//   GET  /v1/kv/replicas   what the index holds per replica
//   POST /v1/completions, /v1/chat/completions
//                          proxied to the chosen replica (actors/proxy.hpp)
//   POST /v1/route         a completion or chat body: the decision and every
//                          replica's tier-1 and tier-2 score, nothing proxied
// Errors the gateway makes itself are OpenAI-style JSON.
//
// Routing a request (route_flow): tokenize through the tokenizer (or take the
// prompt's token ids), hash the blocks here, on the one-shot actor's thread,
// so the router only walks its index; compute tier-1 chunk hashes; ask the
// router.
#pragma once

#include "actors/http_server.hpp"
#include "actors/interfaces.hpp"
#include "wire/openai_request.hpp"
#include "wire/topology.hpp"

#include <caf/fwd.hpp>

#include <functional>
#include <memory>
#include <string>

namespace llmgw {

class http_client;
struct proxy_stats;

/// The actors a gateway talks to.
struct gateway_peers {
  router_actor router;
  control_actor control;
  tokenizer_actor tokenizer;
};

/// Routes one parsed request, leaving out the replicas in `exclude`; `done`
/// gets the decision (from an actor's thread).
void route_flow(caf::actor_system& sys, const gateway_peers& peers,
                const std::shared_ptr<const wire::topology>& topo, wire::routing_request req,
                bool dry_run, std::function<void(wire::route_decision)> done,
                std::vector<std::string> exclude = {});

class gateway {
public:
  /// Listens on the control node's http address (port 0: any). On failure,
  /// error() says why and port() is 0.
  gateway(caf::actor_system& sys, std::shared_ptr<const wire::topology> topo,
          const std::string& host, std::uint16_t port, gateway_peers peers);
  ~gateway();

  std::uint16_t port() const noexcept { return server_->port(); }
  const std::string& error() const noexcept { return server_->error(); }

  /// Stops serving; requests in flight get no answer.
  void stop() { server_->stop(); }

private:
  void handle(http_request&& req, http_responder respond);

  caf::actor_system& sys_;
  std::shared_ptr<const wire::topology> topo_;
  gateway_peers peers_;
  std::string models_json_;
  std::shared_ptr<proxy_stats> stats_;
  std::shared_ptr<http_client> upstream_; ///< before server_: stopped after it
  std::unique_ptr<http_server> server_;
};

} // namespace llmgw
