// Decoded batches as the actor tests hand them to a mirror: one at a time,
// each sent as the one-batch list a subscriber would send.
#pragma once

#include "messages/local_messages.hpp"

#include <memory>
#include <vector>

namespace llmgw::test {

using batch_ptr = std::shared_ptr<const wire::event_batch>;

/// `b` as the message a subscriber sends after a poll that read one batch.
inline batch_list one_batch(const batch_ptr& b) {
  return std::make_shared<const std::vector<wire::event_batch>>(1, *b);
}

} // namespace llmgw::test
