#include "actors/agent.hpp"

#include "actors/control_connector.hpp"
#include "actors/engine_supervisor.hpp"
#include "actors/load_scraper.hpp"
#include "actors/mirror.hpp"
#include "actors/subscriber.hpp"
#include "base/log.hpp"
#include "config/topology_change.hpp"
#include "wire/address.hpp"

#include <boost/json.hpp>
#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/blocking_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace llmgw {

namespace {

/// How long a retired supervisor may take, after its deadline, to stop its
/// engine (SIGTERM, then SIGKILL after the grace period) and end.
const auto engine_stop_allowance = engine_supervisor_options{}.stop_grace + std::chrono::seconds(1);

/// Binds every rank's subscriber on consecutive ports (vLLM adds the rank to
/// the port). With base 0, tries a few kernel-chosen bases.
std::vector<opened_subscriber> bind_ranks(const agent_engine_config& e, std::string& error) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    std::vector<opened_subscriber> ranks;
    std::uint16_t base = e.events_port;
    for (std::uint32_t r = 0; r < e.dp_size; ++r) {
      subscriber_options opts;
      opts.replica = e.replica;
      opts.topic = e.topic;
      auto port = base == 0 && r == 0 ? 0 : base + r;
      opts.endpoint = "tcp://127.0.0.1:" + std::to_string(port);
      auto bound = open_subscriber(opts);
      if (!bound.socket) {
        error = bound.error;
        break;
      }
      if (r == 0 && base == 0)
        base = static_cast<std::uint16_t>(
          std::stoi(bound.endpoint.substr(bound.endpoint.rfind(':') + 1)));
      ranks.push_back(std::move(bound));
    }
    if (ranks.size() == e.dp_size)
      return ranks;
    if (e.events_port != 0)
      break; // a fixed port that does not bind will not bind on retry
  }
  return {};
}

/// Connects every rank's subscriber to an engine that binds its publisher:
/// rank r at the port + r, as vLLM offsets it.
std::vector<opened_subscriber> connect_ranks(const agent_engine_config& e, std::string& error) {
  std::vector<opened_subscriber> ranks;
  auto at = wire::parse_tcp_endpoint(e.events); // checked by the topology
  if (!at) {
    error = "events '" + e.events + "' is no tcp://HOST:PORT";
    return ranks;
  }
  for (std::uint32_t r = 0; r < e.dp_size; ++r) {
    subscriber_options opts;
    opts.replica = e.replica;
    opts.topic = e.topic;
    opts.endpoint = wire::tcp_endpoint(*at, r);
    opts.engine_binds = true;
    auto opened = open_subscriber(opts);
    if (!opened.socket) {
      error = opened.error;
      return {};
    }
    ranks.push_back(std::move(opened));
  }
  return ranks;
}

/// A base port with `count` consecutive free ports on loopback, for the
/// engine's replay ROUTER (which the engine binds itself); 0 if none found.
std::uint16_t free_port_run(std::uint32_t count) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::vector<int> fds;
    std::uint16_t base = 0;
    bool ok = true;
    for (std::uint32_t r = 0; r < count && ok; ++r) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<std::uint16_t>(r == 0 ? 0 : base + r));
      ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
      if (ok && r == 0) {
        socklen_t len = sizeof addr;
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
        base = ntohs(addr.sin_port);
      }
      if (fd >= 0)
        fds.push_back(fd);
    }
    for (int fd : fds)
      close(fd);
    if (ok)
      return base;
  }
  return 0;
}

/// Whether ports `base` to `base + count - 1` on loopback can be bound now.
bool port_run_free(std::uint16_t base, std::uint32_t count) {
  for (std::uint32_t r = 0; r < count; ++r) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    // As libzmq binds: a connection of the last engine's in TIME_WAIT does
    // not keep the port from it, only a socket bound there does.
    int on = 1;
    if (fd >= 0)
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(base + r));
    bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (fd >= 0)
      close(fd);
    if (!ok)
      return false;
  }
  return true;
}

