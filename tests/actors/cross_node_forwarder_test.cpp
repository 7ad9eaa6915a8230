// A forwarder in one actor system reaching a control node published by
// another over CAF's network layer on loopback: the connector's asynchronous
// connect, the interface check, the session and the acks across the wire.
#include "actors/control_connector.hpp"
#include "actors/forwarder.hpp"
#include "actors/mirror.hpp"
#include "actors/registration.hpp"
#include "tests/support/batches.hpp"
#include "tests/support/captures.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/loopback_control.hpp"

#include <boost/json.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <gtest/gtest.h>

#include <thread>

using namespace std::chrono_literals;
using namespace llmgw;

namespace {

std::vector<test::batch_ptr> s2_batches() {
  std::vector<test::batch_ptr> out;
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S2_churn.map.int.json"));
  for (const auto& f : doc.at("frames").as_array()) {
    auto payload = llmgw::test::from_hex(boost::json::value_to<std::string>(f.at("payload_hex")));
    out.push_back(std::make_shared<const wire::event_batch>(*wire::decode_batch(payload)));
  }
  return out;
}

} // namespace

TEST(cross_node, forwarder_session_and_acks_cross_the_network) {
  test::loopback_control control;
  ASSERT_NE(control.port, 0) << control.error;
  auto log = control.record;

  test::loopback_node_config agent_cfg;
  caf::actor_system agent_sys{agent_cfg};
  auto m = agent_sys.spawn(mirror, std::string("r0"), std::uint32_t{0},
                           std::optional<kv::parity_config>{}, nullptr);
  forwarder_options opts;
  opts.node = "agent-a";
  opts.control = "control-1";
  opts.flush_interval = 20ms;
  opts.window = 2;
  auto fwd = agent_sys.spawn(forwarder, opts, std::vector<mirror_entry>{{"r0", m}},
                             middleman_connector("127.0.0.1", control.port, 5s));
  // Churn in rounds, each waiting for a flush: far more updates than the
  // window allows, so they only all arrive if acks come back over the wire.
  auto batches = s2_batches();
  for (std::size_t i = 0; i < 400; ++i) {
    caf::anon_send(m, apply_atom::value, test::one_batch(batches[i]));
    if (i % 40 == 39)
      std::this_thread::sleep_for(60ms);
  }
  test::eventually([&] { return log->update_count() >= 8; }, 5s);
  {
    std::lock_guard<std::mutex> g(log->mtx);
    ASSERT_EQ(log->hellos.size(), 1u);
    EXPECT_EQ(log->hellos[0].node, "agent-a");
    ASSERT_GE(log->updates.size(), 8u) << "acks must free the window of 2";
    EXPECT_TRUE(log->updates[0].reset);
    for (std::size_t i = 0; i < log->updates.size(); ++i)
      EXPECT_EQ(log->updates[i].seq, i + 1) << "in order, numbered within the session";
  }
  caf::anon_send_exit(fwd, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
}

TEST(cross_node, connector_refuses_an_actor_with_another_interface) {
  test::loopback_node_config other_cfg;
  caf::actor_system other_sys{other_cfg};
  auto received_any = std::make_shared<std::atomic<int>>(0);
  auto stranger = other_sys.spawn([received_any](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler(
      [received_any](caf::scheduled_actor*, caf::message_view&) -> caf::result<caf::message> {
        ++*received_any;
        return caf::message{};
      });
    return {[](int x) { return x; }};
  });
  auto port = other_sys.middleman().publish(stranger, 0, "127.0.0.1");
  ASSERT_TRUE(port);

  test::loopback_node_config agent_cfg;
  caf::actor_system agent_sys{agent_cfg};
  forwarder_options opts;
  opts.node = "agent-a";
  opts.control = "stranger";
  opts.backoff_min = 50ms;
  auto fwd = agent_sys.spawn(forwarder, opts, std::vector<mirror_entry>{},
                             middleman_connector("127.0.0.1", *port, 5s));
  std::this_thread::sleep_for(400ms); // several connect attempts
  EXPECT_EQ(received_any->load(), 0) << "no hello may reach an actor that is not a control node";
  caf::anon_send_exit(fwd, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(stranger, caf::exit_reason::user_shutdown);
}
