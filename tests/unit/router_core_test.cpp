// The router's decision: tiers, fallbacks, costs and their ties, load
// against cache hits, the learnt rate, health, LoRA adapters, and dry runs.
#include "routing/router_core.hpp"

#include <gtest/gtest.h>

#include <set>

using namespace llmgw;
using namespace llmgw::routing;
using namespace llmgw::wire;
using namespace std::chrono_literals;

namespace {

config::topology four_replicas() {
  config::topology t;
  t.block_size = 4;
  t.router.tie_margin = 0.05;
  // Round rates: 1 ms per prompt token, 1 ms per step, 1 ms per decoding
  // request per step.
  t.router.prefill_ms_per_token = 1;
  t.router.step_ms = 1;
  t.router.decode_ms_per_request = 1;
  t.router.speculative_ttl = std::chrono::milliseconds(0); // tests that want them set it
  config::node_spec a;
  a.name = "agent-a";
  a.roles.agent = true;
  for (int i = 0; i < 4; ++i) {
    config::engine_spec e;
    e.replica = "r" + std::to_string(i);
    e.model = "llama";
    e.url = "http://127.0.0.1:800" + std::to_string(i);
    e.kv_events = true;
    e.canary = false; // its engines do not answer completions here
    if (i == 3)
      e.lora = {"sql"};
    a.engines.push_back(e);
  }
  config::engine_spec other;
  other.replica = "q0";
  other.model = "qwen";
  other.url = "http://127.0.0.1:8100";
  a.engines.push_back(other);
  t.nodes.push_back(a);
  return t;
}

const auto t0 = std::chrono::steady_clock::now();

/// Gives `replica` rank `rank` holding `blocks` (a full copy).
void hold(router_core& rc, const std::string& replica, std::vector<kv::block_ref> blocks,
          std::uint32_t rank = 0, kv::parity_state parity = kv::parity_state::verified) {
  rc.kv().apply({replica, rank, 1, true, parity, &blocks, nullptr}, t0);
}

std::vector<kv::block_ref> gpu(std::initializer_list<block_key> keys) {
  std::vector<kv::block_ref> out;
  for (auto k : keys)
    out.push_back({k, kv::medium::gpu});
  return out;
}

route_query query(std::vector<block_key> keys, std::string text = {}) {
  route_query q;
  q.model = "llama";
  q.tokenized = true;
  q.keys = std::move(keys);
  q.chunks = chunk_hashes(text, 8);
  return q;
}

/// Decides and then remembers the prompt, as the router actor does.
route_decision route(router_core& rc, const route_query& q,
                     std::chrono::steady_clock::time_point now) {
  auto d = rc.decide(q, now);
  if (!q.dry_run)
    rc.remember(d, q.chunks, now);
  return d;
}

const replica_score& score_of(const route_decision& d, const std::string& replica) {
  for (const auto& s : d.scores)
    if (s.replica == replica)
      return s;
  static replica_score none;
  ADD_FAILURE() << replica << " is not among the scores";
  return none;
}

} // namespace

TEST(router_core, no_replica_for_an_unknown_model) {
  router_core rc(four_replicas());
  route_query q;
  q.model = "gpt-9";
  auto d = route(rc, q, t0);
  EXPECT_TRUE(d.replica.empty());
  EXPECT_EQ(d.tier, route_tier::none);
  EXPECT_EQ(d.failure, route_failure::unknown_model) << "the gateway answers 404";
  EXPECT_EQ(d.error, "no replica serves model 'gpt-9'");
  EXPECT_EQ(rc.counters().no_replica, 1u);
}

TEST(router_core, without_any_prefix_the_least_loaded_in_turn) {
  router_core rc(four_replicas());
  std::set<std::string> chosen;
  for (int i = 0; i < 4; ++i) {
    auto d = route(rc, query({}), t0);
    EXPECT_EQ(d.tier, route_tier::load);
    chosen.insert(d.replica);
  }
  EXPECT_EQ(chosen.size(), 4u) << "each request went to an idle replica";
  EXPECT_EQ(rc.counters().decisions[static_cast<int>(route_tier::load)], 4u);
  rc.finished({"r2"}, false);
  EXPECT_EQ(route(rc, query({}), t0).replica, "r2") << "the only one with nothing in flight";
}

