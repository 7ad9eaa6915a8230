// `llmgw node --config FILE --node NAME`: runs one node of the topology.
//
// Everything is checked before the actor system starts (the whole topology,
// TLS files included). Signals are blocked before CAF starts its threads, so
// SIGTERM and SIGINT reach only the main thread, which then stops the node's
// actors in order and lets the actor system wait for them.
//
// A control node runs the router, the control actor (published on its CAF
// port, mutual TLS unless the topology says plaintext), the tokenizer and the
// gateway (its http address). An agent node runs a mirror and subscriber per
// engine, engine supervisors for launched engines, and a forwarder per
// control node. CAF heartbeats run on every node, so a frozen peer is found.
#include "actors/agent.hpp"
#include "actors/control.hpp"
#include "actors/control_plane.hpp"
#include "actors/registration.hpp"
#include "apps/common/stop_signals.hpp"
#include "apps/llmgw/commands.hpp"
#include "base/log.hpp"
#include "config/topology.hpp"
#include "config/topology_change.hpp"
#include "gateway/gateway.hpp"
#include "net/node_port_guard.hpp"
#include "wire/metrics_text.hpp"
#include "wire/openai_request.hpp"

#include <CLI/CLI.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>
#include <fmt/format.h>

#include <atomic>
#include <csignal>
#include <map>
#include <mutex>
#include <pthread.h>
#include <sys/socket.h>

namespace llmgw::apps {

namespace {

struct node_config : caf::actor_system_config {
  node_config(const config::topology& topo, const config::node_spec& node, std::size_t threads) {
    load<caf::io::middleman>();
    if (!topo.plaintext) {
      load<caf::openssl::manager>();
      openssl_certificate = node.cert;
      openssl_key = node.key;
      openssl_cafile = topo.ca;
    }
    register_message_types(*this);
    set("middleman.heartbeat-interval", caf::timespan{topo.heartbeat});
    set("middleman.connection-timeout", caf::timespan{topo.connection_timeout});
    set("scheduler.max-threads", threads);
    // CAF 0.17's idle workers nap 50 us at a time for up to 500 polls, and
    // nothing wakes them early: every message from a gateway thread to an
    // actor (the tokenizer, the control actor) waited for the nap to end.
    // Go from spinning straight to the wait an enqueue notifies (measured
    // when the gateway still asked the router actor: -85 us on its p50).
    set("work-stealing.moderate-poll-attempts", std::size_t{1});
    // A worker in that wait also wakes every relaxed-sleep-duration (10 ms)
    // to steal work: on this VM ~30 us of CPU per wake, 3 ms/s per idle
    // worker. Enqueues from outside CAF (HTTP threads, the multiplexer, the
    // clock) notify a worker anyway; only stealing waits longer.
    set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::milliseconds(100)});
    set("logger.verbosity", caf::atom("quiet"));
  }
};

/// Reloads (SIGHUP) counted for /metrics.
struct reload_counts {
  std::atomic<std::uint64_t> applied{0};
  std::atomic<std::uint64_t> refused{0};
};

void append_reload_metrics(wire::metrics_text& m, const reload_counts& c) {
  for (auto [outcome, n] : {std::pair{"applied", c.applied.load()}, {"refused", c.refused.load()}})
    m.counter("llmgw_topology_reloads_total",
              "Reloads of the topology file (SIGHUP): applied, or refused (the file has "
              "problems, or changes what needs a restart; the topology in force stays).",
              static_cast<double>(n), {{"outcome", outcome}});
}

/// The agent's counters as the HTTP threads read them: no actor handles,
/// and replaced whole when a reload changes the engines or control nodes.
class agent_counters {
public:
  void set(const agent_handles& h) {
    auto counted = std::make_shared<agent_handles>();
    counted->subscribers = h.subscribers;
    counted->forwarders = h.forwarders;
    counted->mirror_views = h.mirror_views;
    counted->loads = h.loads;
    for (const auto& e : h.engines) { // no actor handles: they would outlive a reload
      agent_engine view;
      view.spec = e.spec;
      view.counters = e.counters;
      counted->engines.push_back(std::move(view));
    }
    std::lock_guard<std::mutex> g(mtx_);
    current_ = std::move(counted);
  }
  /// Null on a node without the agent role.
  std::shared_ptr<const agent_handles> get() const {
    std::lock_guard<std::mutex> g(mtx_);
    return current_;
  }

private:
  mutable std::mutex mtx_;
  std::shared_ptr<const agent_handles> current_;
};

