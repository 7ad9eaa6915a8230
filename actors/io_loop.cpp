#include "actors/io_loop_impl.hpp"

#include <algorithm>

namespace llmgw {

io_loop::io_loop(std::size_t threads) : impl_(std::make_unique<impl>()) {
  for (std::size_t i = 0; i < std::max<std::size_t>(threads, 1); ++i)
    impl_->threads.emplace_back([io = &impl_->io] { io->run(); });
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
