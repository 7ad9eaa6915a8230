// The control actor: the control node's side of agent sessions. It accepts a
// session from each agent node of the topology, checks every update, and
// passes on to the router only what the sending node owns.
//
// - A session is accepted when the agent names a node of the topology with
//   the agent role and, unless disabled, connects from an address of that
//   node's host (CAF's TLS accepts any certificate of the cluster's CA, so
//   the claimed name is checked against where the connection comes from).
//   Updates that arrive while the address is being looked up wait, bounded.
//   A refused session is told why, so the agent's log says so.
// - A new session of a node replaces the old one and drops that node's
//   replicas first (the session's full copies follow).
// - An update is refused, counted and logged once per (node, reason) unless
//   it comes from the node's current forwarder within its current session,
//   for a replica that node owns, with kv_events on and a rank below dp_size.
//   Refused updates are acknowledged too: the agent's window must not stall.
// - When an agent's forwarder goes down (its node died or was cut off), that
//   node's replicas are dropped at once: tier 1 routes them until a new
//   session sends full copies.
#pragma once

#include "actors/interfaces.hpp"
#include "wire/topology.hpp"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace llmgw {

struct control_options {
  std::string node; ///< this control node's name (logs)
  std::shared_ptr<const wire::topology> topo;
  /// Agent node -> the addresses its connections may come from (its host,
  /// resolved). Empty: the peer address is not checked.
  std::map<std::string, std::set<std::string>> agent_addresses;
  std::size_t pending_limit = 1024; ///< updates held while a session is checked
};

struct control_state {
  struct session {
    std::uint64_t id = 0;
    forwarder_actor forwarder;
    bool accepted = false;
    std::vector<replica_update> pending; ///< arrived while the address was checked
  };
  control_options opts;
  router_actor router;
  std::map<std::string, session> sessions;                              ///< by agent node
  std::map<std::pair<std::string, std::string>, std::uint64_t> refused; ///< (node, reason)
  std::map<std::string, std::uint64_t> sessions_refused;                ///< by reason
  std::uint64_t sessions_started = 0;
  std::uint64_t updates_passed = 0;
  std::set<std::string> logged; ///< "node/reason/replica" already logged once
  static inline const char* name = "control";
};

control_actor::behavior_type control(control_actor::stateful_pointer<control_state> self,
                                     control_options opts, router_actor router);

} // namespace llmgw
