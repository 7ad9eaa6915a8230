// wire/ block hashing against golden/block_hashes.json, which
// golden/make_block_hash_vectors.py computes with Python's cbor2 + hashlib.
// If the recipe changes on purpose, regenerate with
//   golden/make_block_hash_vectors.py
// and review the diff.
#include "tests/support/captures.hpp"
#include "wire/block_hash.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw::wire;
namespace json = boost::json;

namespace {

const char* regenerate =
  "; regenerate with golden/make_block_hash_vectors.py if the recipe changed";

} // namespace

TEST(block_hash, none_hash_of_seed_zero) {
  EXPECT_EQ(to_hex(none_hash("0")),
            "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e");
  EXPECT_NE(none_hash("0"), none_hash("1"));
}

TEST(block_hash, key_is_last_eight_bytes_big_endian) {
  auto d = *digest_from_hex("3802de9f58d7db4e00000000000000000000000000000000e1ff47b6ace57628");
  EXPECT_EQ(key_of(d), 16284813627505341992u);
  EXPECT_FALSE(digest_from_hex("abc"));
  EXPECT_FALSE(digest_from_hex(std::string(64, 'g')));
}

TEST(block_hash, golden_vectors) {
  auto doc = llmgw::test::read_json(llmgw::test::source_path("golden/block_hashes.json"));
  const auto& cases = doc.at("cases").as_array();
  ASSERT_GE(cases.size(), 14u);
  std::size_t blocks_checked = 0;
  for (const auto& c : cases) {
    const auto& o = c.as_object();
    auto name = json::value_to<std::string>(o.at("name"));
    SCOPED_TRACE(name);
    auto seed = json::value_to<std::string>(o.at("seed"));
    auto block_size = json::value_to<std::size_t>(o.at("block_size"));
    block_hasher hasher(seed, block_size);
    EXPECT_EQ(to_hex(hasher.root()), json::value_to<std::string>(o.at("none_hash"))) << regenerate;
    std::vector<std::uint32_t> tokens;
    for (const auto& t : o.at("tokens").as_array())
      tokens.push_back(json::value_to<std::uint32_t>(t));
    extra_key_recipe extras;
    if (!o.at("lora_name").is_null())
      extras.lora_name = json::value_to<std::string>(o.at("lora_name"));
    if (!o.at("cache_salt").is_null())
      extras.cache_salt = json::value_to<std::string>(o.at("cache_salt"));
    for (const auto& m : o.at("mm_items").as_array())
      extras.mm_items.push_back(
        {json::value_to<std::string>(m.at(0)), m.at(1).as_int64(), m.at(2).as_int64()});
    auto blocks = hasher.hash(tokens, extras);
    const auto& want = o.at("blocks").as_array();
    ASSERT_EQ(blocks.size(), want.size()) << regenerate;
    ASSERT_EQ(blocks.size(), tokens.size() / block_size);
    digest parent = hasher.root();
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const auto& w = want[i].as_object();
      EXPECT_EQ(to_hex(blocks[i].full), json::value_to<std::string>(w.at("digest")))
        << "block " << i << regenerate;
      EXPECT_EQ(blocks[i].key, json::value_to<std::uint64_t>(w.at("key"))) << "block " << i;
      if (auto cbor = w.if_contains("cbor")) {
        std::string bytes;
        auto start = static_cast<std::int64_t>(i * block_size);
        append_block_cbor(
          bytes, parent, tokens.data() + i * block_size, block_size,
          extras.for_block(i, start, start + static_cast<std::int64_t>(block_size)));
        EXPECT_EQ(llmgw::test::to_hex(bytes), json::value_to<std::string>(*cbor)) << "block " << i;
      }
      parent = blocks[i].full;
      ++blocks_checked;
    }
  }
  EXPECT_GT(blocks_checked, 250u);
}

TEST(block_hash, extra_keys_order_and_placement) {
  extra_key_recipe r;
  r.lora_name = "L";
  r.cache_salt = "S";
  r.mm_items = {{"img", 20, 40}};
  auto b0 = r.for_block(0, 0, 16);
  ASSERT_TRUE(b0);
  EXPECT_EQ(*b0, (std::vector<extra_item>{extra_item::of_text("L"), extra_item::of_text("S")}))
    << "salt on block 0 only, after the LoRA name; no image yet";
  auto b1 = r.for_block(1, 16, 32);
  ASSERT_TRUE(b1);
  EXPECT_EQ(*b1, (std::vector<extra_item>{
                   extra_item::of_text("L"),
                   extra_item::of_list({extra_item::of_text("img"), extra_item::of_integer(4)})}));
  auto b3 = r.for_block(3, 48, 64);
  ASSERT_TRUE(b3);
  EXPECT_EQ((*b3)[1].items[1].integer, -28) << "offset relative to the block start may be negative";
  extra_key_recipe none;
  EXPECT_FALSE(none.for_block(0, 0, 16)) << "no extra keys is CBOR null, never an empty array";
}

TEST(block_hash, cbor_of_negative_and_long_items) {
  std::string out;
  digest zero{};
  block_extra extra =
    std::vector<extra_item>{extra_item::of_integer(-1), extra_item::of_integer(-25),
                            extra_item::of_bytes(std::string(24, 'x'))};
  std::uint32_t tokens[] = {0, 23, 24, 255, 256, 65535, 65536, 4294967295u};
  append_block_cbor(out, zero, tokens, 8, extra);
  auto hex = llmgw::test::to_hex(out);
  EXPECT_EQ(hex.substr(0, 6), "835820");
  EXPECT_EQ(
    hex.substr(6 + 64),
    "88" // array of 8 tokens
    "00"
    "17"
    "1818"
    "18ff"
    "190100"
    "19ffff"
    "1a00010000"
    "1affffffff"
    "83"   // 3 extra items
    "20"   // -1
    "3818" // -25
    "5818"
      + std::string(48, '0').replace(0, 48, "787878787878787878787878787878787878787878787878"));
}

TEST(block_hash, short_prompt_has_no_blocks) {
  block_hasher hasher("0", 16);
  EXPECT_TRUE(hasher.hash(std::vector<std::uint32_t>(15, 1)).empty());
  EXPECT_EQ(hasher.hash(std::vector<std::uint32_t>(47, 1)).size(), 2u);
}
