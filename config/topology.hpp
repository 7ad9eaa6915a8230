// The cluster's shape: one TOML file read by every node and tool.
//
//   [cluster]   name, hash_seed (the engines' PYTHONHASHSEED), block_size,
//               flush_interval_ms, heartbeat_ms, connection_timeout_ms,
//               check_agent_address, tls_handshake_timeout_ms,
//               max_pending_handshakes
//   [tls]       ca (PEM), or plaintext = true (loopback tests only)
//   [router]    scoring and tier-1 knobs (router_settings below)
//   [gateway]   HTTP limits and the proxy's timeouts (gateway_settings below)
//   [[node]]    name, host, port, roles = ["agent", "control"], http
//               ("host:port", control nodes), admin ("host:port", optional:
//               health and metrics only), cert and key (PEM),
//               fingerprints (the certificates it may present)
//   [[node.engine]] (agent nodes) replica, model, url, lora, kv_events,
//               events_port or events, topic, dp_size, launch, replay,
//               replay_endpoint, block_keys, canary
//
// load_topology() reads and checks everything before anything starts and
// reports every problem at once, each with FILE:LINE:COLUMN: unknown keys,
// wrong types, missing values, duplicates, clashing ports, unreadable or
// mismatched TLS files. Relative paths are relative to the file's folder.
// deploy/ has commented examples.
#pragma once

#include "wire/kv_events.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace llmgw::config {

/// Whether an engine with base model `model` and LoRA adapters `lora`
/// serves requests that name `name` (OpenAI's "model"): its base model or
/// one of its adapters. The one rule the router, the tokenizer and the
/// gateway use.
bool serves(const std::string& model, const std::vector<std::string>& lora,
            const std::string& name);

/// Whose engine it is: how its events are encoded, which flags set its
/// block size, what its HTTP API has.
enum class engine_kind : std::uint8_t { vllm, sglang, trtllm };

/// "vllm", "sglang", "trtllm".
const char* to_string(engine_kind kind) noexcept;

/// How an engine of `kind` sets its block size, as a message completes it
/// with the size ("start it with --page-size 16"): --block-size,
/// --page-size, or TensorRT-LLM's YAML key.
const char* block_size_flag(engine_kind kind) noexcept;

/// The dialect its KV events are decoded in.
wire::event_dialect dialect_of(engine_kind kind) noexcept;

/// One engine (one vLLM, SGLang or TensorRT-LLM server, possibly with
/// data-parallel ranks).
struct engine_spec {
  std::string replica;                  ///< unique in the cluster
  engine_kind kind = engine_kind::vllm; ///< `engine = "vllm" | "sglang" | "trtllm"`
  std::string model;                    ///< served model name (OpenAI "model")
  std::string url;                      ///< HTTP base URL, e.g. http://10.0.0.5:8000
  std::vector<std::string> lora;        ///< LoRA adapters it serves, by name
  bool kv_events = false;               ///< tier 2: mirror its KV events
  std::uint16_t events_port = 0;        ///< SUB port on the agent's loopback (0: any)
  /// Attached engines whose publisher binds (vLLM's default tcp://*:5557):
  /// where the agent connects, tcp://HOST:PORT; rank r at PORT + r.
  std::string events;
  std::string topic;
  std::uint32_t dp_size = 1;
  std::vector<std::string> launch; ///< empty: attached (started by the operator)
  bool replay = true;              ///< launched engines get a replay endpoint
  /// Attached engines: theirs, if any (tcp://HOST:PORT; rank r at PORT + r).
  std::string replay_endpoint;
  /// Key blocks by the cluster's hash of their tokens (true, "translate"),
  /// or use the engine's own hashes, which must then be the cluster's
  /// (false, "engine": sha256_cbor with PYTHONHASHSEED = hash_seed).
  bool translate_keys = true;
  /// With kv_events: each control node sends the engine a short prompt when
  /// its KV state first arrives and after each restart, and routes it by
  /// tier 1 until its events show that prompt's blocks under the keys the
  /// router computes (routing/canary.hpp). Off: routed on its KV state
  /// unchecked (an engine that refuses unauthenticated completions).
  bool canary = true;

  bool serves(const std::string& name) const { return config::serves(model, lora, name); }
};

/// What an operator should know of how `e`'s KV events reach the agent:
/// which side binds, how the engine must be started, and a line beginning
/// "warning:" when its events cross the network in plaintext. `llmgw
/// check` prints them; the agent logs the warnings. Empty without events.
std::vector<std::string> events_notes(const engine_spec& e);

