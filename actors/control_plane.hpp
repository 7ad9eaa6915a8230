// A control node's actors, assembled: the router, the control actor (which
// agents connect to) and the tokenizer, with the state the router shares
// with the node's gateways (routing/shared_router, routing/token_cache).
// The control-node counterpart of actors/agent.hpp; `llmgw node`, the tests
// and the benchmark build a control node through it.
#pragma once

#include "actors/interfaces.hpp"

#include <caf/fwd.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

namespace llmgw {

struct control_options;

namespace routing {
class shared_router;
class token_cache;
} // namespace routing

namespace config {
class node_identity;
struct topology;
struct node_spec;
} // namespace config

/// The actors of a control node, and the state its gateways share with them.
struct control_plane {
  router_actor router;
  control_actor control;
  tokenizer_actor tokenizer;
  canary_actor canary;
  std::shared_ptr<routing::shared_router> shared_router; ///< the router actor's state
  std::shared_ptr<routing::token_cache> token_cache;     ///< the tokenizer's cache
};

/// Every address `host` resolves to, as CAF reports peers (IPv4 also in its
/// IPv4-mapped IPv6 form). Empty if it does not resolve.
std::set<std::string> addresses_of(const std::string& host);

/// The control actor's options for control node `name` of `topo`: its
/// identity (null in a plaintext cluster) and, when the topology checks
/// agent addresses, each agent node's resolved addresses (a host that does
/// not resolve is logged, and its sessions are refused until it does).
control_options control_options_of(std::shared_ptr<const config::topology> topo,
                                   const std::string& name,
                                   std::shared_ptr<const config::node_identity> identity);

/// The tokenizer's cache as the topology sizes it ([router]
/// tokenize_cache_entries and tokenize_cache_mib).
std::shared_ptr<routing::token_cache> token_cache_of(const config::topology& topo);

/// Spawns a control node's router, control, tokenizer and canary actors.
control_plane spawn_control_plane(caf::actor_system& sys, const control_options& opts);

/// Publishes the control actor on `node`'s CAF port (mutual TLS unless the
/// topology is plaintext); the port it listens on, or why it cannot.
caf::expected<std::uint16_t> publish_control(caf::actor_system& sys, const control_plane& plane,
                                             const config::topology& topo,
                                             const config::node_spec& node);

/// Each agent node's resolved addresses, when `topo` checks them (a host
/// that does not resolve is logged, and its sessions are refused until it
/// does); empty when it does not.
std::map<std::string, std::set<std::string>> agent_addresses_of(const config::topology& topo,
                                                                const std::string& name);

/// Puts a reloaded topology in force on control node `name`'s control
/// actor (which passes it on to the router, after the updates it checked
/// against the old one: config/topology_change.hpp) and tokenizer.
void reload_control_plane(caf::actor_system& sys, const control_plane& plane,
                          const std::shared_ptr<const config::topology>& fresh,
                          const std::string& name);

/// Tells those actors to stop (a default-constructed plane is nothing to stop).
void stop_control_plane(const control_plane& plane);

} // namespace llmgw