/// A new folder only this user can enter (mode 0700), for launched engines'
/// ipc sockets; "" and `error` set if none can be made.
std::string private_folder(const std::string& node, std::string& error) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/llmgw-" + node + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) {
    error =
      "cannot make a private folder for KV event sockets (" + tmpl + "): " + std::strerror(errno);
    return {};
  }
  return tmpl;
}

} // namespace

agent_config agent_config_of(const config::topology& topo, const config::node_spec& node) {
  agent_config cfg;
  cfg.node = node.name;
  cfg.seed = topo.seed;
  cfg.block_size = topo.block_size;
  cfg.flush_interval = topo.flush_interval;
  cfg.engines = node.engines;
  for (const auto* c : topo.controls())
    cfg.controls.push_back({c->name, c->host, c->port, c->fingerprints});
  return cfg;
}

namespace {

/// Starts one engine's actors: its mirrors, subscribers and (launched)
/// supervisor. `id` names its sockets in the private folder (made in
/// `runtime_dir` when first needed).
agent_engine start_engine(caf::actor_system& sys, const agent_config& cfg,
                          const agent_engine_config& e, std::size_t id, std::string& runtime_dir) {
  agent_engine out;
  out.spec = e;
  const std::string who = "agent " + cfg.node + " engine " + e.replica;
  std::vector<opened_subscriber> ranks;
  // A launched engine publishes into an ipc socket in the agent's private
  // folder, where no other local user can connect a publisher. vLLM takes
  // ipc endpoints for one rank only (it offsets tcp ports per rank), so
  // data-parallel engines and attached ones use tcp on loopback.
  std::string folder;
  bool private_sockets = e.kv_events && !e.launch.empty() && e.dp_size == 1;
  if (private_sockets) {
    std::string error;
    if (runtime_dir.empty())
      runtime_dir = private_folder(cfg.node, error);
    folder = runtime_dir;
    if (folder.empty()) {
      LLMGW_LOG(warning, who, "{}: its KV events use tcp on loopback", error);
      private_sockets = false;
    }
  }
  if (private_sockets) {
    subscriber_options opts;
    opts.replica = e.replica;
    opts.topic = e.topic;
    opts.endpoint = "ipc://" + folder + "/" + std::to_string(id) + ".events";
    auto opened = open_subscriber(opts);
    if (opened.socket)
      ranks.push_back(std::move(opened));
    else
      LLMGW_LOG(error, who, "starting without KV events, routed by prefix tree only: {}",
                opened.error);
  } else if (e.kv_events) {
    std::string error;
    ranks = e.events.empty() ? bind_ranks(e, error) : connect_ranks(e, error);
    if (ranks.empty())
      LLMGW_LOG(error, who, "starting without KV events, routed by prefix tree only: {}", error);
  }
  bool events = !ranks.empty();
  std::vector<std::string> replay(e.dp_size); // per rank, where the engine's replay is
  // Ports on loopback for a launched engine's replay, which the engine
  // binds itself: on a restart they may be another socket's by now, and
  // the supervisor moves the engine to free ones (see below).
  std::uint16_t replay_base = 0;
  std::vector<std::shared_ptr<replay_address>> replay_moves;
  if (events && !e.launch.empty() && e.replay) {
    if (private_sockets) {
      replay[0] = "ipc://" + folder + "/" + std::to_string(id) + ".replay";
    } else if (auto base = free_port_run(e.dp_size); base != 0) {
      replay_base = base;
      for (std::uint32_t r = 0; r < e.dp_size; ++r) {
        replay[r] = "tcp://127.0.0.1:" + std::to_string(base + r);
        replay_moves.push_back(std::make_shared<replay_address>());
      }
    }
  } else if (events && !e.replay_endpoint.empty()) {
    // An attached engine's: vLLM offsets it per rank as it does the events.
    if (auto at = wire::parse_tcp_endpoint(e.replay_endpoint))
      for (std::uint32_t r = 0; r < e.dp_size; ++r)
        replay[r] = wire::tcp_endpoint(*at, r);
  }
  for (const auto& note : config::events_notes(e))
    if (note.rfind("warning: ", 0) == 0)
      LLMGW_LOG(warning, who, "{}", note.substr(9));
  std::vector<mirror_actor> mirrors;
  for (std::uint32_t r = 0; r < e.dp_size; ++r) {
    auto view = std::make_shared<mirror_view>();
    out.mirror_views.push_back({e.replica, r, view});
    auto m =
      sys.spawn(mirror, e.replica, r,
                std::optional<kv::parity_config>(kv::parity_config{
                  cfg.seed, cfg.block_size, e.translate_keys, config::block_size_flag(e.kind)}),
                view);
    out.actors.push_back(caf::actor_cast<caf::actor>(m));
    // Only replicas with events are forwarded: a replica without them must
    // reach the router as "no KV state" (tier 1), not as "holds nothing".
    if (events)
      out.mirrors.push_back(mirror_entry{e.replica, m});
    mirrors.push_back(m);
  }
  for (std::uint32_t r = 0; events && r < e.dp_size; ++r) {
    subscriber_options opts;
    opts.replica = e.replica;
    opts.topic = e.topic;
    opts.replay = replay[r];
    opts.dialect = config::dialect_of(e.kind);
    if (!replay_moves.empty())
      opts.replay_moves = replay_moves[r];
    // The replay address is known only now (it follows the events socket).
    std::string error;
    if (!replay[r].empty() && !ranks[r].socket->connect_replay(replay[r], error))
      LLMGW_LOG(warning, who, "rank {}: gaps will not be filled by replay: {}", r, error);
    auto stats = std::make_shared<subscriber_stats>();
    out.subscribers.push_back({e.replica, r, stats});
    out.actors.push_back(
      sys.spawn<caf::detached>(subscriber, ranks[r].socket, opts, mirrors[r], stats));
  }
  out.events_endpoint = events ? ranks[0].endpoint : std::string{};
  if (!e.launch.empty()) {
    config::engine_launch_options lo;
    lo.command = e.launch;
    lo.kind = e.kind;
    lo.seed = cfg.seed;
    lo.block_size = cfg.block_size;
    lo.kv_events = events;
    lo.topic = e.topic;
    if (events)
      lo.events_endpoint = ranks[0].endpoint;
    lo.replay_endpoint = replay[0]; // vLLM offsets it per rank itself
    engine_supervisor_options so;
    so.replica = e.replica;
    so.launch = config::make_engine_launch(lo);
    if (replay_base != 0)
      so.before_restart = [lo, replay_moves, base = replay_base, count = e.dp_size,
                           who](config::engine_launch& launch) mutable {
        if (port_run_free(base, count))
          return;
        auto fresh = free_port_run(count);
        if (fresh == 0)
          return; // the engine tries the old ports; failing, it is restarted again
        LLMGW_LOG(warning, who, "replay port {} is taken: the engine moves to {}", base, fresh);
        base = fresh;
        lo.replay_endpoint = "tcp://127.0.0.1:" + std::to_string(base);
        launch = config::make_engine_launch(lo);
        for (std::uint32_t r = 0; r < count; ++r)
          replay_moves[r]->set("tcp://127.0.0.1:" + std::to_string(base + r));
      };
    // The supervisor resets rank 0's mirror on exit; the other ranks' streams
    // restart at seq 0 when the engine comes back, which resets them too.
    out.counters = so.counters;
    out.supervisor = caf::actor_cast<caf::actor>(sys.spawn(engine_supervisor, so, mirrors[0]));
  }
  return out;
}

/// How often the scraper reads every engine's /metrics: every flush
/// interval, but not so often that a short one keeps the engines' API
/// servers busy answering.
std::chrono::milliseconds scrape_interval(const agent_config& cfg) {
  return std::max(cfg.flush_interval, std::chrono::milliseconds(100));
}

/// Starts the load scraper for `cfg`'s engines with a url (invalid if none).
caf::actor start_scraper(caf::actor_system& sys, const agent_config& cfg,
                         const std::shared_ptr<engine_loads>& loads) {
  load_scraper_options scrape;
  scrape.interval = scrape_interval(cfg);
  std::vector<std::string> scraped;
  for (const auto& e : cfg.engines)
    if (!e.url.empty()) {
      scrape.engines.push_back({e.replica, e.url});
      scraped.push_back(e.replica);
    }
  loads->set_replicas(scraped);
  if (scrape.engines.empty())
    return {};
  return caf::actor_cast<caf::actor>(sys.spawn(load_scraper, scrape, loads));
}

agent_forwarder start_forwarder(caf::actor_system& sys, const agent_config& cfg,
                                const agent_control_config& c,
                                const std::vector<mirror_entry>& mirrors,
                                const std::shared_ptr<engine_loads>& loads) {
  forwarder_options fo;
  fo.node = cfg.node;
  fo.control = c.name;
  fo.flush_interval = cfg.flush_interval;
  fo.window = cfg.window;
  fo.identity = cfg.identity;
  fo.control_fingerprints = c.fingerprints;
  fo.counters = std::make_shared<forwarder_counters>();
  fo.loads = loads;
  // Scrapes come every flush interval: a reading several intervals old
  // means the engine stopped answering, and is not sent.
  fo.load_max_age = std::max(std::chrono::milliseconds(1000), 4 * scrape_interval(cfg));
  auto f =
    sys.spawn(forwarder, fo, mirrors, middleman_connector(c.host, c.port, cfg.connect_timeout));
  return {c, caf::actor_cast<caf::actor>(f), fo.counters};
}

/// Fills the flat lists of `h` from its engines and forwarders.
void flatten(agent_handles& h) {
  h.actors.clear();
  h.mirrors.clear();
  h.events_endpoints.clear();
  h.subscribers.clear();
  h.mirror_views.clear();
  h.forwarders.clear();
  for (const auto& e : h.engines) {
    h.actors.insert(h.actors.end(), e.actors.begin(), e.actors.end());
    if (e.supervisor)
      h.actors.push_back(e.supervisor);
    h.mirrors.insert(h.mirrors.end(), e.mirrors.begin(), e.mirrors.end());
    h.events_endpoints.push_back(e.events_endpoint);
    h.subscribers.insert(h.subscribers.end(), e.subscribers.begin(), e.subscribers.end());
    h.mirror_views.insert(h.mirror_views.end(), e.mirror_views.begin(), e.mirror_views.end());
  }
  if (h.scraper)
    h.actors.push_back(h.scraper);
  for (const auto& f : h.forwarder_actors) {
    h.actors.push_back(f.actor);
    h.forwarders.emplace_back(f.control.name, f.counters);
  }
  for (const auto& r : h.retiring)
    h.actors.push_back(r.supervisor);
}

bool same_control(const agent_control_config& a, const agent_control_config& b) {
  return a.name == b.name && a.host == b.host && a.port == b.port
         && a.fingerprints == b.fingerprints;
}

} // namespace

