// The mirror's rules, on the pure block table.
#include "kv/block_table.hpp"
#include "tests/support/captures.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <unordered_map>

using namespace llmgw;
using namespace llmgw::kv;
using namespace llmgw::wire;
namespace json = boost::json;

namespace {

block_hash h(block_key key) {
  block_hash out;
  out.key = key;
  return out;
}

kv_event stored(std::vector<block_key> keys, const char* where = "GPU", std::int64_t group = 0) {
  kv_event ev;
  ev.kind = event_kind::block_stored;
  for (auto k : keys)
    ev.block_hashes.push_back(h(k));
  ev.medium = where;
  ev.group_idx = group;
  return ev;
}

kv_event removed(std::vector<block_key> keys, const char* where = "GPU", std::int64_t group = 0) {
  auto ev = stored(std::move(keys), where, group);
  ev.kind = event_kind::block_removed;
  return ev;
}

kv_event cleared() {
  return kv_event{};
}

event_batch batch(std::vector<kv_event> events) {
  event_batch b;
  b.events = std::move(events);
  return b;
}

std::vector<block_ref> gpu(std::vector<block_key> keys) {
  std::vector<block_ref> out;
  for (auto k : keys)
    out.push_back({k, medium::gpu});
  return out;
}

/// A subscriber's copy, maintained only from deltas.
struct peer_copy {
  std::set<block_ref> blocks;
  std::uint64_t epoch = 0;
  void apply(const table_delta& d) {
    if (d.reset)
      blocks.clear();
    for (const auto& r : d.removed)
      EXPECT_EQ(blocks.erase(r), 1u) << "removed a block the peer did not hold";
    for (const auto& r : d.added) // held now: a renewal names one the peer holds
      blocks.insert(r);
    epoch = d.epoch;
  }
  std::vector<block_ref> sorted() const { return {blocks.begin(), blocks.end()}; }
};

} // namespace

TEST(block_table, duplicate_store_needs_two_removes) {
  block_table t;
  t.apply(batch({stored({1}), stored({1})}));
  t.apply(batch({removed({1})}));
  EXPECT_TRUE(t.holds({1, medium::gpu})) << "one copy is still cached";
  t.apply(batch({removed({1})}));
  EXPECT_FALSE(t.holds({1, medium::gpu}));
}

TEST(block_table, remove_then_store_in_one_batch_keeps_the_block) {
  block_table t;
  t.apply(batch({stored({7})}));
  auto counts = t.apply(batch({removed({7}), stored({7})}));
  EXPECT_TRUE(t.holds({7, medium::gpu}));
  EXPECT_EQ(counts.removed, 1u);
  EXPECT_EQ(counts.stored, 1u);
}

TEST(block_table, unknown_removes_are_counted) {
  block_table t;
  t.apply(batch({stored({1})}));
  auto counts = t.apply(batch({removed({2, 3, 1})}));
  EXPECT_EQ(counts.ignored_removes, 2u);
  EXPECT_EQ(t.size(), 0u);
}

TEST(block_table, media_and_groups_are_separate) {
  block_table t;
  t.apply(batch({stored({5}, "GPU", 0), stored({5}, "CPU", 0), stored({5}, "disk", 0)}));
  EXPECT_EQ(t.held(),
            (std::vector<block_ref>{{5, medium::gpu}, {5, medium::cpu}, {5, medium::storage}}));
  auto counts = t.apply(batch({removed({5}, "GPU", 1)}));
  EXPECT_EQ(counts.ignored_removes, 1u) << "group 1 never stored key 5";
  EXPECT_TRUE(t.holds({5, medium::gpu}));
  t.apply(batch({stored({5}, "GPU", 1), removed({5}, "GPU", 0)}));
  EXPECT_TRUE(t.holds({5, medium::gpu})) << "still held by group 1";
  t.apply(batch({removed({5}, "CPU", 0)}));
  EXPECT_FALSE(t.holds({5, medium::cpu}));
}

