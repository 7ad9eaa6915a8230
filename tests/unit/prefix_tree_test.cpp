// Tier 1's approximate prefix tree: chained chunk hashes, the walk, and the
// bounds (capacity with LRU order, TTL, the lazy queue's size).
#include "routing/prefix_tree.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace llmgw;
using namespace llmgw::routing;
using namespace std::chrono_literals;

namespace {

std::string text_of(char c, std::size_t n) {
  return std::string(n, c);
}

std::vector<std::uint32_t> walk(const prefix_tree& t, const std::string& text,
                                const std::vector<tree_replica>& candidates) {
  std::vector<std::uint32_t> out;
  t.walk(chunk_hashes(text, 8), candidates, out);
  return out;
}

} // namespace

TEST(chunk_hashes, chain_so_equal_prefixes_share_leading_hashes) {
  auto a = chunk_hashes("0123456789abcdefXXXXXXXXyyy", 8);
  auto b = chunk_hashes("0123456789abcdefZZZZZZZZ", 8);
  ASSERT_EQ(a.size(), 3u) << "the 3 trailing bytes are not a full chunk";
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);
  auto c = chunk_hashes("89abcdef01234567", 8);
  EXPECT_NE(c[1], a[0]) << "a chunk's hash depends on everything before it";
  EXPECT_TRUE(chunk_hashes("short", 8).empty());
}

TEST(prefix_tree, the_walk_counts_leading_chunks_per_replica) {
  prefix_tree t(1000, 3600s);
  auto now = prefix_tree::clock::now();
  std::string system = text_of('s', 32); // 4 chunks
  t.insert(0, chunk_hashes(system + text_of('a', 16), 8), now);
  t.insert(1, chunk_hashes(system, 8), now);
  auto m = walk(t, system + text_of('a', 24), {0, 1, 2, 9});
  EXPECT_EQ(m, (std::vector<std::uint32_t>{6, 4, 0, 0}));
  m = walk(t, text_of('x', 40), {0, 1});
  EXPECT_EQ(m, (std::vector<std::uint32_t>{0, 0}));
  EXPECT_EQ(t.size(0), 6u);
  EXPECT_EQ(t.nodes(), 6u) << "the shared prefix is one set of nodes";
}

TEST(prefix_tree, capacity_evicts_the_least_recently_used) {
  prefix_tree t(8, 3600s);
  auto now = prefix_tree::clock::now();
  std::string old_text = text_of('o', 32), hot = text_of('h', 32), fresh = text_of('f', 32);
  t.insert(0, chunk_hashes(hot, 8), now);
  t.insert(0, chunk_hashes(old_text, 8), now);
  t.insert(0, chunk_hashes(hot, 8), now); // touched again: now the newest
  t.insert(0, chunk_hashes(fresh, 8), now);
  EXPECT_EQ(t.size(0), 8u);
  EXPECT_EQ(walk(t, hot, {0})[0], 4u) << "recently used survives";
  EXPECT_EQ(walk(t, fresh, {0})[0], 4u);
  EXPECT_EQ(walk(t, old_text, {0})[0], 0u) << "least recently used went first";
}

TEST(prefix_tree, nodes_age_out_after_the_ttl) {
  prefix_tree t(1000, 10s);
  auto now = prefix_tree::clock::now();
  t.insert(0, chunk_hashes(text_of('a', 16), 8), now);
  t.insert(1, chunk_hashes(text_of('a', 16), 8), now + 8s);
  t.expire(now + 12s);
  auto m = walk(t, text_of('a', 16), {0, 1});
  EXPECT_EQ(m, (std::vector<std::uint32_t>{0, 2})) << "replica 0's entries are 12 s old";
  t.expire(now + 30s);
  EXPECT_EQ(t.nodes(), 0u);
}

TEST(prefix_tree, forget_removes_one_replica) {
  prefix_tree t(1000, 3600s);
  auto now = prefix_tree::clock::now();
  t.insert(0, chunk_hashes(text_of('a', 16), 8), now);
  t.insert(1, chunk_hashes(text_of('a', 16), 8), now);
  t.forget(0);
  EXPECT_EQ(walk(t, text_of('a', 16), {0, 1}), (std::vector<std::uint32_t>{0, 2}));
  EXPECT_EQ(t.size(0), 0u);
}

TEST(prefix_tree, memory_stays_bounded_under_repeated_touches) {
  prefix_tree t(64, 3600s);
  auto now = prefix_tree::clock::now();
  auto chunks = chunk_hashes(text_of('r', 8 * 32), 8);
  for (int i = 0; i < 20000; ++i)
    t.insert(static_cast<tree_replica>(i % 2), chunks, now);
  EXPECT_EQ(t.size(0), 32u);
  EXPECT_EQ(t.nodes(), 32u);
  EXPECT_LE(t.queue_size(0), 2 * 32u + 64) << "stale LRU records are compacted away";
  for (int i = 0; i < 2000; ++i)
    t.insert(0, chunk_hashes(std::to_string(i) + text_of('u', 64), 8), now);
  EXPECT_EQ(t.size(0), 64u) << "capacity holds under churn";
  EXPECT_EQ(walk(t, text_of('r', 8 * 32), {1})[0], 32u) << "replica 1 is not affected";
}