TEST(router_core, tier2_picks_the_longest_held_prefix_and_its_rank) {
  router_core rc(four_replicas());
  hold(rc, "r0", gpu({1, 2}));
  hold(rc, "r1", gpu({1, 2, 3, 4}), 1);
  hold(rc, "r1", gpu({1}), 0);
  hold(rc, "r2", gpu({2, 3, 4, 5})); // not the prompt's start
  auto d = route(rc, query({1, 2, 3, 4, 5}), t0);
  EXPECT_EQ(d.replica, "r1");
  EXPECT_EQ(d.tier, route_tier::kv);
  EXPECT_DOUBLE_EQ(d.score, 0.8);
  EXPECT_EQ(d.dp_rank, 1) << "rank 1 holds the prefix, rank 0 only one block";
  EXPECT_EQ(d.prompt_blocks, 5u);
  EXPECT_DOUBLE_EQ(score_of(d, "r0").kv, 0.4);
  EXPECT_EQ(score_of(d, "r2").kv_blocks, 0u);
  EXPECT_TRUE(score_of(d, "r2").trusted);
  EXPECT_FALSE(score_of(d, "r3").trusted) << "no KV state arrived for r3";
}

TEST(router_core, cpu_blocks_count_less) {
  router_core rc(four_replicas()); // cpu_weight 0.5
  hold(rc, "r0", gpu({1, 2, 3}));
  hold(rc, "r1",
       {{1, kv::medium::cpu}, {2, kv::medium::cpu}, {3, kv::medium::cpu}, {4, kv::medium::cpu}});
  auto d = route(rc, query({1, 2, 3, 4}), t0);
  EXPECT_EQ(d.replica, "r0");
  EXPECT_DOUBLE_EQ(score_of(d, "r1").kv, 0.5);
  EXPECT_EQ(score_of(d, "r1").kv_blocks, 4u);
}

/// A prompt of `blocks` blocks (keys 1..blocks) and one token more.
route_query long_query(block_key blocks) {
  std::vector<block_key> keys;
  for (block_key k = 1; k <= blocks; ++k)
    keys.push_back(k);
  auto q = query(keys);
  q.prompt_tokens = blocks * 4 + 1;
  return q;
}

std::vector<kv::block_ref> first_blocks(block_key n) {
  std::vector<kv::block_ref> out;
  for (block_key k = 1; k <= n; ++k)
    out.push_back({k, kv::medium::gpu});
  return out;
}

TEST(router_core, costs_within_the_margin_go_to_the_least_loaded) {
  router_core rc(four_replicas());
  hold(rc, "r0", first_blocks(25)); // 100 of the 201 tokens
  hold(rc, "r1", first_blocks(25));
  auto first = route(rc, long_query(50), t0);
  EXPECT_EQ(first.replica, "r0") << "equal costs and loads: the first in turn";
  EXPECT_EQ(first.uncached_tokens, 101u);
  EXPECT_DOUBLE_EQ(first.cost_ms, 101 + 1);
  rc.first_token(progress_of(first), 102); // r0 now decodes one request
  auto d = route(rc, long_query(50), t0);
  EXPECT_DOUBLE_EQ(score_of(d, "r0").cost_ms, 101 + (1 + 1));
  EXPECT_EQ(d.replica, "r1") << "103 ms is within 5% of 102 ms: the less loaded wins";
  EXPECT_EQ(d.tier, route_tier::kv);
}

TEST(router_core, a_queue_outweighs_a_cache_hit) {
  router_core rc(four_replicas());
  hold(rc, "r0", first_blocks(40)); // all of a 161-token prompt but its last token
  // Each request decodes on r0 after its first token: with i of them, r0
  // costs 1 (prefill) + 1 x (1 + i) ms; an empty replica 161 + 1 ms.
  int moved_at = -1;
  for (int i = 0; i < 200 && moved_at < 0; ++i) {
    auto d = route(rc, long_query(40), t0);
    if (d.replica != "r0") {
      moved_at = i;
      EXPECT_EQ(d.tier, route_tier::load);
      EXPECT_DOUBLE_EQ(score_of(d, "r0").cost_ms, 171);
      EXPECT_EQ(score_of(d, "r0").decoding, 169u);
      EXPECT_EQ(score_of(d, "r0").cached_tokens, 160u);
      EXPECT_EQ(score_of(d, "r1").uncached_tokens, 161u);
    } else {
      EXPECT_EQ(d.tier, route_tier::kv);
      EXPECT_DOUBLE_EQ(d.cost_ms, 2.0 + i);
      rc.first_token(progress_of(d), d.model_ms);
    }
  }
  EXPECT_EQ(moved_at, 169)
    << "with 169 decoding there, r0 costs 171 ms: more than 5% above an empty replica's 162 ms "
       "(within 5%, the replica holding the prompt wins the tie)";
  EXPECT_EQ(rc.counters().load_overrides, 1u);
}

