#include "actors/subscriber.hpp"

#include "base/burst_log.hpp"
#include "base/log.hpp"

#include <caf/after.hpp>
#include <caf/blocking_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>

namespace llmgw {

opened_subscriber open_subscriber(const subscriber_options& opts) {
  opened_subscriber out;
  auto socket = std::make_shared<kv_event_socket>(opts);
  if (!socket->error().empty()) {
    out.error = socket->error();
    return out;
  }
  out.endpoint = socket->endpoint();
  out.socket = std::move(socket);
  return out;
}

void subscriber(caf::blocking_actor* self, const std::shared_ptr<kv_event_socket>& socket,
                const subscriber_options& opts, mirror_actor mirror,
                std::shared_ptr<subscriber_stats> stats) {
  const std::string who = "subscriber " + opts.replica;
  // The actor's arguments (this socket with them) live as long as its
  // handles: the port is freed as the body ends, however it ends, for a
  // reload that binds it again.
  struct closer {
    kv_event_socket& socket;
    ~closer() { socket.close(); }
  } close_on_exit{*socket};
  kv::event_stream::config cfg;
  cfg.replay_available = socket->has_replay();
  stats->replay = cfg.replay_available;
  cfg.replay_timeout = opts.replay_timeout;
  cfg.dialect = opts.dialect;
  kv::event_stream stream(cfg);
  auto last_error_log = std::chrono::steady_clock::time_point{};
  burst_log frame_log; // a bad frame per message must not log per message
  // Batches decoded in one poll go to the mirror in one message: a message
  // per batch cost more than applying it. Flushed before any reset (order
  // matters), at 256 batches, and at the end of every poll.
  auto pending = std::make_shared<std::vector<wire::event_batch>>();
  auto flush_pending = [&] {
    if (pending->empty())
      return;
    self->send(mirror, apply_atom::value, batch_list{std::move(pending)});
    pending = std::make_shared<std::vector<wire::event_batch>>();
  };
  auto publish_stats = [&] {
    const auto& c = stream.counts();
    stats->messages = c.messages;
    stats->decode_errors = c.decode_errors;
    stats->unknown_events = c.unknown_events;
    stats->gaps = c.gaps;
    stats->gaps_filled = c.gaps_filled;
    stats->restarts = c.restarts;
  };
  bool first = true;
  kv_event_socket::handlers handlers;
  handlers.act = [&](kv::stream_action& a) {
    switch (a.what) {
    case kv::stream_action::kind::apply:
      if (std::exchange(first, false))
        LLMGW_LOG(info, who, "first event batch: seq {}", a.seq);
      pending->push_back(std::move(a.batch));
      if (pending->size() >= 256)
        flush_pending();
      break;
    case kv::stream_action::kind::reset:
      flush_pending();
      if (a.decode_failure) {
        auto now = std::chrono::steady_clock::now();
        if (now - last_error_log > std::chrono::seconds(1)) { // once per burst
          LLMGW_LOG(warning, who, "seq {}: payload does not decode ({}): {}", a.seq,
                    to_string(a.decode_failure->code), a.decode_failure->message);
          last_error_log = now;
        }
      } else {
        LLMGW_LOG(info, who, "resetting the mirror: {} (seq {} after {})", kv::to_string(a.reason),
                  a.seq, a.expected);
      }
      self->send(mirror, reset_atom::value, a.reason);
      break;
    case kv::stream_action::kind::request_replay:
      LLMGW_LOG(info, who, "asking the replay endpoint for seq {} onwards", a.seq);
      break;
    }
  };
  handlers.bad_frame = [&](const char* which, const error& e) {
    ++stats->bad_frames;
    if (auto n = frame_log.admit(which))
      LLMGW_LOG(warning, who, "{}: {}{}", which, e.message, burst_note(n));
  };

  bool running = true;
  std::uint64_t replay_seen = 0;
  while (running) {
    if (opts.replay_moves)
      if (auto moved = opts.replay_moves->changed(replay_seen)) {
        std::string error;
        if (socket->connect_replay(*moved, error))
          LLMGW_LOG(info, who, "the engine's replay endpoint moved to {}", *moved);
        else
          LLMGW_LOG(warning, who, "gaps will not be filled by replay: {}", error);
        // A gap with no endpoint to ask resets at once, rather than waiting
        // replay_timeout for an answer that cannot come.
        stream.set_replay_available(socket->has_replay());
        stats->replay = socket->has_replay();
      }
    socket->wait(opts.poll_interval);
    socket->pump(stream, std::chrono::steady_clock::now(), handlers);
    flush_pending();
    publish_stats(); // after the flush: a reader of the stats may query the mirror next
    // Between polls: the mailbox, without waiting. An exit message ends the
    // loop; nothing else is sent to a subscriber.
    self->receive(
      [&](caf::exit_msg& em) {
        running = false;
        self->fail_state(std::move(em.reason));
      },
      caf::after(std::chrono::milliseconds(0)) >> [] {});
  }
}

} // namespace llmgw
