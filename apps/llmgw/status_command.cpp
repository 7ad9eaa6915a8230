// `llmgw status --config FILE [--node NAME]`: the whole cluster in one table,
// for a person at a terminal, from one control node's view.
//
// It asks the control node (the first in the topology, or --node) on its
// admin address if it has one, else its http address, for /readyz and
// /v1/kv/replicas, and prints one line per replica: its node, whether it is
// avoided, its KV state (trusted, parity, canary, blocks, age of the last update),
// whether its answers made the index distrusted, and its load (requests in
// flight, and the engine's own running and waiting counts with its KV cache
// use; a replica's parity and update age are its ranks' worst). Then a line
// per node of the topology: whether it answers /healthz (on its admin
// address; a control node without one on its http address) and, for an
// agent, its replicas with KV state. TLS files are not read: the command
// reads only HTTP. Exit code 0 when the control node
// answered and is ready, 1 when it is not ready, 2 when it did not answer.
#include "apps/llmgw/commands.hpp"
#include "net/http_client.hpp"

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <map>
#include <optional>

namespace llmgw::apps {

namespace {

namespace json = boost::json;
using namespace std::chrono_literals;

http_response get(http_client& http, const std::string& base, const std::string& target,
                  std::chrono::milliseconds timeout = 5s) {
  std::promise<http_response> p;
  http.request("GET", base, target, "", timeout,
               [&p](http_response r) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

/// Whether `n` is up, as its /healthz says.
std::string node_health(http_client& http, const config::node_spec& n) {
  bool admin = !n.admin_host.empty();
  if (!admin && !n.roles.control)
    return "health not known (no admin address)";
  auto base = admin ? fmt::format("http://{}:{}", n.admin_host, n.admin_port)
                    : fmt::format("http://{}:{}", n.http_host, n.http_port);
  auto r = get(http, base, "/healthz", 2s);
  if (r.status == 200)
    return "up";
  if (r.status == 0)
    return "down (" + r.error + ")";
  if (r.body.find("draining") != std::string::npos)
    return "draining";
  return "unhealthy (status " + std::to_string(r.status) + ")";
}

std::string roles_of(const config::node_spec& n) {
  if (n.roles.control && n.roles.agent)
    return "control, agent";
  return n.roles.control ? "control" : "agent";
}

/// `v` as text for the table: numbers without a trailing .0, "-" for none.
std::string cell(const json::value* v) {
  if (!v || v->is_null())
    return "-";
  if (v->is_bool())
    return v->as_bool() ? "yes" : "no";
  if (v->is_int64())
    return std::to_string(v->as_int64());
  if (v->is_uint64())
    return std::to_string(v->as_uint64());
  if (v->is_double())
    return fmt::format("{:.1f}", v->as_double());
  if (v->is_string())
    return std::string(v->as_string());
  return json::serialize(*v);
}

const json::value* at(const json::object& o, std::initializer_list<const char*> path) {
  const json::value* v = nullptr;
  const json::object* cur = &o;
  for (const char* key : path) {
    if (!cur)
      return nullptr;
    auto it = cur->find(key);
    if (it == cur->end())
      return nullptr;
    v = &it->value();
    cur = v->if_object();
  }
  return v;
}

/// Prints a line per replica; returns, per node, its replicas with KV state
/// and all its replicas.
std::map<std::string, std::pair<int, int>> print_replicas(const json::array& replicas) {
  fmt::print("{:<14} {:<12} {:<5} {:<8} {:<14} {:<8} {:>8} {:>9} {:<10} {:>6} {:>8} {:>8}\n",
             "REPLICA", "NODE", "UP", "TRUSTED", "PARITY", "CANARY", "BLOCKS", "UPDATED",
             "DISTRUST", "FLIGHT", "RUN/WAIT", "KV USE");
  std::map<std::string, std::pair<int, int>> nodes; // node -> (with state, replicas)
  for (const auto& rv : replicas) {
    const auto* r = rv.if_object();
    if (!r)
      continue;
    std::string parity = "-", updated = "-";
    bool has_state = false;
    std::optional<double> oldest; // the rank updated longest ago
    if (const auto* ranks = at(*r, {"ranks"}); ranks && ranks->is_array())
      for (const auto& k : ranks->as_array()) {
        const auto* x = k.if_object();
        if (!x)
          continue;
        has_state = has_state || (at(*x, {"has_state"}) && cell(at(*x, {"has_state"})) == "yes");
        // The worst rank's: not routable, then unknown, then translated, then
        // verified.
        auto p = cell(at(*x, {"parity"}));
        auto rank_of = [](const std::string& s) {
          return s == "mismatch" || s == "untranslatable" ? 4
                 : s == "unknown"                         ? 3
                 : s == "translated"                      ? 2
                 : s == "verified"                        ? 1
                                                          : 0;
        };
        if (rank_of(p) > rank_of(parity))
          parity = p;
        if (const auto* age = at(*x, {"seconds_since_update"}); age && age->is_number())
          oldest = std::max(oldest.value_or(0.0), age->to_number<double>());
      }
    if (oldest)
      updated = fmt::format("{:.1f}s ago", *oldest);
    auto node = cell(at(*r, {"node"}));
    auto& n = nodes[node];
    n.first += has_state;
    ++n.second;
    std::string load = "-", kv_use = "-";
    if (at(*r, {"engine_load"})) {
      load =
        cell(at(*r, {"engine_load", "running"})) + "/" + cell(at(*r, {"engine_load", "waiting"}));
      if (const auto* u = at(*r, {"engine_load", "kv_cache_usage"}); u && u->is_double())
        kv_use = fmt::format("{:.0f}%", 100 * u->as_double());
    }
    bool kv_events = at(*r, {"kv_events"}) && cell(at(*r, {"kv_events"})) == "yes";
    bool down = at(*r, {"down"}) && cell(at(*r, {"down"})) == "yes";
    fmt::print("{:<14} {:<12} {:<5} {:<8} {:<14} {:<8} {:>8} {:>9} {:<10} {:>6} {:>8} {:>8}\n",
               cell(at(*r, {"replica"})), node, down ? "no" : "yes",
               kv_events ? cell(at(*r, {"trusted"})) : "no events", kv_events ? parity : "-",
               kv_events ? cell(at(*r, {"canary", "state"})) : "-",
               kv_events ? cell(at(*r, {"blocks"})) : "-", updated,
               cell(at(*r, {"index_check", "distrusted"})), cell(at(*r, {"outstanding"})), load,
               kv_use);
  }
  // Why a rank is not routed on its KV state, in the agent's words, and
  // why a canary failed, in the router's.
  for (const auto& rv : replicas) {
    const auto* r = rv.if_object();
    if (r && at(*r, {"canary", "reason"}))
      fmt::print("  {} canary {}: {}\n", cell(at(*r, {"replica"})),
                 cell(at(*r, {"canary", "state"})), cell(at(*r, {"canary", "reason"})));
    const auto* ranks = r ? at(*r, {"ranks"}) : nullptr;
    if (!ranks || !ranks->is_array())
      continue;
    for (const auto& k : ranks->as_array())
      if (const auto* x = k.if_object(); x && at(*x, {"parity_reason"}))
        fmt::print("  {} rank {}: {}: {}\n", cell(at(*r, {"replica"})), cell(at(*x, {"dp_rank"})),
                   cell(at(*x, {"parity"})), cell(at(*x, {"parity_reason"})));
  }
  return nodes;
}

} // namespace

void add_status_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("status", "show the cluster as one control node sees it");
  auto path = std::make_shared<std::string>();
  auto node_name = std::make_shared<std::string>();
  cmd->add_option("--config", *path, "topology file")->required();
  cmd->add_option("--node", *node_name, "the control node to ask (default: the first)");
  cmd->callback([path, node_name, &exit_code] {
    config::topology topo;
    config::topology_options opts;
    opts.check_tls_files = false; // only HTTP is read
    if (!load_or_report(*path, topo, "status", opts)) {
      exit_code = 2;
      return;
    }
    const config::node_spec* control = nullptr;
    for (const auto* c : topo.controls())
      if (node_name->empty() || c->name == *node_name) {
        control = c;
        break;
      }
    if (!control) {
      fmt::print(stderr, "llmgw status: no control node {}in {}\n",
                 node_name->empty() ? "" : "'" + *node_name + "' ", *path);
      exit_code = 2;
      return;
    }
    bool admin = !control->admin_host.empty();
    auto host = admin ? control->admin_host : control->http_host;
    auto port = admin ? control->admin_port : control->http_port;
    auto base = fmt::format("http://{}:{}", host, port);
    http_client http;
    auto replicas = get(http, base, "/v1/kv/replicas");
    boost::system::error_code ec;
    auto doc = replicas.status == 200 ? json::parse(replicas.body, ec) : json::value{};
    const auto* listed = doc.is_object() ? at(doc.as_object(), {"replicas"}) : nullptr;
    if (replicas.status != 200 || ec || !listed || !listed->is_array()) {
      fmt::print(stderr, "llmgw status: control node {} at {} did not answer /v1/kv/replicas: {}\n",
                 control->name, base,
                 replicas.status != 0 ? "status " + std::to_string(replicas.status)
                                      : replicas.error);
      exit_code = 2;
      return;
    }
    auto ready = get(http, base, "/readyz");
    fmt::print("control node {} at {}: {}\n", control->name, base,
               ready.status == 200 ? "ready" : "not ready: " + ready.body);
    auto with_state = print_replicas(listed->as_array());
    for (const auto& n : topo.nodes) {
      auto line = fmt::format("node {} ({}): {}", n.name, roles_of(n), node_health(http, n));
      if (auto it = with_state.find(n.name); it != with_state.end())
        line +=
          fmt::format("; {} of {} replicas with KV state", it->second.first, it->second.second);
      fmt::print("{}\n", line);
    }
    exit_code = ready.status == 200 ? 0 : 1;
  });
}

} // namespace llmgw::apps
