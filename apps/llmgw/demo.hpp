// The local cluster's demo traffic (llmgw up --demo): multi-turn chats over a
// few shared system prompts, first through the gateway, then (after the
// engines' prefix caches are reset) the same traffic round-robin straight to
// the engines, for comparison. Answers are streamed, so time to first token
// is measured. Prints a table per replica: requests, decisions by tier,
// prompt and cached tokens, time to first token.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace llmgw::apps {

struct demo_engine {
  std::string replica;
  std::string url;
};

struct demo_options {
  std::string gateway_url;
  std::string model;
  std::vector<demo_engine> engines;
  std::size_t system_prompts = 4;
  std::size_t conversations = 16;
  std::size_t turns = 4;
  std::size_t parallel = 4;
};

/// What the demo measured, for callers that check it (tests).
struct demo_summary {
  std::size_t requests = 0;
  std::size_t failed = 0;
  double gateway_cached_ratio = 0;     ///< cached / prompt tokens, through llmgw
  double round_robin_cached_ratio = 0; ///< the same, round-robin to the engines
  double gateway_mean_ms = 0;
  double round_robin_mean_ms = 0;
  double gateway_ttft_p90_ms = 0; ///< time to first token, 90th percentile
  double round_robin_ttft_p90_ms = 0;
  std::size_t kv_decisions = 0;
};

/// Runs both phases and prints the table to stdout.
demo_summary run_demo(const demo_options& opts);

} // namespace llmgw::apps
