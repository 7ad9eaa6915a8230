// llmgw-sim's continuous batching, pinned step by step: chunked prefill
// within the token budget, admissions in order, preemption of the newest
// request when a running one needs a block, head-of-line blocking, and the
// time to first token that follows.
#include "apps/llmgw-sim/sim_batch.hpp"

#include <gtest/gtest.h>

#include <map>

using namespace llmgw;
using namespace llmgw::sim;
using namespace std::chrono_literals;

namespace {

using clock_type = std::chrono::steady_clock;

/// Requests named by a letter, and everything they sent.
struct bench {
  kv_cache cache;
  batch_scheduler batch;
  std::map<std::string, std::shared_ptr<sim_request>> by_name;
  std::vector<std::string> tokens; ///< "A1", "A2"...: who got which token, in order
  std::vector<std::string> rejected;
  std::size_t removed = 0; ///< BlockRemoved events so far
  clock_type::time_point now{};

  bench(std::size_t blocks, std::size_t block_size, batch_options o)
    : cache({blocks, block_size, "0", true, true}), batch(o, cache) {}

  void add(const std::string& name, std::uint32_t first, std::size_t prompt, std::size_t max) {
    auto r = std::make_shared<sim_request>();
    for (std::uint32_t i = 0; i < prompt; ++i)
      r->prompt.push_back(first + i);
    r->max_tokens = max;
    r->emit = [this, name](const token_out& t) {
      tokens.push_back(name + std::to_string(t.generated));
      return true;
    };
    r->reject = [this, name](const std::string&) { rejected.push_back(name); };
    by_name[name] = r;
    batch.enqueue(r, now);
  }

  std::string name_of(const std::shared_ptr<sim_request>& r) const {
    for (const auto& [n, q] : by_name)
      if (q == r)
        return n;
    return "?";
  }

  /// One step, written as "A+8 B+6 admitted:B preempted:" and run to its end.
  std::string step() {
    auto p = batch.plan();
    std::string s;
    for (const auto& it : p.items)
      s += name_of(it.req) + "+" + std::to_string(it.tokens) + " ";
    s += "admitted:";
    for (const auto& r : p.admitted)
      s += name_of(r);
    s += " preempted:";
    for (const auto& r : p.preempted)
      s += name_of(r);
    for (const auto& e : p.events)
      removed += e.kind == wire::event_kind::block_removed;
    now += std::chrono::microseconds(static_cast<std::int64_t>(p.ms * 1000));
    batch.complete(p, now);
    return s;
  }
};

batch_options options(std::size_t budget, std::size_t seqs) {
  batch_options o;
  o.max_num_batched_tokens = budget;
  o.max_num_seqs = seqs;
  o.step_ms = 1;
  o.us_per_token = 1000; // a step: 1 ms + 1 ms per token
  o.ns_per_context_token = 0;
  return o;
}

} // namespace

TEST(sim_batch, prompts_prefill_in_chunks_within_the_token_budget) {
  bench b(8, 4, options(8, 4));
  b.add("A", 1, 10, 3);
  b.add("B", 100, 6, 2);
  EXPECT_EQ(b.step(), "A+8 admitted:A preempted:") << "A's first chunk takes the whole budget";
  EXPECT_TRUE(b.tokens.empty()) << "no token before the prompt's last chunk";
  EXPECT_EQ(b.step(), "A+2 B+6 admitted:B preempted:") << "running first, then the queue";
  EXPECT_EQ(b.tokens, (std::vector<std::string>{"A1", "B1"}));
  EXPECT_EQ(b.step(), "A+1 B+1 admitted: preempted:") << "one token each while decoding";
  EXPECT_EQ(b.batch.running(), 1u) << "B finished with its second token";
  EXPECT_EQ(b.step(), "A+1 admitted: preempted:");
  EXPECT_EQ(b.tokens, (std::vector<std::string>{"A1", "B1", "A2", "B2", "A3"}));
  EXPECT_EQ(b.batch.running() + b.batch.waiting(), 0u);
  EXPECT_TRUE(b.batch.plan().empty());
  EXPECT_EQ(b.batch.succeeded(), 2u);
  // Time to first token: A after steps of 9 and 9 ms, B after the second.
  EXPECT_EQ(b.batch.ttft().count(), 2u);
  EXPECT_DOUBLE_EQ(b.batch.ttft().sum(), 0.018 + 0.018);
  EXPECT_EQ(b.cache.used_blocks(), 0u);
}

