// A fixture for deterministic actor tests: CAF's test coordinator runs every
// message and timer on the test's thread, only when told (run, advance_time).
#pragma once

#include "actors/registration.hpp"
#include "messages/local_messages.hpp"
#include "tests/support/batches.hpp"
#include "tests/support/captures.hpp"

#include <boost/json.hpp>
#include <caf/all.hpp>
#include <gtest/gtest.h>

namespace llmgw::test {

struct deterministic_config : caf::actor_system_config {
  deterministic_config() {
    register_message_types(*this);
    set("scheduler.policy", caf::atom("testing"));
    set("logger.verbosity", caf::atom("quiet"));
  }
};

struct deterministic : ::testing::Test {
  deterministic_config cfg;
  caf::actor_system sys{cfg};
  caf::scheduler::test_coordinator& sched =
    dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  std::vector<caf::actor> to_stop;

  /// Remembers an actor to stop at the end of the test: the actor system's
  /// destructor waits for every actor, and here nothing runs them but us.
  template <class Handle>
  Handle stop_at_end(Handle h) {
    to_stop.push_back(caf::actor_cast<caf::actor>(h));
    return h;
  }

  void TearDown() override {
    for (auto& a : to_stop)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// Every batch of a capture, decoded.
  static std::vector<batch_ptr> capture(const std::string& name) {
    std::vector<batch_ptr> out;
    auto doc = read_json(capture_path(name));
    for (const auto& f : doc.at("frames").as_array()) {
      auto payload = from_hex(boost::json::value_to<std::string>(f.at("payload_hex")));
      out.push_back(std::make_shared<const wire::event_batch>(*wire::decode_batch(payload)));
    }
    return out;
  }
};

} // namespace llmgw::test