TEST(router_core, prompt_tokens_waiting_for_their_first_token_count_as_queue) {
  router_core rc(four_replicas());
  hold(rc, "r0", first_blocks(40));
  auto a = route(rc, long_query(40), t0);
  EXPECT_EQ(a.replica, "r0");
  EXPECT_EQ(a.uncached_tokens, 1u);
  // A 400-token prompt nobody holds goes to r1 and is not started yet.
  auto other = query({});
  other.prompt_tokens = 400;
  other.tokenized = true;
  auto b = route(rc, other, t0);
  EXPECT_NE(b.replica, "r0") << "r0 has a request queued: the empty ones cost less";
  auto c = route(rc, other, t0);
  EXPECT_NE(c.replica, b.replica) << "401 ms of queue on " << b.replica;
  rc.finished(progress_of(b), false);
  auto on_b = route(rc, other, t0);
  EXPECT_DOUBLE_EQ(score_of(on_b, b.replica).cost_ms, 401) << "its queue is gone";
}

TEST(router_core, the_cost_scale_learns_from_observed_first_tokens) {
  router_core rc(four_replicas());
  auto q = query({});
  q.prompt_tokens = 99;
  auto d = route(rc, q, t0);
  EXPECT_DOUBLE_EQ(d.model_ms, 100);
  rc.first_token(progress_of(d), 300); // three times slower than estimated
  rc.finished(progress_of(d), true);
  auto dry = q;
  dry.dry_run = true;
  auto again = rc.decide(dry, t0);
  EXPECT_DOUBLE_EQ(score_of(again, d.replica).scale, 0.8 + 0.2 * 3);
  EXPECT_DOUBLE_EQ(score_of(again, d.replica).cost_ms, 100 * 1.4);
  EXPECT_NE(again.replica, d.replica) << "the slower replica costs more";
  rc.first_token(progress_of(d), 1e9); // an outlier moves it by a bounded step
  EXPECT_LE(score_of(rc.decide(dry, t0), d.replica).scale, 0.8 * 1.4 + 0.2 * 10 + 1e-9);
}

