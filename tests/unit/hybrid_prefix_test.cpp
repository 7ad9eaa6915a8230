// Hybrid models (sliding-window and Mamba groups beside full attention):
// the prefix the router predicts for such an engine is the one vLLM's
// HybridKVCacheCoordinator finds. The reference here follows vLLM's rules
// directly on per-group sets of held blocks (FullAttentionManager,
// SlidingWindowManager, MambaManager, the coordinator's fixed point), and
// random stores and evictions in every group are compared with what the
// agent's table publishes and the router's index makes of it.
#include "kv/block_table.hpp"
#include "routing/replica_index.hpp"
#include "routing/router_core.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <set>

using namespace llmgw;
using namespace llmgw::kv;
using namespace llmgw::wire;

namespace {

constexpr std::size_t bs = 16;

struct group_def {
  std::int64_t idx;
  const char* kind;
  std::optional<std::int64_t> window; ///< tokens, sliding-window groups
};

kv_event stored(const std::vector<block_key>& keys, std::optional<block_key> parent,
                const group_def& g) {
  kv_event ev;
  ev.kind = event_kind::block_stored;
  for (auto k : keys) {
    block_hash h;
    h.key = k;
    ev.block_hashes.push_back(h);
  }
  if (parent) {
    block_hash p;
    p.key = *parent;
    ev.parent_block_hash = p;
  }
  ev.block_size = bs;
  ev.medium = "GPU";
  ev.group_idx = g.idx;
  ev.kv_cache_spec_kind = g.kind;
  ev.kv_cache_spec_sliding_window = g.window;
  return ev;
}

kv_event removed(block_key key, const group_def& g) {
  kv_event ev;
  ev.kind = event_kind::block_removed;
  block_hash h;
  h.key = key;
  ev.block_hashes.push_back(h);
  ev.medium = "GPU";
  ev.group_idx = g.idx;
  return ev;
}

event_batch batch(std::vector<kv_event> events) {
  event_batch b;
  b.events = std::move(events);
  return b;
}

/// vLLM's rules on plain sets: which groups hold which blocks.
struct reference_engine {
  std::vector<group_def> groups;
  std::map<std::int64_t, std::multiset<block_key>> held; // by group: copies

