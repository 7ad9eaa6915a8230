// Reading whole multipart ZMQ messages without blocking, as views that
// wire/zmq_message.hpp can split. Header-only; the one llmgw header that
// needs cppzmq: include it only where a ZMQ socket is read.
#pragma once

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <iterator>
#include <string_view>
#include <vector>

namespace llmgw {

/// Views of every part; valid while `parts` lives.
inline std::vector<std::string_view> views_of(const std::vector<zmq::message_t>& parts) {
  std::vector<std::string_view> out;
  out.reserve(parts.size());
  for (const auto& p : parts)
    out.emplace_back(static_cast<const char*>(p.data()), p.size());
  return out;
}

/// The next whole message if one is waiting; false when none is.
inline bool receive_now(zmq::socket_t& socket, std::vector<zmq::message_t>& parts) {
  parts.clear();
  return zmq::recv_multipart(socket, std::back_inserter(parts), zmq::recv_flags::dontwait)
    .has_value();
}

} // namespace llmgw
