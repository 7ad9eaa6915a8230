// What crosses nodes between an agent's forwarder and a control node, and
// between the mirror and its subscribers. Plain structs with CAF 0.17
// inspect() overloads; registered on every node by register_message_types()
// (actors/registration.hpp), because a type missing on one side arrives as
// an empty message.
//
// A session: the forwarder sends agent_hello, the control node answers with
// control_proof, the forwarder with agent_proof (config/node_identity.hpp: each
// side proves its certificate's name and both derive a session key). Then
// replica_update messages numbered 1, 2, ... within the session, each with a
// MAC under the session key; the control node acknowledges with session_ack
// (the highest seq applied), which frees the forwarder's window. The first
// update for each replica in a session has reset = true and holds the
// replica's full state.
#pragma once

#include "kv/block_table.hpp"

#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace llmgw::kv {

/// A mirror's running totals, sent with every update.
static_assert(reset_reason_count == 5, "inspect(mirror_totals) lists each reset reason");
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, mirror_totals& x) {
  return f(caf::meta::type_name("mirror_totals"), x.batches, x.stored, x.removed, x.ignored_removes,
           x.verified_blocks, x.translated_blocks, x.untranslated_blocks, x.resets[0], x.resets[1],
           x.resets[2], x.resets[3], x.resets[4]);
}

/// Serializes a block as (key, medium); the enum goes as its integer.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, block_ref& x) {
  return f(caf::meta::type_name("block_ref"), x.key, x.where);
}

} // namespace llmgw::kv

namespace llmgw {

/// The first message of a session: who the agent says it is, what it owns,
/// and its half of the key exchange.
struct agent_hello {
  std::string node;                  ///< the agent's node name in the topology
  std::uint64_t session = 0;         ///< new for every connection attempt
  std::vector<std::string> replicas; ///< replicas the agent believes it owns
  std::string nonce;                 ///< 32 fresh random bytes
  std::string key_share;             ///< X25519 public key, 32 bytes
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, agent_hello& x) {
  return f(caf::meta::type_name("agent_hello"), x.node, x.session, x.replicas, x.nonce,
           x.key_share);
}

/// The control node's answer to a hello: its half of the key exchange and
/// its proof of being the control node the agent connected to.
struct control_proof {
  std::uint64_t session = 0;
  std::string node; ///< the control node's name
  std::string nonce;
  std::string key_share;
  std::string certificate; ///< DER; empty in a plaintext cluster
  std::string signature;   ///< over proof_input(control, transcript)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, control_proof& x) {
  return f(caf::meta::type_name("control_proof"), x.session, x.node, x.nonce, x.key_share,
           x.certificate, x.signature);
}

/// The agent's proof: the last message of the handshake.
struct agent_proof {
  std::uint64_t session = 0;
  std::string certificate; ///< DER; empty in a plaintext cluster
  std::string signature;   ///< over proof_input(agent, transcript)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, agent_proof& x) {
  return f(caf::meta::type_name("agent_proof"), x.session, x.certificate, x.signature);
}

/// The net change of one replica's KV blocks since the last update.
struct replica_update {
  std::string node;          ///< sending agent node (checked by control)
  std::string replica;       ///< replica id from the topology
  std::uint32_t dp_rank = 0; ///< data-parallel rank: each has its own KV cache
  std::uint64_t session = 0;
  std::uint64_t seq = 0;   ///< 1, 2, ... within the session
  std::uint64_t epoch = 0; ///< the mirror's epoch
  bool reset = false;      ///< drop what is held for the replica first
  std::uint8_t parity = 0; ///< kv::parity_state as an integer
  bool partial = false;    ///< kv::block_table::partial(): the engine may hold more
  bool hybrid = false;     ///< kv::block_table::hybrid(): prefixes end at end markers
  std::vector<kv::block_ref> added;
  std::vector<kv::block_ref> removed;
  kv::mirror_totals totals; ///< the mirror's counts so far
  /// Why parity is not routable (mismatch, untranslatable), as the mirror
  /// says it; empty otherwise. At most max_parity_reason bytes.
  std::string parity_reason;
  std::string mac; ///< update_mac() under the session key
};

/// The longest parity_reason a control node takes.
inline constexpr std::size_t max_parity_reason = 1024;

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, replica_update& x) {
  return f(caf::meta::type_name("replica_update"), x.node, x.replica, x.dp_rank, x.session, x.seq,
           x.epoch, x.reset, x.parity, x.partial, x.hybrid, x.added, x.removed, x.totals,
           x.parity_reason, x.mac);
}

/// What in `u` is not a value of its enum (`parity`, a block's medium), or
/// "" when every such field is in range. CAF decodes an enum as its integer,
/// so a peer can send any value: the control node refuses such an update
/// before anything reads those fields.
std::string out_of_range_fields(const replica_update& u);

/// HMAC-SHA256 under a session key of every field of `u` but its mac, in a
/// fixed byte form: what the forwarder sets and the control node checks.
std::string update_mac(std::string_view key, const replica_update& u);

/// One engine's load, as the agent last read it from the engine's /metrics
/// (wire::engine_gauges: vLLM's gauges, summed over its ranks).
struct engine_load {
  std::string replica;
  std::uint32_t running = 0;
  std::uint32_t waiting = 0;
  std::int32_t kv_usage_permille = -1; ///< KV cache in use, 0..1000; -1: not reported
  std::uint32_t age_ms = 0;            ///< how old the reading was when sent
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_load& x) {
  return f(caf::meta::type_name("engine_load"), x.replica, x.running, x.waiting,
           x.kv_usage_permille, x.age_ms);
}

/// The loads of an agent's engines, within a session: numbered and MACed
/// like replica_update (one seq space, one window), sent when they change
/// and at least every second. An engine whose /metrics could not be read
/// lately is left out, and its last load ages out at the router.
struct load_report {
  std::string node;
  std::uint64_t session = 0;
  std::uint64_t seq = 0;
  std::vector<engine_load> loads;
  std::string mac; ///< load_report_mac() under the session key
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, load_report& x) {
  return f(caf::meta::type_name("load_report"), x.node, x.session, x.seq, x.loads, x.mac);
}

/// The longest age of a load reading the control node takes, in ms.
inline constexpr std::uint32_t max_load_age_ms = 60000;

/// What in `r` is out of range (a count over wire::max_engine_requests, a
/// usage outside -1..1000, an age over max_load_age_ms, a replica named
/// twice), or "".
std::string out_of_range_fields(const load_report& r);

/// HMAC-SHA256 of every field of `r` but its mac, as update_mac() does.
std::string load_report_mac(std::string_view key, const load_report& r);

/// The control node has applied every update of `session` up to `seq`.
struct session_ack {
  std::uint64_t session = 0;
  std::uint64_t seq = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, session_ack& x) {
  return f(caf::meta::type_name("session_ack"), x.session, x.seq);
}

} // namespace llmgw
