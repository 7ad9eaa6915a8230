// Messages that stay inside one process: a decoded batch goes from the
// subscriber to its mirror as a shared pointer, never serialized.
#pragma once

#include "wire/kv_events.hpp"

#include <caf/allowed_unsafe_message_type.hpp>

#include <memory>
#include <vector>

namespace llmgw {

/// A decoded batch, shared read-only between the subscriber and its mirror.
using batch_ptr = std::shared_ptr<const wire::event_batch>;

/// Several decoded batches in seq order, as one message.
using batch_list = std::shared_ptr<const std::vector<wire::event_batch>>;

} // namespace llmgw

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::batch_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::batch_list)
