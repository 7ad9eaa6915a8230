#include "actors/control_connector.hpp"

#include "base/log.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/node_id.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/send.hpp>

#include <algorithm>
#include <set>

namespace llmgw {

connect_function middleman_connector(const std::string& host, std::uint16_t port,
                                     std::chrono::milliseconds timeout) {
  return [host, port, timeout](const forwarder_actor& fwd) {
    auto& sys = caf::actor_cast<caf::abstract_actor*>(fwd)->home_system();
    auto where = host + ":" + std::to_string(port);
    auto expected_ifs = sys.message_types<control_actor>();
    // A one-shot actor asks the middleman, so the forwarder never waits; it
    // answers as itself (the forwarder takes the outcome only from an actor
    // of its own node).
    sys.spawn([fwd, host, port, timeout, where, expected_ifs](caf::event_based_actor* self) {
      // With the OpenSSL module loaded, connections go through its middleman
      // (mutual TLS); otherwise through the plain one.
      auto& s = self->system();
      auto mm =
        s.has_openssl_manager() ? s.openssl_manager().actor_handle() : s.middleman().actor_handle();
      self->request(mm, timeout, caf::connect_atom::value, host, port)
        .then(
          [self, fwd, where, expected_ifs](const caf::node_id&, caf::strong_actor_ptr& control,
                                           const std::set<std::string>& ifs) {
            if (!control) {
              LLMGW_LOG(warning, "connector " + where, "nothing is published there");
              self->send(fwd, connected_atom::value, caf::strong_actor_ptr{});
              return;
            }
            if (!std::includes(ifs.begin(), ifs.end(), expected_ifs.begin(), expected_ifs.end())) {
              LLMGW_LOG(error, "connector " + where,
                        "the actor there is not an llmgw control node (different interface)");
              self->send(fwd, connected_atom::value, caf::strong_actor_ptr{});
              return;
            }
            self->send(fwd, connected_atom::value, std::move(control));
          },
          [self, fwd, where](const caf::error& err) {
            LLMGW_LOG(warning, "connector " + where, "connect failed: {}", caf::to_string(err));
            self->send(fwd, connected_atom::value, caf::strong_actor_ptr{});
          });
    });
  };
}

} // namespace llmgw
