#include "actors/forwarder.hpp"

#include "wire/log.hpp"

#include <caf/actor_cast.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <random>

namespace llmgw {

namespace {

using self_ptr = forwarder_actor::stateful_pointer<forwarder_state>;

std::uint64_t new_session_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uint64_t id = 0;
  while (id == 0)
    id = rng();
  return id;
}

bool is_empty(const replica_update& u) {
  return !u.reset && u.added.empty() && u.removed.empty();
}

void send_update(self_ptr self, replica_update u) {
  auto& st = self->state;
  u.node = st.opts.node;
  u.session = st.window.session();
  u.seq = st.window.next();
  ++st.updates_sent;
  self->send(st.control, std::move(u));
}

/// Schedules the next connection attempt, unless one is scheduled already:
/// one chain of attempts at a time.
void schedule_connect(self_ptr self) {
  auto& st = self->state;
  if (st.connect_scheduled)
    return;
  st.backoff =
    st.backoff.count() == 0 ? st.opts.backoff_min : std::min(st.backoff * 2, st.opts.backoff_max);
  st.connect_scheduled = true;
  self->delayed_send(self, st.backoff, connect_atom::value);
}

/// Starts a connection attempt unless connected or one is in flight: CAF
/// leaks the duplicate when two connections to one node race (seen under
/// ASan with slow TLS handshakes), so there is one attempt at a time and the
/// next is scheduled only when this one reports its outcome.
void try_connect(self_ptr self) {
  auto& st = self->state;
  if (st.control || st.connecting || !st.connect)
    return;
  st.connecting = true;
  st.connect(self);
}

void start_session(self_ptr self, control_actor control) {
  auto& st = self->state;
  st.control = std::move(control);
  st.backoff = std::chrono::milliseconds{0};
  self->monitor(st.control);
  auto session = new_session_id();
  st.window.start(session);
  ++st.sessions;
  agent_hello hello{st.opts.node, session, {}};
  for (const auto& m : st.mirrors)
    hello.replicas.push_back(m.replica);
  self->send(st.control, std::move(hello), forwarder_actor{self});
  LLMGW_LOG(info, "forwarder " + st.opts.control, "session {} started, sending {} replicas",
            session, st.mirrors.size());
  // The first update of every replica in a session is its full state.
  for (const auto& m : st.mirrors)
    self->request(m.mirror, caf::infinite, subscribe_atom::value, st.peer)
      .then([self, session](replica_update& u) {
        if (self->state.control && self->state.window.session() == session)
          send_update(self, std::move(u));
      });
}

} // namespace

forwarder_actor::behavior_type forwarder(forwarder_actor::stateful_pointer<forwarder_state> self,
                                         forwarder_options opts, std::vector<mirror_entry> mirrors,
                                         connect_function connect) {
  auto& st = self->state;
  st.window = wire::session_window(opts.window);
  st.peer = std::hash<std::string>{}(opts.control) | 1; // stable per control node
  st.opts = std::move(opts);
  st.mirrors = std::move(mirrors);
  st.connect = std::move(connect);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source != st.control.address())
      return;
    LLMGW_LOG(warning, "forwarder " + st.opts.control, "control node went away ({}); reconnecting",
              self->system().render(dm.reason));
    st.control = control_actor{};
    st.window.start(0);
    schedule_connect(self);
  });
  self->delayed_send(self, st.opts.flush_interval, flush_atom::value);
  try_connect(self);
  return {
    [self](connected_atom, const caf::strong_actor_ptr& control) {
      auto& st = self->state;
      st.connecting = false;
      if (st.control)
        return; // already in a session
      if (!control) {
        schedule_connect(self); // the attempt failed: the next one waits longer
        return;
      }
      start_session(self, caf::actor_cast<control_actor>(control));
    },
    [self](connect_atom) {
      self->state.connect_scheduled = false;
      try_connect(self);
    },
    [self](flush_atom) {
      auto& st = self->state;
      self->delayed_send(self, st.opts.flush_interval, flush_atom::value);
      if (!st.control)
        return;
      if (!st.window.has_room()) {
        ++st.flushes_skipped; // the changes wait in the mirrors, bounded by their tables
        return;
      }
      auto session = st.window.session();
      for (const auto& m : st.mirrors)
        self->request(m.mirror, caf::infinite, drain_atom::value, st.peer)
          .then([self, session](replica_update& u) {
            if (!self->state.control || self->state.window.session() != session || is_empty(u))
              return;
            send_update(self, std::move(u));
          });
    },
    [self](const session_ack& ack) { self->state.window.ack(ack.session, ack.seq); },
    [self](refused_atom, std::uint64_t session, const std::string& why) {
      auto& st = self->state;
      if (!st.control || session != st.window.session())
        return;
      LLMGW_LOG(error, "forwarder " + st.opts.control,
                "the control node refused this node's session: {}; trying again in {} ms", why,
                st.opts.backoff_max.count());
      ++st.sessions_refused;
      self->demonitor(st.control.address());
      st.control = control_actor{};
      st.window.start(0);
      st.backoff = st.opts.backoff_max;
      if (!st.connect_scheduled) {
        st.connect_scheduled = true;
        self->delayed_send(self, st.opts.backoff_max, connect_atom::value);
      }
    },
  };
}

} // namespace llmgw
