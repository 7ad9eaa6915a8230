// llmgw-sim's tokenizer and KV cache: vLLM's hashes, vLLM's cache rules, and
// its events followed by the agent's own block table to the same state.
#include "apps/llmgw-sim/sim_cache.hpp"
#include "apps/llmgw-sim/sim_engine.hpp"
#include "apps/llmgw-sim/sim_text.hpp"
#include "kv/block_table.hpp"
#include "tests/support/captures.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <random>

using namespace llmgw;
using namespace llmgw::sim;
namespace json = boost::json;

namespace {

std::vector<std::uint32_t> range(std::uint32_t from, std::uint32_t n) {
  std::vector<std::uint32_t> v(n);
  for (std::uint32_t i = 0; i < n; ++i)
    v[i] = from + i;
  return v;
}

std::size_t count(const std::vector<wire::kv_event>& evs, wire::event_kind k) {
  return static_cast<std::size_t>(
    std::count_if(evs.begin(), evs.end(), [k](const wire::kv_event& e) { return e.kind == k; }));
}

} // namespace

TEST(sim_text, equal_prefixes_give_equal_leading_tokens) {
  auto a = tokenize("You are a helpful assistant. Tell me", true);
  auto b = tokenize("You are a helpful assistant. Write a poem", true);
  EXPECT_EQ(a[0], 1u) << "BOS";
  EXPECT_EQ(tokenize("abcd", false).size(), 1u);
  std::size_t same = 0;
  while (same < a.size() && a[same] == b[same])
    ++same;
  EXPECT_EQ(same, 1u + 28 / 4) << "BOS and the seven 4-byte chunks of the shared 28 bytes";
  std::string chat, err;
  ASSERT_TRUE(
    chat_prompt(json::parse(R"([{"role":"user","content":"hi"}])"), true, false, chat, err));
  EXPECT_EQ(chat, "<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE(chat_prompt(json::parse(R"([{"content":"hi"}])"), true, false, chat, err));
  EXPECT_EQ(err, "messages[0].role must be a string");
}

TEST(sim_cache, stores_the_hashes_vllm_computes) {
  auto doc = test::read_json(test::capture_path("S3_lora_salt.map.int.json"));
  for (const auto& r : doc.at("requests").as_array()) {
    kv_cache cache({4096, 16, "0", true, true});
    std::vector<std::uint32_t> tokens;
    for (const auto& t : r.at("tokens").as_array())
      tokens.push_back(static_cast<std::uint32_t>(t.as_int64()));
    wire::extra_key_recipe extras;
    if (!r.at("lora_name").is_null())
      extras.lora_name = json::value_to<std::string>(r.at("lora_name"));
    if (!r.at("cache_salt").is_null())
      extras.cache_salt = json::value_to<std::string>(r.at("cache_salt"));
    std::vector<wire::kv_event> evs;
    auto a = cache.admit(tokens, extras, std::nullopt, 0, evs);
    ASSERT_TRUE(a);
    ASSERT_EQ(evs.size(), 1u);
    const auto& want = r.at("block_hashes_u64").as_array();
    ASSERT_EQ(evs[0].block_hashes.size(), want.size()) << r.at("id");
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(evs[0].block_hashes[i].key, json::value_to<std::uint64_t>(want[i])) << r.at("id");
  }
}

TEST(sim_cache, a_repeated_prompt_hits_all_but_its_last_token) {
  kv_cache cache({64, 16, "0", true, true});
  std::vector<wire::kv_event> evs;
  auto prompt = range(100, 40); // 2 full blocks and 8 tokens
  auto a = cache.admit(prompt, {}, std::nullopt, 8, evs);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->cached_tokens, 0u);
  EXPECT_EQ(a->blocks.size(), 3u) << "40 prompt + 8 generated tokens";
  ASSERT_EQ(count(evs, wire::event_kind::block_stored), 1u);
  EXPECT_EQ(evs[0].block_hashes.size(), 2u);
  EXPECT_FALSE(evs[0].parent_block_hash);
  for (std::uint32_t t = 0; t < 8; ++t)
    cache.append(*a, 1000 + t, evs);
  EXPECT_EQ(evs.size(), 2u) << "the third block filled during decode: a store of its own";
  EXPECT_TRUE(evs[1].parent_block_hash);
  cache.release(*a);
  evs.clear();
  auto b = cache.admit(prompt, {}, std::nullopt, 1, evs);
  EXPECT_EQ(b->cached_tokens, 32u);
  EXPECT_EQ(count(evs, wire::event_kind::block_stored), 0u) << "nothing new to store";
  cache.release(*b);
  auto aligned = range(500, 32);
  auto c = cache.admit(aligned, {}, std::nullopt, 0, evs);
  cache.release(*c);
  auto d = cache.admit(aligned, {}, std::nullopt, 0, evs);
  EXPECT_EQ(d->cached_tokens, 16u) << "the last block of an aligned prompt is recomputed";
}

