// llmgw-sim's scheduler: one thread that runs every request of every
// data-parallel rank in simulated time. A request goes to a rank (its hint,
// else the least busy), waits there until the rank's KV cache (sim_cache)
// has the blocks it needs, then costs base_ms + prefill_us_per_token x (its
// prompt tokens not found in the cache) before its first token, and
// decode_ms_per_token for each further one. Each rank's cache events go to
// its publisher as they happen. How tokens reach the client is the HTTP
// API's business (sim_api): the scheduler hands each token to the request's
// `emit`.
#pragma once

#include "apps/llmgw-sim/sim_cache.hpp"
#include "apps/llmgw-sim/sim_publisher.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace llmgw::sim {

/// One generated token, as the scheduler hands it to the API.
struct token_out {
  std::string piece;  ///< its text
  bool first = false; ///< the first token of the answer
  bool last = false;  ///< max_tokens reached: the answer ends here
  std::size_t prompt_tokens = 0;
  std::size_t cached_tokens = 0; ///< prompt tokens found in the cache
  std::size_t generated = 0;     ///< tokens so far, this one included
};

/// One request, from the API's parsing to its last token.
struct sim_request {
  // Set by the API before submit():
  std::vector<std::uint32_t> prompt;
  wire::extra_key_recipe extras; ///< LoRA name and cache salt, as vLLM hashes them
  std::optional<std::int64_t> lora_id;
  std::size_t max_tokens = 16;
  int rank_hint = -1; ///< X-data-parallel-rank, or -1
  /// Sends one token on; false when the client is gone (the request stops).
  std::function<bool(const token_out&)> emit;
  /// Answers with an error instead (the request can never fit).
  std::function<void(const std::string& message)> reject;
  std::atomic<bool> cancelled{false}; ///< the client left (any thread)

  // The scheduler's own:
  std::size_t rank = 0;
  std::optional<allocation> alloc;
  std::size_t generated = 0;
};

struct scheduler_options {
  double base_ms = 2;
  double prefill_us_per_token = 60;
  double decode_ms_per_token = 4;
};

/// One data-parallel rank: its KV cache and, with KV events on, its publisher.
struct sim_rank {
  explicit sim_rank(cache_config cfg) : cache(std::move(cfg)) {}
  kv_cache cache;
  std::unique_ptr<publisher> pub;
  std::deque<std::shared_ptr<sim_request>> waiting;
  std::size_t running = 0;
};

class scheduler {
public:
  /// Starts the scheduler's thread over `ranks`.
  scheduler(scheduler_options opts, std::vector<std::unique_ptr<sim_rank>> ranks);
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

  /// What vLLM's /metrics reports, as of the last scheduling step.
  struct gauges {
    std::uint64_t running = 0;
    std::uint64_t waiting = 0;
    double usage = 0; ///< KV cache blocks in use, 0..1
    std::uint64_t queried = 0;
    std::uint64_t hits = 0;
    std::uint64_t succeeded = 0;
  };
  gauges read() const;

private:
  void post(std::function<void()> f);
  void at(std::chrono::steady_clock::time_point t, std::function<void()> f);
  void run();
  void refresh_gauges();
  void admit(const std::shared_ptr<sim_request>& r);
  void try_admit(std::size_t rank);
  void step(const std::shared_ptr<sim_request>& r);
  void finish(const std::shared_ptr<sim_request>& r);

  scheduler_options opts_;
  std::vector<std::unique_ptr<sim_rank>> ranks_; ///< the scheduler thread's only
  mutable std::mutex mtx_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> inbox_; ///< guarded by mtx_
  std::multimap<std::chrono::steady_clock::time_point, std::function<void()>>
    due_; ///< the scheduler thread's only
  bool stop_ = false;
  gauges gauges_; ///< guarded by mtx_
  std::uint64_t succeeded_ = 0;
  std::thread thread_; ///< last: starts after everything above exists
};

} // namespace llmgw::sim
