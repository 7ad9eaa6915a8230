#include "messages/kv_messages.hpp"

#include "base/log.hpp"
#include "wire/engine_gauges.hpp"

#include <fmt/format.h>

#include <set>

namespace llmgw {

std::string out_of_range_fields(const replica_update& u) {
  if (u.parity > static_cast<std::uint8_t>(kv::last_parity_state))
    return fmt::format("parity {} is no parity state", u.parity);
  if (u.parity_reason.size() > max_parity_reason)
    return fmt::format("a parity reason of {} bytes (at most {})", u.parity_reason.size(),
                       max_parity_reason);
  for (const auto* list : {&u.added, &u.removed})
    for (const auto& b : *list)
      if (static_cast<std::uint8_t>(b.where) > static_cast<std::uint8_t>(kv::last_medium))
        return fmt::format("block {:016x} has medium {}, which is none", b.key,
                           static_cast<unsigned>(b.where));
  return {};
}

std::string out_of_range_fields(const load_report& r) {
  std::set<std::string_view> seen;
  for (const auto& l : r.loads) {
    if (!seen.insert(l.replica).second)
      return fmt::format("replica '{}' is named twice", log::printable(l.replica, 100));
    if (l.running > wire::max_engine_requests || l.waiting > wire::max_engine_requests)
      return fmt::format("replica '{}': {} running and {} waiting requests, more than {}",
                         log::printable(l.replica, 100), l.running, l.waiting,
                         wire::max_engine_requests);
    if (l.kv_usage_permille < -1 || l.kv_usage_permille > 1000)
      return fmt::format("replica '{}': KV cache usage {} is not -1 or 0..1000 permille",
                         log::printable(l.replica, 100), l.kv_usage_permille);
    if (l.age_ms > max_load_age_ms)
      return fmt::format("replica '{}': a reading {} ms old (at most {})",
                         log::printable(l.replica, 100), l.age_ms, max_load_age_ms);
  }
  return {};
}

} // namespace llmgw
