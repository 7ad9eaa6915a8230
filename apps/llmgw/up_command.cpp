// `llmgw up --config FILE [--demo] [--exit-after-demo] [--logs DIR]`: every
// node of a single-machine topology as child processes, for a demo or a
// test.
//
// It makes the cluster's certificates if the topology names files that do
// not exist yet (a private CA, one certificate per node: mutual TLS as in
// production), checks the whole topology, starts the control nodes, waits
// for their gateways, starts the agents (which launch the engines), waits
// until every replica with KV events has its KV state at the control nodes
// and every engine answers, then until their canaries pass (each is routed
// on its KV state),
// prints the gateway's URL, optionally runs the demo traffic, and then shows
// a one-line status until Ctrl-C or SIGTERM, when it stops every node (and
// so every engine) and waits for them: SIGKILL only after the drain timeout
// and 15 s more. SIGHUP is passed on to every node,
// which reads the topology again. Children get SIGTERM if `llmgw up`
// itself dies. Node logs go to files in the log folder.
#include "apps/common/stop_signals.hpp"
#include "apps/llmgw/commands.hpp"
#include "apps/llmgw/demo.hpp"
#include "config/pki.hpp"
#include "config/topology.hpp"
#include "net/http_client.hpp"
#include "wire/address.hpp"

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char** environ;

namespace llmgw::apps {

namespace {

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace std::chrono_literals;

/// Makes the certificates the topology names, if they do not exist yet and
/// follow the layout `llmgw certs` writes (DIR/ca.pem, DIR/NODE.pem/.key).
bool ensure_certificates(const config::topology& t, std::string& error) {
  if (t.plaintext || t.ca.empty())
    return true;
  auto dir = fs::path(t.ca).parent_path().string();
  bool missing = !fs::exists(t.ca);
  for (const auto& n : t.nodes)
    missing = missing || !fs::exists(n.cert) || !fs::exists(n.key);
  if (!missing)
    return true;
  if (fs::path(t.ca).filename() != "ca.pem") {
    error = "the topology's CA must be DIR/ca.pem for llmgw up to make certificates";
    return false;
  }
  for (const auto& n : t.nodes) {
    auto want = config::credentials_in(dir, n.name);
    if (fs::path(n.cert) != fs::path(want.cert) || fs::path(n.key) != fs::path(want.key)) {
      error = fmt::format("node '{}': cert/key must be {}/{}.pem and .key for llmgw up to make "
                          "them (or make them with llmgw certs)",
                          n.name, dir, n.name);
      return false;
    }
  }
  fmt::print("llmgw up: making a private CA and node certificates in {}\n", dir);
  if (auto e = config::ensure_ca(dir); !e.empty()) {
    error = e;
    return false;
  }
  for (const auto& n : t.nodes)
    if (!fs::exists(n.cert) || !fs::exists(n.key))
      if (auto e = config::issue_node_certificate(dir, n.name, {n.host}); !e.empty()) {
        error = e;
        return false;
      }
  return true;
}

std::string self_path() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("llmgw") : p.string();
}

/// Starts `llmgw node` for `node`, its output into `log`; dies with us.
pid_t start_node(const std::string& self, const std::string& config, const std::string& node,
                 const std::string& log, const std::string& path_env) {
  std::vector<std::string> args = {self, "node", "--config", config, "--node", node};
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("PATH=", 0) != 0)
      env_strings.emplace_back(*e);
  env_strings.push_back("PATH=" + path_env);
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (auto& e : env_strings)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent)
      ::_exit(127);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

