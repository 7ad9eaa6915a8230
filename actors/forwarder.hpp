// The forwarder: one per control node on an agent node. Every flush interval
// it drains every mirror of its node and sends the non-empty changes, one
// message per replica; a session (each new connection) begins with the
// handshake of config/node_identity.hpp (agent_hello, the control node's
// control_proof, checked: it must prove to be the control node this
// forwarder is for; agent_proof) and then a full copy of every replica.
// Every update carries the session key's MAC. A handshake that does not
// finish within handshake_timeout, a refused session, or a control node
// that says it no longer knows this session: the forwarder starts over. A bounded window of
// unacknowledged updates (kv::session_window) keeps a slow or gone control node from growing
// memory: while it is full, the mirrors are simply not drained. When the
// control node goes down, the forwarder asks for a new connection with
// exponential backoff. A reload of the topology attaches and detaches
// mirrors (from this node only) and may have the control node ask for one
// replica's full copy again in the current session (resync).
#pragma once

#include "actors/interfaces.hpp"
#include "actors/load_scraper.hpp"
#include "config/node_identity.hpp"
#include "config/topology.hpp"
#include "kv/session_window.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace llmgw {

/// What a forwarder counts, read by the agent's /metrics from any thread.
struct forwarder_counters {
  std::atomic<std::uint64_t> sessions{0}; ///< sessions started (hellos sent)
  std::atomic<std::uint64_t> updates_sent{0};
  std::atomic<std::uint64_t> load_reports_sent{0};
  std::atomic<std::uint64_t> flushes_skipped{0};  ///< flushes that found the window full
  std::atomic<std::uint64_t> sessions_refused{0}; ///< sessions the control node refused
  std::atomic<std::uint64_t> proofs_refused{0};   ///< control nodes that failed to prove their name
  std::atomic<std::uint64_t> sessions_lost{0};    ///< the control node went away (link or node)
  std::atomic<bool> connected{false};             ///< in a session whose handshake finished
};

struct forwarder_options {
  std::string node;    ///< this agent node's name
  std::string control; ///< the control node's name (logs, peer id)
  std::chrono::milliseconds flush_interval = config::default_flush_interval;
  std::uint64_t window = kv::default_window; ///< unacknowledged updates at most
  std::chrono::milliseconds backoff_min{100};
  /// Capped low: an attempt is one TCP connect, and a restarted control node
  /// must get its full copies within a second.
  std::chrono::milliseconds backoff_max{500};
  std::chrono::milliseconds handshake_timeout{10000};
  /// This node's certificate and key; null in a plaintext cluster.
  std::shared_ptr<const config::node_identity> identity;
  /// The control node's certificates (the topology's fingerprints; empty: any
  /// certificate of the CA that names it).
  std::vector<std::string> control_fingerprints;
  /// Where it counts (made if null).
  std::shared_ptr<forwarder_counters> counters;
  /// The node's engines' loads (null: none are sent). Readings up to
  /// `load_max_age` old are sent when they change, and at least every
  /// `load_heartbeat`, so the router can tell a quiet engine from a lost one.
  std::shared_ptr<const engine_loads> loads;
  std::chrono::milliseconds load_max_age{1000};
  std::chrono::milliseconds load_heartbeat{1000};
};

/// A replica's mirror, by the replica id of the topology.
struct mirror_entry {
  std::string replica;
  mirror_actor mirror;
};

/// Asks for a connection to the control node; whoever carries it out sends
/// `connected_atom` to the forwarder with the control actor when it succeeds,
/// or with a null handle when it fails (the forwarder retries after its
/// backoff). Exactly one answer per call.
using connect_function = std::function<void(const forwarder_actor&)>;

struct forwarder_state {
  forwarder_options opts;
  std::vector<mirror_entry> mirrors;
  connect_function connect;
  control_actor control; ///< invalid while disconnected
  kv::session_window window{64};
  std::uint64_t peer = 0; ///< our subscriber id at every mirror
  std::chrono::milliseconds backoff{0};
  std::shared_ptr<forwarder_counters> counts; ///< opts.counters
  /// The handshake of the current session, until the control node's proof
  /// checked out (then `key` is set and updates flow).
  std::optional<config::key_share> share;
  config::session_transcript transcript;
  std::string key;
  bool connect_scheduled = false; ///< a connect_atom is on its way
  bool connecting = false;        ///< an attempt is in flight
  /// The loads last sent in this session (ages zeroed), and when.
  std::optional<std::vector<engine_load>> loads_sent;
  std::chrono::steady_clock::time_point loads_sent_at{};
  static inline const char* name = "forwarder";
};

/// The subscriber id a forwarder to `control` has at every mirror (stable
/// per control node, so a restarted forwarder takes its place).
std::uint64_t forwarder_peer(const std::string& control);

forwarder_actor::behavior_type forwarder(forwarder_actor::stateful_pointer<forwarder_state> self,
                                         forwarder_options opts, std::vector<mirror_entry> mirrors,
                                         connect_function connect);

} // namespace llmgw
