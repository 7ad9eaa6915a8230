// llmgw-sim's engine, assembled from its parts: data-parallel ranks, each a
// KV cache (sim_cache) and a KV event publisher (sim_publisher, from
// vLLM's --kv-events-config), run by one scheduler thread (sim_scheduler:
// where time to first token comes from, so routing quality shows), behind
// vLLM's HTTP API (sim_api). Generated text is deterministic (sim_text).
#pragma once

#include "apps/llmgw-sim/sim_batch.hpp"
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
  std::size_t num_gpu_blocks = 27500; ///< an 8B model on one H100 (docs/simulator.md)
  std::size_t max_model_len = 8192;
  std::string hash_algo = "sha256"; ///< vLLM's default: not reproducible outside the engine
  std::string seed;                 ///< PYTHONHASHSEED ("" : unset)
  bool int_hashes = true;
  wire::event_shape event_shape = wire::event_shape::map;
  /// --sim-as sglang: publish SGLang's stream (sim_sglang.hpp), enable
  /// events whenever --kv-events-config is given (SGLang has no enable
  /// field), bind for 0.0.0.0 as SGLang does, and serve no render routes.
  bool sglang = false;
  std::string kv_events_config; ///< vLLM's --kv-events-config JSON, or ""
  std::size_t dp_size = 1;
  batch_options batch; ///< continuous batching and step time (sim_batch.hpp)
  bool prompt_tokens_details = false;
  /// vLLM's --enable-scale-out: serve POST /v1/completions/render and
  /// /v1/chat/completions/render (else they are 404, as in vLLM).
  bool enable_scale_out = false;
  std::size_t default_max_tokens = 16;
  /// While this file exists, answer as vLLM does once its engine core died
  /// (EngineDeadError): /health 503, generation 500. For fault tests.
  std::string fail_file;
  /// Block events a second per rank published beside the real ones (a
  /// benchmark's load: stores of random GPU blocks without tokens, and
  /// removes of the oldest once 8,192 are held); 0: none.
  std::size_t event_churn = 0;
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

/// The benchmark churn's blocks held per rank at most: a bounded cache, as
/// an engine's is.
inline constexpr std::size_t churn_cap = 8192;

/// Of `events` churn events on a rank holding `held` churn blocks, how many
/// remove the oldest (the rest store new ones): none while there is room,
/// then about half, and always enough that no more than `cap` stay held
/// (given `events` <= `cap` / 2). An engine's stream never describes more
/// blocks than its cache holds.
std::size_t churn_removes(std::size_t held, std::size_t events, std::size_t cap = churn_cap);

} // namespace llmgw::sim
