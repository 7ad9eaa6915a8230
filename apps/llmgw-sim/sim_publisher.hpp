// llmgw-sim's KV event publisher, as vLLM's ZmqEventPublisher behaves: a PUB
// socket that connects to the endpoint (binds when it contains '*' or '::'
// or is ipc/inproc), messages [topic, seq (8 bytes, big-endian, from 0),
// payload], and a ROUTER at the replay endpoint answering a DEALER's
// ["", start seq] with [topic, seq, payload] for every buffered batch from
// start on, then ["", ff x 8, ""]. One thread owns both sockets; publish()
// only queues. With shape sglang, each batch is first rewritten as SGLang
// publishes it (sim_sglang.hpp), the PUB also binds for 0.0.0.0, and replay
// replies carry no topic frame, as SGLang's.
#pragma once

#include "apps/llmgw-sim/sim_sglang.hpp"
#include "wire/kv_events.hpp"

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace llmgw::sim {

struct publisher_config {
  std::string endpoint;        ///< where vLLM's PUB goes
  std::string replay_endpoint; ///< empty: no replay
  std::string topic;
  std::size_t buffer_steps = 10000;
  wire::event_shape shape = wire::event_shape::map;
  std::optional<std::int64_t> dp_rank;
};

class publisher {
public:
  explicit publisher(publisher_config cfg);
  ~publisher();
  publisher(const publisher&) = delete;
  publisher& operator=(const publisher&) = delete;

  /// Queues one batch (any thread).
  void publish(std::vector<wire::kv_event> events);

  /// Batches sent so far (the next seq).
  std::uint64_t sent() const;

  /// Why the sockets could not be set up, or "".
  const std::string& error() const { return error_; }

private:
  void run();

  publisher_config cfg_;
  std::string error_;
  mutable std::mutex mtx_;
  std::condition_variable cv_;
  std::deque<std::string> queue_; ///< encoded payloads
  std::uint64_t sent_ = 0;
  bool stop_ = false;
  sglang_stream sglang_; ///< shape sglang: the rank's pages, by the cache's keys (mtx_)
  std::thread thread_;
};

} // namespace llmgw::sim
