#include "actors/engine_supervisor.hpp"

#include "base/log.hpp"
#include "kv/block_table.hpp"

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace llmgw {

namespace {

using self_ptr = engine_supervisor_actor::stateful_pointer<engine_supervisor_state>;

/// The path execve needs: `name` itself if it has a slash, else the first
/// executable file of that name on PATH ("" if none).
std::string resolve_executable(const std::string& name) {
  if (name.find('/') != std::string::npos)
    return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t at = 0;
  while (at <= dirs.size()) {
    auto colon = dirs.find(':', at);
    auto dir = dirs.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
    auto candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (colon == std::string::npos)
      break;
    at = colon + 1;
  }
  return {};
}

/// Starts the engine with llmgw's environment plus the launch's overrides.
///
/// fork + execve rather than posix_spawn, for two things only the child can
/// ask for: PR_SET_PDEATHSIG, so the engine gets SIGTERM when this agent dies
/// in any way (a SIGKILLed agent must not leave engines holding GPUs and
/// ports behind, to be launched twice on restart), and its own process group,
/// so stopping it reaches the processes it starts. Between fork and exec the
/// child calls only async-signal-safe functions; an exec failure comes back
/// through a close-on-exec pipe.
pid_t spawn_engine(const config::engine_launch& launch, std::string& error) {
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
  auto exe = resolve_executable(argv_strings.at(0));
  if (exe.empty()) {
    error = "'" + argv_strings[0] + "' is not an executable on PATH";
    return 0;
  }
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    error = std::string("pipe: ") + std::strerror(errno);
    return 0;
  }
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    error = std::string("fork: ") + std::strerror(errno);
    ::close(report[0]);
    ::close(report[1]);
    return 0;
  }
  if (pid == 0) {
    // The child: no signal blocked and default handlers, whatever the forking
    // thread had (it must hear SIGTERM), its own group, death with its parent.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGTERM, SIGINT, SIGPIPE, SIGHUP})
      ::signal(sig, SIG_DFL);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) // the agent died before prctl took effect
      ::_exit(127);
    ::execve(exe.c_str(), argv.data(), envp.data());
    int err = errno;
    ssize_t ignored = ::write(report[1], &err, sizeof err);
    (void)ignored;
    ::_exit(127);
  }
  ::setpgid(pid, pid); // also here: a stop right after fork must reach the group
  ::close(report[1]);
  int child_errno = 0;
  ssize_t n;
  do
    n = ::read(report[0], &child_errno, sizeof child_errno);
  while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n == sizeof child_errno) {
    ::waitpid(pid, nullptr, 0);
    error = exe + ": " + std::strerror(child_errno);
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

/// After the engine's lead process is reaped: SIGKILL to what is left of its
/// process group (vLLM's engine-core and worker processes hold GPU memory
/// and ports), so nothing of the old engine outlives it. The group's id is
/// not reused while a member lives; this runs right after the reap.
void kill_remainder(pid_t group) {
  kill(-group, SIGKILL);
}

/// SIGKILL to the engine's whole process group, and reaps the engine: the
/// last resort of the exit hook, for a supervisor killed before its engine
/// stopped (exit_reason::kill skips the exit handler).
void kill_engine(engine_process& p) {
  if (p.pid <= 0)
    return;
  kill(-p.pid, SIGKILL);
  waitpid(p.pid, nullptr, 0);
  p.pid = 0;
}

/// Starts stopping the engine and ends the supervisor once it is reaped:
/// SIGTERM now, SIGKILL at the end of the grace period (see the poll). The
/// wait is the poll's, not a loop here: a vLLM engine takes seconds to stop,
/// and a loop would hold one of the scheduler's threads all that time, one
/// per engine stopped at once. Ending only after the reap lets whoever waits
/// for the supervisor (a reload starting the engine anew on the same ports
/// and GPUs) know the old process is gone.
void begin_stop(self_ptr self, caf::error reason) {
  auto& st = self->state;
  if (st.process->pid <= 0) {
    self->quit(std::move(reason));
    return;
  }
  if (st.stopping)
    return; // the first deadline holds
  st.stopping = true;
  st.stop_reason = std::move(reason);
  st.stop_deadline = std::chrono::steady_clock::now() + st.opts.stop_grace;
  kill(-st.process->pid, SIGTERM); // the engine's whole process group
}

/// One poll of a stopping engine: ends the supervisor once it is reaped,
/// SIGKILLs it at the deadline.
void poll_stopping(self_ptr self) {
  auto& st = self->state;
  int status = 0;
  if (waitpid(st.process->pid, &status, WNOHANG) != 0) {
    kill_remainder(st.process->pid);
    st.process->pid = 0;
    self->quit(st.stop_reason);
    return;
  }
  if (!st.killed && std::chrono::steady_clock::now() >= st.stop_deadline) {
    LLMGW_LOG(warning, "engine " + st.opts.replica, "still running {} ms after SIGTERM: SIGKILL",
              st.opts.stop_grace.count());
    kill(-st.process->pid, SIGKILL);
    st.killed = true;
  }
}

} // namespace

