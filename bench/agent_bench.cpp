// The agent's events-to-updates path, without actors: decode, follow the
// stream, apply to the block table, drain as the forwarder does every flush,
// and serialize each update with CAF's binary serializer (what crosses the
// network, before TLS). Measures block events per second on one core and the
// bytes sent relative to the raw event bytes for the S2 churn captures.
#include "bench/bench.hpp"
#include "kv/block_table.hpp"
#include "kv/event_stream.hpp"
#include "messages/kv_messages.hpp"

#include <boost/json.hpp>
#include <caf/binary_serializer.hpp>
#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace llmgw::bench {

namespace {

struct run_result {
  std::size_t updates = 0;
  std::size_t bytes_sent = 0;
};

/// One pass over the capture, draining every `drain_every` batches.
run_result one_pass(const capture_payloads& f, std::size_t drain_every, bool parity) {
  kv::event_stream stream({});
  kv::block_table table(parity ? std::optional<kv::parity_config>(kv::parity_config{"0", 16})
                               : std::nullopt);
  table.subscribe(1);
  run_result r;
  std::vector<char> buf;
  auto now = kv::event_stream::clock::now();
  auto drain = [&] {
    auto delta = table.drain(1);
    if (delta.empty())
      return;
    replica_update u;
    u.node = "agent-a";
    u.replica = "replica-0";
    u.epoch = delta.epoch;
    u.reset = delta.reset;
    u.added = std::move(delta.added);
    u.removed = std::move(delta.removed);
    buf.clear();
    caf::binary_serializer sink{nullptr, buf};
    if (sink(u))
      std::abort(); // serializing plain vectors cannot fail
    r.bytes_sent += buf.size();
    ++r.updates;
  };
  for (std::size_t seq = 0; seq < f.payloads.size(); ++seq) {
    for (auto& a : stream.on_live(seq, f.payloads[seq], now)) {
      if (a.what == kv::stream_action::kind::apply)
        table.apply(a.batch);
      else if (a.what == kv::stream_action::kind::reset)
        table.reset(a.reason);
    }
    if ((seq + 1) % drain_every == 0)
      drain();
  }
  drain();
  return r;
}

} // namespace

int run_agent_bench(int rounds) {
  fmt::print("# llmgw-bench agent --rounds {} (medians)\n", rounds);
  for (const char* name : {"S2_churn.map.int.json", "S2_churn.array.int.json"}) {
    capture_payloads f;
    if (!load_capture(name, f))
      return 1;
    // S2 is 2,000 batches from 2,620 engine steps; at ~10 ms a step, a 250 ms
    // flush covers about 25 batches.
    for (bool parity : {false, true}) {
      std::vector<double> times;
      times.reserve(static_cast<std::size_t>(rounds));
      run_result r;
      for (int i = 0; i < rounds; ++i)
        times.push_back(time_once([&] { r = one_pass(f, 25, parity); }));
      auto t = median(times);
      auto label = fmt::format("agent {}{}", name, parity ? " +parity" : "");
      report(label + ": block events/s", static_cast<double>(f.block_events) / t / 1e6, "M/s",
             "(decode, follow, apply, drain, serialize; target >= 1)");
      if (!parity) {
        report(label + ": bytes sent / event bytes",
               static_cast<double>(r.bytes_sent) / static_cast<double>(f.bytes), "x",
               fmt::format("({} updates, {} bytes for {} event bytes)", r.updates, r.bytes_sent,
                           f.bytes));
      }
    }
  }
  return 0;
}

} // namespace llmgw::bench
