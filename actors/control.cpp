#include "actors/control.hpp"

#include "base/burst_log.hpp"
#include "base/log.hpp"
#include "config/topology_change.hpp"
#include "routing/router_report.hpp"
#include "wire/metrics_text.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/result.hpp>
#include <caf/sec.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>

namespace llmgw {

namespace {

using self_ptr = control_actor::stateful_pointer<control_state>;

std::string who(const control_state& st) {
  return "control " + st.opts.node;
}

/// Counts a refused update and logs it the first time per (node, reason,
/// replica).
void refuse(self_ptr self, const std::string& node, const std::string& reason,
            const std::string& replica, const std::string& detail) {
  auto& st = self->state;
  // Anyone can write a node name into a message: only the topology's become
  // metric labels and log keys.
  auto label = st.opts.topo->find_node(node) ? node : std::string("unknown");
  ++st.refused[{label, reason}];
  if (auto n = st.refusal_log.admit("update/" + label + "/" + reason))
    LLMGW_LOG(warning, who(st), "refused update from node '{}' for replica '{}' ({}): {}{}",
              log::printable(node), log::printable(replica), reason, detail, burst_note(n));
}

void drop_replicas_of(self_ptr self, const std::string& node, routing::drop_reason why) {
  const auto* n = self->state.opts.topo->find_node(node);
  if (!n)
    return;
  for (const auto& e : n->engines)
    self->send(self->state.router, drop_atom::value, e.replica, why);
}

/// Checks one update of an accepted session and passes it on.
void handle_update(self_ptr self, const control_state::session& s, const replica_update& u) {
  auto& st = self->state;
  const auto* owner = st.opts.topo->owner_of(u.replica);
  const auto* engine = st.opts.topo->find_engine(u.replica);
  if (!owner || owner->name != u.node)
    refuse(self, u.node, "not_owner", u.replica,
           owner ? "the topology gives it to node '" + owner->name + "'"
                 : "no such replica in the topology");
  else if (!engine->kv_events)
    refuse(self, u.node, "no_kv_events", u.replica, "the topology has kv_events = false for it");
  else if (u.dp_rank >= engine->dp_size)
    refuse(self, u.node, "bad_rank", u.replica,
           "data-parallel rank " + std::to_string(u.dp_rank) + " but dp_size is "
             + std::to_string(engine->dp_size));
  else if (auto bad = out_of_range_fields(u); !bad.empty())
    refuse(self, u.node, "malformed", u.replica, bad);
  else {
    ++st.updates_passed;
    self->send(st.router, u);
  }
  self->send(s.forwarder, session_ack{u.session, u.seq});
}

/// Where a message of an agent session belongs, once its sender, MAC and
/// seq checked out: the node's accepted session, or the attempt being
/// checked; neither when it was refused (counted, logged, and the sender
/// told when it names a session this node does not know).
struct origin {
  control_state::session* s = nullptr;
  control_state::attempt* a = nullptr;
};

template <class Message, class MacFunction>
origin check_origin(self_ptr self, const Message& m, const std::string& what, MacFunction mac) {
  auto& st = self->state;
  auto sender = self->current_sender();
  auto from = [&](const forwarder_actor& f) {
    return sender && sender->get()->address() == f.address();
  };
  auto tell = [&](const std::string& why) {
    // Whoever sent it must start a new session to be heard again.
    if (sender)
      self->send(caf::actor_cast<forwarder_actor>(sender), refused_atom::value, m.session, why);
  };
  auto it = st.sessions.find(m.node);
  if (it != st.sessions.end() && it->second.id == m.session) {
    auto& s = it->second;
    if (!from(s.forwarder)) { // someone else speaks for this node: no ack on its behalf
      refuse(self, m.node, "impostor", what, "sent by an actor that is not the node's forwarder");
      return {};
    }
    if (!config::same_mac(m.mac, mac(s.key, m))) {
      refuse(self, m.node, "mac", what, "the MAC does not match the session key");
      return {};
    }
    if (m.seq <= s.last_seq) { // a relay passing a genuine message on twice
      refuse(self, m.node, "replay", what, "seq " + std::to_string(m.seq) + " came before");
      return {};
    }
    s.last_seq = m.seq;
    return {&s, nullptr};
  }
  auto at = st.attempts.find(m.session);
  if (at != st.attempts.end() && at->second.node == m.node && from(at->second.forwarder)) {
    auto& a = at->second;
    if (a.key.empty()) {
      refuse(self, m.node, "not_proven", what, "sent before the session's handshake finished");
      return {};
    }
    if (!config::same_mac(m.mac, mac(a.key, m))) {
      refuse(self, m.node, "mac", what, "the MAC does not match the session key");
      return {};
    }
    if (m.seq <= a.last_seq) {
      refuse(self, m.node, "replay", what, "seq " + std::to_string(m.seq) + " came before");
      return {};
    }
    a.last_seq = m.seq;
    return {nullptr, &a};
  }
  if (it == st.sessions.end()) {
    refuse(self, m.node, "no_session", what, "the node has no session");
    tell("this control node knows no session of node '" + log::printable(m.node) + "'");
  } else {
    refuse(self, m.node, "old_session", what, "not the node's current session");
    tell("session " + std::to_string(m.session) + " is not node '" + log::printable(m.node)
         + "''s current session");
  }
  return {};
}

/// Checks the loads of an accepted session and passes them on: all or
/// nothing, so a node naming a replica it does not own gets none through.
void handle_loads(self_ptr self, const control_state::session& s, const load_report& r) {
  auto& st = self->state;
  const auto* n = st.opts.topo->find_node(r.node);
  std::string replica = "(engine loads)";
  auto not_owned = std::find_if(r.loads.begin(), r.loads.end(), [&](const engine_load& l) {
    const auto* owner = st.opts.topo->owner_of(l.replica);
    return !owner || owner->name != r.node;
  });
  if (n && r.loads.size() > n->engines.size()) // checked first: it bounds the rest
    refuse(self, r.node, "malformed", replica,
           std::to_string(r.loads.size()) + " loads for " + std::to_string(n->engines.size())
             + " engines");
  else if (not_owned != r.loads.end())
    refuse(self, r.node, "not_owner", not_owned->replica,
           "a load report names it, and it is not the node's: nothing of the report is used");
  else if (auto why = out_of_range_fields(r); !why.empty())
    refuse(self, r.node, "malformed", replica, why);
  else {
    ++st.load_reports_passed;
    self->send(st.router, r);
  }
  self->send(s.forwarder, session_ack{r.session, r.seq});
}

void refuse_session(self_ptr self, const std::string& node, const std::string& reason,
                    std::uint64_t session, const forwarder_actor& fwd, const std::string& detail) {
  auto& st = self->state;
  ++st.sessions_refused[reason];
  auto label = st.opts.topo->find_node(node) ? node : std::string("unknown");
  if (auto n = st.refusal_log.admit("session/" + label + "/" + reason))
    LLMGW_LOG(error, who(st), "refused a session claiming node '{}' ({}): {}{}",
              log::printable(node), reason, detail, burst_note(n));
  if (fwd)
    self->send(fwd, refused_atom::value, session, detail);
}

/// Takes attempt `session` out of the table, if it is still there.
std::optional<control_state::attempt> take_attempt(control_state& st, std::uint64_t session) {
  auto it = st.attempts.find(session);
  if (it == st.attempts.end())
    return std::nullopt;
  auto a = std::move(it->second);
  st.attempts.erase(it);
  return a;
}

/// Ends a session attempt as refused; the node's current session stays.
void refuse_attempt(self_ptr self, std::uint64_t session, const std::string& reason,
                    const std::string& detail) {
  auto& st = self->state;
  auto taken = take_attempt(st, session);
  if (!taken)
    return;
  auto& a = *taken;
  if (!st.watched(a.forwarder))
    self->demonitor(a.forwarder.address());
  refuse_session(self, a.node, reason, session, a.forwarder, detail);
}

/// The attempt proved itself (and came from the node's host): it becomes
/// the node's session, replacing any earlier one.
void accept(self_ptr self, std::uint64_t session) {
  auto& st = self->state;
  auto taken = take_attempt(st, session);
  if (!taken)
    return;
  auto& a = *taken;
  auto old = st.sessions.find(a.node);
  if (old != st.sessions.end()) {
    auto previous = old->second;
    st.sessions.erase(old);
    if (previous.forwarder != a.forwarder) {
      if (!st.watched(previous.forwarder))
        self->demonitor(previous.forwarder.address());
      // A forwarder that is still alive must learn it is no longer heard.
      self->send(previous.forwarder, refused_atom::value, previous.id,
                 std::string("replaced by a newer session of this node"));
    }
    drop_replicas_of(self, a.node, routing::drop_reason::session);
  }
  auto& s = st.sessions[a.node];
  s.id = session;
  s.forwarder = a.forwarder;
  s.key = std::move(a.key);
  s.last_seq = a.last_seq;
  ++st.sessions_started;
  LLMGW_LOG(info, who(st), "session {} of agent node '{}' accepted", session, a.node);
  for (const auto& u : a.pending)
    handle_update(self, s, u);
  if (s.last_seq > 0) // covers load reports dropped while the session was checked
    self->send(s.forwarder, session_ack{session, s.last_seq});
}

/// The address check, once the agent proved its name.
void check_address(self_ptr self, std::uint64_t session) {
  auto& st = self->state;
  auto& a = st.attempts.at(session);
  auto allowed = st.opts.agent_addresses.find(a.node);
  if (allowed == st.opts.agent_addresses.end() || allowed->second.empty())
    return accept(self, session);
  if (a.forwarder.node() == self->node()) {
    // A forwarder of this very process (a node with both roles): there is no
    // connection to look up. A peer cannot pose as one: CAF's handshake
    // closes connections that claim this node's id, and tls_hooks refuses
    // routed messages (whose source node CAF would believe). The name was
    // proven too; in a plaintext cluster, on loopback only, nobody proves
    // one and any local process can claim any node anyway.
    if (a.node == st.opts.node)
      return accept(self, session);
    return refuse_attempt(self, session, "address",
                          "a forwarder of this process speaks for node '" + a.node
                            + "', but this process is node '" + st.opts.node + "'");
  }
  // Where does this connection come from? Ask the middleman, then decide.
  auto mm = self->system().middleman().actor_handle();
  self->request(mm, std::chrono::seconds(10), caf::get_atom::value, a.forwarder.node())
    .then(
      [self, session](const caf::node_id&, const std::string& addr, std::uint16_t) {
        auto& st = self->state;
        auto it = st.attempts.find(session);
        if (it == st.attempts.end())
          return; // timed out or gone meanwhile
        const auto& ok = st.opts.agent_addresses[it->second.node];
        if (ok.count(addr))
          return accept(self, session);
        std::string hosts;
        for (const auto& h : ok)
          hosts += (hosts.empty() ? "" : ", ") + h;
        refuse_attempt(self, session, "address",
                       "the connection comes from '" + addr + "', not from node '" + it->second.node
                         + "''s host (" + hosts + ")");
      },
      [self, session](const caf::error& err) {
        refuse_attempt(self, session, "address",
                       "could not look up the connection's address: " + self->system().render(err));
      });
}

/// Puts a reloaded topology in force. A node that is no longer an agent of
/// it loses its session (the router retired its replicas already); a
/// replica new to it, or changed, is asked again of its node's session, whose
/// earlier updates for it were refused or belong to its old entry.
void reload(self_ptr self, const topology_reload& r) {
  auto& st = self->state;
  // The router follows after the updates this actor passed on until now.
  self->send(st.router, r);
  auto old = st.opts.topo;
  st.opts.topo = r.topo;
  st.opts.agent_addresses = r.agent_addresses;
  auto agent_now = [&](const std::string& node) {
    const auto* n = st.opts.topo->find_node(node);
    return n && n->roles.agent;
  };
  for (auto it = st.attempts.begin(); it != st.attempts.end();) {
    if (agent_now(it->second.node)) {
      ++it;
      continue;
    }
    auto id = (it++)->first;
    refuse_attempt(self, id, "unknown_node", "the node was removed from the topology");
  }
  for (auto it = st.sessions.begin(); it != st.sessions.end();) {
    if (agent_now(it->first)) {
      ++it;
      continue;
    }
    auto s = it->second;
    LLMGW_LOG(warning, who(st), "agent node '{}' is no longer in the topology: its session ends",
              it->first);
    it = st.sessions.erase(it);
    if (!st.watched(s.forwarder))
      self->demonitor(s.forwarder.address());
    self->send(s.forwarder, refused_atom::value, s.id,
               std::string("the node was removed from the control node's topology"));
  }
  auto changes = config::compare_engines(*old, *st.opts.topo);
  auto ask = changes.added;
  ask.insert(ask.end(), changes.changed.begin(), changes.changed.end());
  for (const auto& replica : ask) {
    const auto* owner = st.opts.topo->owner_of(replica);
    const auto* engine = st.opts.topo->find_engine(replica);
    if (!owner || !engine->kv_events)
      continue;
    auto s = st.sessions.find(owner->name);
    if (s != st.sessions.end())
      self->send(s->second.forwarder, resync_atom::value, s->second.id, replica);
  }
  LLMGW_LOG(info, who(st), "topology reloaded: {}", changes.summary());
}

} // namespace

bool control_state::watched(const forwarder_actor& f) const {
  for (const auto& [node, s] : sessions)
    if (s.forwarder == f)
      return true;
  for (const auto& [id, a] : attempts)
    if (a.forwarder == f)
      return true;
  return false;
}

control_actor::behavior_type control(control_actor::stateful_pointer<control_state> self,
                                     control_options opts, router_actor router) {
  self->state.opts = std::move(opts);
  self->state.router = std::move(router);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    for (auto it = st.attempts.begin(); it != st.attempts.end();)
      it = it->second.forwarder.address() == dm.source ? st.attempts.erase(it) : std::next(it);
    for (auto it = st.sessions.begin(); it != st.sessions.end(); ++it) {
      if (it->second.forwarder.address() != dm.source)
        continue;
      LLMGW_LOG(warning, who(st),
                "agent node '{}' went away ({}): its replicas' KV state is "
                "dropped until it reconnects",
                it->first, self->system().render(dm.reason));
      drop_replicas_of(self, it->first, routing::drop_reason::node_down);
      st.sessions.erase(it);
      return;
    }
  });
  return {
    [self](const agent_hello& hello, const forwarder_actor& fwd) {
      auto& st = self->state;
      auto sender = self->current_sender();
      if (!sender || !fwd || sender->get()->address() != fwd.address()) {
        // A hello that names another actor than its sender would have that
        // actor told of refusals it never caused: the answer goes to the
        // sender, and nothing to the actor named.
        return refuse_session(self, hello.node, "malformed", hello.session,
                              caf::actor_cast<forwarder_actor>(sender),
                              "the hello names another forwarder than its sender");
      }
      const auto* n = st.opts.topo->find_node(hello.node);
      if (!n || !n->roles.agent)
        return refuse_session(self, hello.node, "unknown_node", hello.session, fwd,
                              n ? "node '" + hello.node + "' does not have the agent role"
                                : "no node '" + log::printable(hello.node) + "' in the topology");
      if (hello.nonce.size() != 32 || hello.key_share.size() != 32)
        return refuse_session(self, hello.node, "malformed", hello.session, fwd,
                              "the hello's nonce and key share must have 32 bytes each");
      if (st.attempts.count(hello.session) || hello.session == 0)
        return refuse_session(self, hello.node, "malformed", hello.session, fwd,
                              "session id " + std::to_string(hello.session) + " is in use");
      if (st.attempts.size() >= st.opts.max_attempts)
        return refuse_session(self, hello.node, "busy", hello.session, fwd,
                              std::to_string(st.attempts.size())
                                + " session attempts are in progress");
      // One peer node (one connection) holds a few attempts at most: it
      // cannot fill the table and keep other agents from starting theirs.
      auto from_peer = std::count_if(st.attempts.begin(), st.attempts.end(), [&](const auto& a) {
        return a.second.forwarder.node() == fwd.node();
      });
      if (static_cast<std::size_t>(from_peer) >= st.opts.max_attempts_per_peer)
        return refuse_session(self, hello.node, "busy", hello.session, fwd,
                              std::to_string(from_peer)
                                + " session attempts of this peer are in progress");
      auto share = config::key_share::make();
      if (!share)
        return refuse_session(self, hello.node, "internal", hello.session, fwd,
                              share.err().message);
      std::set<std::string> claimed(hello.replicas.begin(), hello.replicas.end());
      for (const auto& e : n->engines)
        if (e.kv_events && !claimed.count(e.replica))
          LLMGW_LOG(info, who(st),
                    "agent node '{}' sends no KV state for replica '{}' (its "
                    "subscriber may have failed): routed by tier 1",
                    hello.node, e.replica);
      control_state::attempt a;
      a.node = hello.node;
      a.forwarder = fwd;
      a.transcript = {hello.node,      st.opts.node,   hello.session,      hello.nonce,
                      hello.key_share, share->nonce(), share->public_key()};
      control_proof proof{hello.session, st.opts.node, share->nonce(), share->public_key(), {}, {}};
      if (st.opts.identity) {
        proof.certificate = st.opts.identity->certificate();
        proof.signature =
          st.opts.identity->sign(config::proof_input(config::proof_role::control, a.transcript));
      }
      a.share.emplace(std::move(*share));
      if (!st.watched(fwd))
        self->monitor(fwd);
      st.attempts.emplace(hello.session, std::move(a));
      self->send(fwd, std::move(proof));
      self->delayed_send(self, st.opts.handshake_timeout, timeout_atom::value, hello.session);
    },
    [self](const agent_proof& proof) {
      auto& st = self->state;
      auto it = st.attempts.find(proof.session);
      auto sender = self->current_sender();
      if (it == st.attempts.end() || !sender
          || sender->get()->address() != it->second.forwarder.address()) {
        ++st.sessions_refused["unknown_attempt"];
        return; // not an attempt of this sender's: nothing to answer
      }
      auto& a = it->second;
      if (!a.key.empty())
        return; // proven already: the address check is under way
      if (st.opts.identity) {
        const auto* n = st.opts.topo->find_node(a.node);
        auto check = st.opts.identity->check_peer(
          proof.certificate, a.node, n->fingerprints,
          config::proof_input(config::proof_role::agent, a.transcript), proof.signature);
        if (!check)
          return refuse_attempt(self, proof.session, check.reason,
                                "it did not prove to be node '" + a.node + "': " + check.detail);
      }
      auto key = a.share->session_key(a.transcript.agent_share, a.transcript);
      if (!key)
        return refuse_attempt(self, proof.session, "malformed", key.err().message);
      a.key = std::move(*key);
      a.share.reset();
      check_address(self, proof.session);
    },
    [self](timeout_atom, std::uint64_t session) {
      if (self->current_sender().get() != self->ctrl())
        return; // its own timer only
      refuse_attempt(self, session, "timeout",
                     "the handshake did not finish within "
                       + std::to_string(self->state.opts.handshake_timeout.count()) + " ms");
    },
    [self](const replica_update& u) {
      auto& st = self->state;
      auto from = check_origin(self, u, u.replica, update_mac);
      if (from.s)
        return handle_update(self, *from.s, u);
      if (!from.a)
        return;
      auto& a = *from.a;
      if (a.pending.size() >= st.opts.pending_limit) {
        // Not acked: an ack says the update was applied, and the agent would
        // never send it again. The attempt ends; a new session sends full
        // copies, so nothing is lost.
        refuse(self, u.node, "pending_full", u.replica,
               "too many updates while the session is being checked");
        return refuse_attempt(self, u.session, "pending_full",
                              std::to_string(a.pending.size())
                                + " updates arrived while the session was being checked");
      }
      a.pending.push_back(u);
    },
    [self](const load_report& r) {
      // While the session is being checked a report is dropped, and not
      // acked: an ack covers every seq up to it, and updates before it may
      // still wait in the attempt. The next report comes within a second.
      auto from = check_origin(self, r, "(engine loads)", load_report_mac);
      if (from.s)
        handle_loads(self, *from.s, r);
    },
    [self](const topology_reload& r) {
      auto sender = self->current_sender();
      if (!sender || sender->node() != self->node() || !r.topo)
        return; // only this node's reload (the actor is published)
      reload(self, r);
    },
    [self](metrics_atom) -> caf::result<std::string> {
      auto sender = self->current_sender();
      if (!sender || sender->node() != self->node())
        return caf::sec::unexpected_message; // this node's own gateway asks, nobody else
      auto& st = self->state;
      wire::metrics_text m;
      for (const auto& [key, count] : st.refused)
        m.counter("llmgw_kv_updates_refused_total",
                  "Agent updates the control node refused, by sending node and reason.",
                  static_cast<double>(count), {{"node", key.first}, {"reason", key.second}});
      if (st.refused.empty())
        m.counter("llmgw_kv_updates_refused_total",
                  "Agent updates the control node refused, by sending node and reason.", 0);
      for (const auto& [reason, count] : st.sessions_refused)
        m.counter("llmgw_agent_sessions_refused_total", "Agent sessions refused, by reason.",
                  static_cast<double>(count), {{"reason", reason}});
      m.counter("llmgw_agent_sessions_total", "Agent sessions accepted.",
                static_cast<double>(st.sessions_started));
      m.counter("llmgw_kv_updates_received_total",
                "Agent updates passed to the router (after the ownership check).",
                static_cast<double>(st.updates_passed));
      for (const auto& n : st.opts.topo->nodes)
        if (n.roles.agent) {
          auto it = st.sessions.find(n.name);
          m.gauge("llmgw_agent_connected", "1 while the agent node has an accepted session.",
                  it != st.sessions.end() ? 1 : 0, {{"node", n.name}});
        }
      return m.str();
    },
  };
}

} // namespace llmgw
