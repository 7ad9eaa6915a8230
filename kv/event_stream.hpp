// Following one publisher's event stream: what to apply, when to ask the
// replay endpoint, when to give up and reset. Pure protocol logic in the
// manner of Broker's: no sockets, no clock of its own; the subscriber actor
// feeds it messages and ticks and carries out the actions it returns.
//
// - The next seq: decode and apply.
// - A jump forward (gap): with a replay endpoint, ask for the missing seqs
//   and hold later live messages (bounded) until the replay ends; apply what
//   the replay returns in order. If it cannot fill the hole (end marker too
//   early, timeout, too much held), reset and go on from the held messages.
//   Without a replay endpoint, reset at once.
// - A step back (restart: a new publisher starts at 0): reset, then apply.
// - The very first message with seq > 0 (llmgw started after the engine):
//   with a replay endpoint, ask for everything from 0, since blocks stored
//   earlier are otherwise unknown. Where that history cannot be had (no
//   replay, or a buffer that no longer reaches 0), reset for a gap: the
//   mirror is then partial until the engine's cache is emptied.
// - A payload that does not decode: reset (replaying it would return the same
//   bytes), nothing of it applied.
#pragma once

#include "kv/block_table.hpp"
#include "wire/kv_events.hpp"
#include "wire/zmq_message.hpp"

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace llmgw::kv {

/// One thing the owner of a stream must do, in order.
struct stream_action {
  enum class kind : std::uint8_t {
    apply,          ///< apply `batch` (seq `seq`) to the mirror
    reset,          ///< reset the mirror for `reason`
    request_replay, ///< send a replay request starting at `seq`
  };
  kind what = kind::apply;
  /// apply: the batch's seq; request_replay: the first seq asked for;
  /// reset: the seq that showed the gap or restart (or did not decode).
  std::uint64_t seq = 0;
  /// reset for a gap or restart: the seq that was due instead of `seq`.
  std::uint64_t expected = 0;
  bool replayed = false; ///< apply: the batch came from the replay endpoint
  wire::event_batch batch;
  reset_reason reason = reset_reason::gap;
  std::optional<error> decode_failure; ///< set on the reset caused by a bad payload
};

/// Counters a subscriber exports as metrics.
struct stream_counts {
  std::uint64_t messages = 0;       ///< live messages received
  std::uint64_t applied = 0;        ///< batches applied (live or replayed)
  std::uint64_t replayed = 0;       ///< batches recovered by replay
  std::uint64_t gaps = 0;           ///< jumps forward seen
  std::uint64_t gaps_filled = 0;    ///< of those, filled by replay
  std::uint64_t restarts = 0;       ///< steps back seen
  std::uint64_t decode_errors = 0;  ///< payloads that did not decode
  std::uint64_t unknown_events = 0; ///< events of a type llmgw does not know, skipped
  std::uint64_t lost_batches = 0;   ///< seqs never recovered
};

class event_stream {
public:
  using clock = std::chrono::steady_clock;

  struct config {
    bool replay_available = false;
    std::chrono::milliseconds replay_timeout{2000};
    std::size_t max_held = 10000; ///< live messages held while a replay runs
    wire::decode_limits limits;
    wire::event_dialect dialect = wire::event_dialect::vllm; ///< whose publisher
  };

  explicit event_stream(config cfg);

  /// A live message arrived.
  std::vector<stream_action> on_live(std::uint64_t seq, std::string_view payload,
                                     clock::time_point now);

  /// A reply from the replay endpoint arrived.
  std::vector<stream_action> on_replay(const wire::replay_reply& reply, clock::time_point now);

  /// Time passed: gives up on a replay past its deadline.
  std::vector<stream_action> on_tick(clock::time_point now);

  /// Whether a gap can ask the engine's replay endpoint from now on (the
  /// endpoint moved, or connecting to it failed). A replay under way still
  /// ends by its reply or its deadline.
  void set_replay_available(bool available) noexcept { cfg_.replay_available = available; }

  /// True while waiting for a replay to end.
  bool replaying() const noexcept { return replay_.has_value(); }

  const stream_counts& counts() const noexcept { return counts_; }

private:
  struct held_message {
    std::uint64_t seq;
    std::string payload;
  };
  struct replay_state {
    std::uint64_t next;  ///< the seq the replay must deliver next
    std::uint64_t until; ///< the first seq already held from the live stream
    clock::time_point deadline;
    bool late_start = false; ///< asked for history at the first message, not for a gap
    bool any_reply = false;
    std::deque<held_message> held;
  };

  void apply_payload(std::uint64_t seq, std::string_view payload, std::vector<stream_action>& out);
  void start_replay(std::uint64_t from, std::uint64_t seq, std::string_view payload,
                    clock::time_point now, bool late_start, std::vector<stream_action>& out);
  void finish_replay(std::vector<stream_action>& out);

  config cfg_;
  wire::seq_tracker tracker_;
  std::optional<replay_state> replay_;
  stream_counts counts_;
};

} // namespace llmgw::kv
