// Every typed actor interface of llmgw, one comment line per handler.
#pragma once

#include "messages/kv_messages.hpp"
#include "messages/local_messages.hpp"
#include "routing/router_report.hpp"

#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstdint>
#include <string>

namespace llmgw {

using apply_atom = caf::atom_constant<caf::atom("apply")>;
using reset_atom = caf::atom_constant<caf::atom("reset")>;
using subscribe_atom = caf::atom_constant<caf::atom("subscribe")>;
using drain_atom = caf::atom_constant<caf::atom("drain")>;
using unsub_atom = caf::atom_constant<caf::atom("unsub")>;
using connected_atom = caf::atom_constant<caf::atom("connected")>;
using connect_atom = caf::atom_constant<caf::atom("connect")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;
using poll_atom = caf::atom_constant<caf::atom("poll")>;
using start_atom = caf::atom_constant<caf::atom("start")>;
using status_atom = caf::atom_constant<caf::atom("status")>;
using refused_atom = caf::atom_constant<caf::atom("refused")>;
using drop_atom = caf::atom_constant<caf::atom("drop")>;
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
using tokenize_atom = caf::atom_constant<caf::atom("tokenize")>;
using tokenized_atom = caf::atom_constant<caf::atom("tokenized")>;
using timeout_atom = caf::atom_constant<caf::atom("timeout")>;
using resync_atom = caf::atom_constant<caf::atom("resync")>;
using attach_atom = caf::atom_constant<caf::atom("attach")>;
using detach_atom = caf::atom_constant<caf::atom("detach")>;
using canary_atom = caf::atom_constant<caf::atom("canary")>;

/// The only owner of one engine's block table.
using mirror_actor = caf::typed_actor<
  // Apply the batches the engine's subscriber read in one poll, in order.
  caf::reacts_to<apply_atom, batch_list>,
  // Reset: the stream had a gap or restart, or the engine exited.
  caf::reacts_to<reset_atom, kv::reset_reason>,
  // Subscribe peer N: answers with the full state (reset = true).
  caf::replies_to<subscribe_atom, std::uint64_t>::with<replica_update>,
  // What peer N has not seen yet (empty when nothing changed).
  caf::replies_to<drain_atom, std::uint64_t>::with<replica_update>,
  // Stop tracking peer N.
  caf::reacts_to<unsub_atom, std::uint64_t>>;

/// One per control node on an agent node: sends its node's mirrors' changes.
using forwarder_actor = caf::typed_actor<
  // The outcome of a connection attempt: the control node's actor (a
  // control_actor) to start a session with, or null when the attempt failed.
  caf::reacts_to<connected_atom, caf::strong_actor_ptr>,
  // Time to ask for a connection (again): the backoff timer fired.
  caf::reacts_to<connect_atom>,
  // The flush timer: drain every mirror and send what changed.
  caf::reacts_to<flush_atom>,
  // The control node's half of the handshake: its key share and proof.
  caf::reacts_to<control_proof>,
  // Timer: a session whose handshake has not finished by now is given up.
  caf::reacts_to<timeout_atom, std::uint64_t>,
  // The control node applied updates up to a seq.
  caf::reacts_to<session_ack>,
  // The control node refused the session (why, for the log); retry later.
  caf::reacts_to<refused_atom, std::uint64_t, std::string>,
  // The control node asks again for a replica's full copy in this session
  // (its topology gained the replica by a reload).
  caf::reacts_to<resync_atom, std::uint64_t, std::string>,
  // This node's reload: forward a new mirror (a mirror_actor) for a replica
  // from now on, starting with its full copy.
  caf::reacts_to<attach_atom, std::string, caf::actor>,
  // This node's reload: stop forwarding a replica's mirror.
  caf::reacts_to<detach_atom, std::string>>;

/// Starts one engine and restarts it with backoff when it exits.
using engine_supervisor_actor = caf::typed_actor<
  // (Re)start the engine process now.
  caf::reacts_to<start_atom>,
  // Timer: check whether the engine process is still running.
  caf::reacts_to<poll_atom>,
  // The engine's pid (0 while not running) and how often it was started.
  caf::replies_to<status_atom>::with<std::int64_t, std::uint64_t>,
  // Retire (the engine left the topology): never start it again, stop it
  // after this many milliseconds, and end once it is gone.
  caf::reacts_to<drain_atom, std::int64_t>>;

/// Reads an agent's engines' /metrics into its engine_loads table.
using load_scraper_actor = caf::typed_actor<
  // Timer: read every engine's gauges (one call per engine at a time).
  caf::reacts_to<poll_atom>>;

/// The control node's side of agent sessions.
using control_actor = caf::typed_actor<
  // A session starts: who the agent says it is, and where to answer.
  caf::reacts_to<agent_hello, forwarder_actor>,
  // The agent proves its name; the session is accepted once checked.
  caf::reacts_to<agent_proof>,
  // Timer: a session attempt not accepted by now is forgotten.
  caf::reacts_to<timeout_atom, std::uint64_t>,
  // The net change of one replica, within a session.
  caf::reacts_to<replica_update>,
  // The loads of the node's engines, within a session.
  caf::reacts_to<load_report>,
  // This node's reload: the topology in force from now on.
  caf::reacts_to<topology_reload>,
  // Prometheus text of the control actor's counters.
  caf::replies_to<metrics_atom>::with<std::string>>;

/// A control node's router: the block index, tier 1 and the decision.
using router_actor = caf::typed_actor<
  // An agent's net change for one replica rank, checked by the control actor.
  caf::reacts_to<replica_update>,
  // An agent's engines' loads, checked by the control actor.
  caf::reacts_to<load_report>,
  // Forget a replica's KV state and its engine's load.
  // Decisions are not asked of the router: the node's gateways decide on
  // their own threads against the shared routing::shared_router, and read
  // its metrics and /v1/kv/replicas from it.
  caf::reacts_to<drop_atom, std::string, routing::drop_reason>,
  // A reload, passed on by the control actor (so the updates it checked
  // against the old topology are applied before): the replicas in force.
  caf::reacts_to<topology_reload>>;

/// Tokenizes prompts through the engines' /tokenize, with a cache.
using tokenizer_actor = caf::typed_actor<
  // Tokens for a /tokenize body (wire::openai_request) of a model.
  caf::replies_to<tokenize_atom, tokenize_request>::with<tokenize_reply>,
  // Internal: the HTTP client's answer for request N.
  caf::reacts_to<tokenized_atom, std::uint64_t, tokenize_reply>,
  // This node's reload: the replicas to tokenize with from now on.
  caf::reacts_to<topology_reload>>;

/// Sends each replica's canary (routing/canary.hpp) and reports its answer.
using canary_actor = caf::typed_actor<
  // Timer: check the canaries sent, send the ones due.
  caf::reacts_to<poll_atom>,
  // Internal: the engine's answer to canary N of a replica (HTTP status, 0
  // for none, and why not).
  caf::reacts_to<canary_atom, std::string, std::uint64_t, int, std::string>>;

} // namespace llmgw