http_response get(http_client& http, const std::string& base, const std::string& target) {
  std::promise<http_response> p;
  http.request("GET", base, target, "", 2s, [&p](http_response r) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

/// A control node's /v1/kv/replicas, or null.
std::optional<json::array> kv_replicas(http_client& http, const std::string& base) {
  auto r = get(http, base, "/v1/kv/replicas");
  if (r.status != 200)
    return std::nullopt;
  boost::system::error_code ec;
  auto doc = json::parse(r.body, ec);
  if (ec || !doc.is_object() || !doc.as_object().if_contains("replicas"))
    return std::nullopt;
  return doc.at("replicas").as_array();
}

/// Control node -> replicas with KV events whose state has arrived there
/// (some rank has state).
std::size_t replicas_with_state(http_client& http, const std::string& base) {
  std::size_t n = 0;
  if (auto replicas = kv_replicas(http, base))
    for (const auto& rep : *replicas)
      for (const auto& rank : rep.at("ranks").as_array())
        if (rank.at("has_state").as_bool()) {
          ++n;
          break;
        }
  return n;
}

/// Control node -> replicas routed on their KV state (their canary passed,
/// or is off); the others in `pending`, with their canary's state and why.
std::size_t replicas_trusted(http_client& http, const std::string& base,
                             std::vector<std::string>& pending) {
  pending.clear();
  std::size_t n = 0;
  if (auto replicas = kv_replicas(http, base))
    for (const auto& v : *replicas) {
      const auto& rep = v.as_object();
      if (!rep.at("kv_events").as_bool())
        continue;
      if (rep.at("trusted").as_bool()) {
        ++n;
        continue;
      }
      const auto& c = rep.at("canary").as_object();
      auto name = json::value_to<std::string>(rep.at("replica"));
      auto state = json::value_to<std::string>(c.at("state"));
      std::string line;
      if (state == "passed" || state == "off") {
        // Held back by something else: its parity, say.
        line = name + ": not routed on its KV state (see llmgw status)";
      } else {
        line = fmt::format("{}: canary {}", name, state);
        for (const char* key : {"reason", "last_error"})
          if (const auto* why = c.if_contains(key))
            line += ": " + json::value_to<std::string>(*why);
      }
      pending.push_back(std::move(line));
    }
  return n;
}

/// One sample of /metrics, or 0.
double metric(const std::string& text, const std::string& sample) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(sample + " ", 0) == 0)
      return std::stod(line.substr(sample.size() + 1));
  return 0;
}

/// The last `n` lines of `log` that mention any of `needles` (what an
/// engine's node wrote about it: why it exited, what it could not bind).
std::vector<std::string> last_lines_with(const std::string& log,
                                         const std::vector<std::string>& needles, std::size_t n) {
  std::ifstream in(log);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line))
    if (std::any_of(needles.begin(), needles.end(),
                    [&](const std::string& w) { return line.find(w) != std::string::npos; })) {
      out.push_back(line);
      if (out.size() > n)
        out.erase(out.begin());
    }
  return out;
}

struct child {
  std::string node;
  std::string log;
  pid_t pid = 0;
  bool exited = false;
};

/// How long the nodes may take to stop: a control node drains for
/// drain_timeout_ms, then cuts what is left; an agent stops its engines.
std::chrono::milliseconds stop_grace(const config::topology& topo) {
  return topo.gateway.drain_timeout + std::chrono::milliseconds(15000);
}

/// SIGTERM to every child, SIGKILL to those still running after `grace`.
void stop_all(std::vector<child>& children, std::chrono::milliseconds grace) {
  for (auto& c : children)
    if (!c.exited)
      ::kill(c.pid, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + grace;
  for (auto& c : children) {
    while (!c.exited && std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(c.pid, nullptr, WNOHANG) == c.pid)
        c.exited = true;
      else
        std::this_thread::sleep_for(20ms);
    }
    if (!c.exited) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, nullptr, 0);
      c.exited = true;
    }
  }
}

struct up_options {
  std::string config;
  bool demo = false;
  bool exit_after_demo = false;
  std::string logs;
  int ready_timeout_s = 60;
};

