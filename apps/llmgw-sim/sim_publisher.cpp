#include "apps/llmgw-sim/sim_publisher.hpp"

#include "base/log.hpp"
#include "wire/zmq_message.hpp"

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <array>
#include <chrono>
#include <future>

namespace llmgw::sim {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

} // namespace

publisher::publisher(publisher_config cfg) : cfg_(std::move(cfg)) {
  std::promise<std::string> ready;
  auto started = ready.get_future();
  thread_ = std::thread([this, &ready] {
    zmq::context_t ctx;
    zmq::socket_t pub(ctx, zmq::socket_type::pub);
    zmq::socket_t router(ctx, zmq::socket_type::router);
    try {
      pub.set(zmq::sockopt::linger, 1000);
      pub.set(zmq::sockopt::sndhwm, 100000);
      bool sglang_binds = cfg_.shape == wire::event_shape::sglang
                          && cfg_.endpoint.find("0.0.0.0") != std::string::npos;
      if (wire::publisher_binds(cfg_.endpoint) || sglang_binds)
        pub.bind(cfg_.endpoint);
      else
        pub.connect(cfg_.endpoint);
      router.set(zmq::sockopt::linger, 0);
      if (!cfg_.replay_endpoint.empty())
        router.bind(cfg_.replay_endpoint);
    } catch (const zmq::error_t& e) {
      ready.set_value(std::string("KV events: ") + e.what());
      return;
    }
    ready.set_value("");
    std::deque<std::pair<std::uint64_t, std::string>> buffer; // for replay
    for (;;) {
      std::deque<std::string> batch;
      {
        std::unique_lock<std::mutex> g(mtx_);
        cv_.wait_for(g, std::chrono::milliseconds(10), [this] { return stop_ || !queue_.empty(); });
        batch.swap(queue_);
        if (stop_ && batch.empty())
          break;
      }
      for (auto& payload : batch) {
        std::uint64_t seq;
        {
          std::lock_guard<std::mutex> g(mtx_);
          seq = sent_++;
        }
        auto seq_bytes = wire::encode_seq(seq);
        std::array<zmq::const_buffer, 3> parts = {zmq::buffer(cfg_.topic), zmq::buffer(seq_bytes),
                                                  zmq::buffer(payload)};
        zmq::send_multipart(pub, parts, zmq::send_flags::dontwait);
        if (cfg_.replay_endpoint.empty())
          continue;
        buffer.emplace_back(seq, std::move(payload));
        if (buffer.size() > cfg_.buffer_steps)
          buffer.pop_front();
      }
      if (cfg_.replay_endpoint.empty())
        continue;
      // Replay requests: [identity, "", start seq].
      for (;;) {
        std::vector<zmq::message_t> req;
        auto got = zmq::recv_multipart(router, std::back_inserter(req), zmq::recv_flags::dontwait);
        if (!got)
          break;
        if (req.size() != 3)
          continue;
        auto start = wire::decode_seq(req[2].to_string_view());
        auto client = zmq::buffer(req[0].data(), req[0].size());
        for (const auto& [seq, payload] : buffer) {
          if (!start || seq < *start)
            continue;
          auto seq_bytes = wire::encode_seq(seq);
          if (cfg_.shape == wire::event_shape::sglang) { // SGLang's replies name no topic
            std::array<zmq::const_buffer, 4> parts = {client, zmq::buffer("", 0),
                                                      zmq::buffer(seq_bytes), zmq::buffer(payload)};
            zmq::send_multipart(router, parts);
            continue;
          }
          std::array<zmq::const_buffer, 5> parts = {client, zmq::buffer("", 0),
                                                    zmq::buffer(cfg_.topic), zmq::buffer(seq_bytes),
                                                    zmq::buffer(payload)};
          zmq::send_multipart(router, parts);
        }
        auto end = wire::encode_seq(~std::uint64_t{0});
        if (cfg_.shape == wire::event_shape::sglang) {
          std::array<zmq::const_buffer, 4> marker = {client, zmq::buffer("", 0), zmq::buffer(end),
                                                     zmq::buffer("", 0)};
          zmq::send_multipart(router, marker);
          continue;
        }
        std::array<zmq::const_buffer, 5> marker = {client, zmq::buffer("", 0), zmq::buffer("", 0),
                                                   zmq::buffer(end), zmq::buffer("", 0)};
        zmq::send_multipart(router, marker);
      }
    }
  });
  error_ = started.get();
}

publisher::~publisher() {
  {
    std::lock_guard<std::mutex> g(mtx_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void publisher::publish(std::vector<wire::kv_event> events) {
  {
    // One lock from rewriting to queueing: batches from the engine and from
    // the churn thread keep the order their rewrites assumed.
    std::lock_guard<std::mutex> g(mtx_);
    if (cfg_.shape == wire::event_shape::sglang)
      events = sglang_.convert(events);
    if (events.empty())
      return;
    wire::event_batch b;
    b.ts = now_seconds();
    b.events = std::move(events);
    b.data_parallel_rank = cfg_.dp_rank;
    queue_.push_back(wire::encode_batch(b, cfg_.shape));
  }
  cv_.notify_all();
}

std::uint64_t publisher::sent() const {
  std::lock_guard<std::mutex> g(mtx_);
  return sent_;
}

} // namespace llmgw::sim
