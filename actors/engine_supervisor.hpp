// The engine supervisor: starts one engine (vLLM, or llmgw-sim) with the
// command line config::make_engine_launch builds, polls for its exit, resets
// the engine's mirror when it exits (its KV cache is gone) and starts it
// again with exponential backoff. Asked to stop (an exit message), it stops
// the engine first: SIGTERM, then SIGKILL after a grace period, and ends once
// the engine is reaped, without holding a thread meanwhile. A retired supervisor
// (its engine left the topology) lets the engine run until a deadline, so
// requests already sent to it can finish, and never restarts it.
#pragma once

#include "actors/interfaces.hpp"
#include "config/engine_command.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <sys/types.h>

namespace llmgw {

/// What a supervisor counts, read by the agent's /metrics from any thread.
struct engine_counters {
  std::atomic<std::uint64_t> starts{0};         ///< processes started
  std::atomic<std::uint64_t> exits{0};          ///< exits nobody asked for (each is restarted)
  std::atomic<std::uint64_t> start_failures{0}; ///< the command could not be started
};

struct engine_supervisor_options {
  std::string replica;
  config::engine_launch launch;
  std::chrono::milliseconds poll_interval{100};
  std::chrono::milliseconds backoff_min{500};
  std::chrono::milliseconds backoff_max{30000};
  std::chrono::milliseconds stop_grace{5000};
  /// Called before every start once an engine has run, with the command
  /// line to change (may be left alone): a port the last engine bound may
  /// be another socket's by now (the replay port, see actors/agent.cpp).
  std::function<void(config::engine_launch&)> before_restart;
  std::shared_ptr<engine_counters> counters = std::make_shared<engine_counters>();
};

/// The engine process a supervisor runs: shared with the supervisor's exit
/// hook, which kills it if the supervisor ended before stopping it, after
/// CAF has destroyed the supervisor's state.
struct engine_process {
  pid_t pid = 0; ///< 0 while not running
};

struct engine_supervisor_state {
  engine_supervisor_options opts;
  mirror_actor mirror; ///< may be invalid: an engine without kv_events
  std::shared_ptr<engine_process> process = std::make_shared<engine_process>();
  std::uint64_t starts = 0;
  std::chrono::milliseconds backoff{0};
  std::chrono::steady_clock::time_point started_at;
  bool retired = false; ///< never start again; end once the engine is gone
  std::chrono::steady_clock::time_point retire_at; ///< stop the engine then
  bool stopping = false;                           ///< SIGTERM sent: end once the engine is reaped
  bool killed = false;                             ///< SIGKILL sent too
  std::chrono::steady_clock::time_point stop_deadline; ///< SIGKILL then
  caf::error stop_reason;                              ///< to end with
  static inline const char* name = "engine_supervisor";
};

engine_supervisor_actor::behavior_type
engine_supervisor(engine_supervisor_actor::stateful_pointer<engine_supervisor_state> self,
                  engine_supervisor_options opts, mirror_actor mirror);

} // namespace llmgw