TEST(router_core, the_engines_own_load_counts_other_gateways_work) {
  auto topo = four_replicas();
  topo.router.engine_load_max_age = 2000ms;
  router_core rc(topo);
  auto q = query({});
  q.prompt_tokens = 99; // 100 ms anywhere: nothing is cached
  auto first = route(rc, q, t0);
  ASSERT_EQ(first.replica, "r0");
  rc.finished(progress_of(first), false, std::nullopt,
              t0 + 10ms); // the mean prefill is now 99 tokens
  // r0's engine, read after that, runs 3 requests and has 2 waiting that
  // this gateway never sent (another gateway's): 2 x 99 tokens of queue.
  rc.engine_load("r0", 3, 2, 800, t0 + 50ms);
  auto dry = q;
  dry.dry_run = true;
  auto d = rc.decide(dry, t0 + 100ms);
  const auto& r0 = score_of(d, "r0");
  EXPECT_TRUE(r0.engine_load);
  EXPECT_EQ(r0.engine_waiting, 2u);
  EXPECT_EQ(r0.engine_kv_usage_permille, 800);
  EXPECT_EQ(r0.others_queued_tokens, 198u);
  EXPECT_EQ(r0.decoding, 3u);
  EXPECT_DOUBLE_EQ(r0.cost_ms, 99 + 198 + 1 * (1 + 3));
  EXPECT_NE(d.replica, "r0") << "the idle replicas cost 100 ms";
  EXPECT_FALSE(score_of(d, "r1").engine_load) << "r1's engine never reported";
  // A request of this gateway's sent after the reading is not in it: the
  // others' work stays 2 requests.
  auto q2 = q;
  q2.exclude = {"r1", "r2", "r3"};
  auto mine = route(rc, q2, t0 + 100ms);
  ASSERT_EQ(mine.replica, "r0");
  EXPECT_EQ(score_of(rc.decide(dry, t0 + 150ms), "r0").others_queued_tokens, 198u);
  // Read again with it waiting there: 3 waiting, one of them this gateway's.
  rc.engine_load("r0", 3, 3, 800, t0 + 200ms);
  EXPECT_EQ(score_of(rc.decide(dry, t0 + 210ms), "r0").others_queued_tokens, 198u);
  // It starts after that reading: still one of the 3, not another gateway's.
  rc.first_token(progress_of(mine), 50, t0 + 250ms);
  EXPECT_EQ(score_of(rc.decide(dry, t0 + 260ms), "r0").others_queued_tokens, 198u);
  // A reading that holds fewer requests than this gateway has there (it
  // lags) counts no others' work, and no negative one.
  auto two = route(rc, q2, t0 + 270ms);
  auto three = route(rc, q2, t0 + 280ms);
  rc.engine_load("r0", 0, 0, 800, t0 + 290ms);
  auto lagging = score_of(rc.decide(dry, t0 + 295ms), "r0");
  EXPECT_EQ(lagging.others_queued_tokens, 0u);
  EXPECT_EQ(lagging.decoding, 1u) << "its own decoding request, whatever the engine said";
  rc.finished(progress_of(two), false, std::nullopt, t0 + 296ms);
  rc.finished(progress_of(three), false, std::nullopt, t0 + 297ms);
  rc.engine_load("r0", 3, 3, 800, t0 + 298ms);
  // An older reading than the one held changes nothing; a stale one stops counting.
  rc.engine_load("r0", 50, 50, 800, t0);
  EXPECT_EQ(score_of(rc.decide(dry, t0 + 300ms), "r0").engine_waiting, 3u);
  auto late = rc.decide(dry, t0 + 298ms + 2001ms);
  EXPECT_FALSE(score_of(late, "r0").engine_load);
  EXPECT_EQ(score_of(late, "r0").others_queued_tokens, 0u);
  rc.engine_load("r0", 3, 2, 800, t0 + 3000ms);
  rc.forget_engine_load("r0"); // its agent went away
  EXPECT_FALSE(score_of(rc.decide(dry, t0 + 3000ms), "r0").engine_load);
}

TEST(router_core, tier1_when_tokenization_failed) {
  router_core rc(four_replicas());
  std::string text(64, 'p');
  hold(rc, "r0", gpu({1, 2}));
  auto first = route(rc, query({}, text), t0); // by load; remembered for tier 1
  ASSERT_EQ(first.tier, route_tier::load);
  rc.finished(progress_of(first), false);
  route_query q = query({}, text + "and more text");
  q.tokenized = false;
  auto d = route(rc, q, t0);
  EXPECT_EQ(d.replica, first.replica);
  EXPECT_EQ(d.tier, route_tier::approx);
  EXPECT_DOUBLE_EQ(d.score, 1.0 * 8 / 9) << "8 of the 9 chunks were sent there";
}

TEST(router_core, tier1_entries_past_the_ttl_do_not_score) {
  auto topo = four_replicas();
  topo.router.tier1_ttl = std::chrono::seconds(60);
  router_core rc(topo);
  std::string text(64, 'p');
  auto first = route(rc, query({}, text), t0);
  rc.finished(progress_of(first), false);
  auto q = query({}, text);
  q.tokenized = false;
  EXPECT_EQ(route(rc, q, t0 + 30s).tier, route_tier::approx);
  rc.finished(progress_of(first), false);
  auto late = q;
  late.dry_run = true;
  EXPECT_EQ(rc.decide(late, t0 + 120s).tier, route_tier::load)
    << "nothing was inserted since, and the entries are 90 s past their last use";
}

