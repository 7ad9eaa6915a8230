// The event encoder (llmgw-sim publishes with it) against vLLM's own bytes:
// every payload of every capture, decoded and encoded again, must come out
// identical, in both event shapes and both hash forms.
#include "tests/support/captures.hpp"
#include "wire/kv_events.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw::wire;

TEST(kv_events_encode, reproduces_every_capture_payload_byte_for_byte) {
  std::size_t payloads = 0;
  for (const auto& name : llmgw::test::capture_names()) {
    auto doc = llmgw::test::read_json(llmgw::test::capture_path(name));
    auto shape = doc.at("event_encoding") == "array" ? event_shape::array : event_shape::map;
    for (const auto& f : doc.at("frames").as_array()) {
      auto payload = llmgw::test::from_hex(boost::json::value_to<std::string>(f.at("payload_hex")));
      auto batch = decode_batch(payload);
      ASSERT_TRUE(batch) << name << ": " << batch.err().message;
      auto again = encode_batch(*batch, shape);
      ASSERT_EQ(llmgw::test::to_hex(again), llmgw::test::to_hex(payload))
        << name << " seq " << f.at("seq");
      ++payloads;
    }
  }
  EXPECT_GT(payloads, 8000u) << "every capture's frames were compared";
}

TEST(kv_events_encode, optional_fields_round_trip) {
  event_batch b;
  b.ts = 12.25;
  kv_event stored;
  stored.kind = event_kind::block_stored;
  block_hash h;
  h.key = 42;
  stored.block_hashes = {h};
  stored.token_ids = {1, 2, 3, 4};
  stored.block_size = 4;
  stored.medium = "CPU";
  stored.lora_id = -1;
  stored.extra_keys = std::vector<block_extra>{
    std::vector<extra_item>{extra_item::of_text("salt"), extra_item::of_integer(-3)}};
  stored.kv_cache_spec_sliding_window = 128;
  stored.locality = "rack-2";
  kv_event removed;
  removed.kind = event_kind::block_removed;
  removed.block_hashes = {h};
  removed.locality = "rack-2";
  b.events = {stored, removed, kv_event{}};
  b.data_parallel_rank = 3;
  for (auto shape : {event_shape::array, event_shape::map}) {
    auto back = decode_batch(encode_batch(b, shape));
    ASSERT_TRUE(back) << back.err().message;
    EXPECT_EQ(back->ts, 12.25);
    EXPECT_EQ(back->data_parallel_rank, std::optional<std::int64_t>(3));
    ASSERT_EQ(back->events.size(), 3u);
    EXPECT_EQ(back->events[0].lora_id, std::optional<std::int64_t>(-1));
    EXPECT_EQ(back->events[0].extra_keys, stored.extra_keys);
    EXPECT_EQ(back->events[0].kv_cache_spec_sliding_window, std::optional<std::int64_t>(128));
    EXPECT_EQ(back->events[0].locality, std::optional<std::string>("rack-2"));
    EXPECT_EQ(back->events[1].locality, std::optional<std::string>("rack-2"));
    EXPECT_EQ(back->events[2].kind, event_kind::all_blocks_cleared);
  }
}
