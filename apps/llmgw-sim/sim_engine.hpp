// llmgw-sim's engine: data-parallel ranks, each a KV cache (sim_cache) and a
// KV event publisher, driven by one scheduler thread, behind vLLM's HTTP API.
//
// A request is admitted to a rank (X-data-parallel-rank, else the least
// busy), waits if the rank's free blocks do not suffice, and then costs
// base_ms + prefill_us_per_token x (prompt tokens not found in the cache)
// before its first token, and decode_ms_per_token per further token: routing
// quality shows up as time to first token. Generated text is deterministic.
//
// HTTP (vLLM's shapes): POST /v1/completions and /v1/chat/completions
// (stream too; usage.prompt_tokens_details.cached_tokens with
// --enable-prompt-tokens-details), POST /tokenize, GET /v1/models, /health,
// /metrics, POST /reset_prefix_cache.
#pragma once

#include "net/http_server.hpp"
#include "wire/kv_events.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace llmgw::sim {

struct engine_options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8000;
  std::string model;
  std::vector<std::pair<std::string, std::string>> lora_modules; ///< name, path
  bool enable_lora = false;
  std::size_t block_size = 16;
  std::size_t num_gpu_blocks = 8192;
  std::size_t max_model_len = 8192;
  std::string hash_algo = "sha256_cbor";
  std::string seed; ///< PYTHONHASHSEED ("" : unset)
  bool int_hashes = true;
  wire::event_shape event_shape = wire::event_shape::map;
  std::string kv_events_config; ///< vLLM's --kv-events-config JSON, or ""
  std::size_t dp_size = 1;
  double base_ms = 2;
  double prefill_us_per_token = 60;
  double decode_ms_per_token = 4;
  bool prompt_tokens_details = false;
  std::size_t default_max_tokens = 16;
};

class engine {
public:
  /// Starts the ranks, the scheduler and the HTTP server; error() says why
  /// not (a bad --kv-events-config, a port in use).
  explicit engine(engine_options opts);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  const std::string& error() const noexcept { return error_; }
  std::uint16_t port() const noexcept;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::string error_;
};

} // namespace llmgw::sim
