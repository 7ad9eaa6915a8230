// The mirror actor under CAF's deterministic test coordinator: no threads,
// every message delivered by run(), results collected by a probe actor.
#include "actors/mirror.hpp"
#include "routing/replica_index.hpp"
#include "tests/actors/deterministic.hpp"
#include "tests/support/captures.hpp"

#include <boost/json.hpp>
#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <set>

namespace json = boost::json;
using namespace llmgw;

namespace {

struct deterministic : llmgw::test::deterministic {
  std::vector<replica_update> replies;

  /// Asks `m` and stores the reply in `replies`.
  template <class... Ts>
  void ask(const mirror_actor& m, Ts... xs) {
    sys.spawn([this, m, xs...](caf::event_based_actor* self) {
      self->request(m, caf::infinite, xs...).then([this](const replica_update& u) {
        replies.push_back(u);
      });
    });
    sched.run();
  }
};

} // namespace

TEST_F(deterministic, mirror_gives_snapshot_then_net_changes) {
  auto view = std::make_shared<mirror_view>();
  auto m = sys.spawn(mirror, std::string("r0"), std::uint32_t{0},
                     std::optional<kv::parity_config>(kv::parity_config{"0", 16}), view);
  auto batches = capture("S1_basic.map.int.json");
  caf::anon_send(m, apply_atom::value, test::one_batch(batches[0]));
  caf::anon_send(m, apply_atom::value, test::one_batch(batches[1]));
  sched.run();
  ask(m, subscribe_atom::value, std::uint64_t{1});
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].replica, "r0");
  EXPECT_TRUE(replies[0].reset);
  EXPECT_EQ(replies[0].parity, static_cast<std::uint8_t>(kv::parity_state::verified));
  auto snapshot_size = replies[0].added.size();
  EXPECT_EQ(snapshot_size,
            batches[0]->events[0].block_hashes.size() + batches[1]->events[0].block_hashes.size());
  ask(m, drain_atom::value, std::uint64_t{1});
  EXPECT_FALSE(replies[1].reset);
  EXPECT_TRUE(replies[1].added.empty()) << "nothing changed since the snapshot";
  for (std::size_t i = 2; i < batches.size(); ++i)
    caf::anon_send(m, apply_atom::value, test::one_batch(batches[i]));
  sched.run();
  ask(m, drain_atom::value, std::uint64_t{1});
  ASSERT_EQ(replies.size(), 3u);
  // The peer's copy, built only from what the mirror sent, equals the
  // capture's final state.
  std::set<kv::block_ref> copy;
  for (const auto& u : replies) {
    if (u.reset)
      copy.clear();
    for (const auto& r : u.removed)
      EXPECT_EQ(copy.erase(r), 1u);
    for (const auto& r : u.added)
      EXPECT_TRUE(copy.insert(r).second);
  }
  std::set<kv::block_ref> want;
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.int.json"));
  for (const auto& b : doc.at("expected").at("final_blocks").as_array())
    want.insert({std::stoull(json::value_to<std::string>(b.at("hash"))), kv::medium::gpu});
  EXPECT_EQ(copy, want);
  EXPECT_FALSE(replies[2].added.empty());
  // What the agent's admin listener shows: the same blocks, by fingerprint.
  EXPECT_EQ(view->blocks.load(), want.size());
  EXPECT_EQ(view->fingerprint.load(),
            routing::fingerprint_of(std::vector<kv::block_ref>(want.begin(), want.end())));
  EXPECT_EQ(view->parity.load(), static_cast<std::uint8_t>(kv::parity_state::verified));
  caf::anon_send(m, reset_atom::value, kv::reset_reason::engine_exit);
  sched.run();
  EXPECT_EQ(view->blocks.load(), 0u);
  EXPECT_EQ(view->fingerprint.load(), 0u);
  EXPECT_EQ(view->resets[static_cast<std::size_t>(kv::reset_reason::engine_exit)].load(), 1u);
  caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_F(deterministic, mirror_reset_is_announced_first) {
  auto m = sys.spawn(mirror, std::string("r1"), std::uint32_t{0},
                     std::optional<kv::parity_config>{}, nullptr);
  auto batches = capture("S1_basic.array.int.json");
  caf::anon_send(m, apply_atom::value, test::one_batch(batches[0]));
  sched.run();
  ask(m, subscribe_atom::value, std::uint64_t{7});
  caf::anon_send(m, reset_atom::value, kv::reset_reason::gap);
  caf::anon_send(m, apply_atom::value, test::one_batch(batches[1]));
  sched.run();
  ask(m, drain_atom::value, std::uint64_t{7});
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_TRUE(replies[1].reset);
  EXPECT_EQ(replies[1].epoch, 1u);
  EXPECT_EQ(replies[1].added.size(), batches[1]->events[0].block_hashes.size());
  EXPECT_EQ(replies[1].parity, static_cast<std::uint8_t>(kv::parity_state::unknown));
  caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
  sched.run();
}
