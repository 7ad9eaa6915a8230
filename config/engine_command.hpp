// The command line and environment llmgw starts an engine with. Pure code:
// the engine supervisor actor only spawns what this returns.
//
// For a vLLM command line (or llmgw-sim, which takes the same flags):
// - PYTHONHASHSEED is the topology's seed, so block hashes are reproducible;
// - --prefix-caching-hash-algo sha256_cbor, the only algorithm llmgw can
//   recompute outside Python;
// - --block-size the cluster's block size (vLLM's default differs by
//   platform: an engine hashing other blocks than the cluster's would be
//   marked mismatched and routed by tier 1 only);
// - with kv_events, --kv-events-config with the events endpoint (an ipc://
//   path in the agent's private folder, which the engine's PUB binds, or a
//   tcp address on loopback the subscriber bound, which it connects to), the
//   replay endpoint and topic if any.
// Flags of the same name in the operator's command are replaced, not
// duplicated (the last occurrence would win in vLLM, silently).
//
// For SGLang (sglang.launch_server): --page-size for the block size,
// --kv-events-config with the same endpoint, replay endpoint and topic, and
// no hash algorithm (SGLang has one, whose ids the agent translates).
#pragma once

#include "config/topology.hpp"

#include <string>
#include <utility>
#include <vector>

namespace llmgw::config {

struct engine_launch {
  std::vector<std::string> argv;                        ///< argv[0] is the program
  std::vector<std::pair<std::string, std::string>> env; ///< set on top of llmgw's own
};

struct engine_launch_options {
  std::vector<std::string> command; ///< the operator's command line
  /// vLLM, or SGLang (--page-size for the block size, no hash algorithm to
  /// choose: its page ids are translated). Never TensorRT-LLM, which llmgw
  /// does not launch (the topology refuses it).
  engine_kind kind = engine_kind::vllm;
  std::string seed;           ///< PYTHONHASHSEED
  std::size_t block_size = 0; ///< --block-size (0: the command's own)
  bool kv_events = false;
  std::string events_endpoint; ///< ipc://PATH, or tcp://127.0.0.1:PORT the subscriber bound
  std::string replay_endpoint; ///< where vLLM's ROUTER binds (ipc:// or tcp://), or empty
  std::string topic;
};

/// The command and environment to start the engine with.
engine_launch make_engine_launch(const engine_launch_options& opts);

/// The JSON for --kv-events-config.
std::string kv_events_config_json(const engine_launch_options& opts);

} // namespace llmgw::config
