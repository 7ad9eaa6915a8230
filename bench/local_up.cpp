#include "bench/local_up.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <sstream>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace llmgw::bench {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

std::uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0
      || ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    addr.sin_port = 0;
  ::close(fd);
  return ntohs(addr.sin_port);
}

void stop_process(pid_t pid) {
  if (pid <= 0)
    return;
  ::kill(pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 400 && ::waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(50ms);
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
}

void up_cluster::stop() {
  stop_process(pid);
  pid = 0;
  for (auto p : attached)
    stop_process(p);
  attached.clear();
}

pid_t spawn(const std::vector<std::string>& argv, const std::string& log, bool unset_hash_seed) {
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::close(fd);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent)
      ::_exit(127);
    if (unset_hash_seed)
      ::unsetenv("PYTHONHASHSEED");
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid < 0 ? 0 : pid;
}

std::string exe_dir() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

bool start_up(const std::string& topology, up_cluster& c, std::string& error) {
  char tmpl[] = "/tmp/llmgw-bench-XXXXXX";
  c.dir = ::mkdtemp(tmpl);
  std::ofstream(c.dir + "/cluster.toml") << topology;
  auto config = c.dir + "/cluster.toml";
  auto out = c.dir + "/up.out";
  auto llmgw = fs::path(exe_dir()).parent_path() / "apps" / "llmgw";
  c.pid = spawn(
    {llmgw.string(), "up", "--config", config, "--logs", c.dir + "/logs", "--ready-timeout", "120"},
    out);
  auto deadline = clock_type::now() + 150s;
  while (clock_type::now() < deadline) {
    std::ifstream in(out);
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().find("is up") != std::string::npos)
      return true;
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.pid = 0;
      error = "llmgw up exited: " + ss.str();
      return false;
    }
    std::this_thread::sleep_for(100ms);
  }
  error = "llmgw up did not come up in time; see " + out;
  return false;
}

namespace {

/// The first process whose command line (its arguments, each followed by a
/// space) `match` accepts; 0 if none.
template <class Match>
pid_t find_process(Match match) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    auto name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit))
      continue;
    std::ifstream in(e.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (match(cmd))
      return static_cast<pid_t>(std::stoi(name));
  }
  return 0;
}

} // namespace

pid_t sim_pid(std::uint16_t port) {
  auto flag = " --port " + std::to_string(port) + " ";
  return find_process([&](const std::string& cmd) {
    return cmd.substr(0, cmd.find(' ')).find("llmgw-sim") != std::string::npos
           && cmd.find(flag) != std::string::npos;
  });
}

pid_t pid_with(const std::string& needle) {
  return find_process(
    [&](const std::string& cmd) { return cmd.find(needle) != std::string::npos; });
}

std::uint64_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stoull(line.substr(6));
  return 0;
}

} // namespace llmgw::bench
