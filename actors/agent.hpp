// An agent node's actors, assembled: for every engine a mirror and (with
// kv_events) a subscriber per data-parallel rank, an engine supervisor when
// llmgw launches the engine, and one forwarder per control node. Engines
// without a launch command are attached: already running, configured by the
// operator to publish to the port given here. If a subscriber cannot bind,
// the engine runs without events and is routed by tier 1 (logged, not fatal).
// A load scraper reads every engine's /metrics each flush interval; the
// forwarders send those loads with the KV changes (actors/load_scraper.hpp).
#pragma once

#include "actors/forwarder.hpp"
#include "actors/mirror.hpp"
#include "actors/subscriber.hpp"
#include "config/topology.hpp"
#include "wire/metrics_text.hpp"

#include <caf/fwd.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llmgw {

struct engine_counters; // actors/engine_supervisor.hpp

/// An engine of the node, as the topology describes it (launch empty: an
/// attached engine, started by the operator).
using agent_engine_config = config::engine_spec;

struct agent_control_config {
  std::string name;
  std::string host;
  std::uint16_t port = 0;
  std::vector<std::string> fingerprints; ///< the certificates it may present (empty: any)
};

struct agent_config {
  std::string node;
  std::string seed;
  std::size_t block_size = 16;
  std::vector<agent_engine_config> engines;
  std::vector<agent_control_config> controls;
  std::chrono::milliseconds flush_interval = config::default_flush_interval;
  std::uint64_t window = kv::default_window;
  std::chrono::milliseconds connect_timeout{5000};
  /// This node's certificate and key (null in a plaintext cluster): each
  /// forwarder proves the node's name with it.
  std::shared_ptr<const config::node_identity> identity;
};

/// One subscriber's counters, by replica and rank.
struct agent_subscriber {
  std::string replica;
  std::uint32_t rank = 0;
  std::shared_ptr<subscriber_stats> stats;
};

/// What one mirror holds, by replica and rank (every engine's, with events
/// or not: one without holds nothing).
struct agent_mirror {
  std::string replica;
  std::uint32_t rank = 0;
  std::shared_ptr<mirror_view> view;
};

/// What start_agent made for one engine.
struct agent_engine {
  agent_engine_config spec;
  std::vector<caf::actor> actors;            ///< its mirrors and subscribers
  caf::actor supervisor;                     ///< a launched engine's (else invalid)
  std::shared_ptr<engine_counters> counters; ///< its supervisor's (else null)
  std::vector<mirror_entry> mirrors;         ///< forwarded: ranks, when it has KV events
  std::string events_endpoint;               ///< rank 0's, or "" (no events)
  std::vector<agent_subscriber> subscribers; ///< per rank, when it has KV events
  std::vector<agent_mirror> mirror_views;    ///< per rank
};

/// One forwarder, to one control node.
struct agent_forwarder {
  agent_control_config control;
  caf::actor actor;
  std::shared_ptr<forwarder_counters> counters;
};

/// What start_agent made, and what happened per engine.
struct agent_handles {
  agent_config config; ///< in force (reload_agent replaces it)
  std::vector<agent_engine> engines;
  std::vector<agent_forwarder> forwarder_actors;
  caf::actor scraper; ///< invalid when no engine has a url
  /// Supervisors of launched engines a reload removed. Each stops its engine
  /// once the gateways' requests in flight there could finish (or when
  /// stop_agent stops it, if sooner), and ends by `gone_by`; a later reload
  /// forgets it then. A reload that adds the replica back stops it first.
  struct retiring_engine {
    std::string replica;
    caf::actor supervisor;
    std::chrono::steady_clock::time_point gone_by;
  };
  std::vector<retiring_engine> retiring;
  std::size_t next_engine_id = 0; ///< names the next engine's sockets
  // The same, flat, as the node's metrics and tests read them:
  std::vector<caf::actor> actors;            ///< everything spawned, stopped by stop_agent
  std::vector<mirror_entry> mirrors;         ///< forwarded: engines (ranks) with KV events
  std::vector<std::string> events_endpoints; ///< per engine: rank 0's endpoint, or "" (no events)
  /// The private folder (mode 0700) of launched engines' ipc sockets, or "".
  std::string runtime_dir;
  std::vector<agent_subscriber> subscribers;
  std::vector<agent_mirror> mirror_views;
  /// The engines' loads, as the scraper last read them.
  std::shared_ptr<engine_loads> loads;
  /// Each forwarder's counters, by control node.
  std::vector<std::pair<std::string, std::shared_ptr<forwarder_counters>>> forwarders;
};

/// The agent of node `node` of `topo`: its engines, the control nodes it
/// forwards to, the cluster's seed, block size and flush interval (no
/// identity: the caller loads it).
agent_config agent_config_of(const config::topology& topo, const config::node_spec& node);

/// Spawns the node's actors in `sys`.
agent_handles start_agent(caf::actor_system& sys, const agent_config& cfg);

/// Puts a reloaded topology's part for this agent in force: engines
/// removed or changed are stopped (their mirrors leave every forwarder; a
/// removed launched engine runs on for `retire_after`, so requests the
/// gateways sent it can finish, then stops), engines added or changed are
/// started and forwarded from their full copy, and forwarders follow the
/// control nodes added, removed or changed. Unchanged engines and control
/// nodes keep their actors and state. The seed, block size and flush
/// interval stay as they are (config/topology_change.hpp).
void reload_agent(caf::actor_system& sys, agent_handles& handles, const agent_config& fresh,
                  std::chrono::milliseconds retire_after);

/// Sends every actor of `handles` an exit message.
void stop_agent(const agent_handles& handles);

/// Removes the private folder of the engines' sockets, once the agent's
/// actors (and the engines they launched) are gone.
void remove_runtime_dir(const agent_handles& handles);

/// The agent's counters as Prometheus text: each subscriber's messages and
/// what it refused, each forwarder's sessions and what it refused.
void append_agent_metrics(wire::metrics_text& m, const agent_handles& handles);

/// What every mirror holds, as JSON: replica, dp_rank, blocks, epoch,
/// fingerprint (16 hex digits, as a control node's /v1/kv/replicas prints
/// it), partial, parity. Served at /v1/kv/mirrors on an agent-only node's
/// admin listener, and on a node with both roles where its gateway serves
/// /metrics. A control node that
/// applied every update has the same fingerprint for the replica; block
/// counts may differ by the blocks it dropped on answers (suppressed).
std::string agent_mirrors_json(const agent_handles& handles);

} // namespace llmgw
