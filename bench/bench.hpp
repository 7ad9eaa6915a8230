// Shared pieces of llmgw-bench: timing, medians, and the report format.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace llmgw::bench {

/// Seconds taken by one call of `fn`.
template <class F>
double time_once(F&& fn) {
  auto start = std::chrono::steady_clock::now();
  fn();
  std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  return took.count();
}

/// The median of a sample (copied, so the caller's order is kept).
inline double median(std::vector<double> xs) {
  if (xs.empty())
    return 0;
  std::sort(xs.begin(), xs.end());
  auto n = xs.size();
  return n % 2 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

/// Prints one result line: "name  value unit  [note]", aligned.
void report(const std::string& name, double value, const std::string& unit,
            const std::string& note = "");

/// A capture's payloads, with what they hold.
struct capture_payloads {
  std::vector<std::string> payloads; ///< index = seq
  std::string topic;
  std::size_t bytes = 0;        ///< payload bytes in all
  std::size_t block_events = 0; ///< hashes stored or removed, plus clears
  std::size_t events = 0;
};

/// Reads golden/vllm-captures/NAME; false (with a message) if it cannot.
bool load_capture(const std::string& name, capture_payloads& out);

/// `llmgw-bench wire`: decoding and hashing throughput.
int run_wire_bench(int rounds);

/// `llmgw-bench agent`: the agent's events-to-updates path.
int run_agent_bench(int rounds);

/// `llmgw-bench router`: decision latency, index updates, index memory.
int run_router_bench(int rounds);

/// `llmgw-bench gateway`: the gateway's overhead beside the upstream and nginx.
int run_gateway_bench(int rounds, double rate, const std::string& only = {},
                      int prompt_tokens = 512);

/// `llmgw-bench routing`: policies compared on seeded workloads over local
/// clusters of llmgw-sim engines (scenarios "a" to "f"); without
/// `engine_load`, the gateways ignore the engines' own load.
int run_routing_bench(const std::vector<std::string>& scenarios,
                      const std::vector<std::string>& policies, std::uint64_t seed,
                      double time_scale, double load, bool engine_load = true);

/// `llmgw-bench agent-actors`: the same through the subscriber and mirror actors.
int run_agent_actors_bench(int rounds);

/// `llmgw-bench soak`: a local cluster under `events_per_second` block
/// events and `request_rate` requests a second for `minutes`; resident
/// memory per minute, and the control nodes' views against the mirrors at
/// the end (0 when they are equal).
int run_soak_bench(double minutes, double events_per_second, double request_rate);

} // namespace llmgw::bench
