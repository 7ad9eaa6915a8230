// llmgw-sim's HTTP API, in vLLM's shapes: POST /v1/completions and
// /v1/chat/completions (streamed too, with usage; cached prompt tokens in
// usage.prompt_tokens_details with --enable-prompt-tokens-details), POST
// /tokenize, with --enable-scale-out POST /v1/completions/render and
// /v1/chat/completions/render, GET /v1/models, /health and /metrics, POST
// /reset_prefix_cache. It parses a request into a sim_request, hands it to
// the scheduler, and turns the tokens the scheduler emits into the answer.
#pragma once

#include "apps/llmgw-sim/sim_engine.hpp"
#include "apps/llmgw-sim/sim_scheduler.hpp"
#include "net/http_server.hpp"

#include <atomic>
#include <cstdint>

namespace llmgw::sim {

class api {
public:
  /// Serves the model and adapters of `opts` through `sched` (which must
  /// outlive the api).
  api(const engine_options& opts, scheduler& sched);

  /// Answers one request (any HTTP thread).
  void handle(http_request&& req, const http_responder& respond);

private:
  void completion(http_request&& req, const http_responder& respond, bool chat);
  void tokenize_endpoint(http_request&& req, const http_responder& respond);
  void render_endpoint(http_request&& req, const http_responder& respond, bool chat);
  void models(const http_responder& respond) const;
  void metrics(const http_responder& respond) const;

  const engine_options& opts_;
  scheduler& sched_;
  std::atomic<std::uint64_t> next_id_{1};
};

} // namespace llmgw::sim
