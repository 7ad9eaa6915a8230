// Messages that stay inside one process: a decoded batch goes from the
// subscriber to its mirror as a shared pointer, and routing queries and
// decisions go between the gateway and the router; none is serialized.
#pragma once

#include "routing/router_core.hpp"
#include "wire/kv_events.hpp"

#include <caf/allowed_unsafe_message_type.hpp>

#include <memory>
#include <string>
#include <vector>

namespace llmgw {

/// A decoded batch, shared read-only between the subscriber and its mirror.
using batch_ptr = std::shared_ptr<const wire::event_batch>;

/// What a tokenization gave: the tokens, or why there are none.
struct tokenize_reply {
  bool ok = false;
  std::vector<std::uint32_t> tokens;
  std::string error;
  std::string replica; ///< whose /tokenize answered
  double seconds = 0;  ///< time the HTTP call took (0 from the cache)
  bool cached = false;
};

/// Several decoded batches in seq order, as one message.
using batch_list = std::shared_ptr<const std::vector<wire::event_batch>>;

} // namespace llmgw

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::batch_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::batch_list)
// The gateway and its router share a process: queries and decisions are
// passed as values, never serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::routing::route_query)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::routing::route_decision)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::tokenize_reply)