agent_handles start_agent(caf::actor_system& sys, const agent_config& cfg) {
  agent_handles out;
  out.config = cfg;
  for (const auto& e : cfg.engines)
    out.engines.push_back(start_engine(sys, cfg, e, out.next_engine_id++, out.runtime_dir));
  out.loads = std::make_shared<engine_loads>(std::vector<std::string>{});
  out.scraper = start_scraper(sys, cfg, out.loads);
  flatten(out);
  for (const auto& c : cfg.controls)
    out.forwarder_actors.push_back(start_forwarder(sys, cfg, c, out.mirrors, out.loads));
  flatten(out);
  return out;
}

void reload_agent(caf::actor_system& sys, agent_handles& h, const agent_config& fresh_in,
                  std::chrono::milliseconds retire_after) {
  auto fresh = fresh_in;
  // Read once, at start: a reload that changes them is refused before this.
  fresh.seed = h.config.seed;
  fresh.block_size = h.config.block_size;
  fresh.flush_interval = h.config.flush_interval;
  fresh.identity = h.config.identity;
  const std::string who = "agent " + h.config.node;
  // The forwarders take attach and detach only from an actor of this node.
  caf::scoped_actor self{sys};
  auto in = [](auto& list, const std::string& name, auto same) {
    return std::find_if(list.begin(), list.end(), [&](const auto& x) { return same(x, name); });
  };
  // Supervisors retired by an earlier reload that have ended by now.
  auto now = std::chrono::steady_clock::now();
  h.retiring.erase(std::remove_if(h.retiring.begin(), h.retiring.end(),
                                  [&](const auto& r) { return r.gone_by <= now; }),
                   h.retiring.end());
  // Engines removed or changed: out of every forwarder, then stopped.
  std::vector<agent_engine> kept;
  std::vector<caf::actor> stopping; ///< waited for: their ports and sockets are free after
  for (auto& e : h.engines) {
    auto now =
      in(fresh.engines, e.spec.replica,
         [](const agent_engine_config& x, const std::string& n) { return x.replica == n; });
    if (now != fresh.engines.end() && config::same_engine(*now, e.spec)) {
      kept.push_back(std::move(e));
      continue;
    }
    for (const auto& f : h.forwarder_actors)
      self->send(caf::actor_cast<forwarder_actor>(f.actor), detach_atom::value, e.spec.replica);
    for (const auto& a : e.actors) {
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
      stopping.push_back(a);
    }
    if (e.supervisor && now == fresh.engines.end() && retire_after.count() > 0) {
      // Removed: the gateways stop sending to it as they reload; what they
      // sent before may finish.
      LLMGW_LOG(info, who + " engine " + e.spec.replica,
                "removed: its KV state is dropped now, the engine stops in {} ms",
                retire_after.count());
      // Retired, not stopped: it must not restart the engine should it exit
      // before (a supervisor that ends early stops nothing still needed).
      self->send(caf::actor_cast<engine_supervisor_actor>(e.supervisor), drain_atom::value,
                 static_cast<std::int64_t>(retire_after.count()));
      h.retiring.push_back(
        {e.spec.replica, e.supervisor,
         std::chrono::steady_clock::now() + retire_after + engine_stop_allowance});
    } else if (e.supervisor) {
      caf::anon_send_exit(e.supervisor, caf::exit_reason::user_shutdown);
      stopping.push_back(e.supervisor); // a changed engine's process holds its ports
    }
  }
  // A replica removed by an earlier reload and added back before its engine
  // stopped: the new engine takes the old one's ports, so the old one stops
  // now (its requests in flight end with it).
  for (auto r = h.retiring.begin(); r != h.retiring.end();) {
    bool back = std::any_of(fresh.engines.begin(), fresh.engines.end(),
                            [&](const agent_engine_config& x) { return x.replica == r->replica; });
    if (!back) {
      ++r;
      continue;
    }
    LLMGW_LOG(info, who + " engine " + r->replica,
              "added back while its old engine drains: the old engine stops now");
    caf::anon_send_exit(r->supervisor, caf::exit_reason::user_shutdown);
    stopping.push_back(r->supervisor);
    r = h.retiring.erase(r);
  }
  // A changed engine binds the same events port and its engine the same
  // HTTP port: the old subscribers (one poll, at most) and the old engine
  // process (SIGTERM, SIGKILL after 5 s) must be gone first.
  self->wait_for(stopping);
  // Engines added or changed: started, and forwarded from their full copy.
  std::vector<agent_engine> engines;
  for (const auto& spec : fresh.engines) {
    auto old = in(kept, spec.replica,
                  [](const agent_engine& x, const std::string& n) { return x.spec.replica == n; });
    if (old != kept.end()) {
      engines.push_back(std::move(*old));
      continue;
    }
    engines.push_back(start_engine(sys, fresh, spec, h.next_engine_id++, h.runtime_dir));
    LLMGW_LOG(info, who + " engine " + spec.replica, "started by a reload");
    for (const auto& f : h.forwarder_actors)
      for (const auto& m : engines.back().mirrors)
        self->send(caf::actor_cast<forwarder_actor>(f.actor), attach_atom::value, m.replica,
                   caf::actor_cast<caf::actor>(m.mirror));
  }
  h.engines = std::move(engines);
  // The scraper reads the engines in force (their loads of before are kept).
  if (h.scraper)
    caf::anon_send_exit(h.scraper, caf::exit_reason::user_shutdown);
  h.scraper = start_scraper(sys, fresh, h.loads);
  flatten(h);
  // Forwarders follow the control nodes.
  std::vector<agent_forwarder> forwarders;
  for (auto& f : h.forwarder_actors) {
    auto now = in(fresh.controls, f.control.name,
                  [](const agent_control_config& x, const std::string& n) { return x.name == n; });
    if (now != fresh.controls.end() && same_control(*now, f.control)) {
      forwarders.push_back(std::move(f));
      continue;
    }
    caf::anon_send_exit(f.actor, caf::exit_reason::user_shutdown);
    // The mirrors stop keeping its changes (a new forwarder subscribes anew).
    for (const auto& m : h.mirrors)
      self->send(m.mirror, unsub_atom::value, forwarder_peer(f.control.name));
  }
  for (const auto& c : fresh.controls)
    if (std::none_of(forwarders.begin(), forwarders.end(),
                     [&](const agent_forwarder& f) { return f.control.name == c.name; }))
      forwarders.push_back(start_forwarder(sys, fresh, c, h.mirrors, h.loads));
  h.forwarder_actors = std::move(forwarders);
  h.config = fresh;
  flatten(h);
}

