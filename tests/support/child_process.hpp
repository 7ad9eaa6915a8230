// A child process for integration tests: started with pipes on stdin, stdout
// and stderr, read line by line with a deadline, stopped with a signal. Tests
// bound everything in time, so a hung child fails the test instead of CI.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

namespace llmgw::test {

class child_process {
public:
  /// Starts `argv[0]` with the given arguments.
  explicit child_process(const std::vector<std::string>& argv);
  ~child_process();
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  /// Writes to the child's stdin, then closes it.
  void write_stdin_and_close(const std::string& data);

  /// The next line of stdout (without '\n'), or nullopt at EOF or deadline.
  std::optional<std::string> read_stdout_line(std::chrono::milliseconds timeout);

  /// The next line of stderr, likewise.
  std::optional<std::string> read_stderr_line(std::chrono::milliseconds timeout);

  /// Everything left on stdout until EOF (or the deadline).
  std::string read_stdout_all(std::chrono::milliseconds timeout);

  /// Everything left on stderr, likewise.
  std::string read_stderr_all(std::chrono::milliseconds timeout);

  /// Sends a signal.
  void signal(int sig);

  /// The child's process id.
  pid_t pid() const noexcept { return pid_; }

  /// Waits for exit; the exit code, 128+signal, or nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);

private:
  std::optional<std::string> read_line(int fd, std::string& buffer,
                                       std::chrono::milliseconds timeout);

  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  int stderr_fd_ = -1;
  std::string stdout_buffer_;
  std::string stderr_buffer_;
  std::optional<int> exit_code_;
};

} // namespace llmgw::test