TEST(router_core, tier1_when_tier2_finds_nothing) {
  router_core rc(four_replicas());
  std::string text(64, 'p');
  auto first = route(rc, query({}, text), t0);
  rc.finished(progress_of(first), false);
  hold(rc, "r0", gpu({7}));
  hold(rc, "r1", gpu({7}));
  auto d = route(rc, query({1, 2}, text), t0);
  EXPECT_EQ(d.tier, route_tier::approx);
  EXPECT_EQ(d.replica, first.replica);
}

TEST(router_core, untrusted_replicas_are_scored_by_tier1_beside_trusted_ones) {
  router_core rc(four_replicas());
  std::string text(80, 't');
  // Send the text to r2 (no KV state) by excluding the others.
  auto q = query({}, text);
  q.exclude = {"r0", "r1", "r3"};
  ASSERT_EQ(route(rc, q, t0).replica, "r2");
  rc.finished({"r2"}, false);
  hold(rc, "r0", gpu({1}));                                         // kv 0.25
  hold(rc, "r1", gpu({1, 2, 3, 4}), 0, kv::parity_state::mismatch); // not trusted
  auto d = route(rc, query({1, 2, 3, 4}, text), t0);
  EXPECT_FALSE(score_of(d, "r1").trusted) << "a hash mismatch is never routed on";
  EXPECT_EQ(d.replica, "r2") << "tier 1's 1.0 for r2 beats r0's 0.25 by tier 2";
  EXPECT_EQ(d.tier, route_tier::approx);
  EXPECT_DOUBLE_EQ(score_of(d, "r0").kv, 0.25);
}

TEST(router_core, a_partial_state_scores_by_the_better_of_the_index_and_tier1) {
  router_core rc(four_replicas());
  for (const char* r : {"r0", "r1", "r2", "r3"})
    hold(rc, r, gpu({}));
  auto q = query({1, 2, 3, 4}, std::string(64, 'p'));
  auto first = route(rc, q, t0);
  ASSERT_EQ(first.tier, route_tier::load) << "nobody holds anything yet";
  // An unfilled gap emptied the sender's mirror of the chosen replica: the
  // engine may still hold the prompt's blocks, which tier 1 remembers.
  std::vector<kv::block_ref> none;
  rc.kv().apply({first.replica, 0, 2, true, kv::parity_state::unknown, &none, nullptr, true}, t0);
  hold(rc, "r2" == first.replica ? "r1" : "r2", gpu({1})); // another holds one block
  rc.finished(progress_of(first), false);
  auto d = route(rc, q, t0 + 1s);
  EXPECT_EQ(d.replica, first.replica) << "tier 1 knows more than the partial index";
  EXPECT_EQ(d.tier, route_tier::approx);
  EXPECT_TRUE(score_of(d, first.replica).partial);
  // Once the engine is known to be empty (trusted, not partial), tier 1's
  // memory no longer counts for it.
  rc.kv().apply({first.replica, 0, 3, true, kv::parity_state::unknown, &none, nullptr, false}, t0);
  rc.finished(progress_of(d), false);
  rc.forget_sent(first.replica);
  d = route(rc, q, t0 + 2s);
  EXPECT_NE(d.replica, first.replica);
  EXPECT_EQ(d.tier, route_tier::kv) << "the holder of block 1";
}

TEST(router_core, a_dry_run_changes_nothing) {
  router_core rc(four_replicas());
  std::string text(64, 'd');
  auto q = query({}, text);
  q.dry_run = true;
  auto d = route(rc, q, t0);
  EXPECT_EQ(d.tier, route_tier::load);
  EXPECT_EQ(rc.counters().decisions[static_cast<int>(route_tier::load)], 0u);
  for (const auto& r : rc.replicas())
    EXPECT_EQ(r.outstanding, 0u);
  q.dry_run = false;
  q.tokenized = false;
  EXPECT_EQ(route(rc, q, t0).tier, route_tier::load) << "the dry run left no tier-1 trace";
}