TEST(block_table, subscribe_gives_a_snapshot_then_net_changes) {
  block_table t;
  t.apply(batch({stored({1, 2, 3})}));
  auto snap = t.subscribe(9);
  EXPECT_TRUE(snap.reset);
  EXPECT_EQ(snap.added, gpu({1, 2, 3}));
  EXPECT_TRUE(t.drain(9).empty());
  t.apply(batch({stored({4}), removed({1})}));
  auto d = t.drain(9);
  EXPECT_FALSE(d.reset);
  EXPECT_EQ(d.added, gpu({4}));
  EXPECT_EQ(d.removed, gpu({1}));
}

TEST(block_table, changes_that_cancel_send_nothing_and_a_renewal_is_sent_as_added) {
  block_table t;
  t.apply(batch({stored({1, 4})}));
  t.subscribe(1);
  t.apply(batch({stored({2}), removed({2})})); // stored then removed: nothing
  t.apply(batch({removed({1})}));
  t.apply(batch({stored({1})}));                            // removed then stored: renewed
  t.apply(batch({stored({3}), stored({3}), removed({3})})); // still held once
  auto d = t.drain(1);
  EXPECT_EQ(d.added, gpu({1, 3})) << "the engine stored 1 again: the router must hear of it";
  EXPECT_TRUE(d.removed.empty());
  t.apply(batch({stored({4})})); // stored while held: another copy, or its removal was lost
  EXPECT_EQ(t.drain(1).added, gpu({4}));
  t.apply(batch({stored({4}), removed({4}), removed({4}), removed({4})})); // every copy gone
  d = t.drain(1);
  EXPECT_TRUE(d.added.empty()) << "renewed, then gone: only the removal counts";
  EXPECT_EQ(d.removed, gpu({4}));
  EXPECT_EQ(t.held(), gpu({1, 3}));
}

TEST(block_table, pending_changes_are_bounded_by_the_table_not_the_event_rate) {
  block_table t;
  t.apply(batch({stored({1, 2, 3, 4})}));
  t.subscribe(1);
  for (block_key k = 100; k < 100100; ++k)
    t.apply(batch({stored({k}), removed({k})}));
  EXPECT_EQ(t.pending_size(1), 0u) << "100,000 stored-then-removed blocks leave nothing pending";
  for (block_key k = 0; k < 100000; ++k)
    t.apply(batch({removed({1 + k % 4}), stored({1 + k % 4})}));
  EXPECT_EQ(t.pending_size(1), 4u) << "four renewals, however many times";
  t.drain(1);
  t.apply(batch({removed({1, 2}), stored({50})}));
  EXPECT_EQ(t.pending_size(1), 3u);
}

TEST(block_table, reset_is_announced_before_later_changes) {
  block_table t;
  t.apply(batch({stored({1, 2})}));
  t.subscribe(1);
  t.subscribe(2);
  t.reset(reset_reason::gap);
  EXPECT_EQ(t.epoch(), 1u);
  EXPECT_EQ(t.size(), 0u);
  t.apply(batch({stored({2, 3})}));
  auto d = t.drain(1);
  EXPECT_TRUE(d.reset);
  EXPECT_EQ(d.epoch, 1u);
  EXPECT_EQ(d.added, gpu({2, 3})) << "everything after the reset, even a key held before";
  EXPECT_TRUE(d.removed.empty());
  EXPECT_FALSE(t.drain(1).reset) << "announced once";
  EXPECT_TRUE(t.drain(2).reset) << "every peer hears of it";
}

TEST(block_table, all_blocks_cleared_resets) {
  block_table t;
  t.subscribe(1);
  auto counts = t.apply(batch({stored({1}), cleared(), stored({2})}));
  EXPECT_EQ(counts.clears, 1u);
  EXPECT_EQ(t.epoch(), 1u);
  EXPECT_EQ(t.held(), gpu({2}));
  auto d = t.drain(1);
  EXPECT_TRUE(d.reset);
  EXPECT_EQ(d.added, gpu({2}));
}

