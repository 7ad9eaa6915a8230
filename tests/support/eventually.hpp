// Waiting for a condition instead of sleeping: tests poll what they wait for,
// bounded in time, so a slow machine only makes them slower and a hung
// component fails the test instead of hanging CI.
#pragma once

#include <chrono>
#include <thread>

namespace llmgw::test {

/// True as soon as `done()` is, polling every `step`; false if it still is
/// not after `timeout`. `done` is called at least once, and once more at the
/// deadline.
template <class Predicate>
bool eventually(Predicate&& done, std::chrono::milliseconds timeout = std::chrono::seconds(10),
                std::chrono::milliseconds step = std::chrono::milliseconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return done();
    std::this_thread::sleep_for(step);
  }
  return true;
}

} // namespace llmgw::test