TEST(router_core, excluded_and_down_replicas) {
  router_core rc(four_replicas());
  hold(rc, "r0", gpu({1, 2}));
  auto q = query({1, 2});
  q.exclude = {"r0"};
  auto d = route(rc, q, t0);
  EXPECT_NE(d.replica, "r0");
  EXPECT_EQ(d.tier, route_tier::load);
  rc.finished(progress_of(d), false);
  rc.mark_down("r0", t0 + 10s);
  EXPECT_NE(route(rc, query({1, 2}), t0).replica, "r0") << "down for 10 s";
  auto back = route(rc, query({1, 2}), t0 + 11s);
  EXPECT_EQ(back.replica, "r0") << "back after that";
  rc.finished(progress_of(back), false);
  for (const char* r : {"r0", "r1", "r2", "r3"})
    rc.mark_down(r, t0 + 60s);
  d = route(rc, query({1, 2}), t0 + 20s);
  EXPECT_EQ(d.replica, "r0") << "every candidate down: try them anyway, best first";
  EXPECT_TRUE(score_of(d, "r0").down);
  q.exclude = {"r0", "r1", "r2", "r3"};
  d = route(rc, q, t0);
  EXPECT_EQ(d.failure, route_failure::all_excluded) << "the gateway answers 503";
  EXPECT_EQ(d.error, "every replica serving model 'llama' was tried");
}

TEST(router_core, lora_adapters_route_to_the_replicas_serving_them) {
  auto topo = four_replicas();
  router_core rc(topo);
  EXPECT_TRUE(topo.is_adapter("sql"));
  EXPECT_FALSE(topo.is_adapter("llama")) << "a base model hashes without an adapter name";
  route_query q;
  q.model = "sql";
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(route(rc, q, t0).replica, "r3");
  q.model = "qwen";
  EXPECT_EQ(route(rc, q, t0).replica, "q0");
  q.model = "mistral";
  EXPECT_EQ(route(rc, q, t0).failure, route_failure::unknown_model);
}

TEST(router_core, a_routed_prompt_counts_for_its_replica_at_once) {
  auto t = four_replicas();
  t.router.speculative_ttl = 2s;
  router_core rc(t);
  for (const char* r : {"r0", "r1", "r2", "r3"})
    hold(rc, r, gpu({}));
  auto first = route(rc, long_query(40), t0);
  EXPECT_EQ(first.tier, route_tier::load) << "nobody holds it";
  auto second = route(rc, long_query(40), t0 + 1ms);
  EXPECT_EQ(second.replica, first.replica) << "the burst follows the first, before any event";
  EXPECT_EQ(second.tier, route_tier::kv);
  auto h = *rc.kv().find(first.replica, 0);
  EXPECT_EQ(rc.kv().info(h).speculative, 40u);
  rc.finished(progress_of(first), false);
  rc.finished(progress_of(second), false);
  auto later = rc.decide(long_query(40), t0 + 3s);
  EXPECT_EQ(later.tier, route_tier::load) << "nothing confirmed them: expired";
  EXPECT_EQ(rc.kv().info(h).speculative_expired, 40u);
}

TEST(router_core, an_answer_short_of_the_prediction_drops_the_blocks_it_lacked) {
  router_core rc(four_replicas());
  for (const char* r : {"r0", "r2", "r3"})
    hold(rc, r, gpu({}));
  hold(rc, "r1", first_blocks(10));
  auto d = route(rc, long_query(10), t0);
  ASSERT_EQ(d.replica, "r1");
  EXPECT_EQ(d.predicted_cached_tokens, 40u);
  EXPECT_NE(d.watch, 0u);
  rc.finished(progress_of(d), false, 8); // the engine had evicted blocks 3..10
  EXPECT_EQ(rc.kv().blocks().count(*rc.kv().find("r1", 0)), 2u);
  EXPECT_EQ(rc.replicas()[1].shortfall_drops, 8u);
  EXPECT_EQ(rc.replicas()[1].recent_shortfalls(), 1u);
  auto next = rc.decide(long_query(10), t0 + 1ms);
  EXPECT_EQ(score_of(next, "r1").kv_blocks, 2u) << "the next decision knows";
  rc.finished(progress_of(next), false); // failed: no answer, nothing checked
  EXPECT_EQ(rc.kv().watching(), 0u);
  EXPECT_EQ(rc.replicas()[1].checks_seen, 1u);
}

