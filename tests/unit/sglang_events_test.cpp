// SGLang's KV events: the streams its own publisher and event code wrote
// (golden/sglang-captures/), decoded exactly, written again byte for byte,
// and keyed by the cluster's hash as the router hashes the same prompts.
#include "apps/llmgw-sim/sim_sglang.hpp"
#include "kv/block_table.hpp"
#include "tests/support/captures.hpp"
#include "wire/block_hash.hpp"
#include "wire/kv_events.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

using namespace llmgw;
using llmgw::test::from_hex;

namespace {

boost::json::value capture(const std::string& name) {
  return test::read_json(test::source_path("golden/sglang-captures/" + name));
}

std::vector<std::uint32_t> tokens_of(const boost::json::value& request) {
  std::vector<std::uint32_t> out;
  for (const auto& t : request.at("tokens").as_array())
    out.push_back(static_cast<std::uint32_t>(t.to_number<std::int64_t>()));
  return out;
}

std::optional<std::string> salt_of(const boost::json::value& request) {
  const auto& s = request.at("cache_salt");
  if (s.is_null())
    return std::nullopt;
  return std::string(s.as_string());
}

/// The keys the router gives a request's whole blocks.
std::vector<wire::block_key> router_keys(const boost::json::value& request) {
  wire::block_hasher hasher("0", 16);
  wire::extra_key_recipe recipe;
  recipe.cache_salt = salt_of(request);
  std::vector<wire::block_key> out;
  for (const auto& b : hasher.hash(tokens_of(request), recipe))
    out.push_back(b.key);
  return out;
}

wire::event_batch decode(const boost::json::value& frame) {
  auto b = wire::decode_batch(from_hex(std::string(frame.at("payload_hex").as_string())), {},
                              wire::event_dialect::sglang);
  EXPECT_TRUE(b) << b.err().message;
  return b ? *b : wire::event_batch{};
}

} // namespace

TEST(sglang_captures, every_frame_decodes_and_is_written_again_byte_for_byte) {
  for (const char* name : {"G1_basic.json", "G2_dp.json"}) {
    SCOPED_TRACE(name);
    auto doc = capture(name);
    std::set<wire::block_key> ids; // SGLang's ids of every request's pages
    for (const auto& r : doc.at("requests").as_array())
      for (const auto& id : r.at("sglang_block_ids").as_array())
        ids.insert(static_cast<wire::block_key>(id.to_number<std::int64_t>()));
    const auto& frames = doc.at("frames").as_array();
    ASSERT_FALSE(frames.empty());
    int salted_pages = 0;
    for (const auto& f : frames) {
      auto payload = from_hex(std::string(f.at("payload_hex").as_string()));
      auto b = decode(f);
      EXPECT_EQ(b.data_parallel_rank, doc.at("attn_dp_rank").to_number<std::int64_t>());
      EXPECT_EQ(wire::encode_batch(b, wire::event_shape::sglang), payload)
        << "frame " << f.at("seq").as_int64();
      for (const auto& ev : b.events) {
        for (const auto& h : ev.block_hashes)
          EXPECT_EQ(ids.count(h.key), 1u) << "a page id no request has: " << h.key;
        if (ev.kind != wire::event_kind::block_stored)
          continue;
        EXPECT_EQ(ev.block_size, 16u);
        EXPECT_EQ(ev.block_hashes.size(), 1u); // one BlockStored per page
        ASSERT_TRUE(ev.extra_keys);
        ASSERT_EQ(ev.extra_keys->size(), 1u);
        // The salt among the extra keys of a salted chain's first page only.
        bool first_salted = ev.cache_salt && !ev.parent_block_hash;
        EXPECT_EQ(bool((*ev.extra_keys)[0]), first_salted);
        if (first_salted) {
          EXPECT_EQ((*ev.extra_keys)[0]->at(0), wire::extra_item::of_text(*ev.cache_salt));
        }
        salted_pages += ev.cache_salt ? 1 : 0;
      }
    }
    EXPECT_EQ(salted_pages, std::string(name) == "G1_basic.json" ? 2 : 0);
  }
}

