// The router's block index and the replica registry above it: each rule, and
// a randomized comparison with a plain reference model.
#include "routing/block_index.hpp"
#include "routing/replica_index.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

using namespace llmgw;
using namespace llmgw::routing;
using namespace llmgw::wire;

namespace {

const std::array<double, 3> weights{1.0, 0.5, 0.25};

std::vector<walk_score> walk(block_index& idx, const std::vector<block_key>& keys,
                             const std::vector<holder_id>& candidates) {
  std::vector<walk_score> out;
  idx.walk(keys.data(), keys.size(), candidates, weights, out);
  return out;
}

} // namespace

TEST(block_index, add_remove_and_holds) {
  block_index idx;
  EXPECT_TRUE(idx.add(42, 1, kv::medium::gpu));
  EXPECT_FALSE(idx.add(42, 1, kv::medium::gpu)) << "the same entry twice is one entry";
  EXPECT_TRUE(idx.add(42, 1, kv::medium::cpu)) << "another medium is another entry";
  EXPECT_TRUE(idx.add(42, 2, kv::medium::gpu));
  EXPECT_TRUE(idx.holds(42, 1, kv::medium::cpu));
  EXPECT_FALSE(idx.holds(42, 2, kv::medium::cpu));
  EXPECT_FALSE(idx.holds(43, 1, kv::medium::gpu));
  EXPECT_EQ(idx.entries(), 3u);
  EXPECT_EQ(idx.keys(), 1u);
  EXPECT_EQ(idx.count(1), 2u);
  EXPECT_TRUE(idx.remove(42, 1, kv::medium::gpu));
  EXPECT_FALSE(idx.remove(42, 1, kv::medium::gpu));
  EXPECT_FALSE(idx.remove(99, 1, kv::medium::gpu)) << "unknown key";
  EXPECT_EQ(idx.count(1), 1u);
  EXPECT_TRUE(idx.remove(42, 1, kv::medium::cpu));
  EXPECT_TRUE(idx.remove(42, 2, kv::medium::gpu));
  EXPECT_EQ(idx.keys(), 0u) << "a key nobody holds is erased";
  EXPECT_EQ(idx.entries(), 0u);
}

TEST(block_index, key_zero_is_a_key_like_any_other) {
  block_index idx;
  EXPECT_FALSE(idx.holds(0, 0, kv::medium::gpu));
  EXPECT_TRUE(idx.add(0, 0, kv::medium::gpu));
  EXPECT_TRUE(idx.holds(0, 0, kv::medium::gpu));
  EXPECT_EQ(idx.blocks_of(0), (std::vector<kv::block_ref>{{0, kv::medium::gpu}}));
}

TEST(block_index, many_holders_of_one_key_spill_and_come_back) {
  block_index idx;
  for (holder_id h = 0; h < 40; ++h)
    ASSERT_TRUE(idx.add(7, h, kv::medium::gpu));
  for (holder_id h = 0; h < 40; ++h)
    EXPECT_TRUE(idx.holds(7, h, kv::medium::gpu)) << h;
  EXPECT_FALSE(idx.add(7, 39, kv::medium::gpu));
  for (holder_id h = 0; h < 38; ++h)
    ASSERT_TRUE(idx.remove(7, h, kv::medium::gpu));
  EXPECT_TRUE(idx.holds(7, 38, kv::medium::gpu));
  EXPECT_TRUE(idx.holds(7, 39, kv::medium::gpu));
  EXPECT_FALSE(idx.holds(7, 0, kv::medium::gpu));
  // And up again: the freed pool list is reused.
  for (holder_id h = 100; h < 110; ++h)
    ASSERT_TRUE(idx.add(7, h, kv::medium::cpu));
  EXPECT_EQ(idx.entries(), 12u);
  EXPECT_TRUE(idx.holds(7, 105, kv::medium::cpu));
}

