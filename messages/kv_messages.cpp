#include "messages/kv_messages.hpp"

#include <fmt/format.h>

namespace llmgw {

std::string out_of_range_fields(const replica_update& u) {
  if (u.parity > static_cast<std::uint8_t>(kv::last_parity_state))
    return fmt::format("parity {} is no parity state", u.parity);
  for (const auto* list : {&u.added, &u.removed})
    for (const auto& b : *list)
      if (static_cast<std::uint8_t>(b.where) > static_cast<std::uint8_t>(kv::last_medium))
        return fmt::format("block {:016x} has medium {}, which is none", b.key,
                           static_cast<unsigned>(b.where));
  return {};
}

} // namespace llmgw
