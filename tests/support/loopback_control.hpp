// A control node on loopback for tests: an actor system of its own with
// CAF's network layer, running the recording fake control node
// (fake_control.hpp) published on 127.0.0.1 at a port the kernel picks.
// Agents in another actor system reach it as they would a real one.
#pragma once

#include "actors/registration.hpp"
#include "tests/support/fake_control.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/send.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace llmgw::test {

/// The configuration of one node's actor system in a loopback test.
struct loopback_node_config : caf::actor_system_config {
  loopback_node_config() {
    load<caf::io::middleman>();
    register_message_types(*this);
    set("scheduler.max-threads", 2);
  }
};

struct loopback_control {
  loopback_node_config cfg;
  caf::actor_system sys{cfg};
  std::shared_ptr<control_record> record = std::make_shared<control_record>();
  control_actor actor;
  std::uint16_t port = 0; ///< 0 if it could not be published (see error)
  std::string error;

  loopback_control() {
    actor = sys.spawn(recording_control, record);
    auto published = sys.middleman().publish(actor, 0, "127.0.0.1");
    if (published)
      port = *published;
    else
      error = sys.render(published.error());
  }

  ~loopback_control() { caf::anon_send_exit(actor, caf::exit_reason::user_shutdown); }
};

} // namespace llmgw::test