TEST(block_index, drop_forgets_one_holder_only) {
  block_index idx;
  for (block_key k = 1; k <= 5000; ++k) {
    idx.add(k * 0x9E3779B97F4A7C15ull, 3, k % 2 ? kv::medium::gpu : kv::medium::cpu);
    if (k % 3 == 0)
      idx.add(k * 0x9E3779B97F4A7C15ull, 4, kv::medium::gpu);
  }
  auto before = idx.blocks_of(4);
  idx.drop(3);
  EXPECT_EQ(idx.count(3), 0u);
  EXPECT_TRUE(idx.blocks_of(3).empty());
  EXPECT_EQ(idx.blocks_of(4), before);
  EXPECT_EQ(idx.keys(), before.size()) << "keys only holder 3 had are gone";
}

TEST(block_index, the_walk_stops_at_the_first_missing_block_per_candidate) {
  block_index idx;
  std::vector<block_key> prompt{11, 12, 13, 14, 15};
  // Holder 0: all five on GPU. Holder 1: the first two, then a gap.
  // Holder 2: blocks 0-3, block 1 only on CPU, block 2 on both.
  for (auto k : prompt)
    idx.add(k, 0, kv::medium::gpu);
  idx.add(11, 1, kv::medium::gpu);
  idx.add(12, 1, kv::medium::gpu);
  idx.add(14, 1, kv::medium::gpu);
  idx.add(11, 2, kv::medium::gpu);
  idx.add(12, 2, kv::medium::cpu);
  idx.add(13, 2, kv::medium::cpu);
  idx.add(13, 2, kv::medium::gpu);
  idx.add(14, 2, kv::medium::storage);
  auto s = walk(idx, prompt, {0, 1, 2, 5});
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].blocks, 5u);
  EXPECT_DOUBLE_EQ(s[0].weighted, 5.0);
  EXPECT_EQ(s[1].blocks, 2u) << "block 14 after a gap does not count";
  EXPECT_EQ(s[2].blocks, 4u);
  EXPECT_DOUBLE_EQ(s[2].weighted, 1.0 + 0.5 + 1.0 + 0.25) << "the best medium of each block";
  EXPECT_EQ(s[3].holder, 5u);
  EXPECT_EQ(s[3].blocks, 0u) << "a candidate the index never saw";
  s = walk(idx, {99, 11}, {0, 1});
  EXPECT_EQ(s[0].blocks, 0u) << "an unknown first block ends the walk";
  s = walk(idx, {}, {0});
  EXPECT_EQ(s[0].blocks, 0u);
}

TEST(block_index, walks_are_independent_of_each_other) {
  block_index idx;
  idx.add(1, 0, kv::medium::gpu);
  idx.add(2, 1, kv::medium::gpu);
  for (int i = 0; i < 3; ++i) {
    auto s = walk(idx, {1, 2}, {0, 1});
    EXPECT_EQ(s[0].blocks, 1u);
    EXPECT_EQ(s[1].blocks, 0u) << "holder 1 lacks block 1 (it was seen in an earlier walk)";
  }
}

TEST(block_index, randomized_against_a_reference_model) {
  std::mt19937_64 rng(20261202);
  block_index idx;
  std::map<block_key, std::set<std::pair<holder_id, kv::medium>>> model;
  // Few distinct keys with many colliding homes: the low bits repeat, which
  // stresses displacement and backward shifts.
  std::vector<block_key> keys;
  for (int i = 0; i < 3000; ++i)
    keys.push_back(i % 5 == 0 ? static_cast<block_key>(i) : rng());
  for (int step = 0; step < 200000; ++step) {
    auto key = keys[rng() % keys.size()];
    auto h = static_cast<holder_id>(rng() % 9);
    auto m = static_cast<kv::medium>(rng() % 3);
    auto op = rng() % 100;
    if (op < 55) {
      bool fresh = model[key].insert({h, m}).second;
      ASSERT_EQ(idx.add(key, h, m), fresh) << "step " << step;
    } else if (op < 99) {
      auto it = model.find(key);
      bool had = it != model.end() && it->second.erase({h, m}) == 1;
      if (it != model.end() && it->second.empty())
        model.erase(it);
      ASSERT_EQ(idx.remove(key, h, m), had) << "step " << step;
    } else {
      idx.drop(h);
      for (auto it = model.begin(); it != model.end();) {
        for (int mm = 0; mm < 3; ++mm)
          it->second.erase({h, static_cast<kv::medium>(mm)});
        it = it->second.empty() ? model.erase(it) : std::next(it);
      }
    }
  }
  std::size_t entries = 0;
  for (const auto& [k, set] : model)
    entries += set.size();
  EXPECT_EQ(idx.entries(), entries);
  EXPECT_EQ(idx.keys(), model.size());
  for (holder_id h = 0; h < 9; ++h) {
    std::vector<kv::block_ref> expected;
    for (const auto& [k, set] : model)
      for (const auto& [hh, m] : set)
        if (hh == h)
          expected.push_back({k, m});
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(idx.blocks_of(h), expected) << "holder " << h;
    EXPECT_EQ(idx.count(h), expected.size());
  }
  for (auto key : keys)
    for (holder_id h = 0; h < 9; ++h) {
      auto it = model.find(key);
      bool expected = it != model.end() && it->second.count({h, kv::medium::gpu});
      ASSERT_EQ(idx.holds(key, h, kv::medium::gpu), expected);
    }
}