TEST(block_table, an_unfilled_gap_leaves_it_partial_until_the_engine_is_emptied) {
  block_table t;
  t.apply(batch({stored({1, 2})}));
  EXPECT_FALSE(t.partial()) << "followed from the start";
  t.reset(reset_reason::gap);
  EXPECT_TRUE(t.partial()) << "the engine may still hold 1 and 2";
  t.apply(batch({removed({7}), stored({3})}));
  EXPECT_TRUE(t.partial()) << "new stores say nothing of the blocks stored before the gap";
  t.reset(reset_reason::decode_error);
  EXPECT_TRUE(t.partial());
  for (auto why : {reset_reason::clear, reset_reason::restart, reset_reason::engine_exit}) {
    t.reset(reset_reason::gap);
    t.reset(why);
    EXPECT_FALSE(t.partial()) << to_string(why) << ": the engine is truly empty";
  }
  t.reset(reset_reason::gap);
  t.apply(batch({cleared()}));
  EXPECT_FALSE(t.partial()) << "a clear in the stream empties the engine too";
}

TEST(block_table, any_interleaving_of_events_and_drains_keeps_peers_equal) {
  std::mt19937 rng(424242);
  for (int trial = 0; trial < 200; ++trial) {
    block_table t;
    std::map<peer_id, peer_copy> peers;
    const char* media[] = {"GPU", "CPU", "GPU"};
    for (int step = 0; step < 300; ++step) {
      auto r = rng() % 100;
      std::vector<kv_event> events;
      if (r < 70) {
        for (int e = 0; e < 1 + static_cast<int>(rng() % 3); ++e) {
          std::vector<block_key> keys;
          for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k)
            keys.push_back(rng() % 12);
          auto where = media[rng() % 3];
          auto group = static_cast<std::int64_t>(rng() % 2);
          events.push_back(rng() % 2 ? stored(keys, where, group) : removed(keys, where, group));
        }
        if (rng() % 40 == 0)
          events.insert(events.begin() + static_cast<long>(rng() % events.size()), cleared());
        t.apply(batch(events));
      } else if (r < 73) {
        t.reset(reset_reason::restart);
      } else if (r < 78) {
        auto id = rng() % 3;
        peers[id] = peer_copy{};
        peers[id].apply(t.subscribe(id));
        ASSERT_EQ(peers[id].sorted(), t.held());
      } else if (r < 80 && !peers.empty()) {
        auto it = peers.begin();
        std::advance(it, static_cast<long>(rng() % peers.size()));
        t.unsubscribe(it->first);
        peers.erase(it);
      } else {
        for (auto& [id, copy] : peers) {
          if (rng() % 2)
            continue;
          copy.apply(t.drain(id));
          ASSERT_EQ(copy.sorted(), t.held()) << "trial " << trial << " step " << step;
          ASSERT_EQ(copy.epoch, t.epoch());
          ASSERT_LE(t.pending_size(id), 0u);
        }
      }
      for (const auto& [id, copy] : peers)
        ASSERT_LE(t.pending_size(id), copy.blocks.size() + t.size());
      std::uint64_t sum = 0; // the running fingerprint is the held blocks' digest
      for (const auto& b : t.held())
        sum += fingerprint_of(b);
      ASSERT_EQ(t.fingerprint(), sum) << "trial " << trial << " step " << step;
    }
  }
}

namespace {

struct capture_run {
  block_table table;
  std::vector<block_ref> expected;
  apply_counts totals;
};

capture_run run_capture(const std::string& name, std::optional<parity_config> parity) {
  capture_run run{block_table(std::move(parity)), {}, {}};
  auto doc = llmgw::test::read_json(llmgw::test::capture_path(name));
  for (const auto& f : doc.at("frames").as_array()) {
    auto payload = llmgw::test::from_hex(json::value_to<std::string>(f.at("payload_hex")));
    auto b = decode_batch(payload);
    EXPECT_TRUE(b) << b.err().message;
    if (!b)
      break;
    auto c = run.table.apply(*b);
    run.totals.verified += c.verified;
    run.totals.ignored_removes += c.ignored_removes;
    run.totals.mismatch_found |= c.mismatch_found;
  }
  for (const auto& blk : doc.at("expected").at("final_blocks").as_array()) {
    auto hash = json::value_to<std::string>(blk.at("hash"));
    block_key key = 0;
    if (json::value_to<std::string>(blk.at("hash_kind")) == "int")
      key = std::stoull(hash);
    else
      key = key_of(*digest_from_hex(hash));
    run.expected.push_back({key, medium_of(json::value_to<std::string>(blk.at("medium")))});
  }
  std::sort(run.expected.begin(), run.expected.end());
  return run;
}

} // namespace

