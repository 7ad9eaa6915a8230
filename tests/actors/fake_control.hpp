// A stand-in control node for tests of the agent side: it records every
// hello and update, keeps a copy of each (replica, rank)'s blocks as the
// updates describe them, and acknowledges updates unless told not to.
// Thread-safe, so tests with real actor systems can read it while it runs.
#pragma once

#include "actors/interfaces.hpp"

#include <caf/typed_event_based_actor.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace llmgw::test {

struct control_record {
  std::mutex mtx;
  std::vector<agent_hello> hellos;
  std::vector<replica_update> updates;
  /// Per (replica, rank): an update only ever speaks for its own replica.
  std::map<std::pair<std::string, std::uint32_t>, std::set<wire::block_ref>> replicas;
  bool ack = true; ///< answer every update with an ack

  std::size_t update_count() {
    std::lock_guard<std::mutex> g(mtx);
    return updates.size();
  }

  std::set<wire::block_ref> blocks_of(const std::string& replica, std::uint32_t rank = 0) {
    std::lock_guard<std::mutex> g(mtx);
    return replicas[{replica, rank}];
  }
};

inline control_actor::behavior_type recording_control(control_actor::pointer self,
                                                      std::shared_ptr<control_record> rec) {
  auto fwd = std::make_shared<forwarder_actor>();
  return {
    [rec, fwd](const agent_hello& h, const forwarder_actor& f) {
      std::lock_guard<std::mutex> g(rec->mtx);
      rec->hellos.push_back(h);
      *fwd = f;
    },
    [self, rec, fwd](const replica_update& u) {
      bool ack;
      {
        std::lock_guard<std::mutex> g(rec->mtx);
        rec->updates.push_back(u);
        auto& blocks = rec->replicas[{u.replica, u.dp_rank}];
        if (u.reset)
          blocks.clear();
        for (const auto& r : u.removed)
          blocks.erase(r);
        for (const auto& r : u.added)
          blocks.insert(r);
        ack = rec->ack;
      }
      if (ack && *fwd)
        self->send(*fwd, session_ack{u.session, u.seq});
    },
    [](metrics_atom) { return std::string{}; },
  };
}

} // namespace llmgw::test
