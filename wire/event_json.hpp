// JSON renderings of decoded KV events, one object per event, with vLLM's
// field names and hashes as unsigned 64-bit decimals. Used by `llmgw events`
// and by tests that compare decoded captures.
#pragma once

#include "wire/kv_events.hpp"

#include <cstdint>
#include <string>

namespace llmgw::wire {

/// One event as a single-line JSON object: {"seq", "dp_rank", "type", fields...}.
/// Fields absent on the wire are rendered as null.
std::string event_to_json(std::uint64_t seq, const event_batch& batch, const kv_event& event);

} // namespace llmgw::wire