TEST(sglang_captures, blocks_are_keyed_by_the_clusters_hash_of_the_same_prompts) {
  auto doc = capture("G1_basic.json");
  const auto& requests = doc.at("requests").as_array();
  kv::block_table table(kv::parity_config{"0", 16, true});
  const auto& frames = doc.at("frames").as_array();
  ASSERT_EQ(frames.size(), 7u);
  // The first four batches store four requests' pages (one salted): the
  // table holds exactly the router's keys of all of them, on the GPU.
  std::set<kv::block_ref> want;
  for (std::size_t r = 0; r < 4; ++r)
    for (auto k : router_keys(requests.at(r)))
      want.insert({k, kv::medium::gpu});
  for (std::size_t i = 0; i < 4; ++i) {
    auto counts = table.apply(decode(frames.at(i)));
    EXPECT_EQ(counts.untranslated, 0u);
  }
  auto held = table.held();
  EXPECT_EQ(std::set<kv::block_ref>(held.begin(), held.end()), want);
  EXPECT_EQ(table.parity(), kv::parity_state::translated);
  // A host copy (CPU_PINNED) of the first request's own two pages, then
  // both copies evicted, each by one BlockRemoved for the node.
  table.apply(decode(frames.at(4)));
  auto first = router_keys(requests.at(0));
  ASSERT_EQ(first.size(), 5u);
  held = table.held();
  EXPECT_EQ(held.size(), want.size() + 2);
  for (std::size_t i = 3; i < 5; ++i)
    EXPECT_EQ(std::count(held.begin(), held.end(), kv::block_ref{first[i], kv::medium::cpu}), 1);
  auto removed = table.apply(decode(frames.at(5)));
  EXPECT_EQ(removed.ignored_removes, 0u);
  for (std::size_t i = 3; i < 5; ++i)
    want.erase({first[i], kv::medium::gpu});
  held = table.held();
  EXPECT_EQ(std::set<kv::block_ref>(held.begin(), held.end()), want);
  // Cleared, then the system prompt stored again.
  table.apply(decode(frames.at(6)));
  held = table.held();
  auto system = router_keys(requests.at(4));
  EXPECT_EQ(held.size(), system.size());
  for (auto k : system)
    EXPECT_EQ(std::count(held.begin(), held.end(), kv::block_ref{k, kv::medium::gpu}), 1);
}

TEST(sglang_events, the_map_shape_since_2026_09_carries_the_salt_by_name) {
  // {"type": "BlockStored", "block_hashes": [-2], "parent_block_hash": nil,
  //  "token_ids": [5], "block_size": 1, "lora_id": nil, "cache_salt": "s"}
  auto payload = from_hex("93cb3ff8000000000000" // [1.5,
                          "91"                   //  [event]
                          "87"
                          "a474797065ab426c6f636b53746f726564"
                          "ac626c6f636b5f686173686573"
                          "91fe"
                          "b1706172656e745f626c6f636b5f68617368"
                          "c0"
                          "a9746f6b656e5f696473"
                          "9105"
                          "aa626c6f636b5f73697a65"
                          "01"
                          "a76c6f72615f6964"
                          "c0"
                          "aa63616368655f73616c74"
                          "a173"
                          "00"); // attn_dp_rank 0]
  auto b = wire::decode_batch(payload, {}, wire::event_dialect::sglang);
  ASSERT_TRUE(b) << b.err().message;
  ASSERT_EQ(b->events.size(), 1u);
  const auto& ev = b->events[0];
  EXPECT_EQ(ev.block_hashes.at(0).key, static_cast<wire::block_key>(-2));
  EXPECT_EQ(ev.cache_salt, "s");
  ASSERT_TRUE(ev.extra_keys);
  ASSERT_TRUE((*ev.extra_keys)[0]);
  EXPECT_EQ((*ev.extra_keys)[0]->at(0), wire::extra_item::of_text("s"));
  // vLLM's hashes are unsigned: the same bytes are refused as vLLM's.
  auto v = wire::decode_batch(payload);
  ASSERT_FALSE(v);
  EXPECT_EQ(v.err().code, errc::bad_hash);
}

TEST(sglang_events, a_salt_that_is_not_text_is_refused_saying_where) {
  // ["BlockStored", [1], nil, [5], 1, nil, "GPU", {"cache_salt": 7}]
  auto payload = from_hex("93cb3ff8000000000000"
                          "91"
                          "98ab426c6f636b53746f726564"
                          "9101"
                          "c0"
                          "9105"
                          "01"
                          "c0"
                          "a3475055"
                          "81aa63616368655f73616c7407"
                          "00");
  auto b = wire::decode_batch(payload, {}, wire::event_dialect::sglang);
  ASSERT_FALSE(b);
  EXPECT_NE(b.err().message.find("metadata"), std::string::npos) << b.err().message;
  EXPECT_NE(b.err().message.find("cache salt"), std::string::npos) << b.err().message;
}