/// A node's roles.
struct node_roles {
  bool agent = false;
  bool control = false;
};

/// One process of the cluster.
struct node_spec {
  std::string name;
  std::string host;       ///< CAF address (control nodes listen on it)
  std::uint16_t port = 0; ///< CAF port; agent-only nodes may leave it 0
  node_roles roles;
  std::string http_host; ///< control nodes: the gateway's listen address
  std::uint16_t http_port = 0;
  /// Optional: a listener for /healthz and /metrics (and on control nodes
  /// /v1/kv/replicas), with connections of its own, so probes and scrapes
  /// get through whatever clients do on the gateway's port; on an agent
  /// node, its only HTTP endpoint (its subscribers' and forwarders' counts).
  std::string admin_host;
  std::uint16_t admin_port = 0;
  std::string cert; ///< PEM certificate, signed by the cluster's CA
  std::string key;  ///< its private key (PEM, unencrypted)
  /// The certificates this node may present, as normalize_fingerprint()
  /// gives them; empty: any certificate of the CA that names the node. A
  /// lost key is revoked by issuing a new certificate and listing only it.
  std::vector<std::string> fingerprints;
  std::vector<engine_spec> engines;
};

/// Knobs of the router's decision.
struct router_settings {
  double cpu_weight = 0.5;      ///< a CPU-offloaded block counts this much
  double storage_weight = 0.25; ///< a block on another storage tier
  double tie_margin = 0.05;     ///< costs this close (relatively) to the least count as ties
  // What a replica's time to first token costs, before the gateway refines
  // it from what it observes (routing/router_core.hpp). The defaults are
  // vLLM's on an 8B model on one H100 (docs/simulator.md).
  double prefill_ms_per_token = 0.04;    ///< per prompt token not cached
  double step_ms = 5;                    ///< per engine step
  double decode_ms_per_request = 0.1;    ///< per step, per request decoding there
  std::size_t max_batched_tokens = 8192; ///< tokens per step (vLLM's --max-num-batched-tokens)
  /// A routed prompt's blocks count for the chosen replica this long, unless
  /// its KV events confirm them first (0: no speculative entries).
  std::chrono::milliseconds speculative_ttl{5000};
  /// An engine's own load (its /metrics, forwarded by its agent) counts in
  /// the cost while no older than this, and at least two flush intervals
  /// (0: never counts).
  std::chrono::milliseconds engine_load_max_age{2000};
  /// A replica's KV state is distrusted (scored by tier 1) when more than
  /// this share of its last 32 checked answers found fewer tokens cached
  /// than the index predicted (0: never).
  double distrust_shortfall_share = 0.5;
  std::size_t tier1_chunk_bytes = 64;  ///< prompt text per tier-1 tree step
  std::size_t tier1_capacity = 200000; ///< tier-1 chunks kept per replica
  std::chrono::seconds tier1_ttl{900};
  std::chrono::milliseconds tokenize_timeout{500};
  std::size_t tokenize_cache_entries = 4096;
  std::size_t tokenize_cache_mib = 256; ///< the cache's bytes at most, in MiB
  /// A canary (engine_spec::canary) fails when its blocks have not appeared
  /// in the engine's events this long after the engine first answered it.
  std::chrono::milliseconds canary_timeout{30000};
  /// A failed canary is sent again this long after it failed.
  std::chrono::milliseconds canary_retry{60000};
};

