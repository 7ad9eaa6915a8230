// State a control node's gateway shares with its actors: the router's
// (routing::shared_router) and the tokenizer's cache (routing::token_cache).
#include "routing/shared_router.hpp"
#include "routing/token_cache.hpp"
#include "wire/block_hash.hpp"
#include "wire/metrics_text.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <tuple>

using namespace llmgw;
using namespace llmgw::routing;
using namespace llmgw::wire;
using namespace std::chrono_literals;

namespace {

config::topology two_replicas() {
  config::topology t;
  t.block_size = 4;
  config::node_spec a;
  a.name = "agent-a";
  a.roles.agent = true;
  for (int i = 0; i < 2; ++i) {
    config::engine_spec e;
    e.replica = "r" + std::to_string(i);
    e.model = "llama";
    e.url = "http://127.0.0.1:800" + std::to_string(i);
    e.kv_events = true;
    e.canary = false; // its engines do not answer completions here
    a.engines.push_back(e);
  }
  t.nodes.push_back(a);
  return t;
}

route_query text_query(const std::string& text, bool dry_run = false) {
  route_query q;
  q.model = "llama";
  q.chunks = chunk_hashes(text, 8);
  q.dry_run = dry_run;
  return q;
}

std::uint32_t outstanding(shared_router& lr, const std::string& replica) {
  return lr.with([&](const router_core& core, const router_stats&) {
    for (const auto& r : core.replicas())
      if (r.name == replica)
        return r.outstanding;
    ADD_FAILURE() << "no replica " << replica;
    return 0u;
  });
}

std::uint64_t decisions_counted(shared_router& lr) {
  return lr.with(
    [](const router_core&, const router_stats& s) { return s.decision_seconds.count(); });
}

} // namespace

TEST(shared_router, record_remembers_the_prompt_and_counts_the_decision) {
  shared_router lr(two_replicas());
  std::string text(64, 'p');
  auto q = text_query(text);
  auto first = lr.decide(q);
  ASSERT_FALSE(first.replica.empty());
  EXPECT_EQ(first.tier, route_tier::load);
  lr.record(q, first);
  lr.finished(progress_of(first), false);
  auto again = lr.decide(q);
  EXPECT_EQ(again.tier, route_tier::approx) << "tier 1 knows the prompt now";
  EXPECT_EQ(again.replica, first.replica);
  EXPECT_EQ(decisions_counted(lr), 1u);
}

TEST(shared_router, decide_and_record_does_both_and_leaves_dry_runs_alone) {
  shared_router lr(two_replicas());
  std::string text(64, 'r');
  auto dry = lr.decide_and_record(text_query(text, true));
  ASSERT_FALSE(dry.replica.empty());
  EXPECT_EQ(outstanding(lr, dry.replica), 0u) << "a dry run counts no load";
  auto first = lr.decide_and_record(text_query(text));
  EXPECT_EQ(first.tier, route_tier::load) << "the dry run left no tier-1 trace";
  EXPECT_EQ(outstanding(lr, first.replica), 1u);
  lr.finished(progress_of(first), false);
  auto again = lr.decide_and_record(text_query(text));
  EXPECT_EQ(again.tier, route_tier::approx) << "tier 1 knows the prompt now";
  EXPECT_EQ(again.replica, first.replica);
  EXPECT_EQ(decisions_counted(lr), 2u);
}

TEST(shared_router, a_dry_run_is_neither_remembered_nor_counted) {
  shared_router lr(two_replicas());
  std::string text(64, 'q');
  auto dry = text_query(text, true);
  auto d = lr.decide(dry);
  lr.record(dry, d);
  EXPECT_EQ(outstanding(lr, d.replica), 0u);
  EXPECT_EQ(lr.decide(text_query(text)).tier, route_tier::load) << "no tier-1 trace";
  EXPECT_EQ(decisions_counted(lr), 0u);
}

