#include "wire/zmq_message.hpp"

#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw::wire;
using namespace std::string_literals;

TEST(zmq_message, splits_topic_seq_payload) {
  auto seq = "\x00\x00\x00\x00\x00\x01\x02\x03"s;
  auto msg = split_live_message({"kv-events", seq, "\x93payload"});
  ASSERT_TRUE(msg) << msg.err().message;
  EXPECT_EQ(msg->topic, "kv-events");
  EXPECT_EQ(msg->seq, 0x010203u);
  EXPECT_EQ(msg->payload, "\x93payload");
}

TEST(zmq_message, seq_is_unsigned_big_endian) {
  auto msg = split_live_message({"", "\xff\xff\xff\xff\xff\xff\xff\xfe"s, ""});
  ASSERT_TRUE(msg);
  EXPECT_EQ(msg->seq, 0xfffffffffffffffeu);
  EXPECT_EQ(encode_seq(0x0102030405060708u), (std::array<char, 8>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(zmq_message, rejects_wrong_frame_count) {
  auto two = split_live_message({"", "\0\0\0\0\0\0\0\0"s});
  ASSERT_FALSE(two);
  EXPECT_EQ(two.err().code, errc::bad_frame);
  EXPECT_NE(two.err().message.find("2 frames"), std::string::npos) << two.err().message;
  auto four = split_live_message({"", "\0\0\0\0\0\0\0\0"s, "", ""});
  ASSERT_FALSE(four);
  EXPECT_NE(four.err().message.find("4 frames"), std::string::npos);
}

TEST(zmq_message, rejects_wrong_seq_width) {
  auto msg = split_live_message({"", "\0\0\0\0"s, "x"});
  ASSERT_FALSE(msg);
  EXPECT_EQ(msg.err().code, errc::bad_frame);
  EXPECT_NE(msg.err().message.find("4 bytes, expected 8"), std::string::npos) << msg.err().message;
}

TEST(zmq_message, replay_reply_layouts) {
  auto seq = "\0\0\0\0\0\0\0\x07"s;
  auto end = "\xff\xff\xff\xff\xff\xff\xff\xff"s;
  // vLLM since 2026-07: ["", topic, seq, payload] and ["", "", ff*8, ""].
  auto now = split_replay_reply({"", "kv", seq, "p"});
  ASSERT_TRUE(now) << now.err().message;
  EXPECT_FALSE(now->end);
  EXPECT_EQ(now->topic, "kv");
  EXPECT_EQ(now->seq, 7u);
  EXPECT_EQ(now->payload, "p");
  auto now_end = split_replay_reply({"", "", end, ""});
  ASSERT_TRUE(now_end);
  EXPECT_TRUE(now_end->end);
  // Before: ["", seq, payload] and ["", ff*8, ""].
  auto old = split_replay_reply({"", seq, "q"});
  ASSERT_TRUE(old);
  EXPECT_EQ(old->seq, 7u);
  EXPECT_EQ(old->payload, "q");
  auto old_end = split_replay_reply({"", end, ""});
  ASSERT_TRUE(old_end);
  EXPECT_TRUE(old_end->end);
  EXPECT_FALSE(split_replay_reply({"x", seq, "q"}));
  EXPECT_FALSE(split_replay_reply({"", seq}));
}

TEST(seq_tracker, verdicts) {
  seq_tracker t;
  EXPECT_FALSE(t.expected());
  EXPECT_EQ(t.observe(5), seq_verdict::first);
  EXPECT_EQ(t.observe(6), seq_verdict::next);
  EXPECT_EQ(*t.expected(), 7u);
  EXPECT_EQ(t.observe(9), seq_verdict::gap);
  EXPECT_EQ(t.observe(10), seq_verdict::next);
  EXPECT_EQ(t.observe(0), seq_verdict::restart);
  EXPECT_EQ(t.observe(0), seq_verdict::restart) << "a repeated seq is a new publisher";
  EXPECT_EQ(t.observe(1), seq_verdict::next);
  t.reset();
  EXPECT_EQ(t.observe(1), seq_verdict::first);
}
