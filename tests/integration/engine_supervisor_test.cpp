// The engine supervisor with real processes: a stand-in engine (a shell
// script) records how it was started; the supervisor must pass the seed and
// flags, restart it with backoff when it exits, reset its mirror each time,
// and stop it when the supervisor stops. A retired supervisor (its engine
// left the topology) never restarts it, and stops it at its deadline.
#include "actors/engine_supervisor.hpp"
#include "actors/mirror.hpp"
#include "actors/registration.hpp"
#include "tests/support/eventually.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>
#include <unistd.h>

using namespace std::chrono_literals;
using namespace llmgw;

namespace {

struct sys_config : caf::actor_system_config {
  sys_config() {
    register_message_types(*this);
    set("scheduler.max-threads", 2);
  }
};

std::string temp_path(const std::string& name) {
  return "/tmp/llmgw-test-" + std::to_string(getpid()) + "-" + name;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

std::pair<std::int64_t, std::uint64_t> status(caf::actor_system& sys,
                                              const engine_supervisor_actor& s) {
  caf::scoped_actor self{sys};
  std::pair<std::int64_t, std::uint64_t> out{-1, 0};
  self->request(s, 10s, status_atom::value)
    .receive(
      [&](std::int64_t pid, std::uint64_t starts) {
        out = {pid, starts};
      },
      [&](const caf::error& e) { ADD_FAILURE() << sys.render(e); });
  return out;
}

std::uint64_t mirror_epoch(caf::actor_system& sys, const mirror_actor& m) {
  caf::scoped_actor self{sys};
  std::uint64_t epoch = 0;
  self->request(m, 10s, subscribe_atom::value, std::uint64_t{1})
    .receive([&](const replica_update& u) { epoch = u.epoch; },
             [&](const caf::error& e) { ADD_FAILURE() << sys.render(e); });
  return epoch;
}

} // namespace

TEST(engine_supervisor, restarts_an_exiting_engine_and_resets_its_mirror) {
  auto record = temp_path("starts");
  std::remove(record.c_str());
  sys_config cfg;
  caf::actor_system sys{cfg};
  auto m = sys.spawn(mirror, std::string("r0"), std::uint32_t{0},
                     std::optional<kv::parity_config>{}, nullptr);
  config::engine_launch_options lo;
  lo.command = {"/bin/sh", "-c", "echo \"$PYTHONHASHSEED $*\" >> " + record + "; exit 3", "engine"};
  lo.seed = "1234";
  lo.kv_events = true;
  lo.events_endpoint = "tcp://127.0.0.1:40000";
  engine_supervisor_options opts;
  opts.replica = "r0";
  opts.launch = config::make_engine_launch(lo);
  opts.poll_interval = 20ms;
  opts.backoff_min = 50ms;
  opts.backoff_max = 200ms;
  auto s = sys.spawn(engine_supervisor, opts, m);
  test::eventually([&] { return lines_of(record).size() >= 4; }, 3s);
  auto lines = lines_of(record);
  ASSERT_GE(lines.size(), 4u) << "the engine is started again after each exit";
  EXPECT_EQ(lines[0].rfind("1234 --prefix-caching-hash-algo sha256_cbor --kv-events-config {", 0),
            0u)
    << lines[0];
  EXPECT_NE(lines[0].find("\"endpoint\":\"tcp://127.0.0.1:40000\""), std::string::npos) << lines[0];
  EXPECT_GE(status(sys, s).second, 4u);
  EXPECT_GE(mirror_epoch(sys, m), 3u) << "each exit resets the mirror";
  caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
  std::remove(record.c_str());
}

TEST(engine_supervisor, stopping_the_supervisor_stops_the_engine) {
  sys_config cfg;
  caf::actor_system sys{cfg};
  engine_supervisor_options opts;
  opts.replica = "r1";
  opts.launch.argv = {"/bin/sleep", "30"};
  opts.poll_interval = 20ms;
  auto s = sys.spawn(engine_supervisor, opts, mirror_actor{});
  std::int64_t pid = 0;
  test::eventually([&] { return (pid = status(sys, s).first) > 0; }, 2s);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(kill(static_cast<pid_t>(pid), 0), 0) << "running";
  caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  bool gone = test::eventually([&] { return kill(static_cast<pid_t>(pid), 0) != 0; }, 3s);
  EXPECT_TRUE(gone) << "the engine is stopped (and reaped) with its supervisor";
}

TEST(engine_supervisor, a_missing_program_is_retried_not_fatal) {
  sys_config cfg;
  caf::actor_system sys{cfg};
  engine_supervisor_options opts;
  opts.replica = "r2";
  opts.launch.argv = {"/nonexistent/llmgw-engine"};
  opts.poll_interval = 20ms;
  opts.backoff_min = 20ms;
  auto s = sys.spawn(engine_supervisor, opts, mirror_actor{});
  std::this_thread::sleep_for(100ms);
  auto [pid, starts] = status(sys, s);
  EXPECT_EQ(pid, 0);
  EXPECT_EQ(starts, 0u);
  caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
}

namespace {

/// Waits until `s` has ended; false if it still runs after `limit`.
bool ends_within(caf::actor_system& sys, const engine_supervisor_actor& s,
                 std::chrono::milliseconds limit) {
  caf::scoped_actor self{sys};
  self->monitor(s);
  bool ended = false;
  self->receive([&](const caf::down_msg&) { ended = true; }, caf::after(limit) >> [] {});
  return ended;
}

} // namespace

TEST(engine_supervisor, a_retired_engine_that_exits_is_not_restarted) {
  sys_config cfg;
  caf::actor_system sys{cfg};
  engine_supervisor_options opts;
  opts.replica = "r3";
  opts.launch.argv = {"/bin/sleep", "30"};
  opts.poll_interval = 20ms;
  opts.backoff_min = 20ms;
  auto s = sys.spawn(engine_supervisor, opts, mirror_actor{});
  std::int64_t pid = 0;
  test::eventually([&] { return (pid = status(sys, s).first) > 0; }, 2s);
  ASSERT_GT(pid, 0);
  caf::anon_send(s, drain_atom::value, std::int64_t{60000});
  // The retire is handled before the status request that follows it.
  EXPECT_EQ(status(sys, s).first, pid) << "a retired engine runs on until its deadline";
  kill(static_cast<pid_t>(pid), SIGKILL);
  EXPECT_TRUE(ends_within(sys, s, 3s)) << "the supervisor ends with its engine";
  EXPECT_NE(kill(static_cast<pid_t>(pid), 0), 0)
    << "reaped (ends_within above shows it was not restarted)";
}

TEST(engine_supervisor, a_retired_engine_is_stopped_at_its_deadline) {
  sys_config cfg;
  caf::actor_system sys{cfg};
  engine_supervisor_options opts;
  opts.replica = "r4";
  opts.launch.argv = {"/bin/sleep", "30"};
  opts.poll_interval = 20ms;
  auto s = sys.spawn(engine_supervisor, opts, mirror_actor{});
  std::int64_t pid = 0;
  test::eventually([&] { return (pid = status(sys, s).first) > 0; }, 2s);
  ASSERT_GT(pid, 0);
  caf::anon_send(s, drain_atom::value, std::int64_t{200});
  EXPECT_TRUE(ends_within(sys, s, 5s)) << "the supervisor ends at its deadline";
  EXPECT_NE(kill(static_cast<pid_t>(pid), 0), 0) << "after the engine is stopped and reaped";
}

namespace {

/// A stand-in engine that answers SIGTERM with `on_term` (a shell trap).
/// It runs 30 s at most (a failed test leaves nothing running for long) and
/// `before` runs first, in the background.
engine_supervisor_options trapping_engine(const std::string& replica, const std::string& on_term,
                                          const std::string& before = "") {
  engine_supervisor_options opts;
  opts.replica = replica;
  opts.launch.argv = {"/bin/sh", "-c",
                      before + "trap '" + on_term + "' TERM; : > " + temp_path(replica + ".ready")
                        + "; i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"};
  opts.poll_interval = 20ms;
  std::remove(temp_path(replica + ".ready").c_str());
  return opts;
}

/// The engine's pid once its trap is set (0 if it never was).
std::int64_t running_pid(caf::actor_system& sys, const engine_supervisor_actor& s,
                         const std::string& replica) {
  auto ready = temp_path(replica + ".ready");
  std::int64_t pid = 0;
  test::eventually(
    [&] { return (pid = status(sys, s).first) > 0 && access(ready.c_str(), F_OK) == 0; }, 5s);
  std::remove(ready.c_str());
  return pid;
}

/// Whether process `pid` runs (a zombie does not).
bool alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line))
    return false;
  auto state = line.rfind(") ");
  return state != std::string::npos && line.at(state + 2) != 'Z';
}