TEST(block_index, memory_per_entry_stays_under_32_bytes_when_keys_are_held_once) {
  block_index idx;
  std::mt19937_64 rng(7);
  double worst = 0;
  for (std::size_t n = 1; n <= 300000; ++n) {
    idx.add(rng(), static_cast<holder_id>(n % 64), kv::medium::gpu);
    if (n >= 1000 && n % 997 == 0)
      worst = std::max(worst, static_cast<double>(idx.memory_bytes()) / idx.entries());
  }
  EXPECT_LE(worst, 32.0) << "the index's layout promises at most 28 bytes + counters";
  EXPECT_GE(worst, 16.0) << "a slot is 16 bytes: less would mean entries are not all counted";
}

TEST(replica_index, a_full_copy_then_changes) {
  replica_index idx;
  auto now = std::chrono::steady_clock::now();
  std::vector<kv::block_ref> first{{1, kv::medium::gpu}, {2, kv::medium::gpu}};
  std::vector<kv::block_ref> more{{3, kv::medium::cpu}};
  std::vector<kv::block_ref> gone{{1, kv::medium::gpu}};
  EXPECT_EQ(idx.apply({"r0", 0, 0, false, kv::parity_state::unknown, &more, nullptr}, now),
            apply_outcome::needs_reset)
    << "changes before a full copy would build on nothing";
  EXPECT_EQ(idx.apply({"r0", 0, 3, true, kv::parity_state::verified, &first, nullptr}, now),
            apply_outcome::applied);
  auto h = *idx.find("r0", 0);
  EXPECT_TRUE(idx.trusted(h));
  EXPECT_EQ(idx.info(h).epoch, 3u);
  EXPECT_EQ(idx.apply({"r0", 0, 3, false, kv::parity_state::verified, &more, &gone}, now),
            apply_outcome::applied);
  EXPECT_EQ(idx.blocks().blocks_of(h),
            (std::vector<kv::block_ref>{{2, kv::medium::gpu}, {3, kv::medium::cpu}}));
  EXPECT_EQ(idx.info(h).fingerprint, fingerprint_of(idx.blocks().blocks_of(h)))
    << "kept up to date as blocks come and go";
  EXPECT_NE(idx.info(h).fingerprint, fingerprint_of(first));
  EXPECT_EQ(idx.apply({"r0", 0, 2, false, kv::parity_state::verified, &first, nullptr}, now),
            apply_outcome::stale_epoch);
  EXPECT_EQ(idx.blocks().count(h), 2u) << "a stale change changes nothing";
  // A reset with a new epoch replaces everything.
  EXPECT_EQ(idx.apply({"r0", 0, 4, true, kv::parity_state::unknown, &gone, nullptr}, now),
            apply_outcome::applied);
  EXPECT_EQ(idx.blocks().blocks_of(h), gone);
  EXPECT_EQ(idx.info(h).resets, 2u);
}

