// Golden bytes of every event kind in both shapes, annotated field by field.
// The bytes are those vLLM's own publisher produced (golden/vllm-captures/
// wire_dump.txt); the annotations say what each run of bytes means.
#include "tests/support/captures.hpp"
#include "wire/kv_events.hpp"

#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw::wire;
using llmgw::test::from_hex;

namespace {

// The block hash used throughout wire_dump.txt, as uint64.
constexpr block_key dump_key = 16284813627505341992u;

// Wraps one event into a batch [1.5, [event], 0].
std::string batch_of(const std::string& event_hex) {
  return from_hex("93"                 // array of 3: the batch
                  "cb3ff8000000000000" // float64 1.5: ts
                  "91"                 // array of 1: events
                  + event_hex          //
                  + "00");             // positive fixint 0: data_parallel_rank
}

kv_event decode_one(const std::string& event_hex) {
  auto batch = decode_batch(batch_of(event_hex));
  EXPECT_TRUE(batch) << batch.err().message;
  if (!batch)
    return {};
  EXPECT_EQ(batch->ts, 1.5);
  EXPECT_EQ(batch->data_parallel_rank, 0);
  EXPECT_EQ(batch->events.size(), 1u);
  return batch->events.empty() ? kv_event{} : batch->events[0];
}

} // namespace

TEST(kv_events_golden, array_block_stored_all_common_fields) {
  auto ev = decode_one("9c"                             // array of 12
                       "ab426c6f636b53746f726564"       // str(11) "BlockStored"
                       "91cfe1ff47b6ace57628"           // block_hashes: [uint64 0xe1ff47b6ace57628]
                       "07"                             // parent_block_hash: 7
                       "9101"                           // token_ids: [1]
                       "10"                             // block_size: 16
                       "01"                             // lora_id: 1
                       "a3475055"                       // medium: "GPU"
                       "a873716c2d6c6f7261"             // lora_name: "sql-lora"
                       "91"                             // extra_keys: array of 1 (one block)
                       "92a873716c2d6c6f7261"           //   ["sql-lora",
                       "a874656e616e742d61"             //    "tenant-a"]
                       "00"                             // group_idx: 0
                       "ae66756c6c5f617474656e74696f6e" // kv_cache_spec_kind: "full_attention"
                       "c0");                           // kv_cache_spec_sliding_window: nil
  EXPECT_EQ(ev.kind, event_kind::block_stored);
  ASSERT_EQ(ev.block_hashes.size(), 1u);
  EXPECT_EQ(ev.block_hashes[0].key, dump_key);
  EXPECT_FALSE(ev.block_hashes[0].has_digest());
  ASSERT_TRUE(ev.parent_block_hash);
  EXPECT_EQ(ev.parent_block_hash->key, 7u);
  EXPECT_EQ(ev.token_ids, std::vector<std::uint32_t>{1});
  EXPECT_EQ(ev.block_size, 16u);
  EXPECT_EQ(ev.lora_id, 1);
  EXPECT_EQ(ev.medium, "GPU");
  EXPECT_EQ(ev.lora_name, "sql-lora");
  ASSERT_TRUE(ev.extra_keys);
  ASSERT_EQ(ev.extra_keys->size(), 1u);
  ASSERT_TRUE((*ev.extra_keys)[0]);
  EXPECT_EQ(*(*ev.extra_keys)[0], (std::vector<extra_item>{extra_item::of_text("sql-lora"),
                                                           extra_item::of_text("tenant-a")}));
  EXPECT_EQ(ev.group_idx, 0);
  EXPECT_EQ(ev.kv_cache_spec_kind, "full_attention");
  EXPECT_FALSE(ev.kv_cache_spec_sliding_window);
  EXPECT_FALSE(ev.locality);
}

