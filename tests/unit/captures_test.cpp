// Every capture in golden/vllm-captures/ decodes frame by frame, and applying
// its batches to the capture README's reference model (refcounts per hash as
// on the wire and medium) gives exactly the capture's `expected` section.
// The request chains listed in each capture are recomputed with wire/'s
// hashing and must equal vLLM's digests.
#include "tests/support/captures.hpp"
#include "wire/block_hash.hpp"
#include "wire/kv_events.hpp"
#include "wire/zmq_message.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <map>
#include <set>

using namespace llmgw;
using namespace llmgw;
using namespace llmgw::wire;
namespace json = boost::json;

namespace {

/// The capture README's reference model: a multiset of (hash as on the wire,
/// medium) with refcounts.
struct reference_table {
  using key = std::tuple<std::string, std::string, std::string>; // medium, kind, hash
  std::map<key, std::int64_t> refs;
  std::int64_t ignored_removes = 0;

  /// The capture README's notable batches, as this table sees them.
  std::map<std::string, std::set<std::int64_t>> notable;
  std::int64_t batch = 0;
  std::set<key> removed_in_batch;

  void start_batch(std::int64_t seq) {
    batch = seq;
    removed_in_batch.clear();
  }

  static std::pair<std::string, std::string> wire_form(const block_hash& h) {
    if (!h.has_digest())
      return {"int", std::to_string(h.key)};
    std::string bytes(reinterpret_cast<const char*>(h.digest.data()), h.digest_size);
    return {"bytes", test::to_hex(bytes)};
  }

  void apply(const kv_event& ev) {
    if (ev.kind != event_kind::all_blocks_cleared && ev.medium_or_gpu() != "GPU")
      notable["cpu_medium"].insert(batch);
    switch (ev.kind) {
    case event_kind::block_stored:
      for (const auto& h : ev.block_hashes) {
        auto [kind, text] = wire_form(h);
        key k{std::string(ev.medium_or_gpu()), kind, text};
        if (refs.count(k))
          notable["duplicate_store"].insert(batch);
        if (removed_in_batch.count(k))
          notable["removed_then_stored"].insert(batch);
        ++refs[k];
      }
      break;
    case event_kind::block_removed:
      for (const auto& h : ev.block_hashes) {
        auto [kind, text] = wire_form(h);
        key k{std::string(ev.medium_or_gpu()), kind, text};
        removed_in_batch.insert(k);
        auto it = refs.find(k);
        if (it == refs.end()) {
          ++ignored_removes;
          notable["ignored_remove"].insert(batch);
          continue;
        }
        if (it->second > 1)
          notable["refcount_decrement_not_delete"].insert(batch);
        if (--it->second == 0)
          refs.erase(it);
      }
      break;
    case event_kind::all_blocks_cleared:
      notable["all_blocks_cleared"].insert(batch);
      refs.clear();
      break;
    }
  }

  std::int64_t total_refs() const {
    std::int64_t sum = 0;
    for (const auto& [key, n] : refs)
      sum += n;
    return sum;
  }
};

class capture_test : public ::testing::TestWithParam<std::string> {};

TEST_P(capture_test, decodes_and_replays_to_expected_state) {
  auto doc = test::read_json(test::capture_path(GetParam()));
  ASSERT_TRUE(doc.is_object());
  const auto& cap = doc.as_object();
  const auto& frames = cap.at("frames").as_array();
  const auto& expected = cap.at("expected").as_object();
  auto topic = json::value_to<std::string>(cap.at("topic"));
  auto rank = cap.at("data_parallel_rank").as_int64();
  ASSERT_EQ(frames.size(), static_cast<std::size_t>(cap.at("published_batches").as_int64()));

  reference_table table;
  std::map<std::string, std::int64_t> counts;
  seq_tracker tracker;
  const auto& sizes = expected.at("sizes_after_batch").as_array();
  const auto& totals = expected.at("total_refs_after_batch").as_array();
  ASSERT_EQ(sizes.size(), frames.size());
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const auto& f = frames[i].as_object();
    auto topic_bytes = test::from_hex(json::value_to<std::string>(f.at("topic_hex")));
    auto seq_bytes = test::from_hex(json::value_to<std::string>(f.at("seq_hex")));
    auto payload = test::from_hex(json::value_to<std::string>(f.at("payload_hex")));
    auto msg = split_live_message({topic_bytes, seq_bytes, payload});
    ASSERT_TRUE(msg) << "frame " << i << ": " << msg.err().message;
    EXPECT_EQ(msg->topic, topic);
    EXPECT_EQ(msg->seq, static_cast<std::uint64_t>(f.at("seq").as_int64()));
    auto verdict = tracker.observe(msg->seq);
    EXPECT_TRUE(verdict == seq_verdict::first || verdict == seq_verdict::next) << "frame " << i;
    auto batch = decode_batch(msg->payload);
    ASSERT_TRUE(batch) << GetParam() << " frame " << i << ": " << batch.err().message;
    EXPECT_EQ(batch->data_parallel_rank, rank);
    EXPECT_GT(batch->ts, 1.6e9) << "ts is the capture's wall-clock time";
    table.start_batch(static_cast<std::int64_t>(msg->seq));
    for (const auto& ev : batch->events) {
      ++counts[to_string(ev.kind)];
      if (ev.kind == event_kind::block_stored)
        counts["stored_hashes"] += static_cast<std::int64_t>(ev.block_hashes.size());
      if (ev.kind == event_kind::block_removed)
        counts["removed_hashes"] += static_cast<std::int64_t>(ev.block_hashes.size());
      table.apply(ev);
    }
    EXPECT_EQ(static_cast<std::int64_t>(table.refs.size()), sizes[i].as_int64())
      << "after batch " << i;
    EXPECT_EQ(table.total_refs(), totals[i].as_int64()) << "after batch " << i;
  }