class block_table_capture : public ::testing::TestWithParam<std::string> {};

TEST_P(block_table_capture, ends_in_the_expected_state_with_verified_hashes) {
  auto run = run_capture(GetParam(), parity_config{"0", 16});
  EXPECT_EQ(run.table.held(), run.expected);
  EXPECT_EQ(run.totals.ignored_removes, 0u);
  EXPECT_NE(run.table.parity(), parity_state::mismatch) << run.table.parity_message();
  EXPECT_FALSE(run.totals.mismatch_found);
  if (GetParam().find("S4_clear") == std::string::npos) { // S4 ends right after a clear
    EXPECT_EQ(run.table.parity(), parity_state::verified) << GetParam();
  }
  EXPECT_GT(run.totals.verified, 0u) << "the captures carry extra_keys: blocks are checkable";
}

TEST_P(block_table_capture, a_wrong_seed_is_a_mismatch_that_names_the_fix) {
  auto run = run_capture(GetParam(), parity_config{"1", 16});
  EXPECT_EQ(run.table.held(), run.expected) << "parity never changes what is held";
  EXPECT_EQ(run.table.parity(), parity_state::mismatch);
  EXPECT_NE(run.table.parity_message().find("PYTHONHASHSEED=1"), std::string::npos)
    << run.table.parity_message();
  EXPECT_NE(run.table.parity_message().find("sha256_cbor"), std::string::npos);
}

TEST(block_table_parity, a_wrong_block_size_is_a_mismatch) {
  auto run = run_capture("S1_basic.map.int.json", parity_config{"0", 32});
  EXPECT_EQ(run.table.parity(), parity_state::mismatch);
  EXPECT_NE(run.table.parity_message().find("--block-size 32"), std::string::npos)
    << run.table.parity_message();
}

TEST(block_table_parity, one_wrong_token_is_caught) {
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.int.json"));
  auto payload =
    llmgw::test::from_hex(json::value_to<std::string>(doc.at("frames").at(0).at("payload_hex")));
  auto b = decode_batch(payload);
  ASSERT_TRUE(b);
  block_table good(parity_config{"0", 16});
  good.apply(*b);
  EXPECT_EQ(good.parity(), parity_state::verified);
  b->events[0].token_ids[20] += 1; // block 1 of the first store
  block_table bad(parity_config{"0", 16});
  bad.apply(*b);
  EXPECT_EQ(bad.parity(), parity_state::mismatch);
  EXPECT_NE(bad.parity_message().find("block 1"), std::string::npos) << bad.parity_message();
  bad.reset(reset_reason::restart);
  EXPECT_EQ(bad.parity(), parity_state::unknown) << "a restarted engine is checked afresh";
}

INSTANTIATE_TEST_SUITE_P(vllm_captures, block_table_capture,
                         ::testing::ValuesIn(llmgw::test::capture_names()), [](const auto& info) {
                           std::string name = info.param.substr(0, info.param.size() - 5);
                           for (auto& c : name)
                             if (c == '.')
                               c = '_';
                           return name;
                         });

// Key translation: blocks keyed by the cluster's hash of their tokens,
// whatever the engine hashes with. The captures were recorded with seed "0";
// a cluster with seed "1" is an engine hashing "another way" (as vLLM's
// default sha256 over pickle is), and the keys the router computes for the
// captured requests' prompts with seed "1" are what the table must hold.
namespace {

/// The capture's first batch, decoded.
result<event_batch> first_batch(const json::value& doc) {
  return decode_batch(
    llmgw::test::from_hex(json::value_to<std::string>(doc.at("frames").at(0).at("payload_hex"))));
}

/// Held keys, a copy on the GPU and one on the CPU counted once.
std::size_t distinct_keys(const block_table& t) {
  std::set<block_key> keys;
  for (const auto& b : t.held())
    keys.insert(b.key);
  return keys.size();
}

parity_config translating(std::string seed, std::size_t block_size = 16) {
  return parity_config{std::move(seed), block_size, true};
}

} // namespace

