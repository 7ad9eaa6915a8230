// Logging refusals once per burst, never per packet: a peer that sends a
// thousand bad messages a second must not write a thousand log lines (nor
// grow memory with the keys it makes up).
//
//   if (auto n = st.refusal_log.admit("impostor/agent-b"))
//     LLMGW_LOG(warning, who, "...{}", burst_note(n));
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

namespace llmgw {

/// Decides which events of a kind are logged: the first, then at most one
/// per period, which says how many were not logged since. Keys are bounded:
/// past max_keys, the table starts afresh (a few extra lines, never growth).
/// Thread-safe.
class burst_log {
public:
  using clock = std::chrono::steady_clock;

  explicit burst_log(std::chrono::milliseconds period = std::chrono::seconds(10),
                     std::size_t max_keys = 256)
    : period_(period), max_keys_(max_keys) {}

  /// 0: do not log this one. Otherwise log it: 1 + how many of this key
  /// went unlogged since the last line.
  std::uint64_t admit(const std::string& key, clock::time_point now = clock::now()) {
    std::lock_guard<std::mutex> g(mtx_);
    auto it = keys_.find(key);
    if (it == keys_.end()) {
      if (keys_.size() >= max_keys_)
        keys_.clear();
      keys_.emplace(key, entry{now, 0});
      return 1;
    }
    auto& e = it->second;
    if (now - e.last < period_) {
      ++e.suppressed;
      return 0;
    }
    auto n = e.suppressed + 1;
    e = entry{now, 0};
    return n;
  }

private:
  struct entry {
    clock::time_point last;
    std::uint64_t suppressed = 0;
  };
  std::chrono::milliseconds period_;
  std::size_t max_keys_;
  std::mutex mtx_;
  std::unordered_map<std::string, entry> keys_;
};

/// " (and N more like it since the last line)" for admit()'s n > 1, else "".
inline std::string burst_note(std::uint64_t n) {
  return n > 1 ? " (and " + std::to_string(n - 1) + " more like it since the last line)"
               : std::string{};
}

} // namespace llmgw
