#include "actors/engine_supervisor.hpp"

#include "wire/block_table.hpp"
#include "wire/log.hpp"

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char** environ;

namespace llmgw {

namespace {

using self_ptr = engine_supervisor_actor::stateful_pointer<engine_supervisor_state>;

/// posix_spawnp with llmgw's environment plus the launch's overrides.
pid_t spawn_engine(const wire::engine_launch& launch, std::string& error) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    bool overridden = false;
    for (const auto& [k, v] : launch.env)
      overridden |= entry.rfind(k + "=", 0) == 0;
    if (!overridden)
      env_strings.push_back(std::move(entry));
  }
  for (const auto& [k, v] : launch.env) {
    std::string entry = k;
    entry += '=';
    entry += v;
    env_strings.push_back(std::move(entry));
  }
  std::vector<char*> envp;
  envp.reserve(env_strings.size() + 1);
  for (auto& e : env_strings)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_strings = launch.argv;
  std::vector<char*> argv;
  argv.reserve(argv_strings.size() + 1);
  for (auto& a : argv_strings)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  // The engine starts with no signal blocked and default handlers, whatever
  // the spawning thread had: it must hear SIGTERM when llmgw stops it.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, argv[0], nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    error = std::strerror(rc);
    return 0;
  }
  return pid;
}

std::string describe_exit(int status) {
  if (WIFEXITED(status))
    return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

void schedule_restart(self_ptr self) {
  auto& st = self->state;
  auto ran = std::chrono::steady_clock::now() - st.started_at;
  if (ran > st.opts.backoff_max)
    st.backoff = std::chrono::milliseconds{0}; // it ran fine for a while: start over
  st.backoff =
    st.backoff.count() == 0 ? st.opts.backoff_min : std::min(st.backoff * 2, st.opts.backoff_max);
  LLMGW_LOG(info, "engine " + st.opts.replica, "restarting in {} ms", st.backoff.count());
  self->delayed_send(self, st.backoff, start_atom::value);
}

/// SIGTERM, a grace period, then SIGKILL; reaps the child.
void stop_engine(engine_supervisor_state& st) {
  if (st.pid <= 0)
    return;
  kill(st.pid, SIGTERM);
  auto deadline = std::chrono::steady_clock::now() + st.opts.stop_grace;
  int status = 0;
  while (waitpid(st.pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(st.pid, SIGKILL);
      waitpid(st.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  st.pid = 0;
}

} // namespace

engine_supervisor_actor::behavior_type
engine_supervisor(engine_supervisor_actor::stateful_pointer<engine_supervisor_state> self,
                  engine_supervisor_options opts, mirror_actor mirror) {
  self->state.opts = std::move(opts);
  self->state.mirror = std::move(mirror);
  self->attach_functor([self] { stop_engine(self->state); });
  self->send(self, start_atom::value);
  self->delayed_send(self, self->state.opts.poll_interval, poll_atom::value);
  return {
    [self](start_atom) {
      auto& st = self->state;
      if (st.pid > 0)
        return;
      std::string error;
      st.pid = spawn_engine(st.opts.launch, error);
      st.started_at = std::chrono::steady_clock::now();
      if (st.pid <= 0) {
        LLMGW_LOG(error, "engine " + st.opts.replica, "cannot start {}: {}",
                  st.opts.launch.argv.at(0), error);
        schedule_restart(self);
        return;
      }
      ++st.starts;
      LLMGW_LOG(info, "engine " + st.opts.replica, "started {} (pid {})", st.opts.launch.argv.at(0),
                st.pid);
    },
    [self](poll_atom) {
      auto& st = self->state;
      self->delayed_send(self, st.opts.poll_interval, poll_atom::value);
      if (st.pid <= 0)
        return;
      int status = 0;
      auto r = waitpid(st.pid, &status, WNOHANG);
      if (r == 0)
        return; // still running
      LLMGW_LOG(warning, "engine " + st.opts.replica, "exited ({})",
                r == st.pid ? describe_exit(status) : "lost");
      st.pid = 0;
      if (st.mirror) // its KV cache is gone with it
        self->send(st.mirror, reset_atom::value,
                   static_cast<std::uint8_t>(wire::reset_reason::engine_exit));
      schedule_restart(self);
    },
    [self](status_atom) {
      return caf::make_result(static_cast<std::int64_t>(self->state.pid), self->state.starts);
    },
  };
}

} // namespace llmgw