TEST_P(block_table_capture, translation_of_the_clusters_own_hashes_is_the_identity) {
  auto run = run_capture(GetParam(), translating("0"));
  EXPECT_EQ(run.table.held(), run.expected);
  EXPECT_EQ(run.totals.ignored_removes, 0u);
  EXPECT_FALSE(run.totals.mismatch_found) << run.table.parity_message();
  if (GetParam().find("S4_clear") == std::string::npos) {
    EXPECT_EQ(run.table.parity(), parity_state::verified) << GetParam();
  }
  EXPECT_EQ(run.table.translations(), distinct_keys(run.table)) << "one entry per held block";
}

TEST_P(block_table_capture, an_engine_hashing_another_way_is_keyed_as_the_router_hashes) {
  auto doc = llmgw::test::read_json(llmgw::test::capture_path(GetParam()));
  auto keys = llmgw::test::capture_router_keys(doc, "1");
  auto run = run_capture(GetParam(), translating("1"));
  std::set<block_ref> expected(run.expected.begin(), run.expected.end());
  auto held = run.table.held();
  EXPECT_EQ(std::set<block_ref>(held.begin(), held.end()),
            llmgw::test::translated_blocks(expected, keys))
    << "every held block under the key the router computes for its prompt";
  EXPECT_EQ(run.totals.ignored_removes, 0u) << "every removal resolved to its cluster key";
  EXPECT_FALSE(run.totals.mismatch_found) << run.table.parity_message();
  EXPECT_TRUE(routable(run.table.parity()));
  if (GetParam().find("S4_clear") == std::string::npos) {
    EXPECT_EQ(run.table.parity(), parity_state::translated) << GetParam();
  }
  EXPECT_EQ(run.table.translations(), distinct_keys(run.table))
    << "entries leave with their blocks";
}

class block_table_late : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(hash_forms, block_table_late,
                         ::testing::Values("S1_basic.map.int.json", "S1_basic.map.bytes.json"),
                         [](const auto& info) {
                           return std::string(info.param.find("bytes") != std::string::npos
                                                ? "digests"
                                                : "integers");
                         });

// With whole digests published, a block chained from a parent stored before
// the subscriber joined matches its own recomputation under any seed: that
// proves the engine's algorithm, not its seed, and must not count as parity.
TEST_P(block_table_late, a_late_subscriber_leaves_out_blocks_whose_parent_it_never_saw) {
  auto doc = llmgw::test::read_json(llmgw::test::capture_path(GetParam()));
  auto keys = llmgw::test::capture_router_keys(doc, "1");
  block_table table(translating("1"));
  apply_counts totals;
  const auto& frames = doc.at("frames").as_array();
  for (std::size_t i = 1; i < frames.size(); ++i) { // the first batch was missed
    auto b =
      decode_batch(llmgw::test::from_hex(json::value_to<std::string>(frames[i].at("payload_hex"))));
    ASSERT_TRUE(b);
    auto c = table.apply(*b);
    totals.untranslated += c.untranslated;
    totals.translated += c.translated;
  }
  EXPECT_GT(totals.untranslated, 0u) << "children of the missed system prompt";
  EXPECT_GT(totals.translated, 0u) << "blocks chained from the root still are keyed";
  std::set<block_key> cluster;
  for (const auto& [engine, key] : keys)
    cluster.insert(key);
  for (const auto& b : table.held())
    EXPECT_EQ(cluster.count(b.key), 1u) << "only the router's keys, never an engine's";
  EXPECT_EQ(table.parity(), parity_state::translated);
}

