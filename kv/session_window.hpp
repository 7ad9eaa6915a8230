// The forwarder's flow control, as pure code. CAF 0.17 has no flow control on
// remote sends, so a forwarder numbers its updates within a session and keeps
// at most `limit` unacknowledged. When the window is full it simply does not
// drain its mirrors: their net changes wait there, bounded by the tables, so
// a slow or vanished control node never grows the agent's memory.
#pragma once

#include <cstdint>

namespace llmgw::kv {

/// Unacknowledged updates a forwarder allows by default.
inline constexpr std::uint64_t default_window = 64;

class session_window {
public:
  explicit session_window(std::uint64_t limit) : limit_(limit) {}

  /// A new session: numbering starts again at 1, nothing is in flight.
  void start(std::uint64_t session) noexcept {
    session_ = session;
    sent_ = 0;
    acked_ = 0;
  }

  /// True when another update may be sent.
  bool has_room() const noexcept { return in_flight() < limit_; }

  /// The seq of the next update (1, 2, ...); counts it as in flight.
  std::uint64_t next() noexcept { return ++sent_; }

  /// The control node applied everything up to `seq` of `session`. Acks of
  /// an old session, or beyond what was sent, are ignored; returns whether
  /// this one counted.
  bool ack(std::uint64_t session, std::uint64_t seq) noexcept {
    if (session != session_ || seq > sent_ || seq <= acked_)
      return false;
    acked_ = seq;
    return true;
  }

  std::uint64_t in_flight() const noexcept { return sent_ - acked_; }
  std::uint64_t session() const noexcept { return session_; }
  std::uint64_t limit() const noexcept { return limit_; }

private:
  std::uint64_t limit_;
  std::uint64_t session_ = 0;
  std::uint64_t sent_ = 0;
  std::uint64_t acked_ = 0;
};

} // namespace llmgw::kv
