#include "actors/subscriber.hpp"

#include "base/burst_log.hpp"
#include "base/log.hpp"
#include "net/zmq_parts.hpp"
#include "wire/zmq_message.hpp"

#include <caf/after.hpp>
#include <caf/blocking_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace llmgw {

struct subscriber_socket {
  zmq::context_t context{1};
  zmq::socket_t sub{context, zmq::socket_type::sub};
};

opened_subscriber open_subscriber(const subscriber_options& opts) {
  opened_subscriber out;
  auto socket = std::make_shared<subscriber_socket>();
  bool connect = wire::publisher_binds(opts.endpoint);
  try {
    socket->sub.set(zmq::sockopt::linger, 0);
    // A publisher that sends more than the decoder would read is cut off
    // before its message is held; a full queue drops messages (a gap,
    // filled by replay), rather than growing without bound.
    socket->sub.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(opts.max_message_bytes));
    socket->sub.set(zmq::sockopt::rcvhwm, opts.queue_messages);
    socket->sub.set(zmq::sockopt::subscribe, opts.topic);
    if (connect) {
      socket->sub.connect(opts.endpoint);
      out.endpoint = opts.endpoint;
    } else {
      auto endpoint = opts.endpoint;
      if (endpoint.size() > 2 && endpoint.compare(endpoint.size() - 2, 2, ":0") == 0)
        endpoint.replace(endpoint.size() - 1, 1, "*");
      socket->sub.bind(endpoint);
      out.endpoint = socket->sub.get(zmq::sockopt::last_endpoint);
    }
    out.socket = std::move(socket);
  } catch (const zmq::error_t& e) {
    out.error = fmt::format("cannot {} the KV event socket at {}: {}", connect ? "connect" : "bind",
                            opts.endpoint, e.what());
  }
  return out;
}

void subscriber(caf::blocking_actor* self, const std::shared_ptr<subscriber_socket>& socket,
                const subscriber_options& opts, mirror_actor mirror,
                std::shared_ptr<subscriber_stats> stats) {
  const std::string who = "subscriber " + opts.replica;
  kv::event_stream::config cfg;
  cfg.replay_available = !opts.replay.empty();
  cfg.replay_timeout = opts.replay_timeout;
  kv::event_stream stream(cfg);
  std::optional<zmq::socket_t> dealer;
  if (cfg.replay_available) {
    dealer.emplace(socket->context, zmq::socket_type::dealer);
    dealer->set(zmq::sockopt::linger, 0);
    // Bounded as the live socket is: the replay endpoint is the engine's too.
    dealer->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(opts.max_message_bytes));
    dealer->set(zmq::sockopt::rcvhwm, opts.queue_messages);
    dealer->connect(opts.replay);
  }
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
    stats->gaps = c.gaps;
    stats->gaps_filled = c.gaps_filled;
    stats->restarts = c.restarts;
  };
  auto carry_out = [&](std::vector<kv::stream_action> actions) {
    for (auto& a : actions) {
      switch (a.what) {
      case kv::stream_action::kind::apply:
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
          LLMGW_LOG(info, who, "resetting the mirror: {}", kv::to_string(a.reason));
        }
        self->send(mirror, reset_atom::value, a.reason);
        break;
      case kv::stream_action::kind::request_replay: {
        auto start = wire::replay_request(a.seq);
        std::array<zmq::const_buffer, 2> request = {zmq::const_buffer("", 0),
                                                    zmq::const_buffer(start.data(), start.size())};
        zmq::send_multipart(*dealer, request, zmq::send_flags::dontwait);
        LLMGW_LOG(info, who, "asking the replay endpoint for seq {} onwards", a.seq);
        break;
      }
      }
    }
  };

  bool running = true;
  std::vector<zmq::message_t> parts;
  while (running) {
    zmq::pollitem_t items[2] = {{socket->sub.handle(), 0, ZMQ_POLLIN, 0},
                                {dealer ? dealer->handle() : nullptr, 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, dealer ? 2 : 1, opts.poll_interval);
    auto now = std::chrono::steady_clock::now();
    while (receive_now(socket->sub, parts)) {
      auto msg = wire::split_live_message(views_of(parts));
      if (!msg) {
        ++stats->bad_frames;
        if (auto n = frame_log.admit("live"))
          LLMGW_LOG(warning, who, "{}{}", msg.err().message, burst_note(n));
        continue;
      }
      if (stream.counts().messages == 0)
        LLMGW_LOG(info, who, "first event batch: seq {}", msg->seq);
      carry_out(stream.on_live(msg->seq, msg->payload, now));
    }
    while (dealer && receive_now(*dealer, parts)) {
      auto reply = wire::split_replay_reply(views_of(parts));
      if (!reply) {
        ++stats->bad_frames;
        if (auto n = frame_log.admit("replay"))
          LLMGW_LOG(warning, who, "replay: {}{}", reply.err().message, burst_note(n));
        continue;
      }
      carry_out(stream.on_replay(*reply, now));
    }
    carry_out(stream.on_tick(now));
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
