// Following a publisher through gaps, replays, restarts and bad payloads,
// with vLLM's own frames (S1_basic) and the block table as the mirror.
#include "kv/event_stream.hpp"
#include "tests/support/captures.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw::kv;
using namespace llmgw::wire;
using namespace std::chrono_literals;
namespace json = boost::json;
using clock_type = event_stream::clock;

namespace {

struct fixture {
  std::vector<std::string> payloads; // index = seq
  std::vector<block_ref> expected;
  block_table mirror;
  std::vector<std::string> log; // "apply 3", "reset gap", "replay 3"
  clock_type::time_point now = clock_type::time_point{} + 1h;

  fixture() {
    auto doc = llmgw::test::read_json(llmgw::test::capture_path("S1_basic.map.int.json"));
    for (const auto& f : doc.at("frames").as_array())
      payloads.push_back(llmgw::test::from_hex(json::value_to<std::string>(f.at("payload_hex"))));
    for (const auto& b : doc.at("expected").at("final_blocks").as_array())
      expected.push_back({std::stoull(json::value_to<std::string>(b.at("hash"))), medium::gpu});
    std::sort(expected.begin(), expected.end());
  }

  void run(std::vector<stream_action> actions) {
    for (auto& a : actions) {
      switch (a.what) {
      case stream_action::kind::apply:
        mirror.apply(a.batch);
        log.push_back("apply " + std::to_string(a.seq));
        break;
      case stream_action::kind::reset:
        mirror.reset(a.reason);
        log.push_back(std::string("reset ") + to_string(a.reason));
        break;
      case stream_action::kind::request_replay:
        log.push_back("replay " + std::to_string(a.seq));
        break;
      }
    }
  }

  void live(event_stream& s, std::uint64_t seq) { run(s.on_live(seq, payloads.at(seq), now)); }
  void replayed(event_stream& s, std::uint64_t seq) {
    replay_reply r;
    r.seq = seq;
    r.payload = payloads.at(seq);
    run(s.on_replay(r, now));
  }
  void replay_end(event_stream& s) {
    replay_reply r;
    r.end = true;
    run(s.on_replay(r, now));
  }
};

event_stream::config with_replay(bool on) {
  event_stream::config cfg;
  cfg.replay_available = on;
  return cfg;
}

} // namespace

TEST(event_stream, in_order_stream_applies_everything) {
  fixture f;
  event_stream s(with_replay(false));
  for (std::uint64_t seq = 0; seq < f.payloads.size(); ++seq)
    f.live(s, seq);
  EXPECT_EQ(f.mirror.held(), f.expected);
  EXPECT_EQ(f.mirror.epoch(), 0u);
  EXPECT_EQ(s.counts().applied, f.payloads.size());
  EXPECT_EQ(f.log.front(), "apply 0");
}

TEST(event_stream, gap_without_replay_resets_then_goes_on) {
  fixture f;
  event_stream s(with_replay(false));
  for (std::uint64_t seq = 0; seq < f.payloads.size(); ++seq)
    if (seq != 3)
      f.live(s, seq);
  EXPECT_EQ(f.log[3], "reset gap");
  EXPECT_EQ(f.log[4], "apply 4");
  EXPECT_EQ(f.mirror.epoch(), 1u);
  EXPECT_EQ(s.counts().gaps, 1u);
  EXPECT_EQ(s.counts().lost_batches, 1u);
  // After the reset the mirror holds only what was stored since: a subset.
  for (const auto& b : f.mirror.held())
    EXPECT_TRUE(std::binary_search(f.expected.begin(), f.expected.end(), b));
}

TEST(event_stream, gap_filled_by_replay_needs_no_reset) {
  fixture f;
  event_stream s(with_replay(true));
  f.live(s, 0);
  f.live(s, 1);
  f.live(s, 2);
  f.live(s, 5); // 3 and 4 lost
  EXPECT_EQ(f.log.back(), "replay 3");
  EXPECT_TRUE(s.replaying());
  f.live(s, 6);     // held while replaying
  f.replayed(s, 2); // before what was asked: ignored
  f.replayed(s, 3);
  f.replayed(s, 4);
  f.replayed(s, 5); // already held from the live stream: ignored
  f.replay_end(s);
  EXPECT_FALSE(s.replaying());
  for (std::uint64_t seq = 7; seq < f.payloads.size(); ++seq)
    f.live(s, seq);
  EXPECT_EQ(f.mirror.held(), f.expected);
  EXPECT_EQ(f.mirror.epoch(), 0u) << "nothing was reset";
  EXPECT_EQ(s.counts().gaps_filled, 1u);
  EXPECT_EQ(s.counts().replayed, 2u);
  EXPECT_EQ(s.counts().lost_batches, 0u);
  std::vector<std::string> applied;
  for (const auto& l : f.log)
    if (l.rfind("apply", 0) == 0)
      applied.push_back(l);
  ASSERT_EQ(applied.size(), f.payloads.size());
  for (std::size_t i = 0; i < applied.size(); ++i)
    EXPECT_EQ(applied[i], "apply " + std::to_string(i)) << "in seq order";
}

TEST(event_stream, replay_that_ends_short_resets) {
  fixture f;
  event_stream s(with_replay(true));
  f.live(s, 0);
  f.live(s, 3);
  f.replayed(s, 1); // 2 is gone from the engine's buffer
  f.replay_end(s);
  EXPECT_EQ(f.mirror.epoch(), 1u);
  EXPECT_EQ(s.counts().lost_batches, 1u);
  EXPECT_EQ(f.log.back(), "apply 3") << "the held message comes after the reset";
}

