#include "tests/integration/test_cluster.hpp"

#include "tests/support/eventually.hpp"

#include "config/pki.hpp"
#include "routing/replica_index.hpp"
#include "tests/support/captures.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <arpa/inet.h>
#include <csignal>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <future>
#include <mutex>
#include <netinet/in.h>
#include <random>
#include <set>
#include <sstream>
#include <sys/socket.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace std::chrono_literals;

namespace llmgw::test {

namespace {

/// The lowest port the kernel hands out by itself (bind to 0, connect).
int ephemeral_low() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  in >> low;
  return low;
}

bool bindable(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  if (fd >= 0)
    ::close(fd);
  return ok;
}

} // namespace

std::uint16_t free_port_run(std::uint16_t count) {
  // Topologies name fixed ports, which the nodes bind seconds later. A port
  // from the kernel's ephemeral range could meanwhile become some socket's
  // local end (an outgoing connection, an agent's replay port), and a port
  // another test process picked could be picked again. So: ports below the
  // ephemeral range, each leased with a lock on the byte of that number in
  // one shared file. Open-file-description locks are held until this
  // process ends, and the kernel drops them with it, so nothing goes stale.
  static std::mutex mtx;
  static std::mt19937 random(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  // Without the file (another user's, not writable) ports are still checked
  // and never repeated within this process, only not leased.
  static const int leases = [] {
    int fd = ::open("/tmp/llmgw-test-ports.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd >= 0)
      ::fchmod(fd, 0666); // whoever made it, every user's tests share it
    return fd;
  }();
  static std::set<std::uint16_t> mine; // this process's own leases do not conflict
  std::lock_guard<std::mutex> guard(mtx);
  const int high = ephemeral_low();
  const int low = std::max(10000, high - 20000);
  std::uniform_int_distribution<int> pick(low, high - count);
  for (int attempt = 0; attempt < 10000; ++attempt) {
    auto port = static_cast<std::uint16_t>(pick(random));
    bool taken = false;
    for (std::uint16_t i = 0; i < count; ++i)
      taken |= mine.count(static_cast<std::uint16_t>(port + i)) != 0;
    if (taken)
      continue;
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    lock.l_start = port;
    lock.l_len = count;
    if (leases >= 0 && ::fcntl(leases, F_OFD_SETLK, &lock) != 0)
      continue;
    bool free = true;
    for (std::uint16_t i = 0; i < count; ++i)
      free &= bindable(static_cast<std::uint16_t>(port + i));
    if (!free) {
      lock.l_type = F_UNLCK;
      if (leases >= 0)
        ::fcntl(leases, F_OFD_SETLK, &lock);
      continue;
    }
    for (std::uint16_t i = 0; i < count; ++i)
      mine.insert(static_cast<std::uint16_t>(port + i));
    return port;
  }
  ADD_FAILURE() << "no free port below " << high << " after 10000 tries";
  return 0;
}

std::uint16_t free_port() {
  return free_port_run(1);
}

test_cluster::test_cluster(std::vector<test_node_spec> nodes, std::string extra_cluster)
  : nodes_(std::move(nodes)) {
  char tmpl[] = "/tmp/llmgw-cluster-XXXXXX";
  dir_ = ::mkdtemp(tmpl);
  EXPECT_EQ(config::ensure_ca(dir_), "");
  for (const auto& n : nodes_) {
    EXPECT_EQ(config::issue_node_certificate(dir_, n.name, {n.host}), "");
    admin_ports_[n.name] = free_port();
    for (const auto& e : n.engines)
      if (e.sim)
        sim_ports_[e.replica] = free_port();
    if (n.control) {
      caf_ports_[n.name] = free_port();
      http_ports_[n.name] = free_port();
    }
  }
  topology_ = write_topology(nodes_, "cluster.toml");
  if (!extra_cluster.empty()) {
    // [cluster] is the file's first table: extra lines go right after it.
    std::ifstream in(topology_);
    std::stringstream buf;
    buf << in.rdbuf();
    auto text = buf.str();
    text.insert(text.find('\n') + 1, extra_cluster + "\n");
    std::ofstream(topology_) << text;
  }
}

test_cluster::~test_cluster() {
  for (auto& [name, proc] : running_)
    if (proc) {
      proc->signal(SIGKILL);
      proc->wait(5s);
    }
  running_.clear();
  if (!::testing::Test::HasFailure())
    std::system(("rm -rf " + dir_).c_str());
  else
    std::fprintf(stderr, "test cluster kept for inspection: %s\n", dir_.c_str());
}

std::string test_cluster::write_topology(const std::vector<test_node_spec>& nodes,
                                         const std::string& file_name) const {
  std::string t = "[cluster]\nname = \"test\"\nhash_seed = \"0\"\nblock_size = 16\n"
                  "flush_interval_ms = 50\nheartbeat_ms = 200\nconnection_timeout_ms = 1000\n\n"
                  "[tls]\nca = \"ca.pem\"\n\n"
                  "[router]\ntokenize_timeout_ms = 200\n";
  for (const auto& n : nodes) {
    std::vector<std::string> roles;
    if (n.control)
      roles.push_back("\"control\"");
    if (n.agent)
      roles.push_back("\"agent\"");
    t +=
      fmt::format("\n[[node]]\nname = \"{}\"\nhost = \"{}\"\nroles = [{}]\n"
                  "cert = \"{}.pem\"\nkey = \"{}.key\"\nadmin = \"127.0.0.1:{}\"\n",
                  n.name, n.host, fmt::join(roles, ", "), n.name, n.name, admin_ports_.at(n.name));
    if (n.control)
      t += fmt::format("port = {}\nhttp = \"127.0.0.1:{}\"\n", caf_ports_.at(n.name),
                       http_ports_.at(n.name));
    if (!n.fingerprints.empty())
      t += fmt::format("fingerprints = [\"{}\"]\n", fmt::join(n.fingerprints, "\", \""));
    for (const auto& e : n.engines) {
      if (e.sim) {
        if (!sim_ports_.count(e.replica))
          sim_ports_[e.replica] = free_port();
        auto port = sim_ports_.at(e.replica);
        t += fmt::format("\n[[node.engine]]\nreplica = \"{}\"\nmodel = \"{}\"\n"
                         "url = \"http://127.0.0.1:{}\"\nkv_events = true\ndp_size = {}\n"
                         "launch = [\"{}\", \"serve\", \"{}\", \"--port\", \"{}\", "
                         "\"--num-gpu-blocks\", \"2048\", \"--enable-prompt-tokens-details\", "
                         "\"--data-parallel-size\", \"{}\", \"--sim-fail-file\", \"{}\"]\n",
                         e.replica, e.model, port, e.dp_size, LLMGW_SIM, e.model, port, e.dp_size,
                         fail_file(e.replica));
        if (e.events_port != 0)
          t += fmt::format("events_port = {}\n", e.events_port);
        continue;
      }
      std::vector<std::string> lora;
      for (const auto& l : e.lora)
        lora.push_back("\"" + l + "\"");
      t += fmt::format("\n[[node.engine]]\nreplica = \"{}\"\nmodel = \"{}\"\nurl = \"{}\"\n"
                       "lora = [{}]\nkv_events = {}\ncanary = false\n"
                       "launch = [\"{}\", \"--capture\", \"{}\", \"--pid-file\", \"{}\"]\n",
                       e.replica, e.model, e.url, fmt::join(lora, ", "),
                       e.kv_events ? "true" : "false", LLMGW_TEST_ENGINE, capture_path(e.capture),
                       engine_pid_file(e.replica));
    }
  }
  auto path = dir_ + "/" + file_name;
  std::ofstream(path) << t;
  return path;
}

void test_cluster::start(const std::string& name, const std::string& topology) {
  auto log = dir_ + "/" + name + ".log";
  // Logs go to a file: a pipe nobody reads could fill and block the node.
  auto cmd = fmt::format("exec {} node --config {} --node {} 2>>{}", LLMGW_BINARY,
                         topology.empty() ? topology_ : topology, name, log);
  running_[name] = std::make_unique<child_process>(std::vector<std::string>{"/bin/sh", "-c", cmd});
  logs_[name] = log;
}

std::optional<int> test_cluster::stop(const std::string& name, int sig) {
  auto it = running_.find(name);
  if (it == running_.end() || !it->second)
    return std::nullopt;
  it->second->signal(sig);
  auto code = it->second->wait(10s);
  running_.erase(it);
  return code;
}

std::string test_cluster::engine_pid_file(const std::string& replica) const {
  return dir_ + "/" + replica + ".pid";
}

pid_t test_cluster::engine_pid(const std::string& replica) const {
  std::ifstream in(engine_pid_file(replica));
  pid_t pid = 0;
  in >> pid;
  return pid;
}

pid_t test_cluster::sim_pid(const std::string& replica) const {
  auto it = sim_ports_.find(replica);
  if (it == sim_ports_.end())
    return -1;
  // The agent adds flags to the command line; "--port N" stays as written.
  auto needle = std::string(LLMGW_SIM) + " serve ";
  auto port = " --port " + std::to_string(it->second) + " ";
  std::unique_ptr<DIR, int (*)(DIR*)> proc(::opendir("/proc"), ::closedir);
  while (auto* e = proc ? ::readdir(proc.get()) : nullptr) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0])))
      continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos && cmd.find(port) != std::string::npos)
      return static_cast<pid_t>(std::stoi(e->d_name));
  }
  return -1;
}