/// A cluster being brought up: its nodes as children, where they log, and
/// what to wait for.
struct cluster_run {
  config::topology topo;
  sigset_t signals{};
  std::string logs;                   ///< the folder of the nodes' logs
  std::string self, config, path_env; ///< how to start `llmgw node`
  std::vector<child> children;
  std::vector<std::string> gateways;    ///< each control node's gateway URL
  std::vector<std::string> admins;      ///< where each serves /v1/kv/replicas (admin, or gateway)
  std::vector<demo_engine> engines;     ///< every engine of the topology
  std::vector<std::string> engine_logs; ///< the log of each engine's node
  std::size_t with_events = 0;          ///< engines with KV events
  int ready_timeout_s = 60;
  std::chrono::steady_clock::time_point deadline; ///< of every wait until the cluster is up
  bool reload_pending = false;                    ///< a SIGHUP came while nodes were starting
  http_client http;

  void launch(const config::node_spec& n) {
    child c{n.name, logs + "/" + n.name + ".log", 0, false};
    c.pid = start_node(self, config, n.name, c.log, path_env);
    children.push_back(c);
  }

  /// Polls `ready` every `step` until it holds (true), or until the
  /// deadline passes or a stop signal arrives (false).
  bool wait_until(const std::function<bool()>& ready, std::chrono::milliseconds step) {
    while (!ready()) {
      timespec zero{0, 0};
      if (std::chrono::steady_clock::now() > deadline)
        return false;
      int sig = sigtimedwait(&signals, nullptr, &zero);
      if (sig == SIGHUP)
        reload_pending = true; // a node still starting would die of it: passed on once up
      else if (sig > 0)
        return false;
      std::this_thread::sleep_for(step);
    }
    return true;
  }

  /// SIGHUP: every running node reads the file again and applies it or
  /// refuses it (its log says which). Nodes added to the file are not
  /// started, nor removed ones stopped: that needs a new `llmgw up`.
  void forward_reload() {
    std::size_t sent = 0;
    for (const auto& c : children)
      if (!c.exited && ::kill(c.pid, SIGHUP) == 0)
        ++sent;
    fmt::print("\nllmgw up: SIGHUP: {} node(s) read {} again (their logs say whether they "
               "applied it; nodes added to or removed from the file need a new llmgw up)\n",
               sent, config);
  }
};

/// Loads and checks the topology, making its certificates first if it names
/// files that do not exist yet; 0, or the exit code after saying why.
int prepare(const up_options& o, config::topology& topo) {
  auto lenient = config::load_topology(o.config, config::topology_options{false, {}});
  if (!lenient.value) {
    fmt::print(stderr, "llmgw up: {} has problems:\n", o.config);
    for (const auto& p : lenient.problems)
      fmt::print(stderr, "  {}\n", p.to_string());
    return 2;
  }
  for (const auto& n : lenient.value->nodes)
    if (!wire::is_loopback(n.host)) {
      fmt::print(stderr,
                 "llmgw up: node '{}' is on {}: llmgw up runs single-machine topologies (start "
                 "llmgw node on each machine instead)\n",
                 n.name, n.host);
      return 2;
    }
  std::string error;
  if (!ensure_certificates(*lenient.value, error)) {
    fmt::print(stderr, "llmgw up: {}\n", error);
    return 2;
  }
  return load_or_report(o.config, topo, "up") ? 0 : 2;
}

/// Starts the control nodes and waits for their gateways' /healthz.
bool start_controls(cluster_run& r) {
  for (const auto* c : r.topo.controls()) {
    r.launch(*c);
    r.gateways.push_back(fmt::format(
      "http://{}:{}", c->http_host == "0.0.0.0" ? "127.0.0.1" : c->http_host, c->http_port));
    // With an admin listener, the gateway's port no longer serves the
    // node's state: ask the admin listener.
    bool admin = !c->admin_host.empty();
    auto host = admin ? c->admin_host : c->http_host;
    r.admins.push_back(fmt::format("http://{}:{}", host == "0.0.0.0" ? "127.0.0.1" : host,
                                   admin ? c->admin_port : c->http_port));
  }
  for (const auto& g : r.gateways)
    if (!r.wait_until([&] { return get(r.http, g, "/healthz").status == 200; }, 50ms)) {
      fmt::print(stderr, "llmgw up: the gateway at {} did not come up; logs in {}\n", g, r.logs);
      return false;
    }
  return true;
}

