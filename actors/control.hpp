// The control actor: the control node's side of agent sessions. It accepts a
// session from each agent node of the topology, checks every update, and
// passes on to the router only what the sending node owns.
//
// - A session is accepted when the agent names a node of the topology with
//   the agent role, proves it holds that node's certificate and key (the
//   handshake of config/node_identity.hpp: CAF's TLS accepts any certificate
//   of the cluster's CA and does not say which), and, unless disabled,
//   connects from an address of that node's host. Updates that arrive while
//   the address is being looked up wait, up to pending_limit; one more ends
//   the attempt unacked (an ack would say it was applied), and the agent's
//   next session sends full copies. A refused session is told why, so the
//   agent's log says so.
// - Until then nothing changes: a hello or proof that fails, or a session
//   attempt that never finishes (forgotten after handshake_timeout), leaves
//   the node's current session as it was. Attempts in progress are bounded.
// - A new session of a node replaces the old one once accepted: the node's
//   replicas are dropped first (the session's full copies follow), and the
//   old forwarder is told, so a forwarder that is still alive starts over.
// - An update is refused, counted and logged once per burst of (node, reason) unless
//   it comes from the node's current forwarder within its current session,
//   carries that session's MAC, and is for a replica that node owns, with
//   kv_events on and a rank below dp_size. Updates refused for what they
//   claim are acknowledged too: the agent's window must not stall. An update for a
//   session this node does not know is answered with a refusal, so the
//   forwarder that sent it starts a new session.
// - When an agent's forwarder goes down (its node died or was cut off), that
//   node's replicas are dropped at once: tier 1 routes them until a new
//   session sends full copies.
// - A load report (the agent's engines' own gauges) is checked like an
//   update, and refused whole if it names a replica the node does not own
//   or a value out of range; while the session is being checked, reports
//   are dropped (the next one comes within a second), and acknowledged
//   with the pending updates once the session is accepted.
// - A reload (topology_reload, from this node only) ends the sessions of
//   nodes that are no longer agents and asks a session again for the full
//   copy of each replica of its node that was added or changed.
#pragma once

#include "actors/interfaces.hpp"
#include "base/burst_log.hpp"
#include "config/node_identity.hpp"
#include "config/topology.hpp"

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace llmgw {

struct control_options {
  std::string node; ///< this control node's name (logs, and in every handshake)
  std::shared_ptr<const config::topology> topo;
  /// This node's certificate and key; null in a plaintext cluster (the
  /// handshake still derives a session key, but nobody proves a name).
  std::shared_ptr<const config::node_identity> identity;
  /// Agent node -> the addresses its connections may come from (its host,
  /// resolved). Empty: the peer address is not checked.
  std::map<std::string, std::set<std::string>> agent_addresses;
  std::size_t pending_limit = 1024; ///< updates held while a session is checked
  std::chrono::milliseconds handshake_timeout{10000};
  std::size_t max_attempts = 64;         ///< session attempts in progress at once
  std::size_t max_attempts_per_peer = 4; ///< ... from one peer node
};

struct control_state {
  /// An accepted session.
  struct session {
    std::uint64_t id = 0;
    forwarder_actor forwarder;
    std::string key;            ///< the session key its updates' MACs use
    std::uint64_t last_seq = 0; ///< updates must come with a higher one
  };
  /// A session that has said hello but is not accepted yet.
  struct attempt {
    std::string node;
    forwarder_actor forwarder;
    config::session_transcript transcript;
    std::optional<config::key_share> share;
    std::string key; ///< set once the agent's proof checked out
    std::uint64_t last_seq = 0;
    std::vector<replica_update> pending; ///< arrived while the address was checked
  };
  control_options opts;
  router_actor router;
  std::map<std::string, session> sessions;                              ///< by agent node
  std::map<std::uint64_t, attempt> attempts;                            ///< by session id
  std::map<std::pair<std::string, std::string>, std::uint64_t> refused; ///< (node, reason)
  std::map<std::string, std::uint64_t> sessions_refused;                ///< by reason
  std::uint64_t sessions_started = 0;
  std::uint64_t updates_passed = 0;
  std::uint64_t load_reports_passed = 0;
  burst_log refusal_log; ///< refusals are logged once per burst
  static inline const char* name = "control";

  /// True if a session or attempt refers to `f` (so it stays monitored).
  bool watched(const forwarder_actor& f) const;
};

control_actor::behavior_type control(control_actor::stateful_pointer<control_state> self,
                                     control_options opts, router_actor router);

} // namespace llmgw
