// What a reload of the topology (SIGHUP) may change while a node runs, and
// what changed. A node reads [cluster], [tls], [router] and [gateway] and its
// own listening addresses, certificate and roles once, as it starts; a file
// that changes any of those is refused whole (the topology in force stays)
// and the node must be restarted for it. Everything else takes effect live:
// engines and nodes added, removed or changed. An engine counts as changed
// when anything of its entry differs; a changed engine's state starts over,
// an unchanged one's is kept.
//
// `live_topology` is the topology in force, read by gateway threads and
// actors alike; a request holds the one it started with until it ends, so a
// reload never pulls a topology from under a request in flight.
#pragma once

#include "config/topology.hpp"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace llmgw::config {

/// Why `fresh` cannot replace `old` on node `node` without a restart, one
/// line per difference ("[router] differs", "node 'c1': http differs");
/// empty when it can.
std::vector<std::string> restart_needed(const topology& old, const topology& fresh,
                                        const std::string& node);

/// Whether two engine entries are the same in every field.
bool same_engine(const engine_spec& a, const engine_spec& b);

/// The engines (replica names) that differ between two topologies.
struct engine_changes {
  std::vector<std::string> added;   ///< in the new one only
  std::vector<std::string> removed; ///< in the old one only
  std::vector<std::string> changed; ///< in both, with a field or the owning node different
  bool empty() const { return added.empty() && removed.empty() && changed.empty(); }
  /// "added a, b; removed c; changed d" (or "no engine changed").
  std::string summary() const;
};

/// The engines of `old` and `fresh` compared, every node's.
engine_changes compare_engines(const topology& old, const topology& fresh);

/// The same, for `node`'s engines only (an agent's own).
engine_changes compare_engines(const topology& old, const topology& fresh, const std::string& node);

/// The topology in force on a node; safe to read from any thread.
class live_topology {
public:
  explicit live_topology(std::shared_ptr<const topology> t) : current_(std::move(t)) {}
  /// The topology in force now (hold it for as long as it is used).
  std::shared_ptr<const topology> get() const {
    std::lock_guard<std::mutex> g(mtx_);
    return current_;
  }
  /// Puts `t` in force.
  void set(std::shared_ptr<const topology> t) {
    std::lock_guard<std::mutex> g(mtx_);
    current_ = std::move(t);
  }

private:
  mutable std::mutex mtx_;
  std::shared_ptr<const topology> current_;
};

} // namespace llmgw::config