TEST(block_table_translation, a_match_chained_from_an_engines_digest_proves_no_seed) {
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.bytes.json"));
  block_table table(translating("1"));
  const auto& frames = doc.at("frames").as_array();
  for (std::size_t i = 1; i < frames.size(); ++i) { // joined late, and no extra keys
    auto b =
      decode_batch(llmgw::test::from_hex(json::value_to<std::string>(frames[i].at("payload_hex"))));
    ASSERT_TRUE(b);
    for (auto& ev : b->events)
      ev.extra_keys.reset();
    table.apply(*b);
    ASSERT_NE(table.parity(), parity_state::verified) << "after frame " << i;
  }
  EXPECT_EQ(table.parity(), parity_state::untranslatable) << "another seed, nothing to translate";
}

TEST(block_table_translation, blocks_kept_on_a_belief_the_engine_hashes_our_way_go_when_it_fails) {
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.int.json"));
  auto first = first_batch(doc);
  ASSERT_TRUE(first);
  block_table table(translating("0"));
  table.subscribe(1);
  table.apply(*first);
  ASSERT_EQ(table.parity(), parity_state::verified);
  // Believed to hash our way: a copy never seen on the GPU keeps its key,
  // and so does a GPU store without tokens.
  auto no_tokens = stored({777}, "GPU");
  table.apply(batch({stored({4242}, "CPU"), no_tokens}));
  EXPECT_TRUE(table.holds({4242, medium::cpu}));
  EXPECT_TRUE(table.holds({777, medium::gpu}));
  EXPECT_EQ(table.parity(), parity_state::verified) << "no tokens: nothing to disprove";
  table.drain(1);
  // Then a block hashes otherwise (a token the engine hashed differently).
  auto odd = first->events.at(0);
  odd.parent_block_hash.reset();
  odd.token_ids[0] += 1;
  odd.block_hashes.resize(1);
  odd.block_hashes[0].key = 99; // the engine's key for it
  if (odd.extra_keys)
    odd.extra_keys->resize(1);
  odd.token_ids.resize(16);
  auto c = table.apply(batch({odd}));
  EXPECT_EQ(table.parity(), parity_state::translated);
  EXPECT_FALSE(table.holds({4242, medium::cpu})) << "kept under the engine's key: dropped";
  EXPECT_FALSE(table.holds({777, medium::gpu}));
  EXPECT_TRUE(table.partial()) << "the engine still holds them, under keys unknown here";
  EXPECT_EQ(c.untranslated, 2u);
  auto delta = table.drain(1);
  EXPECT_EQ(delta.removed.size(), 2u) << "subscribers are told";
  EXPECT_FALSE(table.holds({99, medium::gpu}));
  EXPECT_EQ(table.translations(), distinct_keys(table));
}

TEST(block_table_translation, copies_on_other_media_follow_the_gpu_blocks_key) {
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.int.json"));
  auto keys = llmgw::test::capture_router_keys(doc, "1");
  auto b = first_batch(doc);
  ASSERT_TRUE(b);
  block_table table(translating("1"));
  table.apply(*b);
  auto engine = b->events.at(0).block_hashes.at(0).key;
  auto cluster = keys.at(engine);
  ASSERT_TRUE(table.holds({cluster, medium::gpu}));
  // Offloaded: a CPU copy without tokens, then the GPU copy evicted.
  table.apply(batch({stored({engine}, "CPU"), removed({engine}, "GPU")}));
  EXPECT_FALSE(table.holds({cluster, medium::gpu}));
  EXPECT_TRUE(table.holds({cluster, medium::cpu})) << "the CPU copy keeps the cluster key";
  EXPECT_FALSE(table.holds({engine, medium::cpu}));
  auto before = table.translations();
  auto c = table.apply(batch({removed({engine}, "CPU")}));
  EXPECT_EQ(c.ignored_removes, 0u);
  EXPECT_FALSE(table.holds({cluster, medium::cpu}));
  EXPECT_EQ(table.translations(), before - 1) << "the last copy gone, its entry goes";
  // A CPU copy of a block never seen on the GPU cannot be keyed.
  c = table.apply(batch({stored({12345}, "CPU")}));
  EXPECT_EQ(c.untranslated, 1u);
  EXPECT_FALSE(table.holds({12345, medium::cpu}));
}

