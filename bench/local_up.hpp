// A local cluster for benchmarks, run by `llmgw up` from a topology the
// benchmark writes: its folder, the process, and the processes under it
// found by their command lines.
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

namespace llmgw::bench {

/// A loopback port the kernel just gave out (free a moment ago).
std::uint16_t free_port();

/// The folder of this executable (build-release/bench).
std::string exe_dir();

/// Starts `argv` (argv[0] a path) with its output into `log`, ending with
/// this process (and with PYTHONHASHSEED unset if asked: as an operator's
/// vLLM runs by default); its pid, 0 if it could not start.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log,
            bool unset_hash_seed = false);

/// Stops `pid` (SIGTERM, then SIGKILL after 20 s) and reaps it.
void stop_process(pid_t pid);

/// `llmgw up` running in a folder of its own; stopped (SIGTERM, then
/// SIGKILL after 20 s) when destroyed, then the engines the benchmark
/// started itself (attached ones).
struct up_cluster {
  std::string dir;
  pid_t pid = 0;
  std::vector<pid_t> attached;
  up_cluster() = default;
  up_cluster(const up_cluster&) = delete;
  up_cluster& operator=(const up_cluster&) = delete;
  ~up_cluster() { stop(); }
  void stop();
};

/// Writes `topology` to a new folder (/tmp/llmgw-bench-XXXXXX/cluster.toml)
/// and starts `llmgw up` on it; false (with why) if the cluster did not
/// come up within 150 s.
bool start_up(const std::string& topology, up_cluster& c, std::string& error);

/// The pid of the llmgw-sim serving `port`, from /proc (0 if none).
pid_t sim_pid(std::uint16_t port);

/// The pid of the process whose command line contains `needle` (0 if none).
pid_t pid_with(const std::string& needle);

/// A process's resident memory in KiB (VmRSS), 0 if it is gone.
std::uint64_t rss_kib(pid_t pid);

} // namespace llmgw::bench
