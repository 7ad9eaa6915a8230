#include "tests/support/child_process.hpp"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <functional>
#include <poll.h>
#include <stdexcept>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace llmgw::test {

child_process::child_process(const std::vector<std::string>& argv) {
  // Node processes stopped by a signal moments after connecting to each
  // other trip over a leak inside CAF (scripts/lsan-nodes.supp says which).
  // The environment is built here: between fork and exec in a process with
  // threads, only async-signal-safe calls (no setenv, no malloc).
  std::vector<std::string> env;
  bool has_lsan = false;
  for (char** e = environ; *e; ++e) {
    env.emplace_back(*e);
    has_lsan = has_lsan || env.back().rfind("LSAN_OPTIONS=", 0) == 0;
  }
  if (!has_lsan)
    env.emplace_back("LSAN_OPTIONS=suppressions=" LLMGW_SOURCE_DIR "/scripts/lsan-nodes.supp");
  std::vector<char*> envp;
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (const auto& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int in[2];
  int out[2];
  int err[2];
  if (pipe(in) != 0 || pipe(out) != 0 || pipe(err) != 0)
    throw std::runtime_error("pipe failed");
  pid_ = fork();
  if (pid_ < 0)
    throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]})
      close(fd);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  stdin_fd_ = in[1];
  stdout_fd_ = out[0];
  stderr_fd_ = err[0];
}

child_process::~child_process() {
  if (pid_ > 0 && !exit_code_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  for (int fd : {stdin_fd_, stdout_fd_, stderr_fd_})
    if (fd >= 0)
      close(fd);
}

void child_process::write_stdin_and_close(const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    auto n = write(stdin_fd_, data.data() + done, data.size() - done);
    if (n <= 0)
      break;
    done += static_cast<std::size_t>(n);
  }
  close(stdin_fd_);
  stdin_fd_ = -1;
}

std::optional<std::string> child_process::read_line(int fd, std::string& buffer,
                                                    std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto nl = buffer.find('\n');
    if (nl != std::string::npos) {
      auto line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0)
      continue;
    char buf[4096];
    auto n = read(fd, buf, sizeof buf);
    if (n <= 0) {
      if (buffer.empty())
        return std::nullopt;
      auto line = buffer;
      buffer.clear();
      return line;
    }
    buffer.append(buf, static_cast<std::size_t>(n));
  }
}

std::optional<std::string> child_process::read_stdout_line(std::chrono::milliseconds timeout) {
  return read_line(stdout_fd_, stdout_buffer_, timeout);
}

std::optional<std::string> child_process::read_stderr_line(std::chrono::milliseconds timeout) {
  return read_line(stderr_fd_, stderr_buffer_, timeout);
}

namespace {

std::string read_all(const std::function<std::optional<std::string>()>& next_line) {
  std::string all;
  while (auto line = next_line())
    all += *line + "\n";
  return all;
}

} // namespace

std::string child_process::read_stdout_all(std::chrono::milliseconds timeout) {
  return read_all([&] { return read_stdout_line(timeout); });
}

std::string child_process::read_stderr_all(std::chrono::milliseconds timeout) {
  return read_all([&] { return read_stderr_line(timeout); });
}

void child_process::signal(int sig) {
  if (pid_ > 0 && !exit_code_)
    kill(pid_, sig);
}

std::optional<int> child_process::wait(std::chrono::milliseconds timeout) {
  if (exit_code_)
    return exit_code_;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    auto r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    usleep(10000);
  }
  return std::nullopt;
}

} // namespace llmgw::test
