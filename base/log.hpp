// llmgw's own logging (Debian's CAF is built with its logging compiled out).
// One line per message on stderr: time, level, who (actor or replica), text.
//   LLMGW_LOG(warning, "mirror " + replica, "hash mismatch: {}", why);
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <string>
#include <string_view>

namespace llmgw::log {

/// Severity, lowest first.
enum class level : int { debug = 0, info = 1, warning = 2, error = 3 };

/// Messages below this level are dropped. Set once at start-up.
inline std::atomic<int> threshold{static_cast<int>(level::info)};

/// Writes one line; use LLMGW_LOG, which skips formatting when filtered out.
void write(level lvl, std::string_view who, std::string_view text);

/// Text from the network or a peer, fit for a log line or an error message:
/// control bytes, non-ASCII and backslashes as \xNN (no forged lines, no
/// terminal escapes), cut after `max` bytes with "...".
std::string printable(std::string_view text, std::size_t max = 96);

} // namespace llmgw::log

#define LLMGW_LOG(lvl, who, ...)                                                                   \
  do {                                                                                             \
    if (static_cast<int>(::llmgw::log::level::lvl) >= ::llmgw::log::threshold.load())              \
      ::llmgw::log::write(::llmgw::log::level::lvl, (who), fmt::format(__VA_ARGS__));              \
  } while (false)