/// Kills every supervisor at the end of a test, however it ends (their
/// exit hook SIGKILLs an engine left running).
struct kill_at_end {
  std::vector<engine_supervisor_actor> supervisors;
  ~kill_at_end() {
    for (const auto& s : supervisors)
      caf::anon_send_exit(s, caf::exit_reason::kill);
  }
};

} // namespace

// A reload that changes an engine starts the new one on the same ports (and,
// with vLLM, the same GPUs) as soon as the old supervisor has ended.
TEST(engine_supervisor, ends_only_once_its_engine_has_exited) {
  sys_config cfg;
  caf::actor_system sys{cfg};
  auto s = sys.spawn(engine_supervisor, trapping_engine("r5", "sleep 0.5; exit 0"), mirror_actor{});
  kill_at_end guard{{s}};
  auto pid = running_pid(sys, s, "r5");
  ASSERT_GT(pid, 0);
  caf::scoped_actor self{sys};
  self->monitor(s);
  caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  bool ended = false;
  self->receive([&](const caf::down_msg&) { ended = true; }, caf::after(10s) >> [] {});
  ASSERT_TRUE(ended);
  EXPECT_NE(kill(static_cast<pid_t>(pid), 0), 0)
    << "the engine, slow to stop, is gone (and reaped) when the supervisor has ended";
}