TEST(sim_batch, a_cached_prefix_is_skipped_and_reported) {
  bench b(16, 4, options(64, 4));
  b.add("A", 1, 12, 1);
  EXPECT_EQ(b.step(), "A+12 admitted:A preempted:");
  b.add("B", 1, 14, 1); // A's 12 tokens and two more
  EXPECT_EQ(b.step(), "B+2 admitted:B preempted:") << "three cached blocks: two tokens to compute";
  EXPECT_EQ(b.by_name["B"]->cached_tokens, 12u);
  b.add("C", 1, 12, 1); // exactly A's prompt: the last block is recomputed
  EXPECT_EQ(b.step(), "C+4 admitted:C preempted:");
  EXPECT_EQ(b.by_name["C"]->cached_tokens, 8u);
}

TEST(sim_batch, the_newest_request_is_preempted_and_the_queue_waits_for_blocks) {
  bench b(4, 4, options(16, 4));
  b.add("C", 1, 7, 6);   // 13 tokens: 4 blocks at the end
  b.add("D", 100, 7, 5); // 12 tokens: 3 blocks
  EXPECT_EQ(b.step(), "C+7 D+7 admitted:CD preempted:");
  EXPECT_EQ(b.step(), "C+1 D+1 admitted: preempted:");
  EXPECT_EQ(b.tokens, (std::vector<std::string>{"C1", "D1", "C2", "D2"}));
  EXPECT_EQ(b.step(), "C+1 admitted: preempted:D")
    << "C's ninth token needs a third block: D, the newest, gives its two back";
  EXPECT_EQ(b.removed, 1u) << "C took D's freed tail block, evicting it";
  EXPECT_EQ(b.batch.preemptions(), 1u);
  EXPECT_EQ(b.batch.waiting(), 1u);
  // D's first block is still cached, but D needs three blocks for its 9
  // tokens and only that one is free: it blocks the queue until C is done.
  EXPECT_EQ(b.step(), "C+1 admitted: preempted:");
  EXPECT_EQ(b.step(), "C+1 admitted: preempted:");
  EXPECT_EQ(b.step(), "C+1 admitted: preempted:");
  EXPECT_EQ(b.batch.running(), 0u) << "C has its six tokens";
  EXPECT_EQ(b.step(), "D+5 admitted:D preempted:")
    << "D recomputes its prompt and two generated tokens, all but its cached first block";
  EXPECT_EQ(b.by_name["D"]->cached_tokens, 0u) << "what it found when it was first scheduled";
  EXPECT_EQ(b.tokens.back(), "D3") << "a resumed request goes on where it was";
  EXPECT_EQ(b.step(), "D+1 admitted: preempted:");
  EXPECT_EQ(b.step(), "D+1 admitted: preempted:");
  EXPECT_EQ(b.batch.running() + b.batch.waiting(), 0u);
  EXPECT_EQ(b.batch.succeeded(), 2u);
}

TEST(sim_batch, the_sequence_limit_caps_admissions) {
  bench b(64, 4, options(100, 2));
  b.add("A", 1, 5, 2);
  b.add("B", 100, 5, 2);
  b.add("C", 200, 5, 2);
  EXPECT_EQ(b.step(), "A+5 B+5 admitted:AB preempted:");
  EXPECT_EQ(b.step(), "A+1 B+1 admitted: preempted:");
  EXPECT_EQ(b.step(), "C+5 admitted:C preempted:");
}

TEST(sim_batch, a_request_larger_than_the_cache_is_rejected_at_once) {
  bench b(4, 4, options(16, 4));
  b.add("A", 1, 14, 3); // 17 tokens: 5 blocks
  EXPECT_EQ(b.rejected, std::vector<std::string>{"A"});
  EXPECT_TRUE(b.batch.plan().empty());
}

TEST(sim_batch, a_cancelled_request_gives_its_blocks_back_at_the_next_step) {
  bench b(8, 4, options(16, 4));
  b.add("A", 1, 8, 10);
  b.add("B", 100, 8, 10);
  EXPECT_EQ(b.step(), "A+8 B+8 admitted:AB preempted:");
  b.by_name["A"]->cancelled = true;
  EXPECT_EQ(b.step(), "B+1 admitted: preempted:");
  EXPECT_EQ(b.cache.used_blocks(), 3u) << "only B's blocks (its ninth token needs a third)";
}