TEST(sglang_events, an_eagle_engines_bigram_pages_give_their_first_tokens) {
  // ["BlockStored", [1], nil, [[5, 6], [6, 7]], 2, nil, "GPU"]
  auto payload = from_hex("93cb3ff8000000000000"
                          "91"
                          "97ab426c6f636b53746f726564"
                          "9101"
                          "c0"
                          "92920506920607"
                          "02"
                          "c0"
                          "a3475055"
                          "00");
  auto b = wire::decode_batch(payload, {}, wire::event_dialect::sglang);
  ASSERT_TRUE(b) << b.err().message;
  EXPECT_EQ(b->events.at(0).token_ids, (std::vector<std::uint32_t>{5, 6}));
  EXPECT_FALSE(wire::decode_batch(payload)); // vLLM never sends pairs
}

TEST(sglang_captures, another_page_size_is_refused_naming_sglangs_flag) {
  auto doc = capture("G1_basic.json");
  kv::block_table table(kv::parity_config{"0", 32, true, "--page-size"});
  auto c = table.apply(decode(doc.at("frames").as_array().at(0)));
  EXPECT_EQ(table.parity(), kv::parity_state::untranslatable);
  EXPECT_EQ(c.untranslated, c.stored);
  EXPECT_NE(table.parity_message().find("start it with --page-size 32"), std::string::npos)
    << table.parity_message();
}

TEST(sglang_sim, page_ids_are_sglangs_own) {
  // llmgw-sim's SGLang ids against the ids SGLang's code gave the recorded
  // prompts, salted chain included.
  auto doc = capture("G1_basic.json");
  wire::sha256 sha;
  for (const auto& r : doc.at("requests").as_array()) {
    auto tokens = tokens_of(r);
    auto salt = salt_of(r);
    std::optional<wire::digest> prior;
    if (salt)
      prior = sim::sglang_salt_root(sha, *salt);
    const auto& want = r.at("sglang_block_ids").as_array();
    ASSERT_EQ(want.size(), tokens.size() / 16);
    for (std::size_t i = 0; i < want.size(); ++i) {
      auto d = sim::sglang_page_digest(sha, prior ? &*prior : nullptr, tokens.data() + i * 16, 16);
      EXPECT_EQ(sim::sglang_page_id(d),
                static_cast<wire::block_key>(want[i].to_number<std::int64_t>()))
        << "page " << i;
      prior = d;
    }
  }
}

TEST(sglang_sim, its_stream_is_keyed_by_the_router_as_vllms_is) {
  // The simulated cache's own (vLLM-shaped) events for a salted prompt and
  // a plain one, a host copy and removals, rewritten as SGLang publishes
  // them, encoded, decoded as SGLang's and translated: the router's keys.
  wire::block_hasher own("engine-seed", 16);
  std::vector<std::uint32_t> tokens(48);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::uint32_t>(i * 7 + 1);
  auto vllm_store = [&](const wire::extra_key_recipe& recipe, const char* medium) {
    wire::kv_event ev;
    ev.kind = wire::event_kind::block_stored;
    ev.block_size = 16;
    ev.medium = medium;
    ev.cache_salt = recipe.cache_salt;
    for (const auto& b : own.hash(tokens, recipe))
      ev.block_hashes.push_back({b.key, 0, {}});
    ev.token_ids = tokens;
    return ev;
  };
  wire::extra_key_recipe salted;
  salted.cache_salt = "t1";
  sim::sglang_stream stream;
  kv::block_table table(kv::parity_config{"0", 16, true, "--page-size"});
  auto send = [&](std::vector<wire::kv_event> evs) {
    wire::event_batch b;
    b.events = stream.convert(evs);
    b.data_parallel_rank = 0;
    auto decoded = wire::decode_batch(wire::encode_batch(b, wire::event_shape::sglang), {},
                                      wire::event_dialect::sglang);
    ASSERT_TRUE(decoded) << decoded.err().message;
    table.apply(*decoded);
  };
  send({vllm_store({}, "GPU"), vllm_store(salted, "GPU")});
  auto cpu = vllm_store({}, "CPU");
  cpu.token_ids.clear(); // vLLM's host copies carry no tokens; SGLang's do
  send({cpu});
  EXPECT_EQ(table.parity(), kv::parity_state::translated) << table.parity_message();
  std::set<kv::block_ref> want;
  wire::block_hasher router("0", 16);
  for (const auto& b : router.hash(tokens)) {
    want.insert({b.key, kv::medium::gpu});
    want.insert({b.key, kv::medium::cpu});
  }
  for (const auto& b : router.hash(tokens, salted))
    want.insert({b.key, kv::medium::gpu});
  auto held = table.held();
  EXPECT_EQ(std::set<kv::block_ref>(held.begin(), held.end()), want);
  // The plain prompt's GPU blocks go; its host copies and the salted chain stay.
  wire::kv_event gone;
  gone.kind = wire::event_kind::block_removed;
  gone.medium = "GPU";
  for (const auto& b : own.hash(tokens))
    gone.block_hashes.push_back({b.key, 0, {}});
  send({gone});
  for (const auto& b : router.hash(tokens))
    want.erase({b.key, kv::medium::gpu});
  held = table.held();
  EXPECT_EQ(std::set<kv::block_ref>(held.begin(), held.end()), want);
  EXPECT_EQ(stream.pages(), 6u) << "three host copies and three salted pages";
}

