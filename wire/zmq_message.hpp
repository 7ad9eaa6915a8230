// The envelope of vLLM's KV event stream, one level below msgpack.
//
// vLLM's ZmqEventPublisher is a PUB socket. Every batch it publishes is one
// ZMQ message of exactly three frames:
//
//   frame 0  topic    UTF-8, empty by default
//   frame 1  seq      8 bytes, unsigned big-endian, 0 for a new publisher,
//                     +1 per batch
//   frame 2  payload  the msgpack-encoded batch (see kv_events.hpp)
//
// A dropped message (past the high-water mark) shows only as a jump in seq; a
// restarted engine starts again at 0. seq_tracker turns the sequence into
// those verdicts.
//
// Replay: a ROUTER socket at the replay endpoint. A DEALER sends
// ["", start_seq (8 bytes)] and receives, per buffered batch with seq >=
// start, ["", topic, seq, payload] (vLLM since 2026-07) or ["", seq, payload]
// (before), then an end marker whose seq frame is ff ff ff ff ff ff ff ff.
// In both layouts seq is the second-to-last frame and payload the last.
#pragma once

#include "base/result.hpp"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llmgw::wire {

/// One message of the live stream, split into its parts. Views point into the
/// caller's frames.
struct live_message {
  std::string_view topic;
  std::uint64_t seq = 0;
  std::string_view payload;
};

/// Reads an 8-byte big-endian unsigned sequence number.
result<std::uint64_t> decode_seq(std::string_view frame);

/// Writes the 8-byte big-endian form of a sequence number.
std::array<char, 8> encode_seq(std::uint64_t seq);

/// Splits a live message; any frame count but 3, or a seq frame that is not 8
/// bytes, is a bad_frame error saying which.
result<live_message> split_live_message(const std::vector<std::string_view>& frames);

/// One reply of a replay stream: a batch, or the end marker.
struct replay_reply {
  bool end = false; ///< true for the end-of-replay marker
  std::string_view topic;
  std::uint64_t seq = 0;
  std::string_view payload;
};

/// Splits a reply received on a DEALER from vLLM's replay ROUTER, in either of
/// the layouts vLLM has used.
result<replay_reply> split_replay_reply(const std::vector<std::string_view>& frames);

/// The first frame of a replay request, after the empty delimiter.
std::array<char, 8> replay_request(std::uint64_t start_seq);

/// True if vLLM's publisher binds its PUB socket at `endpoint` (an address
/// with a wildcard, "::", ipc:// or inproc://); at any other it connects.
/// The subscriber does the opposite, so both sides follow this one rule.
bool publisher_binds(std::string_view endpoint) noexcept;

/// What one newly received seq means for the stream.
enum class seq_verdict : std::uint8_t {
  first,   ///< the first message seen (no history to compare with)
  next,    ///< exactly the expected seq
  gap,     ///< a jump forward: messages in between were lost
  restart, ///< a step back (or repeat): a new publisher started
};

/// A stable lower_snake_case name for a verdict.
const char* to_string(seq_verdict verdict) noexcept;

/// Follows the seq of one publisher. Pure: no sockets, no clock.
class seq_tracker {
public:
  /// The verdict for `seq`; afterwards `seq` is the last one seen.
  seq_verdict observe(std::uint64_t seq) noexcept;

  /// The seq expected next, if any message was seen.
  std::optional<std::uint64_t> expected() const noexcept;

  /// Forgets the history: the next seq is `first` again.
  void reset() noexcept { last_.reset(); }

private:
  std::optional<std::uint64_t> last_;
};

} // namespace llmgw::wire