/// The gateway's limits and the proxy's patience.
struct gateway_settings {
  std::size_t max_body_bytes = 32u << 20; ///< a request body (413 beyond)
  /// Request bodies held at once, in MiB (503 with Retry-After beyond).
  std::size_t max_buffered_body_mib = 1024;
  /// A request's head (431 beyond). What the gateway accepts it forwards, with
  /// at most a few hundred bytes of its own: 15 KiB keeps the forwarded head
  /// within the 16 KiB uvicorn's h11 parser takes (vLLM answers 400 beyond).
  std::size_t max_header_bytes = 15u << 10;
  std::chrono::milliseconds read_timeout{30000};     ///< to receive one whole request
  std::chrono::milliseconds idle_timeout{60000};     ///< a keep-alive connection's silence
  std::chrono::milliseconds request_timeout{600000}; ///< a whole proxied request
  std::chrono::milliseconds connect_timeout{2000};   ///< to connect to a replica
  /// A streamed request's replica must begin its answer (the response head)
  /// this long after the request was sent, else it is tried elsewhere (0:
  /// no such deadline). vLLM sends a stream's head before scheduling it, so
  /// a head that does not come means the engine's server is stuck. Not for
  /// whole answers: their head comes only when the answer is done.
  std::chrono::milliseconds first_byte_timeout{30000};
  std::size_t max_connections = 4096;
  /// Open connections from one client address (0: no cap). Behind a load
  /// balancer that connects from one address, raise it or set 0.
  std::size_t max_connections_per_client = 256;
  std::uint32_t max_attempts = 3;            ///< replicas tried before giving up
  std::chrono::milliseconds down_for{10000}; ///< a failed replica is avoided this long
  /// Every replica's GET /health is probed this often (0: never). Two
  /// failed probes in a row mark it down until one succeeds; a success
  /// also ends a mark from failed requests.
  std::chrono::milliseconds health_interval{2000};
  std::chrono::milliseconds health_timeout{1000}; ///< a probe's answer, at most
  /// On SIGTERM, requests in flight (streams too) may finish this long
  /// while new ones are refused and /healthz says draining (0: stop at once).
  std::chrono::milliseconds drain_timeout{30000};
  /// Gateway HTTP threads, each an event loop with its share of the
  /// connections and its own upstream connections (as nginx's workers).
  std::size_t threads = 1;
};

/// How often an agent sends its mirrors' net changes (the file's
/// `flush_interval_ms`; the forwarder's default too).
inline constexpr std::chrono::milliseconds default_flush_interval{250};

/// The whole cluster.
struct topology {
  std::string path; ///< the file it came from
  std::string name;
  std::string seed;            ///< PYTHONHASHSEED of every engine
  std::size_t block_size = 16; ///< --block-size of every engine
  std::chrono::milliseconds flush_interval = default_flush_interval;
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds connection_timeout{5000};
  /// Control nodes accept an agent's session only from an address of the
  /// agent's host (off for NAT or overlay networks that rewrite addresses).
  bool check_agent_address = true;
  /// A connection to a node's port must finish its TLS handshake this soon.
  std::chrono::milliseconds tls_handshake_timeout{10000};
  /// Connections to a node's port that may be in their TLS handshake at once.
  std::size_t max_pending_handshakes = 64;
  std::string ca;         ///< the CA every node certificate is checked against
  bool plaintext = false; ///< no TLS at all (refused unless every host is loopback)
  router_settings router;
  gateway_settings gateway;
  std::vector<node_spec> nodes;

  /// The node called `name`, or null.
  const node_spec* find_node(const std::string& name) const;

  /// The node owning `replica`, or null.
  const node_spec* owner_of(const std::string& replica) const;

  /// The engine called `replica`, or null.
  const engine_spec* find_engine(const std::string& replica) const;
  /// True when some engine serves `name` as a LoRA adapter: a request for
  /// it is hashed with the adapter's name, as vLLM does.
  bool is_adapter(const std::string& name) const;

  /// The control nodes, in file order.
  std::vector<const node_spec*> controls() const;
};

/// One thing wrong with a topology, with where it is.
struct config_problem {
  std::string file;
  std::uint32_t line = 0; ///< 0: the file as a whole
  std::uint32_t column = 0;
  std::string message;
  /// "FILE:LINE:COLUMN: message" (or "FILE: message").
  std::string to_string() const;
};

/// A topology, or every problem found in it.
struct topology_result {
  std::optional<topology> value;
  std::vector<config_problem> problems;
};

/// How strictly to read.
struct topology_options {
  /// Check that TLS files exist and fit together. Off only for `llmgw up`,
  /// which makes a local cluster's certificates before the strict check.
  bool check_tls_files = true;
  /// When set, only this node's certificate and key are checked: what
  /// `llmgw node` loads. A node's host holds its own key and no other node's
  /// (holding X's key is being X); `llmgw check` checks them all.
  std::string tls_files_of;
};

/// Reads and checks a topology file.
topology_result load_topology(const std::string& path, const topology_options& opts = {});

/// A topology file's size at most: thousands of nodes fit; reading more
/// only costs time.
constexpr std::size_t max_topology_bytes = 4u << 20;

/// How deep arrays and inline tables may nest in a topology (they need 3).
constexpr std::size_t max_topology_nesting = 32;

/// Dots outside strings on one line of a topology (a key needs none).
constexpr std::size_t max_topology_dots = 64;

/// The same from text (for tests); `path` names it in messages and is where
/// relative file names are resolved from.
topology_result parse_topology(const std::string& text, const std::string& path,
                               const topology_options& opts = {});

} // namespace llmgw::config