/// SIGHUP: the topology file read and checked again as at start (every
/// problem is printed as `llmgw check` prints it). The new topology, or null
/// when it is refused: it has problems, or changes what this node reads
/// only at start (config/topology_change.hpp). Counted either way.
std::shared_ptr<const config::topology>
reload_topology(const std::shared_ptr<const config::topology>& old, const std::string& name,
                const std::string& who, reload_counts& counts) {
  LLMGW_LOG(info, who, "SIGHUP: reading {} again", old->path);
  config::topology fresh;
  config::topology_options only_mine;
  only_mine.tls_files_of = name;
  if (!load_or_report(old->path, fresh, "node", only_mine)) {
    ++counts.refused;
    LLMGW_LOG(error, who,
              "reload refused: {} has problems (listed above, as `llmgw check` lists them); the "
              "topology in force stays",
              old->path);
    return nullptr;
  }
  auto needs = config::restart_needed(*old, fresh, name);
  if (!needs.empty()) {
    ++counts.refused;
    std::string why;
    for (const auto& n : needs)
      why += (why.empty() ? "" : "; ") + n;
    LLMGW_LOG(error, who,
              "reload refused: {} changes what this node reads only at start ({}); the topology "
              "in force stays: restart the node for those",
              old->path, why);
    return nullptr;
  }
  if (!fresh.plaintext) {
    std::map<std::string, std::vector<std::string>> nodes;
    for (const auto& n : fresh.nodes)
      nodes[n.name] = n.fingerprints;
    set_node_certificates(std::move(nodes));
  }
  ++counts.applied;
  LLMGW_LOG(info, who, "reload applied: {}", config::compare_engines(*old, fresh).summary());
  return std::make_shared<const config::topology>(std::move(fresh));
}