TEST(trtllm_events, signed_hashes_and_no_extra_keys_are_keyed_as_vllm_would_hash_them) {
  // TensorRT-LLM's map shape: {"type": "BlockStored", "block_hashes": [-5],
  //  "parent_block_hash": nil, "token_ids": [16 tokens], "block_size": 16,
  //  "lora_id": nil, "medium": "GPU", "lora_name": nil, "mm_keys": []}
  std::string tokens = "dc0010";
  std::vector<std::uint32_t> ids;
  for (std::uint32_t t = 1; t <= 16; ++t) {
    tokens += fmt::format("{:02x}", t);
    ids.push_back(t);
  }
  auto payload = from_hex("93cb3ff8000000000000"
                          "91"
                          "89"
                          "a474797065ab426c6f636b53746f726564"
                          "ac626c6f636b5f686173686573"
                          "91fb"
                          "b1706172656e745f626c6f636b5f68617368"
                          "c0"
                          "a9746f6b656e5f696473"
                          + tokens
                          + "aa626c6f636b5f73697a65"
                            "10"
                            "a76c6f72615f6964"
                            "c0"
                            "a66d656469756d"
                            "a3475055"
                            "a96c6f72615f6e616d65"
                            "c0"
                            "a76d6d5f6b657973"
                            "90"
                            "00");
  ASSERT_FALSE(wire::decode_batch(payload)) << "vLLM's hashes are unsigned";
  auto b = wire::decode_batch(payload, {}, wire::event_dialect::trtllm);
  ASSERT_TRUE(b) << b.err().message;
  kv::block_table table(kv::parity_config{"0", 16, true, "kv_cache_config.tokens_per_block"});
  auto c = table.apply(*b);
  EXPECT_EQ(c.translated, 1u);
  EXPECT_EQ(table.parity(), kv::parity_state::translated) << table.parity_message();
  auto held = table.held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].key, wire::block_hasher("0", 16).hash(ids).at(0).key);
}

