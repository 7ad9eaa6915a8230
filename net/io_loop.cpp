#include "net/io_loop_impl.hpp"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace llmgw {

namespace {
thread_local io_loop* running = nullptr;
} // namespace

io_loop::io_loop(std::size_t threads, const char* name) : impl_(std::make_unique<impl>(threads)) {
  for (std::size_t i = 0; i < std::max<std::size_t>(threads, 1); ++i) {
    impl_->threads.emplace_back([this, io = &impl_->io] {
      running = this;
      io->run();
    });
    std::string shown(name, std::min<std::size_t>(std::strlen(name), 15));
    pthread_setname_np(impl_->threads.back().native_handle(), shown.c_str());
  }
}

io_loop* io_loop::current() noexcept {
  return running;
}

io_loop::~io_loop() {
  stop();
}

void io_loop::stop() {
  if (impl_->stopped.exchange(true))
    return;
  impl_->work.reset();
  impl_->io.stop();
  for (auto& t : impl_->threads)
    if (t.joinable() && t.get_id() != std::this_thread::get_id())
      t.join();
}

std::size_t io_loop::threads() const noexcept {
  return impl_->threads.size();
}

} // namespace llmgw
