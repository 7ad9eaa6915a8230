#include "actors/forwarder.hpp"

#include "base/log.hpp"

#include <caf/actor_cast.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <cstring>

namespace llmgw {

namespace {

using self_ptr = forwarder_actor::stateful_pointer<forwarder_state>;

/// A session id nobody can guess (a control node tells a forwarder its
/// session ended by naming it).
std::uint64_t new_session_id() {
  std::uint64_t id = 0;
  while (id == 0) {
    auto bytes = config::random_bytes(sizeof id);
    std::memcpy(&id, bytes.data(), sizeof id);
  }
  return id;
}

/// True if the message being handled comes from `self`'s own timers: its
/// handle crossed nodes (in every hello), so a peer can send it anything
/// its interface names.
bool from_itself(self_ptr self) {
  return self->current_sender().get() == self->ctrl();
}

/// True if it comes from an actor of this node (the connector).
bool from_this_node(self_ptr self) {
  const auto& sender = self->current_sender();
  return sender && sender->node() == self->node();
}

bool is_empty(const replica_update& u) {
  return !u.reset && u.added.empty() && u.removed.empty();
}

void send_update(self_ptr self, replica_update u) {
  auto& st = self->state;
  u.node = st.opts.node;
  u.session = st.window.session();
  u.seq = st.window.next();
  u.mac = update_mac(st.key, u);
  ++st.counts->updates_sent;
  self->send(st.control, std::move(u));
}

/// Sends the engines' loads if they changed since the last report of this
/// session, or the last is a heartbeat old.
void send_loads(self_ptr self) {
  auto& st = self->state;
  if (!st.opts.loads || !st.window.has_room())
    return;
  auto now = std::chrono::steady_clock::now();
  auto loads = st.opts.loads->fresh(now, st.opts.load_max_age);
  auto unchanged = [&] {
    if (!st.loads_sent || st.loads_sent->size() != loads.size())
      return false;
    for (std::size_t i = 0; i < loads.size(); ++i) {
      const auto& a = loads[i];
      const auto& b = (*st.loads_sent)[i];
      if (a.replica != b.replica || a.running != b.running || a.waiting != b.waiting
          || a.kv_usage_permille != b.kv_usage_permille)
        return false;
    }
    return true;
  };
  if (unchanged() && now - st.loads_sent_at < st.opts.load_heartbeat)
    return;
  if (loads.empty() && st.loads_sent && st.loads_sent->empty())
    return; // nothing to say, said already
  load_report r;
  r.node = st.opts.node;
  r.session = st.window.session();
  r.seq = st.window.next();
  r.loads = loads;
  r.mac = load_report_mac(st.key, r);
  st.loads_sent = std::move(loads);
  st.loads_sent_at = now;
  ++st.counts->load_reports_sent;
  self->send(st.control, std::move(r));
}

/// Whether `mirror` is still forwarded: a reply of one detached since
/// (its engine was removed or replaced) must not reach the control node.
bool attached(const forwarder_state& st, const mirror_actor& mirror) {
  return std::any_of(st.mirrors.begin(), st.mirrors.end(),
                     [&](const mirror_entry& m) { return m.mirror == mirror; });
}

/// Asks `m` for its full state and sends it in the current session (the
/// mirror tracks this forwarder's changes from then on).
void send_full_copy(self_ptr self, const mirror_entry& m) {
  auto session = self->state.window.session();
  self->request(m.mirror, caf::infinite, subscribe_atom::value, self->state.peer)
    .then(
      [self, session, mirror = m.mirror](replica_update& u) {
        if (self->state.control && self->state.window.session() == session
            && !self->state.key.empty() && attached(self->state, mirror))
          send_update(self, std::move(u));
      },
      [](const caf::error&) {}); // the mirror is gone (a reload removed it)
}

/// Stops forwarding `replica` (this node's reload removed or replaced its
/// engine): its mirror forgets this forwarder.
void detach(self_ptr self, const std::string& replica) {
  auto& mirrors = self->state.mirrors;
  for (auto it = mirrors.begin(); it != mirrors.end();) {
    if (it->replica != replica) {
      ++it;
      continue;
    }
    self->send(it->mirror, unsub_atom::value, self->state.peer);
    it = mirrors.erase(it);
  }
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

/// Leaves the current session (or attempt) and tries again after the
/// longest backoff.
void end_session(self_ptr self) {
  auto& st = self->state;
  if (st.control)
    self->demonitor(st.control.address());
  st.control = control_actor{};
  st.window.start(0);
  st.share.reset();
  st.key.clear();
  st.counts->connected = false;
  st.backoff = st.opts.backoff_max;
  if (!st.connect_scheduled) {
    st.connect_scheduled = true;
    self->delayed_send(self, st.opts.backoff_max, connect_atom::value);
  }
}

/// Connected: says hello with this session's key share; updates wait for
/// the control node's proof.
void start_session(self_ptr self, control_actor control) {
  auto& st = self->state;
  auto share = config::key_share::make();
  if (!share) {
    LLMGW_LOG(error, "forwarder " + st.opts.control, "cannot start a session: {}",
              share.err().message);
    schedule_connect(self);
    return;
  }
  st.control = std::move(control);
  st.backoff = std::chrono::milliseconds{0};
  self->monitor(st.control);
  auto session = new_session_id();
  st.window.start(session);
  st.key.clear();
  st.loads_sent.reset();
  st.counts->connected = false;
  ++st.counts->sessions;
  agent_hello hello{st.opts.node, session, {}, share->nonce(), share->public_key()};
  for (const auto& m : st.mirrors)
    hello.replicas.push_back(m.replica);
  st.transcript = {
    st.opts.node, st.opts.control, session, share->nonce(), share->public_key(), {}, {}};
  st.share.emplace(std::move(*share));
  self->send(st.control, std::move(hello), forwarder_actor{self});
  self->delayed_send(self, st.opts.handshake_timeout, timeout_atom::value, session);
}

/// The control node proved its name: the session key is known, the agent
/// proves its own name, and the full copies go out.
void on_proof(self_ptr self, const control_proof& proof) {
  auto& st = self->state;
  auto session = st.window.session();
  if (!st.control || !st.share || proof.session != session)
    return; // not for the session being set up
  auto current = self->current_sender();
  if (!current || current->get()->address() != st.control.address())
    return; // only the control node this session is with may answer
  st.transcript.control_nonce = proof.nonce;
  st.transcript.control_share = proof.key_share;
  auto refuse = [&](const std::string& why) {
    ++st.counts->proofs_refused;
    LLMGW_LOG(error, "forwarder " + st.opts.control,
              "the peer did not prove to be control node '{}' (it says '{}'): {}; trying again "
              "in {} ms",
              st.opts.control, log::printable(proof.node), why, st.opts.backoff_max.count());
    end_session(self);
  };
  if (proof.nonce.size() != 32)
    return refuse("its nonce has " + std::to_string(proof.nonce.size()) + " bytes, not 32");
  if (st.opts.identity) {
    auto check = st.opts.identity->check_peer(
      proof.certificate, st.opts.control, st.opts.control_fingerprints,
      config::proof_input(config::proof_role::control, st.transcript), proof.signature);
    if (!check)
      return refuse(check.reason + ": " + check.detail);
  }
  auto key = st.share->session_key(proof.key_share, st.transcript);
  if (!key)
    return refuse(key.err().message);
  st.key = std::move(*key);
  st.counts->connected = true;
  st.share.reset();
  agent_proof mine{session, {}, {}};
  if (st.opts.identity) {
    mine.certificate = st.opts.identity->certificate();
    mine.signature =
      st.opts.identity->sign(config::proof_input(config::proof_role::agent, st.transcript));
  }
  self->send(st.control, std::move(mine));
  LLMGW_LOG(info, "forwarder " + st.opts.control, "session {} started, sending {} replicas",
            session, st.mirrors.size());
  // The first update of every replica in a session is its full state.
  for (const auto& m : st.mirrors)
    send_full_copy(self, m);
}

} // namespace

std::uint64_t forwarder_peer(const std::string& control) {
  return std::hash<std::string>{}(control) | 1; // stable per control node
}

forwarder_actor::behavior_type forwarder(forwarder_actor::stateful_pointer<forwarder_state> self,
                                         forwarder_options opts, std::vector<mirror_entry> mirrors,
                                         connect_function connect) {
  auto& st = self->state;
  st.window = kv::session_window(opts.window);
  st.peer = forwarder_peer(opts.control);
  st.counts = opts.counters ? opts.counters : std::make_shared<forwarder_counters>();
  st.opts = std::move(opts);
  st.mirrors = std::move(mirrors);
  st.connect = std::move(connect);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    if (dm.source != st.control.address())
      return;
    LLMGW_LOG(warning, "forwarder " + st.opts.control, "control node went away ({}); reconnecting",
              self->system().render(dm.reason));
    ++st.counts->sessions_lost;
    st.control = control_actor{};
    st.window.start(0);
    st.share.reset();
    st.key.clear();
    st.counts->connected = false;
    schedule_connect(self);
  });
  self->delayed_send(self, st.opts.flush_interval, flush_atom::value);
  try_connect(self);
  return {
    [self](connected_atom, const caf::strong_actor_ptr& control) {
      if (!from_this_node(self))
        return;
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
      if (!from_itself(self))
        return;
      self->state.connect_scheduled = false;
      try_connect(self);
    },
    [self](flush_atom) {
      if (!from_itself(self))
        return; // a flush from elsewhere would start a second timer chain
      auto& st = self->state;
      self->delayed_send(self, st.opts.flush_interval, flush_atom::value);
      if (!st.control || st.key.empty())
        return; // no session, or its handshake is not done
      if (!st.window.has_room()) {
        ++st.counts->flushes_skipped; // the changes wait in the mirrors, bounded by their tables
        return;
      }
      send_loads(self);
      auto session = st.window.session();
      for (const auto& m : st.mirrors)
        self->request(m.mirror, caf::infinite, drain_atom::value, st.peer)
          .then(
            [self, session, mirror = m.mirror](replica_update& u) {
              if (!self->state.control || self->state.window.session() != session || is_empty(u)
                  || !attached(self->state, mirror))
                return;
              send_update(self, std::move(u));
            },
            [](const caf::error&) {}); // the mirror is gone (a reload removed it)
    },
    [self](const control_proof& proof) { on_proof(self, proof); },
    [self](timeout_atom, std::uint64_t session) {
      if (!from_itself(self))
        return;
      auto& st = self->state;
      if (!st.control || session != st.window.session() || !st.key.empty())
        return; // that session is over, or its handshake finished
      LLMGW_LOG(error, "forwarder " + st.opts.control,
                "the control node did not finish the handshake within {} ms; trying again",
                st.opts.handshake_timeout.count());
      end_session(self);
    },
    [self](const session_ack& ack) {
      auto& st = self->state;
      auto sender = self->current_sender();
      if (st.control && sender && sender->get()->address() == st.control.address())
        st.window.ack(ack.session, ack.seq); // only the control node frees its window
    },
    [self](refused_atom, std::uint64_t session, const std::string& why) {
      auto& st = self->state;
      if (!st.control || session != st.window.session())
        return;
      auto current = self->current_sender();
      if (!current || current->get()->address() != st.control.address())
        return; // only the control node this session is with can end it
      LLMGW_LOG(error, "forwarder " + st.opts.control,
                "the control node refused this node's session: {}; trying again in {} ms",
                log::printable(why, 400), st.opts.backoff_max.count());
      ++st.counts->sessions_refused;
      end_session(self);
    },
    [self](resync_atom, std::uint64_t session, const std::string& replica) {
      auto& st = self->state;
      if (!st.control || session != st.window.session() || st.key.empty())
        return;
      auto current = self->current_sender();
      if (!current || current->get()->address() != st.control.address())
        return; // only the control node this session is with may ask
      for (const auto& m : st.mirrors)
        if (m.replica == replica)
          send_full_copy(self, m);
    },
    [self](attach_atom, const std::string& replica, const caf::actor& mirror) {
      if (!from_this_node(self) || !mirror)
        return;
      auto& st = self->state;
      auto handle = caf::actor_cast<mirror_actor>(mirror);
      for (const auto& m : st.mirrors)
        if (m.mirror == handle)
          return; // attached already
      st.mirrors.push_back(mirror_entry{replica, handle});
      if (st.control && !st.key.empty())
        send_full_copy(self, st.mirrors.back());
    },
    [self](detach_atom, const std::string& replica) {
      if (from_this_node(self))
        detach(self, replica);
    },
  };
}

} // namespace llmgw
