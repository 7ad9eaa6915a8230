// Messages that stay inside one process, never serialized: decoded batches
// go from the subscriber to its mirror as a shared pointer, and the
// tokenizer answers the gateway with a tokenize_reply.
#pragma once

#include "wire/kv_events.hpp"

#include <caf/allowed_unsafe_message_type.hpp>

#include <memory>
#include <string>
#include <vector>

namespace llmgw {

/// What a tokenization gave: the tokens, or why there are none.
struct tokenize_reply {
  bool ok = false;
  std::vector<std::uint32_t> tokens;
  std::string error;
  std::string replica; ///< whose /tokenize answered
  double seconds = 0;  ///< time the HTTP call took (0 from the cache)
  bool cached = false;
};

/// The decoded batches of one poll in seq order, shared read-only between
/// the subscriber and its mirror.
using batch_list = std::shared_ptr<const std::vector<wire::event_batch>>;

} // namespace llmgw

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::batch_list)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::tokenize_reply)
