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

/// A prompt to tokenize, both ways an engine may be asked.
struct tokenize_request {
  std::string model;
  std::string tokenize_body; ///< for POST /tokenize
  std::string render_path;   ///< the render endpoint of the request's kind
  std::string render_body;   ///< for it; also the token cache's key
};

/// What a tokenization gave: the tokens, or why there are none.
struct tokenize_reply {
  bool ok = false;
  std::vector<std::uint32_t> tokens;
  std::string error;
  std::string replica; ///< whose /tokenize answered
  double seconds = 0;  ///< time the HTTP call took (0 from the cache)
  bool cached = false;
  std::string method; ///< "render" or "tokenize": how the replica was asked
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
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::tokenize_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(llmgw::topology_reload)