TEST(kv_events_golden, array_block_stored_minimal_bytes_hash) {
  auto ev = decode_one(
    "9c"                                                                   // array of 12
    "ab426c6f636b53746f726564"                                             // "BlockStored"
    "91c420"                                                               // block_hashes: [bin(32)
    "3802de9f58d7db4e00000000000000000000000000000000e1ff47b6ace57628"     //   digest]
    "c420000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f" // parent: bin(32)
    "93010203"                                                             // token_ids [1,2,3]
    "10"                                                                   // block_size 16
    "c0"                                                                   // lora_id nil
    "a3475055"                                                             // medium "GPU"
    "c0c0c0c0c0");                                                         // 5 more nils
  ASSERT_EQ(ev.block_hashes.size(), 1u);
  EXPECT_EQ(ev.block_hashes[0].digest_size, 32);
  EXPECT_EQ(ev.block_hashes[0].key, dump_key) << "a digest reduces to its last 8 bytes";
  EXPECT_EQ(ev.block_hashes[0].digest[0], 0x38);
  ASSERT_TRUE(ev.parent_block_hash);
  EXPECT_EQ(ev.parent_block_hash->key, 0x18191a1b1c1d1e1fu);
  EXPECT_EQ(ev.token_ids, (std::vector<std::uint32_t>{1, 2, 3}));
  EXPECT_FALSE(ev.lora_id);
  EXPECT_FALSE(ev.lora_name);
  EXPECT_FALSE(ev.extra_keys);
  EXPECT_FALSE(ev.group_idx);
}

TEST(kv_events_golden, array_block_removed) {
  auto ev = decode_one("94"                         // array of 4
                       "ac426c6f636b52656d6f766564" // str(12) "BlockRemoved"
                       "91cfe1ff47b6ace57628"       // block_hashes
                       "a3475055"                   // medium "GPU"
                       "00");                       // group_idx 0
  EXPECT_EQ(ev.kind, event_kind::block_removed);
  ASSERT_EQ(ev.block_hashes.size(), 1u);
  EXPECT_EQ(ev.block_hashes[0].key, dump_key);
  EXPECT_EQ(ev.medium, "GPU");
  EXPECT_EQ(ev.group_idx, 0);
  auto nil_group = decode_one("94ac426c6f636b52656d6f76656491cfe1ff47b6ace57628a3475055"
                              "c0"); // group_idx nil
  EXPECT_FALSE(nil_group.group_idx);
}

TEST(kv_events_golden, array_all_blocks_cleared) {
  auto ev = decode_one("91"                                   // array of 1
                       "b0416c6c426c6f636b73436c6561726564"); // str(16) "AllBlocksCleared"
  EXPECT_EQ(ev.kind, event_kind::all_blocks_cleared);
  EXPECT_TRUE(ev.block_hashes.empty());
}

TEST(kv_events_golden, map_block_stored_all_common_fields) {
  auto ev = decode_one("8b"                                   // map of 11
                       "a474797065ab426c6f636b53746f726564"   // "type": "BlockStored"
                       "ac626c6f636b5f686173686573"           // "block_hashes":
                       "91cfe1ff47b6ace57628"                 //   [0xe1ff47b6ace57628]
                       "b1706172656e745f626c6f636b5f68617368" // "parent_block_hash":
                       "07"                                   //   7
                       "a9746f6b656e5f696473"
                       "9101" // "token_ids": [1]
                       "aa626c6f636b5f73697a65"
                       "10" // "block_size": 16
                       "a76c6f72615f6964"
                       "01" // "lora_id": 1
                       "a66d656469756d"
                       "a3475055"                                 // "medium": "GPU"
                       "a96c6f72615f6e616d65"                     // "lora_name":
                       "a873716c2d6c6f7261"                       //   "sql-lora"
                       "aa65787472615f6b657973"                   // "extra_keys":
                       "9192a873716c2d6c6f7261a874656e616e742d61" // [["sql-lora","tenant-a"]]
                       "a967726f75705f696478"
                       "00"                                     // "group_idx": 0
                       "b26b765f63616368655f737065635f6b696e64" // "kv_cache_spec_kind":
                       "ae66756c6c5f617474656e74696f6e");       //   "full_attention"
  EXPECT_EQ(ev.kind, event_kind::block_stored);
  ASSERT_EQ(ev.block_hashes.size(), 1u);
  EXPECT_EQ(ev.block_hashes[0].key, dump_key);
  EXPECT_EQ(ev.parent_block_hash->key, 7u);
  EXPECT_EQ(ev.token_ids, std::vector<std::uint32_t>{1});
  EXPECT_EQ(ev.block_size, 16u);
  EXPECT_EQ(ev.lora_id, 1);
  EXPECT_EQ(ev.lora_name, "sql-lora");
  ASSERT_TRUE(ev.extra_keys && (*ev.extra_keys)[0]);
  EXPECT_EQ((*ev.extra_keys)[0]->size(), 2u);
  EXPECT_EQ(ev.group_idx, 0);
  EXPECT_EQ(ev.kv_cache_spec_kind, "full_attention");
  EXPECT_FALSE(ev.kv_cache_spec_sliding_window) << "missing map keys take their default";
}

