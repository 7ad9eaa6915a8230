#include "wire/node_port_guard.hpp"

#include <algorithm>

namespace llmgw::wire {

node_port_limits& node_port_settings() {
  static node_port_limits limits;
  return limits;
}

node_port_counts& node_port_counters() {
  static node_port_counts counts;
  return counts;
}

bool basp_frame_guard::feed(const unsigned char* data, std::size_t n) {
  while (n > 0 && !failed_) {
    if (payload_ > 0) { // inside a payload: skip it
      auto skip = static_cast<std::size_t>(std::min<std::uint64_t>(payload_, n));
      payload_ -= skip;
      data += skip;
      n -= skip;
      continue;
    }
    auto take = std::min(n, sizeof header_ - have_);
    std::copy(data, data + take, header_ + have_);
    have_ += take;
    data += take;
    n -= take;
    if (have_ < sizeof header_)
      break;
    have_ = 0;
    std::uint32_t length = (std::uint32_t{header_[4]} << 24) | (std::uint32_t{header_[5]} << 16)
                           | (std::uint32_t{header_[6]} << 8) | std::uint32_t{header_[7]};
    auto limit = messages_++ == 0 ? max_first_ : max_;
    if (length > limit) {
      refused_ = length;
      failed_ = true;
      break;
    }
    payload_ = length;
  }
  return !failed_;
}

} // namespace llmgw::wire