  bool cached(const std::vector<std::int64_t>& ids, block_key k) const {
    return std::all_of(ids.begin(), ids.end(),
                       [&](std::int64_t g) { return held.at(g).count(k) > 0; });
  }
  /// The longest hit for `keys`, at most `max_blocks` blocks.
  std::size_t hit(const std::vector<block_key>& keys, std::size_t max_blocks) const {
    // Groups of one spec are looked up together; full attention first.
    std::vector<std::int64_t> full;
    std::map<std::pair<std::string, std::int64_t>, std::vector<std::int64_t>> others;
    for (const auto& g : groups) {
      if (std::string(g.kind) == "full_attention")
        full.push_back(g.idx);
      else
        others[{g.kind, g.window.value_or(0)}].push_back(g.idx);
    }
    std::size_t length = 0; // FullAttentionManager: left to right
    while (length < max_blocks && cached(full, keys[length]))
      ++length;
    for (;;) {
      auto current = length;
      for (const auto& [spec, ids] : others) {
        if (spec.first == "sliding_window") {
          auto need = static_cast<std::size_t>((spec.second - 1 + bs - 1) / bs);
          std::size_t contiguous = 0;
          bool found = false;
          for (std::size_t i = current; i-- > 0;) {
            if (cached(ids, keys[i])) {
              if (++contiguous >= need) {
                current = i + contiguous;
                found = true;
                break;
              }
            } else {
              contiguous = 0;
            }
          }
          if (!found)
            current = contiguous;
        } else { // mamba: the last cached block
          std::size_t end = 0;
          for (std::size_t i = current; i-- > 0;)
            if (cached(ids, keys[i])) {
              end = i + 1;
              break;
            }
          current = end;
        }
      }
      if (current >= length)
        break;
      length = current;
    }
    return length;
  }
};

/// A tree of prompts: `paths` share leading blocks.
std::vector<std::vector<block_key>> prompt_tree(std::mt19937& rng) {
  std::vector<std::vector<block_key>> paths;
  block_key next = 1000;
  std::vector<block_key> trunk;
  for (int i = 0; i < 10; ++i)
    trunk.push_back(next++);
  paths.push_back(trunk);
  for (int b = 0; b < 4; ++b) {
    auto from = std::uniform_int_distribution<std::size_t>(0, 9)(rng);
    std::vector<block_key> p(trunk.begin(), trunk.begin() + static_cast<std::ptrdiff_t>(from));
    for (int i = 0; i < 8; ++i)
      p.push_back(next++);
    paths.push_back(p);
  }
  return paths;
}

void run_random_engine(const std::vector<group_def>& groups, unsigned seed) {
  std::mt19937 rng(seed);
  auto paths = prompt_tree(rng);
  reference_engine ref;
  ref.groups = groups;
  for (const auto& g : groups)
    ref.held[g.idx];
  block_table table;
  routing::replica_index index;
  auto first = table.subscribe(1);
  ASSERT_EQ(index.apply({"r", 0, first.epoch, true, parity_state::unknown, &first.added, nullptr},
                        std::chrono::steady_clock::now()),
            routing::apply_outcome::applied);
  auto holder = *index.find("r", 0);
  {
    // vLLM caches a step's blocks in every group at once: the first batch
    // names them all.
    std::vector<kv_event> events;
    for (const auto& g : groups) {
      events.push_back(stored({paths[0][0]}, std::nullopt, g));
      ref.held[g.idx].insert(paths[0][0]);
    }
    table.apply(batch(std::move(events)));
  }
  std::size_t compared = 0, hybrid_shorter = 0;
  for (int step = 0; step < 400; ++step) {
    std::vector<kv_event> events;
    auto ops = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int o = 0; o < ops; ++o) {
      const auto& path =
        paths[std::uniform_int_distribution<std::size_t>(0, paths.size() - 1)(rng)];
      const auto& g = groups[std::uniform_int_distribution<std::size_t>(0, groups.size() - 1)(rng)];
      if (std::uniform_int_distribution<int>(0, 2)(rng) == 0) {
        // An eviction of one block from one group.
        auto& held = ref.held[g.idx];
        if (held.empty())
          continue;
        auto it = held.begin();
        std::advance(it, std::uniform_int_distribution<std::size_t>(0, held.size() - 1)(rng));
        events.push_back(removed(*it, g));
        held.erase(it);
      } else {
        // A run of the prompt's blocks, stored by one group: a prefill.
        auto a = std::uniform_int_distribution<std::size_t>(0, path.size() - 1)(rng);
        auto b = std::uniform_int_distribution<std::size_t>(a + 1, path.size())(rng);
        std::vector<block_key> keys(path.begin() + static_cast<std::ptrdiff_t>(a),
                                    path.begin() + static_cast<std::ptrdiff_t>(b));
        std::optional<block_key> parent;
        if (a > 0)
          parent = path[a - 1];
        events.push_back(stored(keys, parent, g));
        for (auto k : keys)
          ref.held[g.idx].insert(k);
      }
    }
    table.apply(batch(std::move(events)));
    ASSERT_TRUE(routable(table.parity())) << table.parity_message();
    ASSERT_TRUE(table.hybrid());
    auto d = table.drain(1);
    ASSERT_EQ(
      index.apply(
        {"r", 0, d.epoch, d.reset, table.parity(), &d.added, &d.removed, false, {}, table.hybrid()},
        std::chrono::steady_clock::now()),
      routing::apply_outcome::applied);
    ASSERT_EQ(index.info(holder).fingerprint, table.fingerprint())
      << "the index holds what the table publishes";
    for (const auto& path : paths) {
      std::vector<routing::walk_score> walk;
      index.blocks().walk(path.data(), path.size(), {holder}, {1.0, 0.5, 0.25}, walk);
      auto walked = walk.at(0).blocks;
      auto predicted = index.hit_blocks(holder, path.data(), walked);
      auto expected = ref.hit(path, path.size());
      ASSERT_EQ(predicted, expected) << "step " << step << ", a prompt of " << path.size()
                                     << " blocks, the walk found " << walked;
      EXPECT_EQ(index.leading_confirmed(holder, path.data(), path.size()), expected)
        << "no speculation here: what the engine's events say";
      ++compared;
      hybrid_shorter += predicted < walked;
    }
  }
  // Every group evicts everything: nothing is left behind.
  std::vector<kv_event> all;
  for (const auto& [g, held] : ref.held)
    for (auto k : held)
      all.push_back(removed(
        k,
        groups[static_cast<std::size_t>(
          std::find_if(groups.begin(), groups.end(), [&](const group_def& x) { return x.idx == g; })
          - groups.begin())]));
  auto c = table.apply(batch(std::move(all)));
  EXPECT_EQ(c.ignored_removes, 0u);
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.markers(), 0u);
  EXPECT_EQ(table.chain_links(), 0u) << "no chain link outlives the blocks it links";
  EXPECT_GT(compared, 1000u);
  EXPECT_GT(hybrid_shorter, 20u) << "the groups' rules must shorten some walks, or this tests "
                                    "nothing beyond full attention";
}

} // namespace