TEST(sglang_events, what_sglang_never_sends_is_refused_and_other_engines_names_are_skipped) {
  auto batch = [](const std::string& event) {
    return from_hex("93cb3ff8000000000000"
                    "91"
                    + event + "00");
  };
  auto sglang = [](const std::string& payload) {
    return wire::decode_batch(payload, {}, wire::event_dialect::sglang);
  };
  // A map event with the salt both ways: a salt given twice.
  auto twice = sglang(batch("84a474797065ab426c6f636b53746f726564"
                            "ac626c6f636b5f686173686573"
                            "9101"
                            "aa63616368655f73616c74"
                            "a173"
                            "a86d65746164617461"
                            "81aa63616368655f73616c74a173"));
  ASSERT_FALSE(twice);
  EXPECT_NE(twice.err().message.find("twice"), std::string::npos) << twice.err().message;
  // Metadata that is not a map.
  auto not_map = sglang(batch("98ab426c6f636b53746f726564"
                              "9101"
                              "c0"
                              "9105"
                              "01"
                              "c0"
                              "a3475055"
                              "a173"));
  ASSERT_FALSE(not_map);
  EXPECT_NE(not_map.err().message.find("metadata"), std::string::npos) << not_map.err().message;
  // Bigram pairs that do not chain, and pairs mixed with plain tokens.
  EXPECT_FALSE(sglang(batch("97ab426c6f636b53746f726564"
                            "9101"
                            "c0"
                            "92920506920807"
                            "02"
                            "c0"
                            "a3475055")));
  EXPECT_FALSE(sglang(batch("97ab426c6f636b53746f726564"
                            "9101"
                            "c0"
                            "9292050606"
                            "02"
                            "c0"
                            "a3475055")));
  EXPECT_FALSE(sglang(batch("97ab426c6f636b53746f726564"
                            "9101"
                            "c0"
                            "919205a178"
                            "01"
                            "c0"
                            "a3475055")))
    << "a last pair whose second is not a token";
  // vLLM has neither salt field: skipped, the salt unread.
  auto v = wire::decode_batch(batch("83a474797065ab426c6f636b53746f726564"
                                    "ac626c6f636b5f686173686573"
                                    "9101"
                                    "aa63616368655f73616c74"
                                    "a173"));
  ASSERT_TRUE(v) << v.err().message;
  EXPECT_FALSE(v->events.at(0).cache_salt);
}

TEST(trtllm_events, blocks_hashed_with_what_is_not_published_are_left_unkeyed) {
  // One plain block (token 1..16), then its child named by an adapter id
  // only, then a block whose tokens are a multimodal placeholder.
  std::string tokens = "dc0010";
  std::vector<std::uint32_t> ids;
  for (std::uint32_t t = 1; t <= 16; ++t) {
    tokens += fmt::format("{:02x}", t);
    ids.push_back(t);
  }
  auto stored = [&](const std::string& hash, const std::string& parent, const std::string& toks,
                    const std::string& lora_id) {
    return "87a474797065ab426c6f636b53746f726564"
           "ac626c6f636b5f686173686573"
           "91"
           + hash + "b1706172656e745f626c6f636b5f68617368" + parent + "a9746f6b656e5f696473" + toks
           + "aa626c6f636b5f73697a65"
             "10"
             "a76c6f72615f6964"
           + lora_id
           + "a66d656469756d"
             "a3475055";
  };
  auto payload = from_hex("93cb3ff8000000000000"
                          "93"
                          + stored("01", "c0", tokens, "c0") + stored("02", "01", tokens, "07")
                          + stored("03", "c0", "91a3696d67", "c0") + "00");
  auto b = wire::decode_batch(payload, {}, wire::event_dialect::trtllm);
  ASSERT_TRUE(b) << b.err().message;
  ASSERT_EQ(b->events.size(), 3u);
  EXPECT_FALSE(b->events[0].unpublished_extras);
  EXPECT_TRUE(b->events[1].unpublished_extras) << "an adapter id without its name";
  EXPECT_TRUE(b->events[2].unpublished_extras) << "a placeholder token as text";
  kv::block_table table(kv::parity_config{"0", 16, true, "kv_cache_config.tokens_per_block:"});
  auto c = table.apply(*b);
  EXPECT_EQ(c.untranslated, 2u);
  EXPECT_TRUE(kv::routable(table.parity())) << "the engine's other blocks are still keyed";
  auto held = table.held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].key, wire::block_hasher("0", 16).hash(ids).at(0).key);
}

TEST(sglang_sim, a_chain_sglang_would_not_have_is_not_published) {
  sim::sglang_stream stream;
  wire::kv_event orphan;
  orphan.kind = wire::event_kind::block_stored;
  orphan.block_size = 16;
  orphan.parent_block_hash = wire::block_hash{42, 0, {}}; // never stored
  orphan.block_hashes = {{43, 0, {}}};
  orphan.token_ids.assign(16, 5);
  EXPECT_TRUE(stream.convert({orphan}).empty());
  EXPECT_EQ(stream.pages(), 0u);
  orphan.parent_block_hash.reset();
  EXPECT_EQ(stream.convert({orphan}).size(), 1u);
  wire::kv_event clear;
  clear.kind = wire::event_kind::all_blocks_cleared;
  EXPECT_EQ(stream.convert({clear}).size(), 1u);
  EXPECT_EQ(stream.pages(), 0u);
}
