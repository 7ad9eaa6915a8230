// What a router reads of an engine's own load in its Prometheus /metrics:
// vLLM's scheduler gauges. vLLM labels every sample with `model_name` and
// `engine` (the data-parallel rank), so an engine with several ranks has one
// sample per rank: running and waiting are summed, cache usage is averaged.
// SGLang's names for the same (sglang:num_running_reqs, sglang:num_queue_reqs,
// sglang:token_usage, served with --enable-metrics) are read alike.
#pragma once

#include "base/result.hpp"

#include <cstdint>
#include <string_view>

namespace llmgw::wire {

struct engine_gauges {
  std::uint32_t running = 0; ///< vllm:num_requests_running, every rank
  std::uint32_t waiting = 0; ///< vllm:num_requests_waiting, every rank
  /// vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc before vLLM 0.10),
  /// 0..1, the ranks' mean; -1 when the engine does not report it.
  double kv_usage = -1;
  std::uint32_t ranks = 0; ///< samples of vllm:num_requests_running seen
};

/// The largest request count taken from an engine: more is not a count.
inline constexpr double max_engine_requests = 1e6;

/// Reads the gauges from a /metrics body. An error names the line when a
/// value is not a number, negative, too large, or a usage outside 0..1, and
/// says so when the running or waiting gauge is missing (not a vLLM engine,
/// or one that does not log stats).
result<engine_gauges> read_engine_gauges(std::string_view text);

} // namespace llmgw::wire
