// vLLM's replay service, as tests need it: a ROUTER on a kernel-chosen (or a
// given) loopback port that answers ["", start_seq] with every frame whose seq is
// >= start, in the current layout ["", topic, seq, payload], then the end
// marker ["", "", ff*8, ""]. Runs on its own thread until destroyed (also
// when an ASSERT leaves the test early).
#pragma once

#include "wire/zmq_message.hpp"

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace llmgw::test {

/// `Frame` has `topic`, `seq` and `payload`.
template <class Frame>
class replay_service {
public:
  /// Binds `at` (throws zmq::error_t if it cannot: a port taken).
  explicit replay_service(std::vector<Frame> frames, const std::string& at = "tcp://127.0.0.1:*")
    : frames_(std::move(frames)), router_(ctx_, zmq::socket_type::router) {
    router_.set(zmq::sockopt::linger, 0);
    router_.bind(at);
    endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { serve(); });
  }

  ~replay_service() {
    done_ = true;
    thread_.join();
  }

  replay_service(const replay_service&) = delete;
  replay_service& operator=(const replay_service&) = delete;

  /// Where to point a replay client.
  const std::string& endpoint() const { return endpoint_; }

  /// Replay requests answered so far.
  int requests() const { return requests_.load(); }

private:
  void serve() {
    while (!done_.load()) {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) == 0)
        continue;
      std::vector<zmq::message_t> req;
      (void)zmq::recv_multipart(router_, std::back_inserter(req));
      if (req.size() != 3)
        continue;
      ++requests_;
      auto start = wire::decode_seq(req[2].to_string_view());
      auto client = zmq::buffer(req[0].data(), req[0].size());
      for (const auto& f : frames_) {
        if (!start || f.seq < *start)
          continue;
        auto seq = wire::encode_seq(f.seq);
        std::array<zmq::const_buffer, 5> parts = {client, zmq::buffer("", 0), zmq::buffer(f.topic),
                                                  zmq::buffer(seq), zmq::buffer(f.payload)};
        zmq::send_multipart(router_, parts);
      }
      auto end = wire::encode_seq(~std::uint64_t{0});
      std::array<zmq::const_buffer, 5> marker = {client, zmq::buffer("", 0), zmq::buffer("", 0),
                                                 zmq::buffer(end), zmq::buffer("", 0)};
      zmq::send_multipart(router_, marker);
    }
  }

  std::vector<Frame> frames_;
  zmq::context_t ctx_;
  zmq::socket_t router_;
  std::string endpoint_;
  std::atomic<bool> done_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

} // namespace llmgw::test