TEST(router_core, persistent_shortfalls_distrust_a_replica_until_its_answers_agree_again) {
  auto t = four_replicas(); // distrust_shortfall_share 0.5: more than 16 of the last 32
  router_core rc(t);
  for (const char* r : {"r0", "r2", "r3"})
    hold(rc, r, gpu({}));
  hold(rc, "r1", first_blocks(4));
  auto h = *rc.kv().find("r1", 0);
  // One answer: a block short (its event lost), or right. A short one
  // drops block 4; the engine's own prefill stores it again.
  auto answer = [&](bool short_of_it) {
    auto d = rc.decide(long_query(4), t0);
    rc.finished(progress_of(d), false,
                short_of_it ? d.predicted_cached_tokens - 4 : d.predicted_cached_tokens);
    auto again = gpu({4});
    rc.kv().apply({"r1", 0, 1, false, kv::parity_state::verified, &again, nullptr}, t0);
    return d;
  };
  for (int i = 0; i < 16; ++i)
    answer(false);
  for (int i = 0; i < 16; ++i)
    answer(true);
  EXPECT_FALSE(rc.replicas()[1].distrusted) << "16 of 32 is not more than half";
  answer(true); // the oldest right answer leaves the window: 17 of 32
  ASSERT_TRUE(rc.replicas()[1].distrusted);
  EXPECT_EQ(rc.replicas()[1].distrusts, 1u);
  EXPECT_EQ(rc.replicas()[1].answers_checked, 33u) << "counted for good, not only the window";
  EXPECT_EQ(rc.replicas()[1].answers_short, 17u);
  auto d = answer(false);
  EXPECT_TRUE(score_of(d, "r1").distrusted);
  EXPECT_FALSE(score_of(d, "r1").trusted);
  EXPECT_FALSE(score_of(d, "r1").by_kv) << "tier 1 scores it";
  EXPECT_EQ(d.tier, route_tier::load) << "no tier-1 memory, no trusted holder of the prompt";
  EXPECT_EQ(score_of(d, "r1").kv_blocks, 4u) << "what the index says is still reported";
  // Right answers bring it back once at most 4 of the last 32 fell short;
  // its answers are checked against what the index would have predicted.
  int from_r1 = 0;
  for (int i = 0; i < 400 && rc.replicas()[1].distrusted; ++i) {
    auto e = rc.decide(long_query(4), t0);
    if (e.replica == "r1") { // tier 1 routes now: equal costs go in turn
      ++from_r1;
      EXPECT_EQ(e.predicted_cached_tokens, 16u);
      EXPECT_NE(e.watch, 0u);
    } else {
      EXPECT_EQ(e.watch, 0u) << "the others hold nothing";
    }
    rc.finished(progress_of(e), false, e.predicted_cached_tokens);
  }
  EXPECT_GT(from_r1, 0);
  EXPECT_FALSE(rc.replicas()[1].distrusted);
  EXPECT_LE(rc.replicas()[1].recent_shortfalls(), 4u);
  EXPECT_EQ(route(rc, long_query(4), t0).tier, route_tier::kv);
  EXPECT_EQ(rc.kv().blocks().count(h), 4u);
}

/// The four replicas, distrusting at `share`.
config::topology distrusting_at(double share) {
  auto t = four_replicas();
  t.router.distrust_shortfall_share = share;
  return t;
}

/// `times` answers from r1 (which holds blocks 1 and 2) that found nothing
/// cached; its index entry is restored after each.
void answers_found_nothing(router_core& rc, int times) {
  hold(rc, "r1", first_blocks(2));
  for (int i = 0; i < times; ++i) {
    auto d = rc.decide(long_query(2), t0);
    ASSERT_EQ(d.replica, "r1");
    rc.finished(progress_of(d), false, 0);
    hold(rc, "r1", first_blocks(2));
  }
}

TEST(router_core, an_emptied_cache_ends_distrust) {
  router_core rc(distrusting_at(0.25));
  answers_found_nothing(rc, 32);
  ASSERT_TRUE(rc.replicas()[1].distrusted);
  rc.forget_sent("r1"); // a clear, a restart or an exit: the index starts over
  EXPECT_FALSE(rc.replicas()[1].distrusted);
  EXPECT_EQ(rc.replicas()[1].checks_seen, 0u);
}