TEST(sim_cache, eviction_takes_the_least_recently_freed_tail_first) {
  kv_cache cache({4, 4, "0", true, true});
  std::vector<wire::kv_event> evs;
  auto a = cache.admit(range(1, 8), {}, std::nullopt, 0, evs);   // blocks A1 A2
  auto b = cache.admit(range(100, 8), {}, std::nullopt, 0, evs); // blocks B1 B2
  ASSERT_TRUE(a && b);
  std::vector<wire::kv_event> none;
  EXPECT_FALSE(cache.admit(range(200, 4), {}, std::nullopt, 0, none)) << "all blocks in use";
  EXPECT_TRUE(none.empty());
  cache.release(*a); // free: A2, A1 (tail first)
  evs.clear();
  auto c = cache.admit(range(300, 4), {}, std::nullopt, 0, evs);
  ASSERT_TRUE(c);
  ASSERT_EQ(count(evs, wire::event_kind::block_removed), 1u);
  EXPECT_EQ(evs[0].block_hashes.size(), 1u) << "one hash per evicted block";
  cache.release(*c);
  std::vector<wire::kv_event> again;
  auto a2 = cache.admit(range(1, 8), {}, std::nullopt, 0, again);
  ASSERT_TRUE(a2);
  EXPECT_EQ(a2->cached_tokens, 4u) << "A1 survived: the tail block A2 went first";
}

TEST(sim_cache, reset_waits_for_running_requests) {
  kv_cache cache({16, 4, "0", true, true});
  std::vector<wire::kv_event> evs;
  auto a = cache.admit(range(1, 9), {}, std::nullopt, 0, evs);
  EXPECT_FALSE(cache.reset(evs));
  cache.release(*a);
  evs.clear();
  EXPECT_TRUE(cache.reset(evs));
  ASSERT_EQ(evs.size(), 1u);
  EXPECT_EQ(evs[0].kind, wire::event_kind::all_blocks_cleared);
  EXPECT_EQ(cache.admit(range(1, 9), {}, std::nullopt, 0, evs)->cached_tokens, 0u);
}

TEST(sim_cache, the_agents_mirror_follows_its_events_to_the_same_state) {
  // Random traffic with shared prefixes, LoRA and salts; every batch goes
  // through the wire (both shapes, both hash forms) into a block table.
  for (bool ints : {true, false})
    for (auto shape : {wire::event_shape::array, wire::event_shape::map}) {
      std::mt19937 rng(ints * 2 + static_cast<int>(shape));
      kv_cache cache({96, 8, "0", ints, true});
      kv::block_table mirror(kv::parity_config{"0", 8});
      std::vector<allocation> running;
      for (int step = 0; step < 3000; ++step) {
        std::vector<wire::kv_event> evs;
        if (rng() % 3 == 0 && !running.empty()) {
          auto i = rng() % running.size();
          cache.release(running[i]);
          running.erase(running.begin() + static_cast<long>(i));
        } else if (rng() % 50 == 0) {
          cache.reset(evs);
        } else {
          auto prompt = range(1, 8 * (rng() % 4));                    // a shared system prompt
          auto own = range(1000 + 10 * (rng() % 20), 1 + rng() % 30); // a user's turn
          prompt.insert(prompt.end(), own.begin(), own.end());
          wire::extra_key_recipe extras;
          if (rng() % 4 == 0)
            extras.lora_name = "sql-lora";
          if (rng() % 5 == 0)
            extras.cache_salt = "tenant-" + std::to_string(rng() % 2);
          auto a = cache.admit(prompt, extras, std::nullopt, rng() % 12, evs);
          if (a) {
            for (std::uint32_t t = 0; t < a->blocks.size() * 8 - a->prompt_tokens && t < 11; ++t)
              cache.append(*a, 5000 + t, evs);
            running.push_back(std::move(*a));
          }
        }
        if (evs.empty())
          continue;
        wire::event_batch b;
        b.ts = step;
        b.events = std::move(evs);
        auto decoded = wire::decode_batch(wire::encode_batch(b, shape));
        ASSERT_TRUE(decoded) << decoded.err().message;
        mirror.apply(*decoded);
      }
      std::vector<wire::block_key> held;
      for (const auto& r : mirror.held())
        held.push_back(r.key);
      EXPECT_EQ(held, cache.hashed_keys()) << "ints " << ints;
      EXPECT_EQ(mirror.parity(), kv::parity_state::verified)
        << "the agent recomputed the sim's hashes and found them equal";
    }
}

TEST(sim_churn, the_blocks_held_stay_at_the_cap_whatever_the_tick_size) {
  // The soak's churn describes a bounded cache, as an engine's stream does:
  // with an odd number of events a tick, removing half (rounded down) added
  // one block a tick for ever, and agents and control nodes grew with it.
  for (std::size_t per_tick : {1u, 2u, 5u, 7u, 250u, 251u, 4096u}) {
    std::size_t held = 0;
    std::size_t most = 0;
    std::size_t removed = 0;
    for (int tick = 0; tick < 20000; ++tick) {
      auto removes = churn_removes(held, per_tick);
      ASSERT_LE(removes, held);
      ASSERT_LE(removes, per_tick);
      held = held - removes + (per_tick - removes);
      removed += removes;
      most = std::max(most, held);
    }
    EXPECT_LE(most, churn_cap) << per_tick << " events a tick";
    EXPECT_GE(held + per_tick, churn_cap) << "it fills up to the cap";
    EXPECT_GT(removed, 0u) << "and then removes";
  }
}