TEST(replica_index, ranks_are_separate_holders_and_drop_takes_them_all) {
  replica_index idx;
  auto now = std::chrono::steady_clock::now();
  std::vector<kv::block_ref> a{{1, kv::medium::gpu}};
  std::vector<kv::block_ref> b{{2, kv::medium::gpu}};
  idx.apply({"r0", 0, 0, true, kv::parity_state::unknown, &a, nullptr}, now);
  idx.apply({"r0", 1, 0, true, kv::parity_state::unknown, &b, nullptr}, now);
  idx.apply({"r1", 0, 0, true, kv::parity_state::unknown, &a, nullptr}, now);
  std::vector<holder_id> trusted;
  idx.trusted_holders("r0", trusted);
  EXPECT_EQ(trusted.size(), 2u);
  idx.drop_replica("r0");
  trusted.clear();
  idx.trusted_holders("r0", trusted);
  EXPECT_TRUE(trusted.empty()) << "no KV state: routed by tier 1";
  EXPECT_EQ(idx.blocks().count(*idx.find("r0", 1)), 0u);
  EXPECT_EQ(idx.blocks().count(*idx.find("r1", 0)), 1u);
  EXPECT_EQ(idx.apply({"r0", 0, 0, false, kv::parity_state::unknown, &a, nullptr}, now),
            apply_outcome::needs_reset);
}

TEST(replica_index, a_hash_mismatch_is_not_trusted) {
  replica_index idx;
  auto now = std::chrono::steady_clock::now();
  std::vector<kv::block_ref> a{{1, kv::medium::gpu}};
  idx.apply({"r0", 0, 0, true, kv::parity_state::mismatch, &a, nullptr}, now);
  auto h = *idx.find("r0", 0);
  EXPECT_FALSE(idx.trusted(h));
  EXPECT_EQ(idx.blocks().count(h), 1u) << "kept, for /v1/kv/replicas, but not routed on";
  idx.apply({"r0", 0, 1, true, kv::parity_state::verified, &a, nullptr}, now);
  EXPECT_TRUE(idx.trusted(h)) << "a reset with good hashes restores trust";
}

TEST(replica_index, ranks_may_arrive_in_any_order) {
  replica_index idx;
  auto now = std::chrono::steady_clock::now();
  std::vector<kv::block_ref> a{{1, kv::medium::gpu}};
  idx.apply({"r0", 2, 0, true, kv::parity_state::unknown, &a, nullptr}, now);
  idx.apply({"r0", 0, 0, true, kv::parity_state::unknown, &a, nullptr}, now);
  auto hs = idx.holders_of("r0");
  ASSERT_EQ(hs.size(), 2u) << "rank 2 is there although rank 1 never was";
  EXPECT_EQ(idx.info(hs[0]).dp_rank, 0u);
  EXPECT_EQ(idx.info(hs[1]).dp_rank, 2u);
  EXPECT_TRUE(idx.holders_of("zz").empty());
}