  for (const auto& [name, value] : expected.at("counts").as_object()) {
    if (name == "batches")
      EXPECT_EQ(static_cast<std::int64_t>(frames.size()), value.as_int64());
    else
      EXPECT_EQ(counts[std::string(name)], value.as_int64()) << name;
  }
  EXPECT_EQ(table.ignored_removes, expected.at("ignored_removes").as_int64());
  EXPECT_EQ(static_cast<std::int64_t>(table.refs.size()), expected.at("final_size").as_int64());
  EXPECT_EQ(table.total_refs(), expected.at("final_total_refs").as_int64());

  std::map<std::tuple<std::string, std::string, std::string>, std::int64_t> want;
  for (const auto& b : expected.at("final_blocks").as_array()) {
    const auto& o = b.as_object();
    want[{json::value_to<std::string>(o.at("medium")),
          json::value_to<std::string>(o.at("hash_kind")),
          json::value_to<std::string>(o.at("hash"))}] = o.at("refs").as_int64();
  }
  EXPECT_EQ(table.refs, want);

  for (const auto& [name, seqs] : expected.at("notable_batches").as_object()) {
    std::set<std::int64_t> want_seqs;
    for (const auto& v : seqs.as_array())
      want_seqs.insert(v.as_int64());
    EXPECT_EQ(table.notable[std::string(name)], want_seqs) << "notable batches: " << name;
  }
}

TEST_P(capture_test, request_chains_match_vllm_digests) {
  auto doc = test::read_json(test::capture_path(GetParam()));
  const auto& cap = doc.as_object();
  auto seed = json::value_to<std::string>(cap.at("hash_seed"));
  auto block_size = static_cast<std::size_t>(cap.at("block_size").as_int64());
  block_hasher hasher(seed, block_size);
  EXPECT_EQ(to_hex(hasher.root()), json::value_to<std::string>(cap.at("none_hash_hex")));
  std::size_t checked = 0;
  for (const auto& r : cap.at("requests").as_array()) {
    const auto& req = r.as_object();
    std::vector<std::uint32_t> tokens;
    for (const auto& t : req.at("tokens").as_array())
      tokens.push_back(static_cast<std::uint32_t>(t.as_int64()));
    extra_key_recipe extras;
    if (!req.at("lora_name").is_null())
      extras.lora_name = json::value_to<std::string>(req.at("lora_name"));
    if (!req.at("cache_salt").is_null())
      extras.cache_salt = json::value_to<std::string>(req.at("cache_salt"));
    auto blocks = hasher.hash(tokens, extras);
    const auto& hexes = req.at("block_hashes_hex").as_array();
    const auto& keys = req.at("block_hashes_u64").as_array();
    ASSERT_EQ(blocks.size(), hexes.size()) << "request " << req.at("id");
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_EQ(to_hex(blocks[i].full), json::value_to<std::string>(hexes[i]))
        << "request " << req.at("id") << " block " << i;
      EXPECT_EQ(blocks[i].key, json::value_to<std::uint64_t>(keys[i]));
      ++checked;
    }
  }
  EXPECT_GT(checked, 0u);
}

std::vector<std::string> all_captures() {
  auto names = test::capture_names();
  return names;
}

INSTANTIATE_TEST_SUITE_P(vllm_captures, capture_test, ::testing::ValuesIn(all_captures()),
                         [](const auto& info) {
                           std::string name = info.param.substr(0, info.param.size() - 5);
                           for (auto& c : name)
                             if (c == '.')
                               c = '_';
                           return name;
                         });

TEST(captures, all_twenty_four_are_present) {
  EXPECT_EQ(test::capture_names().size(), 24u)
    << "expected 6 scenarios x 2 shapes x 2 hash forms in " << LLMGW_CAPTURES_DIR;
}

} // namespace