TEST(kv_events_golden, map_block_removed_and_cleared) {
  auto removed = decode_one("83"                                   // map of 3
                            "a474797065ac426c6f636b52656d6f766564" // "type": "BlockRemoved"
                            "ac626c6f636b5f686173686573"           // "block_hashes":
                            "91cfe1ff47b6ace57628"                 //   [...]
                            "a66d656469756da3475055");             // "medium": "GPU"
  EXPECT_EQ(removed.kind, event_kind::block_removed);
  EXPECT_EQ(removed.block_hashes.at(0).key, dump_key);
  EXPECT_FALSE(removed.group_idx);
  auto cleared = decode_one("81"                                   // map of 1
                            "a474797065"                           // "type":
                            "b0416c6c426c6f636b73436c6561726564"); // "AllBlocksCleared"
  EXPECT_EQ(cleared.kind, event_kind::all_blocks_cleared);
}

TEST(kv_events_golden, map_skips_unknown_keys_and_reads_locality) {
  auto ev = decode_one("84"                                   // map of 4
                       "a474797065ac426c6f636b52656d6f766564" // "type": "BlockRemoved"
                       "a46e657773"
                       "92c0a3616263" // "news": [nil, "abc"] (unknown)
                       "ac626c6f636b5f686173686573"
                       "9105" // "block_hashes": [5]
                       "a86c6f63616c697479"
                       "a46e6f6465"); // "locality": "node"
  EXPECT_EQ(ev.block_hashes.at(0).key, 5u);
  EXPECT_EQ(ev.locality, "node");
}

TEST(kv_events_golden, batch_with_nil_rank_and_two_element_batch) {
  auto nil_rank = decode_batch(from_hex("93cb3ff8000000000000"
                                        "9191b0416c6c426c6f636b73436c6561726564"
                                        "c0")); // data_parallel_rank nil
  ASSERT_TRUE(nil_rank) << nil_rank.err().message;
  EXPECT_FALSE(nil_rank->data_parallel_rank);
  auto two = decode_batch(from_hex("92cb3ff8000000000000"
                                   "90")); // [1.5, []]
  ASSERT_TRUE(two) << two.err().message;
  EXPECT_TRUE(two->events.empty());
  EXPECT_FALSE(two->data_parallel_rank);
  auto extra = decode_batch(from_hex("94cb3ff8000000000000"
                                     "90"
                                     "01"
                                     "a3787878")); // 4th element
  ASSERT_TRUE(extra) << extra.err().message;
  EXPECT_EQ(extra->data_parallel_rank, 1);
}

TEST(kv_events_golden, array_extra_trailing_elements_are_skipped) {
  // BlockRemoved with a sixth, unknown element after locality.
  auto ev = decode_one("96ac426c6f636b52656d6f766564"
                       "9101"
                       "a3435055"
                       "01"
                       "a26e30"
                       "c3");
  EXPECT_EQ(ev.medium, "CPU");
  EXPECT_EQ(ev.group_idx, 1);
  EXPECT_EQ(ev.locality, "n0");
}

TEST(kv_events_golden, every_integer_width_of_hashes) {
  // positive fixint, uint8, uint16, uint32, uint64
  auto ev = decode_one("92ac426c6f636b52656d6f766564"
                       "95"
                       "7f"
                       "ccff"
                       "cd0100"
                       "ce00010000"
                       "cf0000000100000000");
  ASSERT_EQ(ev.block_hashes.size(), 5u);
  EXPECT_EQ(ev.block_hashes[0].key, 0x7fu);
  EXPECT_EQ(ev.block_hashes[1].key, 0xffu);
  EXPECT_EQ(ev.block_hashes[2].key, 0x100u);
  EXPECT_EQ(ev.block_hashes[3].key, 0x10000u);
  EXPECT_EQ(ev.block_hashes[4].key, 0x100000000u);
}

TEST(kv_events_golden, sixteen_byte_digest) {
  auto ev = decode_one("92ac426c6f636b52656d6f766564"
                       "91c410"
                       "00112233445566778899aabbccddeeff");
  ASSERT_EQ(ev.block_hashes.size(), 1u);
  EXPECT_EQ(ev.block_hashes[0].digest_size, 16);
  EXPECT_EQ(ev.block_hashes[0].key, 0x8899aabbccddeeffu);
}