// A hybrid model publishes each KV cache group's blocks; a sliding-window
// group leaves its null blocks out of block_hashes but not of token_ids.
// Its hashes are the full-attention group's, keyed there; what it holds
// shows as end markers, not as blocks (tests/unit/hybrid_prefix_test.cpp).
TEST(block_table_translation, a_hybrid_models_other_groups_follow_the_full_attention_keys) {
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.int.json"));
  auto keys = llmgw::test::capture_router_keys(doc, "1");
  auto first = first_batch(doc);
  ASSERT_TRUE(first);
  auto full = first->events.at(0);
  ASSERT_GE(full.block_hashes.size(), 3u);
  auto window = full;
  window.group_idx = 1;
  window.kv_cache_spec_kind = "sliding_window";
  window.kv_cache_spec_sliding_window = 2 * static_cast<std::int64_t>(full.block_size); // 2 blocks
  window.block_hashes.erase(window.block_hashes.begin()); // block 0 fell out of the window
  if (window.extra_keys)
    window.extra_keys->erase(window.extra_keys->begin());
  block_table table(translating("1"));
  auto c = table.apply(batch({window, full})); // the window's group may come first
  EXPECT_EQ(c.untranslated, 0u);
  EXPECT_EQ(table.parity(), parity_state::translated) << table.parity_message();
  EXPECT_TRUE(table.hybrid());
  auto cluster = [&](std::size_t i) { return keys.at(full.block_hashes.at(i).key); };
  auto marked = [&](std::size_t i) {
    return table.holds({end_marker_of(cluster(i)), medium::gpu});
  };
  for (std::size_t i = 0; i < full.block_hashes.size(); ++i) {
    EXPECT_TRUE(table.holds({cluster(i), medium::gpu}));
    EXPECT_EQ(marked(i), i >= 2) << "block " << i << ": the window holds it and the one before";
  }
  // Removing the full-attention copy of block 1 leaves the window's: block
  // 2 still ends a hit for the window, but no prefix reaches it.
  c = table.apply(batch({removed({full.block_hashes[1].key}, "GPU", 0)}));
  EXPECT_EQ(c.ignored_removes, 0u);
  EXPECT_FALSE(table.holds({cluster(1), medium::gpu}));
  EXPECT_TRUE(marked(2));
  c = table.apply(batch({removed({full.block_hashes[1].key}, "GPU", 1)}));
  EXPECT_EQ(c.ignored_removes, 0u) << "the window's copy resolved to its cluster key";
  EXPECT_FALSE(marked(2));
}

TEST(block_table_translation, what_cannot_be_translated_says_why_and_is_not_routed) {
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.int.json"));
  auto first = first_batch(doc);
  ASSERT_TRUE(first);
  {
    block_table table(translating("1", 32)); // llm-d's and others' sizes differ
    auto c = table.apply(*first);
    EXPECT_TRUE(c.mismatch_found);
    EXPECT_EQ(table.parity(), parity_state::untranslatable);
    EXPECT_FALSE(routable(table.parity()));
    EXPECT_NE(table.parity_message().find("--block-size 32"), std::string::npos)
      << table.parity_message();
    EXPECT_EQ(c.untranslated, c.stored) << "no block is keyed by a guess";
    table.reset(reset_reason::restart);
    EXPECT_EQ(table.parity(), parity_state::unknown) << "a restarted engine is checked afresh";
  }
  {
    auto b = *first;
    b.events.at(0).token_ids.clear();
    block_table table(translating("1"));
    table.apply(b);
    EXPECT_EQ(table.parity(), parity_state::untranslatable);
    EXPECT_NE(table.parity_message().find("without token ids"), std::string::npos);
  }
  {
    auto b = *first; // an engine too old to publish extra keys
    for (auto& ev : b.events)
      ev.extra_keys.reset();
    block_table other(translating("1"));
    other.apply(b);
    EXPECT_EQ(other.parity(), parity_state::untranslatable);
    EXPECT_NE(other.parity_message().find("publishes no extra_keys"), std::string::npos);
    block_table same(translating("0"));
    auto c = same.apply(b);
    EXPECT_EQ(same.parity(), parity_state::verified)
      << "hashed the cluster's way, its blocks prove so without extra keys";
    EXPECT_EQ(c.untranslated, 0u);
  }
}
