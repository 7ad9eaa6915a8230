// Hostile payloads: each must give a precise error (what, and at which event
// and field), never a crash, never an allocation out of proportion to the
// input.
#include "tests/support/captures.hpp"
#include "wire/kv_events.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <random>

using namespace llmgw;
using namespace llmgw::wire;
using llmgw::test::from_hex;

namespace {

const std::string ts = "cb3ff8000000000000"; // float64 1.5
const std::string stored_tag = "ab426c6f636b53746f726564";
const std::string removed_tag = "ac426c6f636b52656d6f766564";

error expect_error(const std::string& hex, errc code) {
  auto batch = decode_batch(from_hex(hex));
  EXPECT_FALSE(batch) << "decoded although it should not: " << hex;
  if (batch)
    return {};
  EXPECT_EQ(batch.err().code, code) << batch.err().message;
  EXPECT_FALSE(batch.err().message.empty());
  return batch.err();
}

bool contains(const error& e, const std::string& part) {
  return e.message.find(part) != std::string::npos;
}

std::string real_payload() {
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.int.json"));
  auto hex = boost::json::value_to<std::string>(doc.at("frames").at(0).at("payload_hex"));
  return from_hex(hex);
}

} // namespace

TEST(kv_events_hostile, every_truncation_of_a_real_payload_is_an_error) {
  auto payload = real_payload();
  ASSERT_TRUE(decode_batch(payload)) << "the untruncated payload decodes";
  for (std::size_t n = 0; n < payload.size(); ++n) {
    auto batch = decode_batch(std::string_view(payload).substr(0, n));
    ASSERT_FALSE(batch) << "prefix of " << n << " bytes decoded";
    // A cut payload either ends inside a value, or its array headers claim
    // more elements than the remaining bytes could hold.
    auto code = batch.err().code;
    EXPECT_TRUE(code == errc::truncated || code == errc::bad_length)
      << n << ": " << batch.err().message;
  }
}

TEST(kv_events_hostile, wrong_types_name_the_field) {
  auto e = expect_error("a3616263", errc::bad_type); // "abc"
  EXPECT_TRUE(contains(e, "batch")) << e.message;
  e = expect_error("92" + ts + "05", errc::bad_type); // events: 5
  EXPECT_TRUE(contains(e, "'events'")) << e.message;
  e = expect_error("93a1780000", errc::bad_type); // ts: "x"
  EXPECT_TRUE(contains(e, "'ts'")) << e.message;
  // Second event: a BlockStored whose token_ids[2] is a string.
  e = expect_error("92" + ts + "92" + "91b0416c6c426c6f636b73436c6561726564" + "96" + stored_tag
                     + "9101" + "c0" + "9301 02 a178" + "10" + "c0",
                   errc::bad_type);
  EXPECT_TRUE(contains(e, "event 1 (BlockStored), field 'token_ids', element 2")) << e.message;
  e = expect_error("92" + ts + "91" + "96" + stored_tag + "9101" + "c0" + "90" + "ff" + "c0",
                   errc::bad_type);
  EXPECT_TRUE(contains(e, "'block_size'")) << e.message;
  e = expect_error("92" + ts + "91" + "93" + removed_tag + "9101" + "05",
                   errc::bad_type); // medium: 5
  EXPECT_TRUE(contains(e, "'medium'")) << e.message;
  e = expect_error("92" + ts + "91" + "05", errc::bad_type); // event: 5
  EXPECT_TRUE(contains(e, "event 0")) << e.message;
  e = expect_error("93" + ts + "90" + "a178", errc::bad_type); // rank: "x"
  EXPECT_TRUE(contains(e, "data_parallel_rank")) << e.message;
}

TEST(kv_events_hostile, out_of_range_values) {
  // token id 2^32
  auto e = expect_error("92" + ts + "91" + "96" + stored_tag + "9101" + "c0"
                          + "91cf0000000100000000" + "10" + "c0",
                        errc::bad_value);
  EXPECT_TRUE(contains(e, "does not fit 32 bits")) << e.message;
  // group_idx 2^64-1 does not fit int64
  e = expect_error("92" + ts + "91" + "94" + removed_tag + "9101" + "c0" + "cfffffffffffffffff",
                   errc::bad_value);
  EXPECT_TRUE(contains(e, "'group_idx'")) << e.message;
}

TEST(kv_events_hostile, absurd_lengths_are_refused_before_allocation) {
  // An array32 header claiming 4 billion events in a 20-byte payload.
  auto e = expect_error("92" + ts + "ddffffffff", errc::bad_length);
  EXPECT_TRUE(contains(e, "claim")) << e.message;
  // A map32 header claiming 2^31 pairs.
  expect_error("92" + ts + "91" + "df80000000", errc::bad_length);
  // A str32 claiming 4 GiB.
  expect_error("92" + ts + "91" + "91dbffffffff", errc::truncated);
  // Fewer elements than an event needs.
  e = expect_error("92" + ts + "91" + "93" + stored_tag + "9101c0", errc::bad_length);
  EXPECT_TRUE(contains(e, "at least 6")) << e.message;
  expect_error("92" + ts + "91" + "90", errc::bad_length); // empty event
  expect_error("91" + ts, errc::bad_length);               // [ts] only
}

TEST(kv_events_hostile, deep_nesting) {
  std::string deep = "92" + ts + "91" + "99" + stored_tag + "9101c09010c0c0c0";
  // extra_keys: 40 levels of single-element arrays
  for (int i = 0; i < 40; ++i)
    deep += "91";
  deep += "c0";
  auto e = expect_error(deep, errc::too_deep);
  EXPECT_TRUE(contains(e, "16 levels")) << e.message;
}

