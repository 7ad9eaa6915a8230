// A stand-in control node for tests of the agent side: it answers the
// session handshake as a plaintext cluster's control node does (a key
// share, no certificate), records every hello, update and load report, counts messages
// whose MAC does not match the session key, keeps a copy of each (replica,
// rank)'s blocks as the updates describe them, and acknowledges updates
// unless told not to.
// Thread-safe, so tests with real actor systems can read it while it runs.
#pragma once

#include "actors/interfaces.hpp"

#include <caf/typed_event_based_actor.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace llmgw::test {

struct control_record {
  std::mutex mtx;
  std::vector<agent_hello> hellos;
  std::vector<replica_update> updates;
  std::vector<load_report> load_reports;
  /// Per (replica, rank): an update only ever speaks for its own replica.
  std::map<std::pair<std::string, std::uint32_t>, std::set<kv::block_ref>> replicas;
  bool ack = true; ///< answer every update with an ack
  std::size_t bad_macs = 0;
  std::map<std::uint64_t, std::string> keys; ///< session keys, by session

  std::size_t update_count() {
    std::lock_guard<std::mutex> g(mtx);
    return updates.size();
  }

  std::set<kv::block_ref> blocks_of(const std::string& replica, std::uint32_t rank = 0) {
    std::lock_guard<std::mutex> g(mtx);
    return replicas[{replica, rank}];
  }
};

/// A plaintext cluster's control node's side of the session handshake
/// (control-1, no certificate), for stand-in control nodes.
struct plaintext_handshake {
  struct pending {
    config::session_transcript transcript;
    std::optional<config::key_share> share;
  };
  std::map<std::uint64_t, pending> started;

  /// The answer to a hello.
  control_proof answer(const agent_hello& h) {
    auto share = config::key_share::make();
    auto& p = started[h.session];
    p.transcript = {h.node,      "control-1",    h.session,          h.nonce,
                    h.key_share, share->nonce(), share->public_key()};
    control_proof out{h.session, "control-1", share->nonce(), share->public_key(), {}, {}};
    p.share.emplace(std::move(*share));
    return out;
  }

  /// The session key once the agent's proof came ("" for an unknown session).
  std::string finish(const agent_proof& proof) {
    auto it = started.find(proof.session);
    if (it == started.end())
      return {};
    auto key =
      it->second.share->session_key(it->second.transcript.agent_share, it->second.transcript);
    started.erase(it);
    return key ? *key : std::string{};
  }
};

inline control_actor::behavior_type recording_control(control_actor::pointer self,
                                                      std::shared_ptr<control_record> rec) {
  auto fwd = std::make_shared<forwarder_actor>();
  auto handshake = std::make_shared<plaintext_handshake>();
  return {
    [self, rec, fwd, handshake](const agent_hello& h, const forwarder_actor& f) {
      {
        std::lock_guard<std::mutex> g(rec->mtx);
        rec->hellos.push_back(h);
      }
      *fwd = f;
      self->send(f, handshake->answer(h));
    },
    [rec, handshake](const agent_proof& proof) {
      auto key = handshake->finish(proof);
      std::lock_guard<std::mutex> g(rec->mtx);
      rec->keys[proof.session] = key;
    },
    [](timeout_atom, std::uint64_t) {},
    [self, rec, fwd](const replica_update& u) {
      bool ack;
      {
        std::lock_guard<std::mutex> g(rec->mtx);
        auto key = rec->keys.find(u.session);
        if (key == rec->keys.end() || !config::same_mac(u.mac, update_mac(key->second, u)))
          ++rec->bad_macs;
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
    [self, rec, fwd](const load_report& r) {
      bool ack;
      {
        std::lock_guard<std::mutex> g(rec->mtx);
        auto key = rec->keys.find(r.session);
        if (key == rec->keys.end() || !config::same_mac(r.mac, load_report_mac(key->second, r)))
          ++rec->bad_macs;
        rec->load_reports.push_back(r);
        ack = rec->ack;
      }
      if (ack && *fwd)
        self->send(*fwd, session_ack{r.session, r.seq});
    },
    [](const topology_reload&) {},
    [](metrics_atom) { return std::string{}; },
  };
}

} // namespace llmgw::test
