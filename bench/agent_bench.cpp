// The agent's events-to-updates path, without actors: decode, follow the
// stream, apply to the block table, drain as the forwarder does every flush,
// and serialize each update with CAF's binary serializer (what crosses the
// network, before TLS). Measures block events per second on one core and the
// bytes sent relative to the raw event bytes for the S2 churn captures, in
// four modes: hashes not checked; checked (block_keys = "engine"); keyed by
// translation where the engine hashes the cluster's way (the identity); and
// where it hashes another way (the capture's seed "0" against a cluster's
// "1": every block re-keyed). And the heap the table takes per held block.
#include "bench/bench.hpp"
#include "kv/block_table.hpp"
#include "kv/event_stream.hpp"
#include "messages/kv_messages.hpp"

#include <boost/json.hpp>
#include <caf/binary_serializer.hpp>
#include <fmt/format.h>

#include <fstream>
#include <malloc.h>
#include <sstream>

namespace llmgw::bench {

namespace {

struct run_result {
  std::size_t updates = 0;
  std::size_t bytes_sent = 0;
  std::size_t held = 0;         ///< blocks held at the end
  std::size_t peak_held = 0;    ///< most blocks held after a batch
  std::size_t heap_at_peak = 0; ///< heap bytes in use then, beyond the start
};

enum class mode { unchecked, parity, identity, translate };

const char* to_string(mode m) {
  switch (m) {
  case mode::unchecked:
    return "";
  case mode::parity:
    return " +parity";
  case mode::identity:
    return " +translate (identity)";
  case mode::translate:
    return " +translate (other seed)";
  }
  return "";
}

std::optional<kv::parity_config> config_of(mode m) {
  switch (m) {
  case mode::unchecked:
    return std::nullopt;
  case mode::parity:
    return kv::parity_config{"0", 16, false};
  case mode::identity:
    return kv::parity_config{"0", 16, true};
  case mode::translate:
    return kv::parity_config{"1", 16, true};
  }
  return std::nullopt;
}

std::size_t heap_in_use() {
  return mallinfo2().uordblks;
}

/// One pass over the capture, draining every `drain_every` batches; with
/// `measure_heap`, the heap in use is read after every batch (slow: not
/// for timed passes).
run_result one_pass(const capture_payloads& f, std::size_t drain_every, mode m,
                    bool measure_heap = false) {
  auto heap_before = measure_heap ? heap_in_use() : 0;
  kv::event_stream stream({});
  kv::block_table table(config_of(m));
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
    if ((seq + 1) % drain_every == 0) {
      drain();
      if (measure_heap && table.size() > r.peak_held) {
        r.peak_held = table.size();
        r.heap_at_peak = heap_in_use() - heap_before;
      }
    }
  }
  drain();
  r.held = table.size();
  return r;
}

/// The heap a table takes per held block when it holds as many as an 8B
/// model's cache on one H100 (27,500 blocks, docs/simulator.md): stored as
/// 1,719 prompts of 16 blocks each, every block with its tokens and extra
/// keys as vLLM publishes them, hashed by an engine with another seed.
double heap_per_block_of_a_full_engine(mode m, std::size_t& held) {
  constexpr std::size_t blocks = 27500, run = 16, bs = 16;
  wire::block_hasher engine("engine-seed", bs);
  wire::event_batch batch;
  std::vector<wire::hashed_block> chain;
  std::vector<std::uint32_t> tokens(run * bs);
  for (std::size_t prompt = 0; prompt * run < blocks; ++prompt) {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<std::uint32_t>(prompt * 7919 + i);
    engine.hash_into(tokens, {}, chain);
    wire::kv_event ev;
    ev.kind = wire::event_kind::block_stored;
    ev.block_size = bs;
    ev.token_ids = tokens;
    ev.extra_keys.emplace(chain.size());
    for (const auto& b : chain) {
      wire::block_hash h;
      h.key = b.key;
      ev.block_hashes.push_back(h);
    }
    batch.events.push_back(std::move(ev));
  }
  auto before = heap_in_use();
  double per_block = 0;
  {
    kv::block_table table(config_of(m));
    table.subscribe(1);
    table.apply(batch);
    table.drain(1);
    held = table.size();
    per_block = static_cast<double>(heap_in_use() - before) / static_cast<double>(held);
  }
  return per_block;
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
    for (mode m : {mode::unchecked, mode::parity, mode::identity, mode::translate}) {
      std::vector<double> times;
      times.reserve(static_cast<std::size_t>(rounds));
      run_result r;
      for (int i = 0; i < rounds; ++i)
        times.push_back(time_once([&] { r = one_pass(f, 25, m); }));
      auto t = median(times);
      auto label = fmt::format("agent {}{}", name, to_string(m));
      bool translating = m == mode::identity || m == mode::translate;
      report(label + ": block events/s", static_cast<double>(f.block_events) / t / 1e6, "M/s",
             translating ? "(decode, follow, translate, apply, drain, serialize; target >= 0.5)"
                         : "(decode, follow, apply, drain, serialize; target >= 1)");
      auto heap = one_pass(f, 25, m, true);
      if (heap.peak_held > 0)
        report(label + ": table heap per held block",
               static_cast<double>(heap.heap_at_peak) / static_cast<double>(heap.peak_held),
               "bytes", fmt::format("({} blocks held at the peak)", heap.peak_held));
      if (m == mode::unchecked) {
        report(label + ": bytes sent / event bytes",
               static_cast<double>(r.bytes_sent) / static_cast<double>(f.bytes), "x",
               fmt::format("({} updates, {} bytes for {} event bytes)", r.updates, r.bytes_sent,
                           f.bytes));
      }
    }
  }
  for (mode m : {mode::unchecked, mode::parity, mode::translate}) {
    std::size_t held = 0;
    auto per_block = heap_per_block_of_a_full_engine(m, held);
    report(fmt::format("agent full engine{}: table heap per held block", to_string(m)), per_block,
           "bytes", fmt::format("({} blocks of one engine's cache)", held));
  }
  return 0;
}

} // namespace llmgw::bench