TEST(kv_events_hostile, unknown_event_types_are_skipped_and_the_rest_applies) {
  // [AllBlocksCleared], ["BlockFoo", 1, 2], then {"type": "BlockTransferred", "x": 1}
  // (ROCm ATOM publishes that kind in the same stream).
  auto batch = decode_batch(from_hex("92" + ts + "93" + "91b0416c6c426c6f636b73436c6561726564"
                                     + "93a8426c6f636b466f6f0102"
                                     + "82a474797065b0426c6f636b5472616e73666572726564a17801"));
  ASSERT_TRUE(batch) << batch.err().message;
  ASSERT_EQ(batch->events.size(), 1u) << "the known event";
  EXPECT_EQ(batch->events[0].kind, event_kind::all_blocks_cleared);
  EXPECT_EQ(batch->skipped, 2u);
  EXPECT_EQ(batch->skipped_types, (std::vector<std::string>{"BlockFoo", "BlockTransferred"}));
  batch = decode_batch(from_hex("92" + ts + "91"
                                + "81a474797065a3"
                                  "0a0d1b")); // control chars in the name
  ASSERT_TRUE(batch) << batch.err().message;
  ASSERT_EQ(batch->skipped_types.size(), 1u);
  EXPECT_NE(batch->skipped_types[0].find("\\x0a"), std::string::npos)
    << "unprintable bytes are escaped: " << batch->skipped_types[0];
  // Many unknown events: all counted, a few names kept.
  std::string many = "92" + ts + "dc0400"; // array16 of 1024 events
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 1024; ++i) { // ["a"], ["b"], ... ["z"], ["a"], ...
    int c = 'a' + i % 26;
    many += std::string("91a1") + hex[c >> 4] + hex[c & 15];
  }
  batch = decode_batch(from_hex(many));
  ASSERT_TRUE(batch) << batch.err().message;
  EXPECT_TRUE(batch->events.empty());
  EXPECT_EQ(batch->skipped, 1024u);
  EXPECT_EQ(batch->skipped_types.size(), event_batch::max_skipped_types);
  auto e = expect_error("92" + ts + "91"
                          + "81a474797065"
                            "05",
                        errc::bad_type); // "type": 5
  e = expect_error("92" + ts + "91"
                     + "81a3747970"
                       "05",
                   errc::bad_value); // no "type" key
  EXPECT_TRUE(contains(e, "without a 'type'")) << e.message;
}

TEST(kv_events_hostile, hashes_of_the_wrong_size_or_form) {
  auto e = expect_error("92" + ts + "91" + "92" + removed_tag + "91c414" + std::string(40, 'a'),
                        errc::bad_hash);
  EXPECT_TRUE(contains(e, "20 bytes")) << e.message;
  EXPECT_TRUE(contains(e, "element 0")) << e.message;
  e = expect_error("92" + ts + "91" + "92" + removed_tag
                     + "92"
                       "01"
                       "ff",
                   errc::bad_hash); // -1
  EXPECT_TRUE(contains(e, "element 1")) << e.message;
  expect_error("92" + ts + "91" + "92" + removed_tag + "91a3616263", errc::bad_hash); // "abc"
  // parent_block_hash as a 31-byte bin
  expect_error("92" + ts + "91" + "96" + stored_tag + "9101" + "c41f" + std::string(62, 'b')
                 + "9010c0",
               errc::bad_hash);
}

TEST(kv_events_hostile, map_shape_rules) {
  // A map BlockStored without block_hashes.
  auto e = expect_error("92" + ts + "91" + "81a474797065" + stored_tag, errc::bad_value);
  EXPECT_TRUE(contains(e, "'block_hashes': missing")) << e.message;
  // block_hashes twice.
  e = expect_error("92" + ts + "91" + "83a474797065" + removed_tag
                     + "ac626c6f636b5f6861736865739101"
                       "ac626c6f636b5f6861736865739102",
                   errc::bad_value);
  EXPECT_TRUE(contains(e, "twice")) << e.message;
  // An integer map key.
  expect_error("92" + ts + "91" + "82a474797065" + removed_tag + "0101", errc::bad_type);
}

TEST(kv_events_hostile, trailing_and_oversized_payloads) {
  auto e = expect_error("92" + ts + "90" + "c0c0", errc::trailing_bytes);
  EXPECT_TRUE(contains(e, "2 bytes after")) << e.message;
  decode_limits small;
  small.max_payload_bytes = 8;
  auto big = decode_batch(from_hex("92" + ts + "90"), small);
  ASSERT_FALSE(big);
  EXPECT_EQ(big.err().code, errc::too_large);
  expect_error("", errc::truncated);
  expect_error("c1", errc::bad_type); // 0xc1 is never valid msgpack
}

TEST(kv_events_hostile, random_corruption_never_crashes) {
  // Decode thousands of corrupted copies of real payloads. Each either
  // decodes or yields an error with a message; ASan/UBSan builds run this too.
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S5_dup.array.int.json"));
  std::vector<std::string> payloads;
  for (const auto& f : doc.at("frames").as_array())
    payloads.push_back(from_hex(boost::json::value_to<std::string>(f.at("payload_hex"))));
  std::mt19937 rng(20261202);
  std::size_t decoded = 0;
  std::size_t rejected = 0;
  for (int round = 0; round < 4000; ++round) {
    auto p = payloads[rng() % payloads.size()];
    auto flips = 1 + rng() % 4;
    for (std::size_t k = 0; k < flips; ++k)
      p[rng() % p.size()] = static_cast<char>(rng());
    auto batch = decode_batch(p);
    if (batch) {
      ++decoded;
    } else {
      ++rejected;
      ASSERT_FALSE(batch.err().message.empty());
    }
  }
  EXPECT_GT(rejected, 0u) << "corruption must be noticed at least sometimes";
  EXPECT_EQ(decoded + rejected, 4000u);
}