/// Starts the agent nodes (which launch the engines) and waits until every
/// replica with KV events has its state at the first control node.
bool start_agents(cluster_run& r) {
  for (const auto& n : r.topo.nodes) {
    if (n.roles.agent && !n.roles.control)
      r.launch(n);
    for (const auto& e : n.engines) {
      r.with_events += e.kv_events;
      r.engines.push_back({e.replica, e.url});
      r.engine_logs.push_back(r.logs + "/" + n.name + ".log");
    }
  }
  fmt::print("llmgw up: {} node{} started, waiting for {} replica{} to send their KV state "
             "(logs in {})\n",
             r.children.size(), r.children.size() == 1 ? "" : "s", r.with_events,
             r.with_events == 1 ? "" : "s", r.logs);
  if (!r.wait_until([&] { return replicas_with_state(r.http, r.admins[0]) >= r.with_events; },
                    100ms)) {
    fmt::print(stderr, "llmgw up: not every replica came up in {} s; logs in {}\n",
               r.ready_timeout_s, r.logs);
    return false;
  }
  return true;
}

/// Waits until every replica with KV events is routed on its KV state at
/// the first control node: its canary passed (routing/canary.hpp). Names
/// those whose canary did not, with why.
bool wait_for_canaries(cluster_run& r) {
  std::vector<std::string> pending;
  if (r.wait_until([&] { return replicas_trusted(r.http, r.admins[0], pending) >= r.with_events; },
                   100ms))
    return true;
  fmt::print(stderr,
             "llmgw up: not every replica is routed on its KV state (its canary passed) in {} "
             "s; logs in {}\n",
             r.ready_timeout_s, r.logs);
  for (const auto& p : pending)
    fmt::print(stderr, "  {}\n", p);
  return false;
}

/// Waits until every engine answers GET /health (vLLM and llmgw-sim do),
/// then for the canaries. An
/// engine that cannot start (its port taken, a bad flag) restarts with
/// backoff forever and the gateway routes around it: it is named, with what
/// its node's log says about it, rather than the cluster called up.
bool wait_for_engines(cluster_run& r) {
  std::vector<std::size_t> silent;
  auto all_answer = [&] {
    silent.clear();
    for (std::size_t i = 0; i < r.engines.size(); ++i)
      if (get(r.http, r.engines[i].url, "/health").status != 200)
        silent.push_back(i);
    return silent.empty();
  };
  if (r.wait_until(all_answer, 100ms))
    return wait_for_canaries(r);
  for (auto i : silent) {
    const auto& e = r.engines[i];
    fmt::print(stderr, "llmgw up: engine {} at {} is not answering GET /health\n", e.replica,
               e.url);
    auto url = wire::parse_http_url(e.url);
    auto port = url ? std::to_string(url->port) : e.url;
    auto said =
      last_lines_with(r.engine_logs[i], {":" + port + ":", "engine " + e.replica + ":"}, 4);
    if (!said.empty())
      fmt::print(stderr, "  from {}:\n", r.engine_logs[i]);
    for (const auto& l : said)
      fmt::print(stderr, "    {}\n", l);
  }
  return false;
}

/// The status line: nodes alive, replicas with KV state, decisions by tier.
std::string status_line(cluster_run& r) {
  auto m = get(r.http, r.gateways[0], "/metrics").body;
  auto tier = [&](const char* t) {
    return metric(m, fmt::format("llmgw_prefix_decisions_total{{tier=\"{}\"}}", t));
  };
  std::size_t alive = 0;
  for (const auto& c : r.children)
    alive += !c.exited;
  return fmt::format(
    "llmgw up: {}/{} nodes, {}/{} replicas with KV state, {} routed (kv {}, approx {}, load {})",
    alive, r.children.size(), replicas_with_state(r.http, r.admins[0]), r.with_events,
    tier("kv") + tier("approx") + tier("load"), tier("kv"), tier("approx"), tier("load"));
}

