// A local cluster for benchmarks, run by `llmgw up` from a topology the
// benchmark writes: its folder, the process, and the processes under it
// found by their command lines.
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>

namespace llmgw::bench {

/// A loopback port the kernel just gave out (free a moment ago).
std::uint16_t free_port();

/// The folder of this executable (build-release/bench).
std::string exe_dir();

/// `llmgw up` running in a folder of its own; stopped (SIGTERM, then
/// SIGKILL after 20 s) when destroyed.
struct up_cluster {
  std::string dir;
  pid_t pid = 0;
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