int run_node(const config::topology& topo_in, const std::string& name, std::size_t threads) {
  auto topo = std::make_shared<const config::topology>(topo_in);
  const auto* node = topo->find_node(name);
  if (!node) {
    std::string names;
    for (const auto& n : topo->nodes)
      names += (names.empty() ? "" : ", ") + n.name;
    fmt::print(stderr, "llmgw node: no node '{}' in {} (nodes: {})\n", name, topo->path, names);
    return 2;
  }
  // Before any thread exists: the signals go to sigwait below, nowhere else.
  auto signals = block_stop_signals();

  auto who = "node " + name;
  std::shared_ptr<const config::node_identity> identity;
  if (topo->plaintext) {
    LLMGW_LOG(warning, who, "[tls] plaintext = true: nodes talk unencrypted (loopback only)");
  } else {
    // The name this node proves in every session (checked by load_topology
    // already; the files are read again here, once).
    auto loaded = config::node_identity::load(name, node->cert, node->key, topo->ca);
    if (!loaded) {
      fmt::print(stderr, "llmgw node: {}\n", loaded.err().message);
      return 2;
    }
    identity = std::move(*loaded);
  }
  // Read by llmgw's TLS hooks below CAF (net/tls_hooks.cpp) from the
  // first connection on.
  auto& port_limits = node_port_settings();
  port_limits.handshake_timeout = topo->tls_handshake_timeout;
  port_limits.max_pending_handshakes = topo->max_pending_handshakes;
  if (!topo->plaintext) // TLS peers: only the topology's nodes, with their certificates
    for (const auto& n : topo->nodes)
      port_limits.nodes[n.name] = n.fingerprints;
  node_config cfg(*topo, *node, threads);
  // Removes the engines' socket folder after the actor system (declared
  // after this) has waited for every actor.
  struct folder_cleanup {
    agent_handles last;
    ~folder_cleanup() { remove_runtime_dir(last); }
  } cleanup;
  caf::actor_system sys{cfg};
  control_plane plane;
  std::unique_ptr<gateway> gw;
  std::unique_ptr<http_server> agent_admin; // an agent-only node's /healthz and /metrics
  agent_handles agent;
  int exit_code = 0;
  if (node->roles.control) {
    plane = spawn_control_plane(sys, control_options_of(topo, name, identity));
    auto published = publish_control(sys, plane, *topo, *node);
    if (!published) {
      LLMGW_LOG(error, who, "cannot listen for agents on {}:{}: {}", node->host, node->port,
                sys.render(published.error()));
      exit_code = 1;
    } else {
      gw = std::make_unique<gateway>(sys, topo, node->http_host, node->http_port, plane,
                                     node->admin_host, node->admin_port);
      if (gw->port() == 0) {
        LLMGW_LOG(error, who, "gateway: {}", gw->error());
        exit_code = 1;
      } else {
        LLMGW_LOG(info, who, "control: agents connect to {}:{} ({}), gateway at http://{}:{}{}",
                  node->host, *published, topo->plaintext ? "plaintext" : "mutual TLS",
                  node->http_host, gw->port(),
                  gw->admin_port() == 0
                    ? std::string{}
                    : fmt::format(", admin at http://{}:{}", node->admin_host, gw->admin_port()));
      }
    }
  }
  auto reloads = std::make_shared<reload_counts>();
  auto counted = std::make_shared<agent_counters>();
  if (gw)
    gw->add_metrics([reloads, counted](wire::metrics_text& m) {
      append_reload_metrics(m, *reloads);
      // both roles: the gateway's /metrics has the agent's counters too
      if (auto handles = counted->get())
        append_agent_metrics(m, *handles);
    });
  if (exit_code == 0 && node->roles.agent) {
    auto cfg_agent = agent_config_of(*topo, *node);
    cfg_agent.identity = identity;
    agent = start_agent(sys, cfg_agent);
    LLMGW_LOG(info, who, "agent: {} engine(s), forwarding to {} control node(s)",
              node->engines.size(), topo->controls().size());
    counted->set(agent);
    if (gw) // both roles: the agent's mirrors beside the control node's view
      gw->add_json("/v1/kv/mirrors", [counted] {
        auto handles = counted->get();
        return handles ? agent_mirrors_json(*handles) : std::string(R"({"mirrors":[]})");
      });
    if (!gw && !node->admin_host.empty()) {
      agent_admin = std::make_unique<http_server>(
        node->admin_host, node->admin_port, 1, http_server_limits{},
        [counted, reloads](http_request&& req, const http_responder& respond) {
          auto handles = counted->get();
          auto path = req.target.substr(0, req.target.find('?'));
          if (req.method != "GET")
            return respond(error_reply(405, "MethodNotAllowed", req.method + " is not allowed"));
          if (path == "/healthz")
            return respond(json_reply(200, R"({"status":"ok"})"));
          if (path == "/v1/kv/mirrors")
            return respond(json_reply(200, agent_mirrors_json(*handles)));
          if (path != "/metrics")
            return respond(error_reply(404, "NotFoundError",
                                       "an agent serves /healthz, /metrics and /v1/kv/mirrors"));
          wire::metrics_text m;
          append_agent_metrics(m, *handles);
          append_reload_metrics(m, *reloads);
          append_node_port_metrics(m);
          respond(http_reply{200, "text/plain; version=0.0.4", m.str(), {}});
        });
      if (agent_admin->port() == 0) {
        LLMGW_LOG(error, who, "admin listener: {}", agent_admin->error());
        exit_code = 1;
      } else {
        LLMGW_LOG(info, who, "agent: admin at http://{}:{}", node->admin_host, agent_admin->port());
      }
    }
  }
  if (exit_code == 0) {
    LLMGW_LOG(info, who, "ready");
    int sig = 0;
    for (;;) {
      sigwait(&signals, &sig);
      if (sig != SIGHUP)
        break;
      auto fresh = reload_topology(topo, name, who, *reloads);
      if (!fresh)
        continue;
      if (gw) {
        reload_control_plane(sys, plane, fresh, name);
        gw->reload(fresh);
      }
      if (node->roles.agent) {
        auto cfg_agent = agent_config_of(*fresh, *fresh->find_node(name));
        reload_agent(sys, agent, cfg_agent, fresh->gateway.drain_timeout);
        counted->set(agent);
      }
      topo = fresh;
      node = topo->find_node(name);
    }
    LLMGW_LOG(info, who, "{}: shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  }
  if (gw) { // drain_timeout 0: what is in flight is cut at once
    LLMGW_LOG(info, who, "draining: requests in flight may finish for {} ms",
              topo->gateway.drain_timeout.count());
    if (!gw->drain(topo->gateway.drain_timeout))
      LLMGW_LOG(warning, who, "drained for {} ms: the requests still in flight are cut",
                topo->gateway.drain_timeout.count());
  }
  if (gw)
    gw->stop();
  if (agent_admin)
    agent_admin->stop();
  stop_agent(agent);
  cleanup.last.runtime_dir = agent.runtime_dir;
  stop_control_plane(plane);
  return exit_code; // the actor system waits for every actor as it goes
}

} // namespace

void add_node_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("node", "run one node of a topology (agent, control or both)");
  struct options {
    std::string config;
    std::string node;
    std::size_t threads = 4;
    bool debug = false;
  };
  auto opts = std::make_shared<options>();
  cmd->add_option("--config", opts->config, "the topology (TOML)")->required();
  cmd->add_option("--node", opts->node, "this node's name in the topology")->required();
  cmd->add_option("--threads", opts->threads, "CAF scheduler threads")
    ->check(CLI::Range(1, 256))
    ->capture_default_str();
  cmd->add_flag("--debug", opts->debug, "log debug lines too");
  cmd->callback([opts, &exit_code] {
    if (opts->debug)
      log::threshold = static_cast<int>(log::level::debug);
    config::topology topo;
    config::topology_options only_mine; // this host has this node's key, no other
    only_mine.tls_files_of = opts->node;
    if (!load_or_report(opts->config, topo, "node", only_mine)) {
      exit_code = 2;
      return;
    }
    exit_code = run_node(topo, opts->node, opts->threads);
  });
}

} // namespace llmgw::apps