void stop_agent(const agent_handles& handles) {
  for (const auto& a : handles.actors)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

namespace {

/// `labels` with a reason added.
wire::metric_labels with_reason(wire::metric_labels labels, const char* reason) {
  labels.emplace_back("reason", reason);
  return labels;
}

} // namespace

void append_agent_metrics(wire::metrics_text& m, const agent_handles& handles) {
  for (const auto& s : handles.subscribers) {
    wire::metric_labels who{{"replica", s.replica}, {"dp_rank", std::to_string(s.rank)}};
    m.counter("llmgw_agent_event_messages_total", "KV event messages read from the engine.",
              static_cast<double>(s.stats->messages.load()), who);
    for (auto [reason, n] : {std::pair{"bad_frame", s.stats->bad_frames.load()},
                             {"decode", s.stats->decode_errors.load()}})
      m.counter("llmgw_agent_event_messages_refused_total",
                "KV event messages refused: bad_frame (not three frames or a bad seq), "
                "decode (a payload that does not decode).",
                static_cast<double>(n), with_reason(who, reason));
    m.counter("llmgw_agent_event_gaps_total", "Gaps in the engine's event stream.",
              static_cast<double>(s.stats->gaps.load()), who);
    m.counter("llmgw_agent_event_gaps_filled_total",
              "Gaps filled from the engine's replay endpoint (the mirror was not reset).",
              static_cast<double>(s.stats->gaps_filled.load()), who);
    m.counter("llmgw_agent_event_stream_restarts_total",
              "Times the engine's event stream started over (its sequence went back: a new "
              "engine process).",
              static_cast<double>(s.stats->restarts.load()), who);
    m.gauge("llmgw_agent_event_replay",
            "1 when gaps can be filled from the engine's replay endpoint.",
            s.stats->replay.load() ? 1 : 0, who);
    m.counter("llmgw_agent_events_skipped_total",
              "Events of a type llmgw does not know, skipped (the batch's others apply).",
              static_cast<double>(s.stats->unknown_events.load()), who);
  }
  for (const auto& v : handles.mirror_views) {
    wire::metric_labels who{{"replica", v.replica}, {"dp_rank", std::to_string(v.rank)}};
    m.gauge("llmgw_agent_mirror_blocks", "Blocks the engine's mirror holds.",
            static_cast<double>(v.view->blocks.load(std::memory_order_relaxed)), who);
    m.gauge("llmgw_agent_mirror_epoch", "Times the engine's mirror was emptied (its epoch).",
            static_cast<double>(v.view->epoch.load(std::memory_order_relaxed)), who);
    for (std::size_t r = 0; r < kv::reset_reason_count; ++r)
      m.counter("llmgw_agent_mirror_resets_total",
                "The mirror emptied, by reason: gap (events lost), restart (the stream "
                "started over), clear (the engine emptied its cache), engine_exit (the "
                "engine exited: restarts of launched engines), decode_error.",
                static_cast<double>(v.view->resets[r].load(std::memory_order_relaxed)),
                with_reason(who, kv::to_string(static_cast<kv::reset_reason>(r))));
  }
  for (const auto& e : handles.engines) {
    if (!e.counters)
      continue; // not launched by this agent
    wire::metric_labels who{{"replica", e.spec.replica}};
    m.counter("llmgw_agent_engine_starts_total",
              "Processes of the launched engine started (the first, then one per restart).",
              static_cast<double>(e.counters->starts.load()), who);
    m.counter("llmgw_agent_engine_exits_total",
              "Exits of the launched engine nobody asked for; each is restarted after a backoff.",
              static_cast<double>(e.counters->exits.load()), who);
    m.counter("llmgw_agent_engine_start_failures_total",
              "Times the launched engine's command could not be started.",
              static_cast<double>(e.counters->start_failures.load()), who);
  }
  if (handles.loads)
    for (const auto& c : handles.loads->totals())
      for (std::size_t o = 0; o < scrape_outcome_count; ++o)
        m.counter("llmgw_agent_engine_scrapes_total",
                  "Reads of an engine's /metrics for its load, by outcome: ok, connect (no "
                  "answer), status (not 200, or the answer broke off), parse (not vLLM's "
                  "gauges), too_large.",
                  static_cast<double>(c.by_outcome[o]),
                  {{"replica", c.replica}, {"outcome", to_string(static_cast<scrape_outcome>(o))}});
  for (const auto& [control, c] : handles.forwarders) {
    wire::metric_labels to{{"control", control}};
    m.gauge("llmgw_agent_session_up", "1 while a session with the control node is established.",
            c->connected.load() ? 1 : 0, to);
    m.counter("llmgw_agent_sessions_started_total", "Sessions started with the control node.",
              static_cast<double>(c->sessions.load()), to);
    m.counter("llmgw_agent_updates_sent_total", "Replica updates sent to the control node.",
              static_cast<double>(c->updates_sent.load()), to);
    m.counter("llmgw_agent_load_reports_sent_total",
              "Reports of the engines' loads sent to the control node.",
              static_cast<double>(c->load_reports_sent.load()), to);
    m.counter("llmgw_agent_flushes_skipped_total",
              "Flushes that found the window of unacknowledged updates full (the control node "
              "is slow, or the link stalls): the mirrors keep the changes, bounded by their "
              "tables, until it acknowledges.",
              static_cast<double>(c->flushes_skipped.load()), to);
    for (auto [reason, n] : {std::pair{"refused", c->sessions_refused.load()},
                             {"unproven", c->proofs_refused.load()},
                             {"lost", c->sessions_lost.load()}})
      m.counter("llmgw_agent_sessions_ended_total",
                "Sessions that ended: refused (by the control node), unproven (the control "
                "node did not prove its name), lost (the link or the control node went away; "
                "the forwarder reconnects).",
                static_cast<double>(n), with_reason(to, reason));
  }
}

std::string agent_mirrors_json(const agent_handles& handles) {
  boost::json::array mirrors;
  for (const auto& v : handles.mirror_views) {
    const auto& x = *v.view;
    mirrors.push_back(boost::json::object{
      {"replica", v.replica},
      {"dp_rank", v.rank},
      {"blocks", x.blocks.load(std::memory_order_relaxed)},
      {"epoch", x.epoch.load(std::memory_order_relaxed)},
      {"fingerprint", fmt::format("{:016x}", x.fingerprint.load(std::memory_order_relaxed))},
      {"partial", x.partial.load(std::memory_order_relaxed)},
      {"parity", kv::to_string(static_cast<kv::parity_state>(
                   std::min(x.parity.load(std::memory_order_relaxed),
                            static_cast<std::uint8_t>(kv::last_parity_state))))}});
  }
  return boost::json::serialize(boost::json::object{{"mirrors", std::move(mirrors)}});
}

void remove_runtime_dir(const agent_handles& handles) {
  if (handles.runtime_dir.empty())
    return;
  std::error_code ignored;
  std::filesystem::remove_all(handles.runtime_dir, ignored);
}

} // namespace llmgw
