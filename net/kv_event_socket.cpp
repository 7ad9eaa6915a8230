#include "net/kv_event_socket.hpp"

#include "net/zmq_parts.hpp"
#include "wire/zmq_message.hpp"

#include <fmt/format.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <array>
#include <optional>
#include <vector>

namespace llmgw {

struct kv_event_socket::impl {
  kv_event_socket_options opts;
  zmq::context_t context{1};
  zmq::socket_t sub{context, zmq::socket_type::sub};
  std::optional<zmq::socket_t> dealer;
  std::vector<zmq::message_t> parts;
};

namespace {

/// Bounds and options of a socket that goes to `endpoint`.
void bound(zmq::socket_t& s, const kv_event_socket_options& opts, const std::string& endpoint) {
  s.set(zmq::sockopt::linger, 0);
  // libzmq resolves IPv4 only unless told. An IPv6 address is written in
  // brackets (tcp://[::1]:5557); names keep resolving to IPv4, where
  // vLLM's tcp://*:5557 listens.
  if (endpoint.find('[') != std::string::npos)
    s.set(zmq::sockopt::ipv6, true);
  s.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(opts.max_message_bytes));
  s.set(zmq::sockopt::rcvhwm, opts.queue_messages);
}

} // namespace

kv_event_socket::kv_event_socket(const kv_event_socket_options& opts)
  : impl_(std::make_unique<impl>()) {
  impl_->opts = opts;
  bool connect = opts.engine_binds || wire::publisher_binds(opts.endpoint);
  const char* step = connect ? "connect" : "bind";
  const std::string& where = opts.endpoint;
  try {
    bound(impl_->sub, opts, opts.endpoint);
    impl_->sub.set(zmq::sockopt::subscribe, opts.topic);
    if (connect) {
      impl_->sub.connect(opts.endpoint);
      endpoint_ = opts.endpoint;
    } else {
      auto endpoint = opts.endpoint;
      if (endpoint.size() > 2 && endpoint.compare(endpoint.size() - 2, 2, ":0") == 0)
        endpoint.replace(endpoint.size() - 1, 1, "*"); // port 0: the kernel picks
      impl_->sub.bind(endpoint);
      endpoint_ = impl_->sub.get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    error_ = fmt::format("cannot {} the KV event socket at {}: {}", step, where, e.what());
    endpoint_.clear();
    impl_.reset();
    return;
  }
  if (!opts.replay.empty() && !connect_replay(opts.replay, error_)) {
    endpoint_.clear();
    impl_.reset();
  }
}

bool kv_event_socket::connect_replay(const std::string& endpoint, std::string& error) {
  try {
    impl_->dealer.emplace(impl_->context, zmq::socket_type::dealer);
    bound(*impl_->dealer, impl_->opts, endpoint); // the replay endpoint is the engine's too
    impl_->dealer->connect(endpoint);
    return true;
  } catch (const zmq::error_t& e) {
    impl_->dealer.reset();
    error = fmt::format("cannot connect to the replay endpoint at {}: {}", endpoint, e.what());
    return false;
  }
}

kv_event_socket::~kv_event_socket() = default;

void kv_event_socket::close() noexcept {
  impl_.reset(); // closes the sockets (linger 0), then ends their context
}

bool kv_event_socket::has_replay() const noexcept {
  return impl_ && impl_->dealer.has_value();
}

void kv_event_socket::wait(std::chrono::milliseconds timeout) {
  zmq::pollitem_t items[2] = {{impl_->sub.handle(), 0, ZMQ_POLLIN, 0},
                              {has_replay() ? impl_->dealer->handle() : nullptr, 0, ZMQ_POLLIN, 0}};
  try {
    zmq::poll(items, has_replay() ? 2 : 1, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR)
      throw;
  }
}

void kv_event_socket::pump(kv::event_stream& stream, std::chrono::steady_clock::time_point now,
                           const handlers& h) {
  auto carry_out = [&](std::vector<kv::stream_action> actions) {
    for (auto& a : actions) {
      if (a.what == kv::stream_action::kind::request_replay && has_replay()) {
        auto start = wire::replay_request(a.seq);
        std::array<zmq::const_buffer, 2> request = {zmq::const_buffer("", 0),
                                                    zmq::const_buffer(start.data(), start.size())};
        zmq::send_multipart(*impl_->dealer, request, zmq::send_flags::dontwait);
      }
      h.act(a);
    }
  };
  auto& parts = impl_->parts;
  while (receive_now(impl_->sub, parts)) {
    auto msg = wire::split_live_message(views_of(parts));
    if (!msg) {
      h.bad_frame("live", msg.err());
      continue;
    }
    carry_out(stream.on_live(msg->seq, msg->payload, now));
  }
  while (has_replay() && receive_now(*impl_->dealer, parts)) {
    auto reply = wire::split_replay_reply(views_of(parts));
    if (!reply) {
      h.bad_frame("replay", reply.err());
      continue;
    }
    carry_out(stream.on_replay(*reply, now));
  }
  carry_out(stream.on_tick(now));
}

} // namespace llmgw