TEST(hybrid_prefix, a_sliding_window_model_is_predicted_as_vllm_finds_it) {
  // gpt-oss's shape: one full-attention group, one of sliding window 128
  // tokens (8 blocks of 16: a hit ends on 8 held blocks).
  for (unsigned seed : {1u, 2u, 3u})
    run_random_engine({{0, "sliding_window", 40}, {1, "full_attention", std::nullopt}}, seed);
}

TEST(hybrid_prefix, several_window_groups_of_one_spec_must_all_hold_the_window) {
  // Gemma 3's shape: several sliding-window groups, one full.
  for (unsigned seed : {4u, 5u})
    run_random_engine({{0, "full_attention", std::nullopt},
                       {1, "sliding_window", 50},
                       {2, "sliding_window", 50},
                       {3, "sliding_window", 50}},
                      seed);
}

TEST(hybrid_prefix, a_mamba_model_ends_where_a_state_is_held) {
  // Qwen3-Next's and Granite 4's shape: Mamba groups beside full attention.
  for (unsigned seed : {6u, 7u})
    run_random_engine(
      {{0, "full_attention", std::nullopt}, {1, "mamba", std::nullopt}, {2, "mamba", std::nullopt}},
      seed);
}

TEST(hybrid_prefix, window_and_mamba_together_meet_at_a_fixed_point) {
  for (unsigned seed : {8u, 9u})
    run_random_engine({{0, "full_attention", std::nullopt},
                       {1, "sliding_window", 33},
                       {2, "mamba", std::nullopt},
                       {3, "sliding_window", 97}},
                      seed);
}

TEST(hybrid_prefix, the_end_markers_follow_the_window) {
  // Window 40 tokens: 3 blocks end a hit (cdiv(39, 16)).
  group_def full{0, "full_attention", std::nullopt};
  group_def window{1, "sliding_window", 40};
  block_table t;
  t.apply(batch({stored({1, 2, 3, 4, 5}, std::nullopt, full), stored({3, 4, 5}, 2, window)}));
  EXPECT_TRUE(t.hybrid());
  for (block_key k : {1, 2, 3, 4, 5})
    EXPECT_TRUE(t.holds({k, medium::gpu})) << "full attention holds " << k;
  auto marked = [&](block_key k) { return t.holds({end_marker_of(k), medium::gpu}); };
  EXPECT_FALSE(marked(1)) << "the window group lacks block 1";
  EXPECT_FALSE(marked(3)) << "block 3 ends a 4-block prefix: the window needs blocks 2..4 of it";
  EXPECT_FALSE(marked(4));
  EXPECT_TRUE(marked(5)) << "blocks 3, 4, 5 held: a 5-block prefix is a hit";
  EXPECT_EQ(t.markers(), 1u);
  EXPECT_EQ(t.size(), 6u) << "five blocks and one marker, all seen by subscribers";
  // The window's block 2 arrives (a re-prefill): 2..4 make 4 an end.
  t.apply(batch({stored({2}, 1, window)}));
  EXPECT_TRUE(marked(4));
  // A short prefix needs only its own blocks.
  t.apply(batch({stored({1}, std::nullopt, window)}));
  EXPECT_TRUE(marked(1)) << "a 1-block prefix: the window holds all of it";
  EXPECT_TRUE(marked(2));
  // Evicting the window's block 3 ends 3, 4 and 5 as ends; 2 stays.
  t.apply(batch({removed(3, window)}));
  EXPECT_FALSE(marked(3));
  EXPECT_FALSE(marked(4));
  EXPECT_FALSE(marked(5));
  EXPECT_TRUE(marked(2));
  EXPECT_TRUE(t.holds({3, medium::gpu})) << "full attention still holds block 3";
  // A clear empties it all; a fresh subscriber's snapshot equals the table.
  t.apply(batch({kv_event{}}));
  EXPECT_EQ(t.size(), 0u);
  EXPECT_TRUE(t.hybrid()) << "the engine's groups outlive a clear";
}

