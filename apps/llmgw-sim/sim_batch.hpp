// One engine rank's continuous batching, as vLLM's V1 scheduler does it, in
// pure code (no clock, no thread): sim_scheduler runs it in real time, the
// unit tests step it by hand.
//
// Each step has a token budget (--max-num-batched-tokens) and a sequence
// limit (--max-num-seqs):
// - Running requests first, oldest first: each gets the tokens it has not
//   computed yet (one while decoding, the rest of its prompt, capped by the
//   budget, while prefilling). Blocks are allocated as tokens need them;
//   when a request cannot get one, the newest running request is preempted
//   (its blocks freed but still cached, its work forgotten, back to the
//   front of the queue) until it can, or until it is the one preempted.
// - Then, only if nobody was preempted in this step, waiting requests in
//   order: a request's cached prefix is looked up when it is admitted, and
//   the rest of its prompt prefills in chunks within the remaining budget.
//   A request that cannot get its blocks blocks the queue behind it.
// - A step lasts step_ms + us_per_token x its tokens + ns_per_context_token
//   x the tokens its requests attend to. When it ends, a request whose
//   tokens are all computed samples one; the first one of a request is its
//   time to first token: queueing, then the steps until the prompt's last
//   chunk, so load and cache hits both show in it.
// KV events (stores, evictions) of a step are published when it ends, as
// vLLM publishes a step's events after the model ran.
#pragma once

#include "apps/llmgw-sim/sim_cache.hpp"
#include "wire/metrics_text.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
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
  std::chrono::steady_clock::time_point arrived;
  allocation alloc;              ///< its tokens (prompt, then generated) and blocks
  std::size_t computed = 0;      ///< leading tokens whose KV is computed
  std::size_t generated = 0;     ///< tokens sampled so far
  std::size_t cached_tokens = 0; ///< found cached when first scheduled
  bool scheduled_once = false;
  std::size_t preemptions = 0;
};

struct batch_options {
  std::size_t max_num_batched_tokens = 8192;
  std::size_t max_num_seqs = 1024;
  double step_ms = 5;
  double us_per_token = 40;
  double ns_per_context_token = 39;
};

/// One step: who computes how many tokens, and what it costs.
struct step_plan {
  struct item {
    std::shared_ptr<sim_request> req;
    std::size_t tokens = 0; ///< computed in this step
  };
  std::vector<item> items; ///< running requests first, then admitted ones
  std::vector<std::shared_ptr<sim_request>> admitted;
  std::vector<std::shared_ptr<sim_request>> preempted;
  std::size_t tokens = 0;  ///< scheduled in all
  std::size_t context = 0; ///< tokens attended to (each request's computed + new)
  double ms = 0;           ///< how long the step takes
  std::vector<wire::kv_event> events;
  bool empty() const noexcept { return items.empty(); }
};

class batch_scheduler {
public:
  batch_scheduler(batch_options opts, kv_cache& cache);

  /// Queues `r` behind the waiting ones; a request that could not fit even
  /// into an empty cache is rejected at once.
  void enqueue(std::shared_ptr<sim_request> r, std::chrono::steady_clock::time_point now);

  /// Chooses the next step (empty when there is nothing to run). Requests
  /// whose clients left are dropped first.
  step_plan plan();

  /// Ends `p` at `now`: its tokens count as computed, requests done with
  /// theirs sample one and hand it on, finished ones free their blocks.
  void complete(const step_plan& p, std::chrono::steady_clock::time_point now);

  std::size_t running() const noexcept { return running_.size(); }
  std::size_t waiting() const noexcept { return waiting_.size(); }
  std::uint64_t preemptions() const noexcept { return preemptions_; }
  std::uint64_t succeeded() const noexcept { return succeeded_; }
  const wire::histogram& ttft() const noexcept { return ttft_; }

private:
  void preempt(const std::shared_ptr<sim_request>& r, step_plan& p);
  void drop_cancelled();
  void finish(const std::shared_ptr<sim_request>& r);

  batch_options opts_;
  kv_cache& cache_;
  std::vector<std::shared_ptr<sim_request>> running_; ///< oldest first
  std::deque<std::shared_ptr<sim_request>> waiting_;
  std::uint64_t preemptions_ = 0;
  std::uint64_t succeeded_ = 0;
  wire::histogram ttft_;
};

/// vLLM's bucket bounds for vllm:time_to_first_token_seconds.
std::vector<double> ttft_buckets();

} // namespace llmgw::sim
