#include "actors/control.hpp"

#include "wire/log.hpp"
#include "wire/metrics_text.hpp"
#include "wire/router_report.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

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
  ++st.refused[{node, reason}];
  if (st.logged.insert(node + "/" + reason + "/" + replica).second)
    LLMGW_LOG(warning, who(st), "refused update from node '{}' for replica '{}' ({}): {}", node,
              replica, reason, detail);
}

void drop_replicas_of(self_ptr self, const std::string& node, wire::drop_reason why) {
  const auto* n = self->state.opts.topo->find_node(node);
  if (!n)
    return;
  for (const auto& e : n->engines)
    self->send(self->state.router, drop_atom::value, e.replica, static_cast<std::uint8_t>(why));
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
  else {
    ++st.updates_passed;
    self->send(st.router, u);
  }
  self->send(s.forwarder, session_ack{u.session, u.seq});
}

void refuse_session(self_ptr self, const std::string& node, const std::string& reason,
                    std::uint64_t session, const forwarder_actor& fwd, const std::string& detail) {
  auto& st = self->state;
  ++st.sessions_refused[reason];
  LLMGW_LOG(error, who(st), "refused a session claiming node '{}' ({}): {}", node, reason, detail);
  self->send(fwd, refused_atom::value, session, detail);
}

void accept(self_ptr self, const std::string& node) {
  auto& st = self->state;
  auto& s = st.sessions[node];
  s.accepted = true;
  ++st.sessions_started;
  LLMGW_LOG(info, who(st), "session {} of agent node '{}' accepted", s.id, node);
  auto pending = std::move(s.pending);
  s.pending.clear();
  for (const auto& u : pending)
    handle_update(self, s, u);
}

} // namespace

control_actor::behavior_type control(control_actor::stateful_pointer<control_state> self,
                                     control_options opts, router_actor router) {
  self->state.opts = std::move(opts);
  self->state.router = std::move(router);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    for (auto it = st.sessions.begin(); it != st.sessions.end(); ++it) {
      if (it->second.forwarder.address() != dm.source)
        continue;
      LLMGW_LOG(warning, who(st),
                "agent node '{}' went away ({}): its replicas' KV state is "
                "dropped until it reconnects",
                it->first, self->system().render(dm.reason));
      if (it->second.accepted)
        drop_replicas_of(self, it->first, wire::drop_reason::node_down);
      st.sessions.erase(it);
      return;
    }
  });
  return {
    [self](const agent_hello& hello, const forwarder_actor& fwd) {
      auto& st = self->state;
      const auto* n = st.opts.topo->find_node(hello.node);
      if (!n || !n->roles.agent) {
        refuse_session(self, hello.node, "unknown_node", hello.session, fwd,
                       n ? "node '" + hello.node + "' does not have the agent role"
                         : "no node '" + hello.node + "' in the topology");
        return;
      }
      // The previous session of this node, if any, ends here.
      auto old = st.sessions.find(hello.node);
      if (old != st.sessions.end()) {
        if (old->second.forwarder != fwd)
          self->demonitor(old->second.forwarder.address());
        if (old->second.accepted)
          drop_replicas_of(self, hello.node, wire::drop_reason::session);
        st.sessions.erase(old);
      }
      std::set<std::string> claimed(hello.replicas.begin(), hello.replicas.end());
      for (const auto& e : n->engines)
        if (e.kv_events && !claimed.count(e.replica))
          LLMGW_LOG(info, who(st),
                    "agent node '{}' sends no KV state for replica '{}' (its "
                    "subscriber may have failed): routed by tier 1",
                    hello.node, e.replica);
      auto& s = st.sessions[hello.node];
      s.id = hello.session;
      s.forwarder = fwd;
      self->monitor(fwd);
      auto allowed = st.opts.agent_addresses.find(hello.node);
      if (allowed == st.opts.agent_addresses.end() || allowed->second.empty()) {
        accept(self, hello.node);
        return;
      }
      // Where does this connection come from? Ask the middleman, then decide.
      auto mm = self->system().middleman().actor_handle();
      auto node = hello.node;
      auto session = hello.session;
      self->request(mm, std::chrono::seconds(10), caf::get_atom::value, fwd.node())
        .then(
          [self, node, session, fwd](const caf::node_id&, const std::string& addr, std::uint16_t) {
            auto& st = self->state;
            auto it = st.sessions.find(node);
            if (it == st.sessions.end() || it->second.id != session)
              return; // replaced or gone meanwhile
            const auto& ok = st.opts.agent_addresses[node];
            if (!ok.count(addr)) {
              std::string hosts;
              for (const auto& a : ok)
                hosts += (hosts.empty() ? "" : ", ") + a;
              self->demonitor(fwd.address());
              st.sessions.erase(it);
              refuse_session(self, node, "address", session, fwd,
                             "the connection comes from '" + addr + "', not from node '" + node
                               + "''s host (" + hosts + ")");
              return;
            }
            accept(self, node);
          },
          [self, node, session, fwd](const caf::error& err) {
            auto& st = self->state;
            auto it = st.sessions.find(node);
            if (it == st.sessions.end() || it->second.id != session)
              return;
            self->demonitor(fwd.address());
            st.sessions.erase(it);
            refuse_session(self, node, "address", session, fwd,
                           "could not look up the connection's address: "
                             + self->system().render(err));
          });
    },
    [self](const replica_update& u) {
      auto& st = self->state;
      auto it = st.sessions.find(u.node);
      auto sender = self->current_sender();
      if (it == st.sessions.end()) {
        refuse(self, u.node, "no_session", u.replica, "the node has no session");
        return;
      }
      auto& s = it->second;
      if (!sender || sender->get()->address() != s.forwarder.address()) {
        // Someone else speaks for this node: do not ack on its behalf.
        refuse(self, u.node, "impostor", u.replica,
               "sent by an actor that is not the node's forwarder");
        return;
      }
      if (u.session != s.id) {
        refuse(self, u.node, "old_session", u.replica, "left over from an earlier session");
        return;
      }
      if (!s.accepted) {
        if (s.pending.size() >= st.opts.pending_limit) {
          refuse(self, u.node, "pending_full", u.replica,
                 "too many updates while the session is being checked");
          self->send(s.forwarder, session_ack{u.session, u.seq});
          return;
        }
        s.pending.push_back(u);
        return;
      }
      handle_update(self, s, u);
    },
    [self](metrics_atom) {
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
                  it != st.sessions.end() && it->second.accepted ? 1 : 0, {{"node", n.name}});
        }
      return m.str();
    },
  };
}

} // namespace llmgw