// A vLLM engine takes seconds to stop. Stopping several at once must not
// take the scheduler's threads (two here) from the node's other actors.
TEST(engine_supervisor, a_slow_stop_holds_no_scheduler_thread) {
  sys_config cfg;
  caf::actor_system sys{cfg};
  std::vector<engine_supervisor_actor> slow;
  std::vector<std::int64_t> pids;
  kill_at_end guard;
  for (const char* name : {"r6", "r7"}) {
    auto opts = trapping_engine(name, ""); // ignores SIGTERM
    opts.stop_grace = 5s;
    slow.push_back(sys.spawn(engine_supervisor, opts, mirror_actor{}));
    guard.supervisors.push_back(slow.back());
    pids.push_back(running_pid(sys, slow.back(), name));
    ASSERT_GT(pids.back(), 0);
  }
  auto other = sys.spawn(engine_supervisor, trapping_engine("r8", "exit 0"), mirror_actor{});
  guard.supervisors.push_back(other);
  ASSERT_GT(running_pid(sys, other, "r8"), 0);
  for (const auto& s : slow)
    caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  // Each slow stop has begun once its supervisor answers after the exit.
  for (const auto& s : slow)
    status(sys, s);
  // Well inside the 5 s grace: a stop that held both threads would answer
  // only after it.
  caf::scoped_actor self{sys};
  bool answered = false;
  self->request(other, 2s, status_atom::value)
    .receive([&](std::int64_t, std::uint64_t) { answered = true; },
             [&](const caf::error& e) { ADD_FAILURE() << sys.render(e); });
  EXPECT_TRUE(answered) << "another actor answers while two engines take their grace period";
  for (auto pid : pids)
    EXPECT_TRUE(alive(static_cast<pid_t>(pid)))
      << "while the engines ignoring SIGTERM still run, in their grace period";
  for (const auto& s : slow)
    EXPECT_TRUE(ends_within(sys, s, 15s)) << "SIGKILL at the end of the grace period";
  for (auto pid : pids)
    EXPECT_FALSE(alive(static_cast<pid_t>(pid)));
  caf::anon_send_exit(other, caf::exit_reason::user_shutdown);
}

// vLLM's engine-core and worker processes are children of the engine, in
// its process group: when the engine is gone, none of them may still hold
// the GPU or a port.
TEST(engine_supervisor, nothing_of_a_stopped_engine_outlives_it) {
  auto child_file = temp_path("r9.child");
  std::remove(child_file.c_str());
  sys_config cfg;
  caf::actor_system sys{cfg};
  // A child that ignores SIGTERM (as a busy worker may), its pid recorded.
  auto s =
    sys.spawn(engine_supervisor,
              trapping_engine("r9", "exit 0",
                              "(trap '' TERM; exec sleep 30) & echo $! > " + child_file + "; "),
              mirror_actor{});
  kill_at_end guard{{s}};
  ASSERT_GT(running_pid(sys, s, "r9"), 0);
  pid_t child = 0;
  std::ifstream(child_file) >> child;
  ASSERT_GT(child, 0);
  EXPECT_TRUE(alive(child));
  caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
  EXPECT_TRUE(ends_within(sys, s, 10s));
  bool gone = test::eventually([&] { return !alive(child); }, 5s);
  EXPECT_TRUE(gone) << "the engine's child was stopped with it";
  if (!gone)
    kill(child, SIGKILL);
  std::remove(child_file.c_str());
}
