// The agent's reader of its engines' own load. Every flush interval it GETs
// each engine's /metrics (one call per engine at a time, bounded in time and
// size) and keeps vLLM's scheduler gauges (wire::engine_gauges) in an
// engine_loads table; each forwarder reads the table when it flushes and
// sends what is fresh to its control node (load_report). The router adds
// that load to its cost, so every control node sees the same load,
// other gateways' traffic included.
#pragma once

#include "actors/interfaces.hpp"
#include "wire/engine_gauges.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace llmgw {

class http_client;

/// How reading an engine's /metrics ended: ok, connect (no answer), status
/// (not 200, or the answer broke off), parse (not vLLM's gauges), too_large.
enum class scrape_outcome : std::uint8_t { ok, connect, status, parse, too_large };
inline constexpr std::size_t scrape_outcome_count = 5;
const char* to_string(scrape_outcome o) noexcept;

/// The last load read of each engine of an agent node; any thread.
class engine_loads {
public:
  using clock = std::chrono::steady_clock;

  explicit engine_loads(std::vector<std::string> replicas);

  /// The engines read from now on (a reload): one still there keeps its
  /// reading and counts, others start unknown.
  void set_replicas(const std::vector<std::string>& replicas);

  /// `replica`'s engine reported `g` at `at`.
  void read(const std::string& replica, const wire::engine_gauges& g, clock::time_point at);
  /// A scrape of `replica`'s engine ended with `o` (ok after read()); true
  /// if the last one ended otherwise and the replica's last line in the log
  /// is 10 s old: worth a line (an engine that flips cannot flood the log).
  bool count(const std::string& replica, scrape_outcome o);

  /// Marks a scrape of `replica` started; false if one is in flight already.
  bool begin(const std::string& replica);
  void end(const std::string& replica);

  /// The readings no older than `max_age` at `now`, as load_report entries.
  std::vector<engine_load> fresh(clock::time_point now, std::chrono::milliseconds max_age) const;

  /// Per replica: scrapes by outcome (for the agent's /metrics).
  struct counts {
    std::string replica;
    std::uint64_t by_outcome[scrape_outcome_count] = {};
  };
  std::vector<counts> totals() const;

private:
  struct entry {
    std::string replica;
    bool in_flight = false;
    bool known = false;
    wire::engine_gauges gauges;
    clock::time_point at{};
    std::uint64_t by_outcome[scrape_outcome_count] = {};
    scrape_outcome last = scrape_outcome::ok;
    clock::time_point logged{};
    bool ever_logged = false;
  };
  entry* find(const std::string& replica);

  mutable std::mutex mtx_;
  std::vector<entry> entries_;
};

struct load_scraper_options {
  struct engine {
    std::string replica;
    std::string url; ///< the engine's HTTP base URL
  };
  std::vector<engine> engines;
  std::chrono::milliseconds interval{250}; ///< the flush interval, 100 ms at least
  std::chrono::milliseconds timeout{2000};
  std::size_t max_body_bytes = 8u << 20; ///< a /metrics body larger is refused
};

struct load_scraper_state {
  load_scraper_options opts;
  std::shared_ptr<engine_loads> loads;
  std::shared_ptr<http_client> client;
  static inline const char* name = "load-scraper";
};

/// Reads the engines' loads into `loads` until it exits.
load_scraper_actor::behavior_type
load_scraper(load_scraper_actor::stateful_pointer<load_scraper_state> self,
             load_scraper_options opts, std::shared_ptr<engine_loads> loads);

} // namespace llmgw
