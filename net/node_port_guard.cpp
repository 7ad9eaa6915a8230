#include "net/node_port_guard.hpp"

#include "base/log.hpp"
#include "config/node_identity.hpp"
#include "wire/metrics_text.hpp"

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>

namespace llmgw {

node_port_limits& node_port_settings() {
  static node_port_limits limits;
  return limits;
}

node_port_counts& node_port_counters() {
  static node_port_counts counts;
  return counts;
}

void append_node_port_metrics(wire::metrics_text& m) {
  const auto& port = node_port_counters();
  for (auto [why, n] : {std::pair{"too_many_handshakes", port.handshakes_refused.load()},
                        {"handshake_timeout", port.handshakes_timed_out.load()},
                        {"payload_too_large", port.payloads_refused.load()},
                        {"message", port.messages_refused.load()},
                        {"certificate", port.certificates_refused.load()}})
    m.counter("llmgw_node_port_refused_total",
              "Connections to or from the node (CAF) port closed below CAF, by reason.",
              static_cast<double>(n), {{"reason", why}});
  m.gauge("llmgw_node_port_pending_handshakes",
          "Connections to the node port in their TLS handshake now.",
          static_cast<double>(port.pending_handshakes.load()));
}

std::string check_node_certificate(const node_port_limits& limits, std::string_view der) {
  if (limits.nodes.empty())
    return {};
  auto name = config::certificate_cn(der);
  if (!name)
    return "the certificate names no node (no single subject CN)";
  auto it = limits.nodes.find(*name);
  if (it == limits.nodes.end())
    return "the certificate names '" + log::printable(*name) + "', no node of the topology";
  const auto& allowed = it->second;
  auto fingerprint = config::fingerprint_of(der);
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), fingerprint) == allowed.end())
    return "certificate " + fingerprint + " is not among node '" + *name + "''s fingerprints";
  return {};
}

namespace {
std::mutex& nodes_mutex() {
  static std::mutex m;
  return m;
}
} // namespace

void set_node_certificates(std::map<std::string, std::vector<std::string>> nodes) {
  std::lock_guard<std::mutex> g(nodes_mutex());
  node_port_settings().nodes = std::move(nodes);
}

bool node_certificates_checked() {
  std::lock_guard<std::mutex> g(nodes_mutex());
  return !node_port_settings().nodes.empty();
}

std::string check_node_certificate_now(std::string_view der) {
  std::lock_guard<std::mutex> g(nodes_mutex());
  return check_node_certificate(node_port_settings(), der);
}

void basp_frame_guard::refuse(verdict why, std::uint32_t length) {
  why_ = why;
  refused_ = length;
}

void basp_frame_guard::captured() {
  if (capture_is_handshake_)
    peer_node_ = capture_;
  else if (capture_ != peer_node_)
    refuse(verdict::forged_source, 0);
}

bool basp_frame_guard::feed(const unsigned char* data, std::size_t n) {
  while (n > 0 && why_ == verdict::ok) {
    if (payload_ > 0) {
      auto take = static_cast<std::size_t>(std::min<std::uint64_t>(payload_, n));
      if (capture_need_ > 0) { // gather the payload's first bytes
        take = std::min(take, capture_need_);
        capture_.append(reinterpret_cast<const char*>(data), take);
        capture_need_ -= take;
        if (capture_need_ == 0)
          captured();
      }
      payload_ -= take;
      data += take;
      n -= take;
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
    auto operation = header_[0];
    std::uint32_t length = (std::uint32_t{header_[4]} << 24) | (std::uint32_t{header_[5]} << 16)
                           | (std::uint32_t{header_[6]} << 8) | std::uint32_t{header_[7]};
    bool first = messages_++ == 0;
    if (length > (first ? max_first_ : max_)) {
      refuse(verdict::too_large, length);
      break;
    }
    if (first && operation > 1) {
      refuse(verdict::not_handshake, length);
      break;
    }
    if (operation == 3) {
      refuse(verdict::routed, length);
      break;
    }
    capture_.clear();
    capture_need_ = 0;
    capture_is_handshake_ = first;
    if (first || operation == 4 || operation == 5) {
      // A handshake names its node; a monitor or down message must name the
      // same one (one too short to name any is refused as well).
      capture_need_ = std::min<std::size_t>(node_bytes, length);
      if (!first && length < node_bytes) {
        refuse(verdict::forged_source, length);
        break;
      }
    }
    payload_ = length;
  }
  return why_ == verdict::ok;
}

} // namespace llmgw