TEST(hybrid_prefix, a_window_group_storing_first_is_chained_by_the_full_group_after_it) {
  // vLLM stores a step's blocks group by group; group 0 may be the window.
  group_def window{0, "sliding_window", 20};
  group_def full{1, "full_attention", std::nullopt};
  block_table t;
  t.apply(batch({stored({1, 2}, std::nullopt, window), stored({1, 2}, std::nullopt, full)}));
  EXPECT_TRUE(t.holds({end_marker_of(1), medium::gpu}));
  EXPECT_TRUE(t.holds({end_marker_of(2), medium::gpu}));
}

TEST(hybrid_prefix, groups_no_prefix_can_be_predicted_for_say_why) {
  {
    block_table t;
    t.apply(batch({stored({1}, std::nullopt, {0, "full_attention", std::nullopt}),
                   stored({1}, std::nullopt, {1, "chunked_local_attention", std::nullopt})}));
    EXPECT_EQ(t.parity(), parity_state::untranslatable);
    EXPECT_NE(t.parity_message().find("group 1 is chunked_local_attention"), std::string::npos)
      << t.parity_message();
    t.reset(reset_reason::clear);
    EXPECT_EQ(t.parity(), parity_state::untranslatable) << "a clear does not change the model";
    t.reset(reset_reason::restart);
    EXPECT_EQ(t.parity(), parity_state::unknown) << "a restarted engine is checked afresh";
  }
  {
    block_table t; // a window without its size
    t.apply(batch({stored({1}, std::nullopt, {0, "full_attention", std::nullopt}),
                   stored({1}, std::nullopt, {1, "sliding_window", std::nullopt})}));
    EXPECT_NE(t.parity_message().find("without a window"), std::string::npos);
  }
  {
    block_table t; // no full-attention group: a hit needs no leading blocks
    t.apply(batch({stored({1}, std::nullopt, {0, "sliding_window", 64})}));
    EXPECT_EQ(t.parity(), parity_state::untranslatable);
    EXPECT_NE(t.parity_message().find("sliding-window or Mamba"), std::string::npos);
  }
  {
    block_table t; // MLA and sink attention are full attention
    t.apply(batch({stored({1}, std::nullopt, {0, "mla_attention", std::nullopt}),
                   stored({1}, std::nullopt, {1, "sink_full_attention", std::nullopt})}));
    EXPECT_FALSE(t.hybrid());
    EXPECT_TRUE(routable(t.parity()));
    EXPECT_TRUE(t.holds({1, medium::gpu}));
  }
}

TEST(hybrid_prefix, the_router_routes_a_hybrid_replica_by_its_hit_not_its_walk) {
  config::topology topo;
  topo.block_size = 4;
  topo.router.speculative_ttl = std::chrono::milliseconds(0);
  config::node_spec a;
  a.name = "agent-a";
  a.roles.agent = true;
  for (const char* name : {"window", "dense"}) {
    config::engine_spec e;
    e.replica = name;
    e.model = "m";
    e.url = std::string("http://127.0.0.1:") + (name[0] == 'w' ? "8000" : "8001");
    e.kv_events = true;
    e.canary = false; // its engines do not answer completions here
    a.engines.push_back(e);
  }
  topo.nodes.push_back(a);
  routing::router_core rc(topo);
  auto now = std::chrono::steady_clock::now();
  // "window" holds 8 blocks in full attention but ends a hit only at 3;
  // "dense" (not hybrid) holds 5.
  std::vector<block_ref> window_blocks;
  for (block_key k = 1; k <= 8; ++k)
    window_blocks.push_back({k, medium::gpu});
  window_blocks.push_back({end_marker_of(3), medium::gpu});
  std::vector<block_ref> dense_blocks;
  for (block_key k = 1; k <= 5; ++k)
    dense_blocks.push_back({k, medium::gpu});
  rc.kv().apply(
    {"window", 0, 1, true, parity_state::translated, &window_blocks, nullptr, false, {}, true},
    now);
  rc.kv().apply({"dense", 0, 1, true, parity_state::translated, &dense_blocks, nullptr}, now);
  routing::route_query q;
  q.model = "m";
  q.tokenized = true;
  q.keys = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  q.prompt_tokens = 41;
  auto d = rc.decide(q, now);
  EXPECT_EQ(d.replica, "dense") << "5 blocks beat the 3 the hybrid engine would reuse";
  for (const auto& s : d.scores)
    if (s.replica == "window") {
      EXPECT_EQ(s.kv_blocks, 3u);
      EXPECT_DOUBLE_EQ(s.kv, 0.3);
    }
  EXPECT_EQ(d.predicted_cached_tokens, 5u * 4);
  // Its marker at 8 makes it the longer hit.
  std::vector<block_ref> more{{end_marker_of(8), medium::gpu}};
  rc.kv().apply({"window", 0, 1, false, parity_state::translated, &more, nullptr, false, {}, true},
                now);
  d = rc.decide(q, now);
  EXPECT_EQ(d.replica, "window");
  EXPECT_EQ(d.predicted_cached_tokens, 8u * 4);
}

