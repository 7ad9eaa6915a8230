// SIGTERM and SIGINT (stop) and SIGHUP (reload the topology), blocked in
// the calling thread before any other thread starts, so that every thread
// inherits the block and the main thread alone receives them (with sigwait
// or sigtimedwait on the returned set). Children started later unblock them
// (see actors/engine_supervisor.cpp).
#pragma once

#include <csignal>
#include <pthread.h>

namespace llmgw::apps {

inline sigset_t block_stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

} // namespace llmgw::apps
