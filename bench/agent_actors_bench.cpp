// The agent's path through its actors: a ZMQ publisher (as vLLM's) sends the
// S2 churn capture, repeated with continuing seqs, to a real subscriber
// (its own thread), which decodes and feeds the mirror; a forwarder drains
// the mirror every 250 ms into a control actor in the same process. Run it
// pinned to one core to measure what one core sustains.
#include "actors/forwarder.hpp"
#include "actors/mirror.hpp"
#include "actors/registration.hpp"
#include "actors/subscriber.hpp"
#include "bench/bench.hpp"
#include "tests/support/fake_control.hpp"
#include "wire/zmq_message.hpp"

#include <boost/json.hpp>
#include <caf/all.hpp>
#include <fmt/format.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <fstream>
#include <sstream>
#include <thread>

namespace llmgw::bench {

namespace {

struct bench_config : caf::actor_system_config {
  bench_config() {
    register_message_types(*this);
    set("scheduler.max-threads", 1);
  }
};

control_actor::behavior_type counting_control(control_actor::pointer self,
                                              std::shared_ptr<std::atomic<std::uint64_t>> updates) {
  auto fwd = std::make_shared<forwarder_actor>();
  auto handshake = std::make_shared<test::plaintext_handshake>();
  return {
    [self, fwd, handshake](const agent_hello& h, const forwarder_actor& f) {
      *fwd = f;
      self->send(f, handshake->answer(h));
    },
    [handshake](const agent_proof& p) { handshake->finish(p); },
    [](timeout_atom, std::uint64_t) {},
    [self, updates, fwd](const replica_update& u) {
      ++*updates;
      self->send(*fwd, session_ack{u.session, u.seq});
    },
    [self, fwd](const load_report& r) {
      self->send(*fwd, session_ack{r.session, r.seq});
    },
    [](const topology_reload&) {},
    [](metrics_atom) { return std::string{}; },
  };
}

} // namespace

int run_agent_actors_bench(int rounds) {
  capture_payloads cap;
  if (!load_capture("S2_churn.map.int.json", cap))
    return 1;
  const auto& payloads = cap.payloads;
  const auto& topic = cap.topic;
  const auto block_events = cap.block_events;

  bench_config cfg;
  caf::actor_system sys{cfg};
  auto m = sys.spawn(mirror, std::string("r0"), std::uint32_t{0},
                     std::optional<kv::parity_config>{}, nullptr);
  auto updates = std::make_shared<std::atomic<std::uint64_t>>(0);
  auto control = sys.spawn(counting_control, updates);
  forwarder_options fo;
  fo.node = "agent-a";
  fo.control = "bench";
  auto connect = [control](const forwarder_actor& f) {
    caf::send_as(f, f, connected_atom::value, caf::actor_cast<caf::strong_actor_ptr>(control));
  };
  auto fwd =
    sys.spawn(forwarder, fo, std::vector<mirror_entry>{{"r0", m}}, connect_function(connect));
  subscriber_options so;
  so.replica = "r0";
  so.topic = topic;
  auto bound = open_subscriber(so);
  if (!bound.socket) {
    fmt::print(stderr, "llmgw-bench: {}\n", bound.error);
    return 1;
  }
  auto stats = std::make_shared<subscriber_stats>();
  auto sub = sys.spawn<caf::detached>(subscriber, bound.socket, so, m, stats);

  zmq::context_t ctx;
  zmq::socket_t pub(ctx, zmq::socket_type::xpub);
  pub.set(zmq::sockopt::sndhwm, 0);
  pub.set(zmq::sockopt::rcvtimeo, 10000);
  pub.connect(bound.endpoint);
  zmq::message_t subscription;
  if (!pub.recv(subscription)) {
    fmt::print(stderr, "llmgw-bench: the subscriber did not subscribe\n");
    return 1;
  }
  fmt::print(
    "# llmgw-bench agent-actors --rounds {} (medians; S2 churn map.int, {} batches a round)\n",
    rounds, payloads.size());
  std::uint64_t seq = 0;
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(rounds));
  caf::scoped_actor self{sys};
  for (int r = 0; r < rounds; ++r) {
    auto target = stats->messages.load() + payloads.size();
    times.push_back(time_once([&] {
      for (const auto& p : payloads) {
        auto s = wire::encode_seq(seq++);
        std::array<zmq::const_buffer, 3> parts = {zmq::buffer(topic), zmq::buffer(s),
                                                  zmq::buffer(p)};
        zmq::send_multipart(pub, parts);
      }
      while (stats->messages.load() < target)
        std::this_thread::sleep_for(std::chrono::microseconds(50)); // do not steal the core
      // Queued behind every apply: answered once the mirror has applied them all.
      self->request(m, caf::infinite, drain_atom::value, std::uint64_t{42})
        .receive([](const replica_update&) {}, [](const caf::error&) {});
    }));
  }
  auto t = median(times);
  report("agent actors: block events/s (publisher -> subscriber -> mirror)",
         static_cast<double>(block_events) / t / 1e6, "M/s", "(target >= 1 on one core)");
  report("agent actors: batches/s", static_cast<double>(payloads.size()) / t / 1e3, "k/s");
  report("agent actors: updates the forwarder sent", static_cast<double>(updates->load()), "",
         "(one per replica per 250 ms flush with changes)");
  caf::anon_send_exit(sub, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(fwd, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(control, caf::exit_reason::user_shutdown);
  return stats->gaps.load() == 0 ? 0 : 1;
}

} // namespace llmgw::bench