void test_cluster::signal(const std::string& name, int sig) {
  auto it = running_.find(name);
  if (it != running_.end() && it->second)
    it->second->signal(sig);
}

bool test_cluster::eventually(const std::function<bool()>& check,
                              std::chrono::milliseconds timeout) {
  return test::eventually(check, timeout, std::chrono::milliseconds(20));
}

bool test_cluster::wait_ready(const std::string& control, std::chrono::milliseconds timeout) {
  return eventually([&] { return get(control, "/healthz").status == 200; }, timeout);
}

namespace {

http_response sync_request(http_client& http, const std::string& method, std::uint16_t port,
                           const std::string& target, const std::string& body) {
  std::promise<http_response> p;
  http.request(method, "http://127.0.0.1:" + std::to_string(port), target, body, 5s,
               [&p](http_response r) { p.set_value(std::move(r)); });
  return p.get_future().get();
}

} // namespace

http_response test_cluster::get(const std::string& control, const std::string& target) {
  return sync_request(http_, "GET", http_ports_.at(control), target, "");
}

http_response test_cluster::admin_get(const std::string& node, const std::string& target) {
  return sync_request(http_, "GET", admin_ports_.at(node), target, "");
}

http_response test_cluster::post(const std::string& control, const std::string& target,
                                 const std::string& body) {
  return sync_request(http_, "POST", http_ports_.at(control), target, body);
}

boost::json::value test_cluster::replicas(const std::string& control) {
  auto r = admin_get(control, "/v1/kv/replicas");
  if (r.status != 200)
    return nullptr;
  return boost::json::parse(r.body);
}

boost::json::value test_cluster::mirrors(const std::string& agent) {
  auto r = admin_get(agent, "/v1/kv/mirrors");
  if (r.status != 200)
    return nullptr;
  return boost::json::parse(r.body);
}

double test_cluster::metric(const std::string& control, const std::string& sample) {
  auto r = admin_get(control, "/metrics");
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(sample + " ", 0) == 0)
      return std::stod(line.substr(sample.size() + 1));
  return -1;
}

std::string test_cluster::log_of(const std::string& name) {
  std::ifstream in(logs_[name]);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::string expected_fingerprint(const std::string& capture) {
  auto blocks = capture_final_blocks(read_json(capture_path(capture)));
  return fmt::format(
    "{:016x}", routing::fingerprint_of(std::vector<kv::block_ref>(blocks.begin(), blocks.end())));
}

} // namespace llmgw::test