TEST(replica_index, speculative_entries_are_confirmed_removed_or_expire) {
  replica_index idx;
  auto t0 = std::chrono::steady_clock::now();
  using namespace std::chrono_literals;
  std::vector<kv::block_ref> held{{1, kv::medium::gpu}};
  idx.apply({"r0", 0, 0, true, kv::parity_state::verified, &held, nullptr}, t0);
  auto h = *idx.find("r0", 0);
  auto fingerprint = idx.info(h).fingerprint;
  std::vector<wire::block_key> prompt{1, 2, 3, 4};
  idx.speculate(h, prompt.data(), prompt.size(), t0 + 5s);
  EXPECT_EQ(idx.blocks().count(h), 4u) << "they count for routing at once";
  EXPECT_EQ(idx.info(h).speculative, 3u) << "block 1 was held already";
  EXPECT_EQ(idx.info(h).fingerprint, fingerprint) << "the mirror does not have them";
  // The engine stores 2 and 3 (confirmed), and evicts 4 before storing it.
  std::vector<kv::block_ref> stored{{2, kv::medium::gpu}, {3, kv::medium::gpu}};
  std::vector<kv::block_ref> removed{{4, kv::medium::gpu}};
  idx.apply({"r0", 0, 0, false, kv::parity_state::verified, &stored, &removed}, t0 + 1s);
  EXPECT_EQ(idx.info(h).speculative, 0u);
  EXPECT_EQ(idx.info(h).speculative_confirmed, 2u);
  EXPECT_EQ(idx.blocks().count(h), 3u) << "a removal deletes a speculative block too";
  EXPECT_EQ(idx.info(h).fingerprint, fingerprint_of(idx.blocks().blocks_of(h)))
    << "confirmed blocks count like any other";
  // One nothing confirms expires; one refreshed lives on.
  std::vector<wire::block_key> a{7}, b{8};
  idx.speculate(h, a.data(), 1, t0 + 6s);
  idx.speculate(h, b.data(), 1, t0 + 6s);
  idx.speculate(h, b.data(), 1, t0 + 9s);
  idx.expire(t0 + 5999ms);
  EXPECT_EQ(idx.info(h).speculative, 2u) << "not yet";
  idx.expire(t0 + 6s);
  EXPECT_FALSE(idx.blocks().holds(7, h, kv::medium::gpu));
  EXPECT_TRUE(idx.blocks().holds(8, h, kv::medium::gpu)) << "refreshed until 9 s";
  EXPECT_EQ(idx.info(h).speculative_expired, 1u);
  // A full copy is the engine's truth: speculation ends with it.
  idx.apply({"r0", 0, 1, true, kv::parity_state::verified, &held, nullptr}, t0 + 7s);
  EXPECT_EQ(idx.info(h).speculative, 0u);
  EXPECT_EQ(idx.blocks().count(h), 1u);
  idx.expire(t0 + 10s);
  EXPECT_EQ(idx.info(h).speculative_expired, 1u) << "a forgotten entry does not expire again";
  EXPECT_EQ(idx.blocks().count(h), 1u);
}

TEST(replica_index, an_answer_that_lacked_watched_blocks_drops_them_unless_stored_since) {
  replica_index idx;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<kv::block_ref> held{
    {1, kv::medium::gpu}, {2, kv::medium::gpu}, {3, kv::medium::gpu}, {4, kv::medium::gpu}};
  idx.apply({"r0", 0, 0, true, kv::parity_state::verified, &held, nullptr}, t0);
  auto h = *idx.find("r0", 0);
  auto fingerprint = idx.info(h).fingerprint;
  std::vector<wire::block_key> prompt{1, 2, 3, 4, 5};
  EXPECT_EQ(idx.leading_confirmed(h, prompt.data(), prompt.size()), 4u);
  auto w = idx.watch(h, prompt.data(), 4);
  ASSERT_NE(w, 0u);
  EXPECT_EQ(idx.watching(), 1u);
  // Its own prefill recomputed 3 and the engine stored it again; 4 it did
  // not yet say.
  std::vector<kv::block_ref> restored{{3, kv::medium::gpu}};
  idx.apply({"r0", 0, 0, false, kv::parity_state::verified, &restored, nullptr}, t0);
  EXPECT_EQ(idx.settle(w, 2), std::optional<std::size_t>(1)) << "the engine found 1 and 2 only";
  EXPECT_TRUE(idx.blocks().holds(2, h, kv::medium::gpu));
  EXPECT_TRUE(idx.blocks().holds(3, h, kv::medium::gpu)) << "stored since: the engine holds it";
  EXPECT_FALSE(idx.blocks().holds(4, h, kv::medium::gpu)) << "claimed, lacking: dropped";
  EXPECT_EQ(idx.info(h).shortfall_drops, 1u);
  EXPECT_EQ(idx.info(h).fingerprint, fingerprint)
    << "the fingerprint is what the events said: the mirror still holds 4";
  EXPECT_EQ(idx.info(h).suppressed, 1u);
  EXPECT_EQ(idx.watching(), 0u);
  EXPECT_FALSE(idx.settle(w, 0).has_value()) << "a watch is settled once";
  // The engine's store of 4 arrives late: routed on again, counted once.
  std::vector<kv::block_ref> late{{4, kv::medium::gpu}};
  idx.apply({"r0", 0, 0, false, kv::parity_state::verified, &late, nullptr}, t0);
  EXPECT_TRUE(idx.blocks().holds(4, h, kv::medium::gpu));
  EXPECT_EQ(idx.info(h).fingerprint, fingerprint);
  EXPECT_EQ(idx.info(h).suppressed, 0u);
  // Dropped again, then the events remove it: out of the fingerprint too.
  auto v = idx.watch(h, prompt.data(), 4);
  EXPECT_EQ(idx.settle(v, 3), std::optional<std::size_t>(1));
  idx.apply({"r0", 0, 0, false, kv::parity_state::verified, nullptr, &late}, t0);
  EXPECT_EQ(idx.info(h).suppressed, 0u);
  EXPECT_EQ(idx.info(h).fingerprint, fingerprint_of(idx.blocks().blocks_of(h)));
  EXPECT_EQ(idx.blocks().count(h), 3u);
}

