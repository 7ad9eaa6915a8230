#include "wire/zmq_message.hpp"

#include <fmt/format.h>

namespace llmgw::wire {

namespace {

constexpr std::uint64_t end_of_replay_seq = ~std::uint64_t{0};

} // namespace

result<std::uint64_t> decode_seq(std::string_view frame) {
  if (frame.size() != 8)
    return error{
      errc::bad_frame,
      fmt::format("seq frame has {} bytes, expected 8 (big-endian unsigned)", frame.size())};
  std::uint64_t seq = 0;
  for (char c : frame)
    seq = (seq << 8) | static_cast<unsigned char>(c);
  return seq;
}

std::array<char, 8> encode_seq(std::uint64_t seq) {
  std::array<char, 8> out{};
  for (int i = 7; i >= 0; --i) {
    out[static_cast<std::size_t>(i)] = static_cast<char>(seq & 0xff);
    seq >>= 8;
  }
  return out;
}

result<live_message> split_live_message(const std::vector<std::string_view>& frames) {
  if (frames.size() != 3)
    return error{
      errc::bad_frame,
      fmt::format("message has {} frames, expected 3 (topic, seq, payload)", frames.size())};
  auto seq = decode_seq(frames[1]);
  if (!seq)
    return error{seq.err().code, "frame 1: " + seq.err().message};
  return live_message{frames[0], *seq, frames[2]};
}

result<replay_reply> split_replay_reply(const std::vector<std::string_view>& frames) {
  // ["", topic, seq, payload] (since 2026-07), ["", seq, payload] (before);
  // DEALER keeps the empty delimiter ROUTER put in front.
  if (frames.size() != 3 && frames.size() != 4)
    return error{errc::bad_frame,
                 fmt::format("replay reply has {} frames, expected 3 or 4", frames.size())};
  if (!frames[0].empty())
    return error{errc::bad_frame, "replay reply: frame 0 is not the empty delimiter"};
  auto seq_index = frames.size() - 2;
  auto seq = decode_seq(frames[seq_index]);
  if (!seq)
    return error{seq.err().code,
                 fmt::format("replay reply frame {}: {}", seq_index, seq.err().message)};
  replay_reply reply;
  reply.seq = *seq;
  reply.end = *seq == end_of_replay_seq;
  reply.payload = frames.back();
  if (frames.size() == 4)
    reply.topic = frames[1];
  return reply;
}

std::array<char, 8> replay_request(std::uint64_t start_seq) {
  return encode_seq(start_seq);
}

const char* to_string(seq_verdict verdict) noexcept {
  switch (verdict) {
  case seq_verdict::first:
    return "first";
  case seq_verdict::next:
    return "next";
  case seq_verdict::gap:
    return "gap";
  case seq_verdict::restart:
    return "restart";
  }
  return "unknown";
}

seq_verdict seq_tracker::observe(std::uint64_t seq) noexcept {
  auto previous = last_;
  last_ = seq;
  if (!previous)
    return seq_verdict::first;
  if (seq == *previous + 1)
    return seq_verdict::next;
  if (seq > *previous + 1)
    return seq_verdict::gap;
  return seq_verdict::restart;
}

std::optional<std::uint64_t> seq_tracker::expected() const noexcept {
  if (!last_)
    return std::nullopt;
  return *last_ + 1;
}

bool publisher_binds(std::string_view endpoint) noexcept {
  // vLLM's ZmqEventPublisher: '"*" in endpoint or "::" in endpoint or
  // endpoint.startswith("ipc://") or endpoint.startswith("inproc://")'.
  return endpoint.find('*') != std::string_view::npos
         || endpoint.find("::") != std::string_view::npos || endpoint.rfind("ipc://", 0) == 0
         || endpoint.rfind("inproc://", 0) == 0;
}

} // namespace llmgw::wire
