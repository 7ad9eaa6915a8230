// A cluster of real `llmgw node` processes on loopback for integration
// tests: a temporary folder with a private CA and node certificates (mutual
// TLS, as in production), a topology written from the test's description
// with ports the kernel found free, nodes started and stopped one by one,
// and HTTP helpers to read the control nodes' gateways. Every wait is
// bounded.
#pragma once

#include "net/http_client.hpp"
#include "tests/support/child_process.hpp"

#include <boost/json/value.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <sys/types.h>
#include <vector>

namespace llmgw::test {

/// A loopback TCP port that was free a moment ago, below the kernel's
/// ephemeral range and leased to this process: no other test process is
/// given it while this one runs.
std::uint16_t free_port();

/// The first of `count` consecutive ports, each as free_port gives one (a
/// data-parallel engine's ranks take consecutive ports).
std::uint16_t free_port_run(std::uint16_t count);

/// An engine of an agent node, launched as llmgw-test-engine publishing a
/// capture's frames, or (sim) as llmgw-sim serving requests on a free port
/// with 2,048 blocks (its url set to it).
struct test_engine_spec {
  std::string replica;
  std::string capture; ///< file name in golden/vllm-captures (its canary is off: no HTTP API)
  std::string model = "m";
  bool kv_events = true;
  std::string url = "http://127.0.0.1:1"; ///< its HTTP API (/tokenize)
  std::vector<std::string> lora = {};     ///< LoRA adapters it serves
  bool sim = false;
  std::uint32_t dp_size = 1;     ///< a sim's data-parallel ranks
  std::uint16_t events_port = 0; ///< a sim's fixed events port (0: the agent picks one)
};

/// A simulated engine (llmgw-sim) with KV events, serving model "m".
inline test_engine_spec sim_engine(std::string replica) {
  test_engine_spec e;
  e.replica = std::move(replica);
  e.sim = true;
  return e;
}

struct test_node_spec {
  std::string name;
  bool control = false;
  bool agent = false;
  std::string host = "127.0.0.1";
  std::vector<test_engine_spec> engines;
  std::vector<std::string> fingerprints = {}; ///< the certificates it may present (empty: any)
};

class test_cluster {
public:
  /// Writes certificates and the topology for `nodes`. `extra_cluster`
  /// lines go into [cluster].
  explicit test_cluster(std::vector<test_node_spec> nodes, std::string extra_cluster = {});
  ~test_cluster();

  /// The process id of running node `name` (-1 if not running).
  pid_t pid(const std::string& name) const {
    auto it = running_.find(name);
    return it == running_.end() || !it->second ? -1 : it->second->pid();
  }

  /// The CAF port of control node `name`.
  std::uint16_t caf_port(const std::string& name) const { return caf_ports_.at(name); }

  /// The topology's path (to start nodes with other files, write your own).
  const std::string& topology_path() const { return topology_; }
  const std::string& dir() const { return dir_; }

  /// Writes another topology file in the same folder (same certificates and
  /// ports; a sim engine new to it gets a free port) from a modified
  /// description; returns its path.
  std::string write_topology(const std::vector<test_node_spec>& nodes,
                             const std::string& file_name) const;

  /// Starts `llmgw node` for `name` (with `topology`, default ours).
  void start(const std::string& name, const std::string& topology = {});

  /// Sends `sig` to the node and waits (bounded) for it to exit; the exit code.
  std::optional<int> stop(const std::string& name, int sig);

  /// The pid of the test engine serving `replica` (0 before it started).
  pid_t engine_pid(const std::string& replica) const;

  /// The pid of the llmgw-sim serving `replica` (-1 if none runs).
  pid_t sim_pid(const std::string& replica) const;

  /// While this file exists, the sim serving `replica` answers as a vLLM
  /// whose engine core died (llmgw-sim --sim-fail-file).
  std::string fail_file(const std::string& replica) const { return dir_ + "/" + replica + ".fail"; }

  /// The base URL of a sim engine's HTTP API.
  std::string engine_url(const std::string& replica) const {
    return "http://127.0.0.1:" + std::to_string(sim_ports_.at(replica));
  }

  /// The base URL of the control node's gateway.
  std::string gateway_url(const std::string& control) const {
    return "http://127.0.0.1:" + std::to_string(http_ports_.at(control));
  }

  /// The agent node's /v1/kv/mirrors, as JSON (null if unreachable).
  boost::json::value mirrors(const std::string& agent);

  /// Sends `sig` to the node without waiting (SIGSTOP, SIGCONT).
  void signal(const std::string& name, int sig);

  /// Waits until the control node's gateway answers /healthz.
  bool wait_ready(const std::string& control, std::chrono::milliseconds timeout);

  /// GET `target` on the control node's gateway; status 0 if unreachable.
  http_response get(const std::string& control, const std::string& target);
  http_response post(const std::string& control, const std::string& target,
                     const std::string& body);

  /// GET `target` on a node's admin listener; status 0 if unreachable.
  http_response admin_get(const std::string& node, const std::string& target);

  /// The control node's /v1/kv/replicas, as JSON (null if unreachable).
  boost::json::value replicas(const std::string& control);

  /// The control node's /metrics value of one sample (exact text before the
  /// value, e.g. `llmgw_agent_connected{node="agent-a"}`); -1 if absent.
  double metric(const std::string& control, const std::string& sample);

  /// Polls `check` every 20 ms until it holds or the timeout passes.
  static bool eventually(const std::function<bool()>& check, std::chrono::milliseconds timeout);

  /// Everything the node wrote to stderr so far (its log).
  std::string log_of(const std::string& name);

private:
  std::string engine_pid_file(const std::string& replica) const;

  std::string dir_;
  std::string topology_;
  std::vector<test_node_spec> nodes_;
  std::map<std::string, std::uint16_t> caf_ports_;
  std::map<std::string, std::uint16_t> http_ports_;
  std::map<std::string, std::uint16_t> admin_ports_;       ///< every node has one
  mutable std::map<std::string, std::uint16_t> sim_ports_; ///< by replica, of sim engines
  std::map<std::string, std::unique_ptr<child_process>> running_;
  std::map<std::string, std::string> logs_;
  http_client http_;
};

/// The fingerprint of a capture's expected final state (what a mirror and
/// the router hold for a replica fed with it), as /v1/kv/replicas prints it.
std::string expected_fingerprint(const std::string& capture);

} // namespace llmgw::test