TEST(replica_index, a_watch_ends_without_effect_after_a_reset_or_unwatch) {
  replica_index idx;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<kv::block_ref> held{{1, kv::medium::gpu}, {2, kv::medium::cpu}};
  idx.apply({"r0", 0, 0, true, kv::parity_state::verified, &held, nullptr}, t0);
  auto h = *idx.find("r0", 0);
  std::vector<wire::block_key> prompt{1, 2};
  EXPECT_EQ(idx.leading_confirmed(h, prompt.data(), 2), 2u) << "any medium counts";
  auto w = idx.watch(h, prompt.data(), 2);
  idx.apply({"r0", 0, 1, true, kv::parity_state::verified, &held, nullptr}, t0);
  EXPECT_FALSE(idx.settle(w, 0).has_value()) << "a full copy since is the engine's truth";
  EXPECT_EQ(idx.blocks().count(h), 2u);
  auto v = idx.watch(h, prompt.data(), 2);
  idx.unwatch(v);
  EXPECT_EQ(idx.watching(), 0u);
  EXPECT_FALSE(idx.settle(v, 0).has_value()) << "an ended watch drops nothing";
  EXPECT_EQ(idx.blocks().count(h), 2u);
  auto u = idx.watch(h, prompt.data(), 2);
  EXPECT_EQ(idx.settle(u, 0), std::optional<std::size_t>(2)) << "a block on any medium goes";
  EXPECT_FALSE(idx.blocks().holds(2, h, kv::medium::cpu));
  EXPECT_EQ(idx.watch(h, prompt.data(), 0), 0u) << "nothing to watch";
}

TEST(replica_index, speculative_entries_are_not_confirmed_claims_and_stay_after_a_shortfall) {
  replica_index idx;
  auto t0 = std::chrono::steady_clock::now();
  using namespace std::chrono_literals;
  // Block 1 is held on CPU only, 2 on GPU; 3 and 4 are new.
  std::vector<kv::block_ref> held{{1, kv::medium::cpu}, {2, kv::medium::gpu}};
  idx.apply({"r0", 0, 0, true, kv::parity_state::verified, &held, nullptr}, t0);
  auto h = *idx.find("r0", 0);
  std::vector<wire::block_key> prompt{1, 2, 3, 4};
  // As the router does: watch the confirmed run, then speculate the prompt.
  auto confirmed = idx.leading_confirmed(h, prompt.data(), prompt.size());
  EXPECT_EQ(confirmed, 2u);
  auto w = idx.watch(h, prompt.data(), confirmed);
  idx.speculate(h, prompt.data(), prompt.size(), t0 + 5s);
  EXPECT_EQ(idx.info(h).speculative, 3u) << "1 on GPU, 3 and 4: the prefill computes them";
  EXPECT_EQ(idx.leading_confirmed(h, prompt.data(), prompt.size()), 2u)
    << "a CPU copy is the engine's word even beside a GPU guess; 3 is only a guess";
  // The engine found nothing: its CPU copy of 1 and its GPU 2 were gone.
  EXPECT_EQ(idx.settle(w, 0), std::optional<std::size_t>(2));
  EXPECT_FALSE(idx.blocks().holds(1, h, kv::medium::cpu));
  EXPECT_FALSE(idx.blocks().holds(2, h, kv::medium::gpu));
  EXPECT_TRUE(idx.blocks().holds(1, h, kv::medium::gpu))
    << "the speculative GPU entry stays: the prefill that lacked it computed it";
}