TEST(shared_router, load_is_counted_until_finished_and_down_replicas_are_avoided) {
  shared_router lr(two_replicas());
  auto a = lr.decide(text_query(""));
  auto b = lr.decide(text_query(""));
  EXPECT_NE(a.replica, b.replica) << "the least loaded goes next";
  EXPECT_EQ(outstanding(lr, a.replica), 1u);
  lr.finished(progress_of(a), false);
  lr.finished(progress_of(b), false);
  EXPECT_EQ(outstanding(lr, a.replica), 0u);
  EXPECT_EQ(outstanding(lr, b.replica), 0u);
  lr.mark_down("r0", 60s);
  for (int i = 0; i < 4; ++i) {
    auto d = lr.decide(text_query(""));
    EXPECT_EQ(d.replica, "r1");
    lr.finished(progress_of(d), false);
  }
}

TEST(shared_router, updates_and_decisions_from_two_threads_leave_consistent_state) {
  shared_router lr(two_replicas());
  const int n = 20000;
  std::atomic<bool> done{false};
  std::thread updater([&] {
    std::vector<kv::block_ref> blocks;
    std::uint64_t epoch = 0;
    while (!done.load()) {
      blocks.assign({{1, kv::medium::gpu}, {2, kv::medium::gpu}, {epoch + 3, kv::medium::gpu}});
      ++epoch;
      lr.with([&](router_core& core, router_stats&) {
        core.kv().apply({"r0", 0, epoch, true, kv::parity_state::verified, &blocks, nullptr},
                        std::chrono::steady_clock::now());
      });
    }
  });
  int by_kv = 0;
  for (int i = 0; i < n; ++i) {
    route_query q;
    q.model = "llama";
    q.tokenized = true;
    q.keys = {1, 2};
    auto d = lr.decide(q);
    ASSERT_FALSE(d.replica.empty());
    lr.record(q, d);
    lr.finished(progress_of(d), false);
    by_kv += d.tier == route_tier::kv;
  }
  done = true;
  updater.join();
  EXPECT_EQ(outstanding(lr, "r0"), 0u);
  EXPECT_EQ(outstanding(lr, "r1"), 0u);
  auto counted = lr.with([](const router_core& core, const router_stats&) {
    const auto& c = core.counters().decisions;
    return c[0] + c[1] + c[2] + c[3];
  });
  EXPECT_EQ(counted, static_cast<std::uint64_t>(n));
  EXPECT_GT(by_kv, 0) << "r0's blocks were seen while the updater ran";
}

TEST(token_cache, holds_what_was_inserted_and_counts_lookups_only) {
  token_cache c(8, 1 << 20);
  std::vector<std::uint32_t> out;
  EXPECT_FALSE(c.lookup("llama", R"({"prompt":"hi"})", out));
  c.insert("llama", R"({"prompt":"hi"})", {5, 6, 7});
  EXPECT_TRUE(c.peek("llama", R"({"prompt":"hi"})", out));
  EXPECT_TRUE(c.lookup("llama", R"({"prompt":"hi"})", out));
  EXPECT_EQ(out, (std::vector<std::uint32_t>{5, 6, 7}));
  auto s = c.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u) << "peek is not counted";
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.bytes, token_cache::cost("llama", R"({"prompt":"hi"})", 3));
}

TEST(token_cache, models_and_bodies_are_told_apart_byte_for_byte) {
  token_cache c(8, 1 << 20);
  c.insert("llama", "body", {1});
  c.insert("qwen", "body", {2});
  c.insert("llama", "body ", {3});
  // The model's length is part of what tells entries apart, not a separator.
  c.insert("ab", "c", {4});
  c.insert("a", "bc", {5});
  std::vector<std::uint32_t> out;
  for (auto [model, body, want] :
       std::vector<std::tuple<const char*, const char*, std::uint32_t>>{{"llama", "body", 1},
                                                                        {"qwen", "body", 2},
                                                                        {"llama", "body ", 3},
                                                                        {"ab", "c", 4},
                                                                        {"a", "bc", 5}}) {
    ASSERT_TRUE(c.peek(model, body, out)) << model << " / " << body;
    EXPECT_EQ(out, std::vector<std::uint32_t>{want}) << model << " / " << body;
  }
  EXPECT_FALSE(c.peek("llama", "bod", out));
  EXPECT_EQ(c.stats().entries, 5u);
}

