// llmgw-sim's scheduler: one thread that runs every data-parallel rank's
// continuous batching (sim_batch) in real time. A request goes to a rank
// (its hint, else the least busy); each rank runs one step after another
// while it has work, each step lasting what sim_batch says, and publishes
// the step's KV events when it ends. How tokens reach the client is the
// HTTP API's business (sim_api): the scheduler hands each token to the
// request's `emit`.
#pragma once

#include "apps/llmgw-sim/sim_batch.hpp"
#include "apps/llmgw-sim/sim_cache.hpp"
#include "apps/llmgw-sim/sim_publisher.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace llmgw::sim {

/// One data-parallel rank: its KV cache, its batching and, with KV events
/// on, its publisher.
struct sim_rank {
  sim_rank(cache_config cfg, batch_options opts) : cache(std::move(cfg)), batch(opts, cache) {}
  kv_cache cache;
  batch_scheduler batch;
  std::unique_ptr<publisher> pub;
  bool stepping = false; ///< a step is under way
};

class scheduler {
public:
  /// Starts the scheduler's thread over `ranks`.
  explicit scheduler(std::vector<std::unique_ptr<sim_rank>> ranks);
  /// Stops the thread; requests still running get no more tokens.
  ~scheduler();
  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;

  /// Runs `r` (any thread).
  void submit(std::shared_ptr<sim_request> r);

  /// Empties every rank's prefix cache, as vLLM's /reset_prefix_cache does;
  /// `done(true)` if every rank was idle and reset, else `done(false)` (any
  /// thread; `done` runs on the scheduler's).
  void reset_prefix_cache(std::function<void(bool)> done);

  /// What vLLM's /metrics reports of one rank (vLLM's `engine` label), as
  /// of the last scheduling step.
  struct gauges {
    std::uint64_t running = 0;
    std::uint64_t waiting = 0;
    double usage = 0; ///< KV cache blocks in use, 0..1
    std::uint64_t queried = 0;
    std::uint64_t hits = 0;
    std::uint64_t succeeded = 0;
    std::uint64_t preemptions = 0;
    wire::histogram ttft{ttft_buckets()}; ///< seconds, all ranks
  };
  std::vector<gauges> read() const;

private:
  void post(std::function<void()> f);
  void at(std::chrono::steady_clock::time_point t, std::function<void()> f);
  void run();
  void refresh_gauges();
  void admit(const std::shared_ptr<sim_request>& r);
  void step(std::size_t rank);

  std::vector<std::unique_ptr<sim_rank>> ranks_; ///< the scheduler thread's only
  mutable std::mutex mtx_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> inbox_; ///< guarded by mtx_
  std::multimap<std::chrono::steady_clock::time_point, std::function<void()>>
    due_; ///< the scheduler thread's only
  bool stop_ = false;
  std::vector<gauges> gauges_; ///< by rank; guarded by mtx_
  std::thread thread_;         ///< last: starts after everything above exists
};

} // namespace llmgw::sim
