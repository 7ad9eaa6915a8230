#include "wire/node_port_guard.hpp"

#include "wire/metrics_text.hpp"

#include <algorithm>
#include <utility>

namespace llmgw::wire {

node_port_limits& node_port_settings() {
  static node_port_limits limits;
  return limits;
}

node_port_counts& node_port_counters() {
  static node_port_counts counts;
  return counts;
}

void append_node_port_metrics(metrics_text& m) {
  const auto& port = node_port_counters();
  for (auto [why, n] : {std::pair{"too_many_handshakes", port.handshakes_refused.load()},
                        {"handshake_timeout", port.handshakes_timed_out.load()},
                        {"payload_too_large", port.payloads_refused.load()}})
    m.counter("llmgw_node_port_refused_total",
              "Connections to or from the node (CAF) port closed below CAF, by reason.",
              static_cast<double>(n), {{"reason", why}});
  m.gauge("llmgw_node_port_pending_handshakes",
          "Connections to the node port in their TLS handshake now.",
          static_cast<double>(port.pending_handshakes.load()));
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