/// Shows the status line (every second on a terminal, every 30 s in a log)
/// and says when a node exits, until SIGINT or SIGTERM; passes SIGHUP on.
void serve_until_stopped(cluster_run& r) {
  bool tty = ::isatty(1);
  auto last = std::chrono::steady_clock::now() - 1h;
  if (r.reload_pending)
    r.forward_reload();
  for (;;) {
    timespec tick{0, 250000000};
    int sig = sigtimedwait(&r.signals, nullptr, &tick);
    if (sig == SIGHUP) {
      r.forward_reload();
    } else if (sig > 0) {
      fmt::print("\nllmgw up: {}: stopping every node\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      return;
    }
    for (auto& c : r.children)
      if (!c.exited && ::waitpid(c.pid, nullptr, WNOHANG) == c.pid) {
        c.exited = true;
        fmt::print("\nllmgw up: node {} exited; its log: {}\n", c.node, c.log);
      }
    auto now = std::chrono::steady_clock::now();
    if (now - last < (tty ? 1s : 30s))
      continue;
    last = now;
    fmt::print(tty ? "\r{:<110}" : "{}\n", status_line(r));
    std::fflush(stdout);
  }
}

int run_up(const up_options& o) {
  // Signals come to this thread via sigtimedwait; children get them
  // unblocked. Blocked before any thread exists (cluster_run's HTTP client
  // starts one), or a thread of ours could take SIGINT and end the process.
  auto signals = block_stop_signals();
  cluster_run r;
  r.signals = signals;
  if (int code = prepare(o, r.topo))
    return code;
  r.logs = o.logs;
  if (r.logs.empty()) {
    char tmpl[] = "/tmp/llmgw-up-XXXXXX";
    r.logs = ::mkdtemp(tmpl);
  }
  fs::create_directories(r.logs);
  r.self = self_path();
  const char* old_path = std::getenv("PATH");
  auto bin = fs::path(r.self).parent_path();
  r.path_env = bin.string() + ":" + (bin.parent_path() / "apps").string() + ":"
               + (old_path ? old_path : "/usr/bin:/bin");
  r.config = fs::absolute(o.config).string();
  r.ready_timeout_s = o.ready_timeout_s;
  r.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(o.ready_timeout_s);
  if (!start_controls(r) || !start_agents(r) || !wait_for_engines(r)) {
    stop_all(r.children, stop_grace(r.topo));
    return 1;
  }
  fmt::print("llmgw up: cluster '{}' is up; the gateway is {}\n", r.topo.name, r.gateways[0]);
  int code = 0;
  if (o.demo) {
    demo_options d;
    d.gateway_url = r.gateways[0];
    d.model = r.engines.empty() ? std::string{} : r.topo.find_engine(r.engines[0].replica)->model;
    d.engines = r.engines;
    code = run_demo(d).failed == 0 ? 0 : 1;
    if (o.exit_after_demo) {
      stop_all(r.children, stop_grace(r.topo));
      return code;
    }
    fmt::print("\nllmgw up: still serving at {}; try\n  curl -s {}/v1/chat/completions "
               "-H 'Content-Type: application/json' -d '{{\"model\": \"{}\", \"messages\": "
               "[{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'\nCtrl-C stops the cluster.\n",
               r.gateways[0], r.gateways[0], d.model);
  }
  serve_until_stopped(r);
  stop_all(r.children, stop_grace(r.topo));
  fmt::print("llmgw up: stopped\n");
  return code;
}

} // namespace

void add_up_command(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("up", "run every node of a single-machine topology (a demo)");
  auto o = std::make_shared<up_options>();
  cmd->add_option("--config", o->config, "the topology (TOML)")->required();
  cmd->add_flag("--demo", o->demo, "send the demo traffic once the cluster is up");
  cmd->add_flag("--exit-after-demo", o->exit_after_demo, "stop after the demo (for tests)");
  cmd->add_option("--logs", o->logs, "folder for node logs (default: a new one in /tmp)");
  cmd->add_option("--ready-timeout", o->ready_timeout_s, "seconds to wait for the cluster")
    ->capture_default_str();
  cmd->callback([o, &exit_code] { exit_code = run_up(*o); });
}

} // namespace llmgw::apps