TEST(hybrid_prefix, hostile_groups_and_chains_are_refused_not_followed) {
  group_def full{0, "full_attention", std::nullopt};
  group_def window{1, "sliding_window", 64};
  {
    // Parent links that loop: a block its own parent, two blocks each
    // other's. Nothing hangs, nothing is marked by the loop, nothing leaks.
    block_table t;
    t.apply(batch({stored({5}, 5, full), stored({5}, 5, window)}));
    t.apply(batch({stored({7}, 8, full), stored({8}, 7, full), stored({7, 8}, 8, window)}));
    EXPECT_FALSE(t.holds({end_marker_of(5), medium::gpu}));
    EXPECT_FALSE(t.holds({end_marker_of(8), medium::gpu}));
    t.apply(batch({removed(5, full), removed(5, window), removed(7, full), removed(8, full),
                   removed(7, window), removed(8, window)}));
    EXPECT_EQ(t.size(), 0u);
    EXPECT_EQ(t.chain_links(), 0u);
  }
  {
    block_table t; // a window no model has: refused, no overflow
    t.apply(batch({stored({1}, std::nullopt, full),
                   stored({1}, std::nullopt,
                          {1, "sliding_window", std::numeric_limits<std::int64_t>::max()})}));
    EXPECT_EQ(t.parity(), parity_state::untranslatable);
    EXPECT_FALSE(t.holds({end_marker_of(1), medium::gpu}));
  }
  {
    block_table t; // a group index no engine has
    t.apply(batch({stored({1}, std::nullopt, full),
                   stored({1}, std::nullopt, {1LL << 40, "mamba", std::nullopt})}));
    EXPECT_NE(t.parity_message().find("outside 0..255"), std::string::npos) << t.parity_message();
  }
  {
    block_table t; // a group that changes its kind without a restart
    t.apply(batch({stored({1}, std::nullopt, full), stored({1}, std::nullopt, window)}));
    EXPECT_TRUE(routable(t.parity()));
    t.apply(batch({stored({2}, 1, {1, "mamba", std::nullopt})}));
    EXPECT_NE(t.parity_message().find("changed its kind"), std::string::npos);
    EXPECT_TRUE(t.hybrid()) << "the group keeps the kind it was learned with";
  }
  {
    // A first batch that names only the window group (a subscriber that
    // joined late) says too little; the full group's store ends that.
    block_table t;
    t.apply(batch({stored({1}, std::nullopt, window)}));
    EXPECT_EQ(t.parity(), parity_state::untranslatable);
    t.apply(batch({stored({1}, std::nullopt, full), stored({2}, 1, full), stored({2}, 1, window)}));
    EXPECT_TRUE(routable(t.parity())) << t.parity_message();
    EXPECT_TRUE(t.holds({end_marker_of(2), medium::gpu}));
  }
  {
    // Stores without a kind (an offloading tier's placeholders) say
    // nothing of a group's kind.
    block_table t;
    t.apply(batch({stored({1}, std::nullopt, window), stored({1}, std::nullopt, full)}));
    kv_event cpu = stored({1}, std::nullopt, window);
    cpu.kv_cache_spec_kind.reset();
    cpu.kv_cache_spec_sliding_window.reset();
    t.apply(batch({cpu}));
    EXPECT_TRUE(routable(t.parity())) << t.parity_message();
    EXPECT_TRUE(t.hybrid());
  }
}
