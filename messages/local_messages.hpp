// Messages that stay inside one process, never serialized: decoded batches
// go from the subscriber to its mirror as a shared pointer, and the
// tokenizer answers the gateway with a tokenize_reply; a reloaded topology
// goes to a control node's actors.
#pragma once

#include "wire/kv_events.hpp"

#include <caf/allowed_unsafe_message_type.hpp>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace llmgw {

namespace config {
struct topology;
} // namespace config

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

/// A reloaded topology (SIGHUP), put in force on a control node's actors.
struct topology_reload {
  std::shared_ptr<const config::topology> topo;
  /// For the control actor: each agent node's resolved addresses
  /// (control_options::agent_addresses), looked up before it is sent.
  std::map<std::string, std::set<std::string>> agent_addresses;
};

} // namespace llmgw

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::batch_list)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::tokenize_reply)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::topology_reload)