TEST(token_cache, bodies_whose_hashes_collide_keep_their_own_tokens) {
  // Every body hashes alike, as a crafted collision would: each is still
  // found by its own bytes only, and eviction removes the right one.
  token_cache c(50, 64 << 20, [](std::string_view, std::string_view) { return std::uint64_t{7}; });
  std::vector<std::uint32_t> out;
  for (std::uint32_t i = 0; i < 60; ++i)
    c.insert("m", "prompt " + std::to_string(i), {i});
  for (std::uint32_t i = 0; i < 10; ++i)
    EXPECT_FALSE(c.peek("m", "prompt " + std::to_string(i), out)) << i << " was evicted";
  for (std::uint32_t i = 10; i < 60; ++i) {
    ASSERT_TRUE(c.peek("m", "prompt " + std::to_string(i), out)) << i;
    EXPECT_EQ(out, std::vector<std::uint32_t>{i});
  }
  EXPECT_FALSE(c.peek("m", "prompt 60", out));
  EXPECT_EQ(c.stats().entries, 50u);
}

TEST(token_cache, the_least_recently_used_goes_first) {
  token_cache c(2, 1 << 20);
  std::vector<std::uint32_t> out;
  c.insert("m", "1", {1});
  c.insert("m", "2", {2});
  EXPECT_TRUE(c.lookup("m", "1", out)) << "1 is now the most recent";
  c.insert("m", "3", {3});
  EXPECT_TRUE(c.peek("m", "1", out));
  EXPECT_FALSE(c.peek("m", "2", out)) << "evicted";
  EXPECT_TRUE(c.peek("m", "3", out));
  EXPECT_EQ(c.stats().entries, 2u);
}

TEST(token_cache, bytes_are_bounded_too) {
  std::vector<std::uint32_t> small(10), big(1000), out;
  auto small_cost = token_cache::cost("m", "s0", small.size());
  // Room for five small entries, not for a sixth.
  token_cache c(100, 5 * small_cost + small_cost / 2);
  for (int i = 0; i < 6; ++i)
    c.insert("m", "s" + std::to_string(i), small);
  EXPECT_EQ(c.stats().entries, 5u);
  EXPECT_LE(c.stats().bytes, 5 * small_cost + small_cost / 2);
  EXPECT_FALSE(c.peek("m", "s0", out)) << "the oldest made room";
  EXPECT_TRUE(c.peek("m", "s5", out));
  // An entry larger than the whole bound is not kept, and evicts nothing.
  c.insert("m", "big", big);
  EXPECT_FALSE(c.peek("m", "big", out));
  EXPECT_EQ(c.stats().entries, 5u);
  // One that fits evicts as many as it needs.
  std::vector<std::uint32_t> three(3 * small.size() + 60);
  c.insert("m", "s6", three);
  EXPECT_TRUE(c.peek("m", "s6", out));
  EXPECT_LE(c.stats().bytes, 5 * small_cost + small_cost / 2);
  EXPECT_LT(c.stats().entries, 5u);
}

TEST(token_cache, capacity_zero_holds_nothing) {
  for (auto [entries, bytes] : {std::pair<std::size_t, std::size_t>{0, 1 << 20}, {8, 0}}) {
    token_cache c(entries, bytes);
    std::vector<std::uint32_t> out;
    c.insert("m", "1", {1});
    EXPECT_FALSE(c.lookup("m", "1", out));
    EXPECT_EQ(c.stats().entries, 0u);
    EXPECT_EQ(c.stats().bytes, 0u);
  }
}

TEST(shared_router, metrics_show_how_much_tier1_remembers_per_replica) {
  shared_router lr(two_replicas());
  auto d = lr.decide_and_record(text_query(std::string(64, 'm'))); // 8 chunks of 8 bytes
  wire::metrics_text m;
  lr.append_metrics(m);
  auto text = m.str();
  EXPECT_NE(text.find("llmgw_tier1_chunks{replica=\"" + d.replica + "\"} 8\n"), std::string::npos)
    << text;
  auto other = d.replica == "r0" ? "r1" : "r0";
  EXPECT_NE(text.find(std::string("llmgw_tier1_chunks{replica=\"") + other + "\"} 0\n"),
            std::string::npos)
    << text;
  EXPECT_NE(text.find("llmgw_tier1_nodes 8\n"), std::string::npos) << text;
}