TEST(event_stream, replay_that_never_answers_times_out) {
  fixture f;
  auto cfg = with_replay(true);
  cfg.replay_timeout = 500ms;
  event_stream s(cfg);
  f.live(s, 0);
  f.live(s, 2);
  f.run(s.on_tick(f.now + 400ms));
  EXPECT_TRUE(s.replaying());
  f.run(s.on_tick(f.now + 600ms));
  EXPECT_FALSE(s.replaying());
  EXPECT_EQ(f.mirror.epoch(), 1u);
  EXPECT_EQ(f.log.back(), "apply 2");
  f.replayed(s, 1); // too late: ignored
  EXPECT_EQ(f.log.back(), "apply 2");
}

TEST(event_stream, too_much_held_gives_up) {
  fixture f;
  auto cfg = with_replay(true);
  cfg.max_held = 2;
  event_stream s(cfg);
  f.live(s, 0);
  f.live(s, 2);
  f.live(s, 3);
  EXPECT_TRUE(s.replaying());
  f.live(s, 4);
  EXPECT_FALSE(s.replaying());
  EXPECT_EQ(f.mirror.epoch(), 1u);
  EXPECT_EQ(f.log.back(), "apply 4");
}

TEST(event_stream, restart_resets_then_applies) {
  fixture f;
  event_stream s(with_replay(true));
  f.live(s, 0);
  f.live(s, 1);
  f.live(s, 0); // a new publisher
  EXPECT_EQ(f.log, (std::vector<std::string>{"apply 0", "apply 1", "reset restart", "apply 0"}));
  EXPECT_EQ(s.counts().restarts, 1u);
}

TEST(event_stream, undecodable_payload_resets_and_applies_nothing) {
  fixture f;
  event_stream s(with_replay(true));
  f.live(s, 0);
  auto broken = f.payloads[1].substr(0, 10);
  auto actions = s.on_live(1, broken, f.now);
  ASSERT_EQ(actions.size(), 1u);
  EXPECT_EQ(actions[0].what, stream_action::kind::reset);
  EXPECT_EQ(actions[0].reason, reset_reason::decode_error);
  ASSERT_TRUE(actions[0].decode_failure);
  EXPECT_FALSE(actions[0].decode_failure->message.empty());
  EXPECT_EQ(s.counts().decode_errors, 1u);
  f.run(std::move(actions));
  f.live(s, 2);
  EXPECT_EQ(f.log.back(), "apply 2") << "the stream goes on";
}

TEST(event_stream, an_unknown_event_type_is_counted_and_the_batch_still_applies) {
  fixture f;
  event_stream s(with_replay(false));
  f.live(s, 0);
  // [ts 0.0, [["AllBlocksCleared"], ["BlockTransferred", 7]]]
  auto payload = llmgw::test::from_hex("92cb0000000000000000"
                                       "92"
                                       "91b0416c6c426c6f636b73436c6561726564"
                                       "92b0426c6f636b5472616e7366657272656407");
  auto actions = s.on_live(1, payload, f.now);
  ASSERT_EQ(actions.size(), 1u) << "no reset: the batch decodes";
  EXPECT_EQ(actions[0].what, stream_action::kind::apply);
  EXPECT_EQ(actions[0].batch.events.size(), 1u);
  EXPECT_EQ(s.counts().unknown_events, 1u);
  EXPECT_EQ(s.counts().decode_errors, 0u);
}

TEST(event_stream, late_start_learns_history_by_replay) {
  fixture f;
  event_stream s(with_replay(true));
  f.live(s, 5);
  EXPECT_EQ(f.log.back(), "replay 0");
  for (std::uint64_t seq = 0; seq < 5; ++seq)
    f.replayed(s, seq);
  f.replay_end(s);
  for (std::uint64_t seq = 6; seq < f.payloads.size(); ++seq)
    f.live(s, seq);
  EXPECT_EQ(f.mirror.held(), f.expected);
  EXPECT_EQ(f.mirror.epoch(), 0u);
  EXPECT_EQ(s.counts().gaps, 0u);
}

TEST(event_stream, late_start_with_a_buffer_that_no_longer_reaches_zero) {
  fixture f;
  event_stream s(with_replay(true));
  f.live(s, 5);
  f.replayed(s, 3); // the engine's buffer starts at 3
  f.replayed(s, 4);
  f.replay_end(s);
  EXPECT_EQ(f.log,
            (std::vector<std::string>{"replay 0", "reset gap", "apply 3", "apply 4", "apply 5"}));
  EXPECT_TRUE(f.mirror.partial()) << "history before the buffer is unknown";
}

TEST(event_stream, late_start_without_replay_resets_for_a_gap) {
  fixture f;
  event_stream s(with_replay(false));
  f.live(s, 5);
  EXPECT_EQ(f.log, (std::vector<std::string>{"reset gap", "apply 5"}));
  EXPECT_TRUE(f.mirror.partial()) << "what was stored before is unknown";
}

#include "kv/session_window.hpp"

TEST(session_window, bounds_what_is_in_flight) {
  session_window w(2);
  w.start(10);
  EXPECT_TRUE(w.has_room());
  EXPECT_EQ(w.next(), 1u);
  EXPECT_EQ(w.next(), 2u);
  EXPECT_FALSE(w.has_room());
  EXPECT_FALSE(w.ack(9, 2)) << "an old session's ack";
  EXPECT_FALSE(w.ack(10, 3)) << "beyond what was sent";
  EXPECT_TRUE(w.ack(10, 1));
  EXPECT_TRUE(w.has_room());
  EXPECT_FALSE(w.ack(10, 1)) << "a repeated ack";
  EXPECT_EQ(w.next(), 3u);
  w.start(11);
  EXPECT_EQ(w.in_flight(), 0u);
  EXPECT_EQ(w.next(), 1u) << "numbering restarts per session";
}