TEST(router_core, a_share_of_zero_never_distrusts) {
  router_core rc(distrusting_at(0));
  answers_found_nothing(rc, 40);
  EXPECT_FALSE(rc.replicas()[1].distrusted);
  EXPECT_EQ(rc.replicas()[1].recent_shortfalls(), 32u);
}

TEST(router_core, an_answer_about_a_state_reset_since_is_not_checked) {
  router_core rc(four_replicas());
  hold(rc, "r1", first_blocks(4));
  auto d = rc.decide(long_query(4), t0);
  ASSERT_EQ(d.replica, "r1");
  hold(rc, "r1", first_blocks(4)); // a full copy arrives meanwhile
  rc.finished(progress_of(d), false, 0);
  EXPECT_EQ(rc.replicas()[1].checks_seen, 0u);
  EXPECT_EQ(rc.kv().blocks().count(*rc.kv().find("r1", 0)), 4u) << "nothing dropped";
}

TEST(router_core, with_several_ranks_the_checked_rank_is_the_one_the_engine_is_told) {
  auto t = four_replicas();
  t.nodes[0].engines[1].dp_size = 2;
  t.router.distrust_shortfall_share = 0.25;
  router_core rc(t);
  for (const char* r : {"r0", "r2", "r3"})
    hold(rc, r, gpu({}));
  hold(rc, "r1", gpu({}), 0);
  hold(rc, "r1", first_blocks(4), 1);
  auto d = rc.decide(long_query(4), t0);
  ASSERT_EQ(d.replica, "r1");
  EXPECT_EQ(d.dp_rank, 1);
  EXPECT_NE(d.watch, 0u);
  rc.finished(progress_of(d), false, 16);
  // Distrusted, tier 1 routes it; the rank is still told, so it is checked.
  for (int i = 0; i < 32; ++i) {
    auto e = rc.decide(long_query(4), t0);
    rc.finished(progress_of(e), false, 0);
    hold(rc, "r1", first_blocks(4), 1);
  }
  ASSERT_TRUE(rc.replicas()[1].distrusted);
  bool checked = false;
  for (int i = 0; i < 40 && !checked; ++i) {
    auto e = rc.decide(long_query(4), t0);
    if (e.replica == "r1") {
      EXPECT_NE(e.tier, route_tier::kv);
      EXPECT_EQ(e.dp_rank, 1) << "told, though tier 1 chose it";
      EXPECT_NE(e.watch, 0u);
      checked = true;
    }
    rc.finished(progress_of(e), false, e.predicted_cached_tokens);
  }
  EXPECT_TRUE(checked);
}

TEST(router_core, probes_mark_a_replica_down_and_a_success_ends_an_unreachable_mark) {
  router_core rc(four_replicas());
  EXPECT_FALSE(rc.probe_result("r1", false, t0)) << "one failure can be a hiccup";
  EXPECT_FALSE(rc.replicas()[1].down(t0));
  EXPECT_FALSE(rc.probe_result("r1", true, t0));
  EXPECT_FALSE(rc.probe_result("r1", false, t0)) << "failures must come in a row";
  EXPECT_FALSE(rc.replicas()[1].down(t0));
  EXPECT_TRUE(rc.probe_result("r1", false, t0)) << "two in a row: down";
  EXPECT_TRUE(rc.replicas()[1].down(t0 + 1h)) << "until a probe succeeds";
  EXPECT_FALSE(rc.probe_result("r1", false, t0)) << "already down";
  EXPECT_TRUE(rc.probe_result("r1", true, t0)) << "back";
  EXPECT_FALSE(rc.replicas()[1].down(t0));
  rc.mark_down("r1", t0 + 10s); // unreachable (a refused connection)
  EXPECT_TRUE(rc.probe_result("r1", true, t0 + 1s)) << "it answers again: back at once";
  EXPECT_FALSE(rc.replicas()[1].down(t0 + 1s));
  rc.mark_down("r1", t0 + 10s, false); // server errors
  EXPECT_FALSE(rc.probe_result("r1", true, t0 + 1s));
  EXPECT_TRUE(rc.replicas()[1].down(t0 + 1s)) << "alive but failing: the mark lasts";
  EXPECT_FALSE(rc.replicas()[1].down(t0 + 10s));
  auto d = rc.decide(long_query(1), t0 + 1s);
  EXPECT_NE(d.replica, "r1");
}