engine_supervisor_actor::behavior_type
engine_supervisor(engine_supervisor_actor::stateful_pointer<engine_supervisor_state> self,
                  engine_supervisor_options opts, mirror_actor mirror) {
  self->state.opts = std::move(opts);
  self->state.mirror = std::move(mirror);
  // CAF destroys the state before it runs attached functors: the functor
  // owns what it needs.
  self->attach_functor([process = self->state.process] { kill_engine(*process); });
  self->set_exit_handler([self](caf::exit_msg& msg) {
    if (msg.reason) // a normal exit of a linked actor is no reason to stop (CAF's default)
      begin_stop(self, std::move(msg.reason));
  });
  self->send(self, start_atom::value);
  self->delayed_send(self, self->state.opts.poll_interval, poll_atom::value);
  return {
    [self](start_atom) {
      auto& st = self->state;
      if (st.process->pid > 0 || st.retired || st.stopping)
        return;
      if (st.starts > 0 && st.opts.before_restart)
        st.opts.before_restart(st.opts.launch);
      std::string error;
      st.process->pid = spawn_engine(st.opts.launch, error);
      st.started_at = std::chrono::steady_clock::now();
      if (st.process->pid <= 0) {
        LLMGW_LOG(error, "engine " + st.opts.replica, "cannot start {}: {}",
                  st.opts.launch.argv.at(0), error);
        ++st.opts.counters->start_failures;
        schedule_restart(self);
        return;
      }
      ++st.starts;
      ++st.opts.counters->starts;
      LLMGW_LOG(info, "engine " + st.opts.replica, "started {} (pid {})", st.opts.launch.argv.at(0),
                st.process->pid);
    },
    [self](poll_atom) {
      auto& st = self->state;
      self->delayed_send(self, st.opts.poll_interval, poll_atom::value);
      if (st.stopping) {
        poll_stopping(self);
        return;
      }
      if (st.retired
          && (st.process->pid <= 0 || std::chrono::steady_clock::now() >= st.retire_at)) {
        begin_stop(self, caf::error{}); // ends now if the engine is gone
        return;
      }
      if (st.process->pid <= 0)
        return;
      int status = 0;
      auto r = waitpid(st.process->pid, &status, WNOHANG);
      if (r == 0)
        return;                        // still running
      kill_remainder(st.process->pid); // a restart must not meet its children
      LLMGW_LOG(warning, "engine " + st.opts.replica, "exited ({})",
                r == st.process->pid ? describe_exit(status) : "lost");
      st.process->pid = 0;
      if (st.retired) {
        self->quit();
        return;
      }
      ++st.opts.counters->exits;
      if (st.mirror) // its KV cache is gone with it
        self->send(st.mirror, reset_atom::value, kv::reset_reason::engine_exit);
      schedule_restart(self);
    },
    [self](status_atom) {
      return caf::make_result(static_cast<std::int64_t>(self->state.process->pid),
                              self->state.starts);
    },
    [self](drain_atom, std::int64_t after_ms) {
      auto& st = self->state;
      st.retired = true;
      st.retire_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(after_ms);
      if (st.process->pid <= 0)
        self->quit(); // not running (a restart pending): nothing to wait for
    },
  };
}

} // namespace llmgw
