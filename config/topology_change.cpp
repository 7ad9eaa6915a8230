#include "config/topology_change.hpp"

#include <algorithm>
#include <tuple>

namespace llmgw::config {

namespace {

auto tied(const router_settings& r) {
  return std::tie(r.cpu_weight, r.storage_weight, r.tie_margin, r.prefill_ms_per_token, r.step_ms,
                  r.decode_ms_per_request, r.max_batched_tokens, r.speculative_ttl,
                  r.engine_load_max_age, r.distrust_shortfall_share, r.tier1_chunk_bytes,
                  r.tier1_capacity, r.tier1_ttl, r.tokenize_timeout, r.tokenize_cache_entries,
                  r.tokenize_cache_mib, r.canary_timeout, r.canary_retry);
}

auto tied(const gateway_settings& g) {
  return std::tie(g.max_body_bytes, g.max_buffered_body_mib, g.max_header_bytes, g.read_timeout,
                  g.idle_timeout, g.request_timeout, g.connect_timeout, g.first_byte_timeout,
                  g.max_connections, g.max_connections_per_client, g.max_attempts, g.down_for,
                  g.health_interval, g.health_timeout, g.drain_timeout, g.threads);
}

auto tied_cluster(const topology& t) {
  return std::tie(t.name, t.seed, t.block_size, t.flush_interval, t.heartbeat, t.connection_timeout,
                  t.check_agent_address, t.tls_handshake_timeout, t.max_pending_handshakes);
}

auto tied(const engine_spec& e) {
  return std::tie(e.replica, e.model, e.url, e.lora, e.kv_events, e.events_port, e.events, e.topic,
                  e.dp_size, e.launch, e.replay, e.replay_endpoint, e.translate_keys, e.kind);
}

/// Every engine of `t` (of node `only` when set) with its owner's name.
std::vector<std::pair<const engine_spec*, const std::string*>> engines_of(const topology& t,
                                                                          const std::string* only) {
  std::vector<std::pair<const engine_spec*, const std::string*>> out;
  for (const auto& n : t.nodes)
    if (!only || n.name == *only)
      for (const auto& e : n.engines)
        out.emplace_back(&e, &n.name);
  return out;
}

engine_changes compare(const topology& old, const topology& fresh, const std::string* only) {
  engine_changes out;
  auto before = engines_of(old, only);
  auto after = engines_of(fresh, only);
  auto find = [](const auto& list, const std::string& replica) {
    return std::find_if(list.begin(), list.end(),
                        [&](const auto& p) { return p.first->replica == replica; });
  };
  for (const auto& [e, owner] : before) {
    auto it = find(after, e->replica);
    if (it == after.end())
      out.removed.push_back(e->replica);
    else if (*it->second != *owner || !same_engine(*e, *it->first))
      out.changed.push_back(e->replica);
  }
  for (const auto& [e, owner] : after)
    if (find(before, e->replica) == before.end())
      out.added.push_back(e->replica);
  return out;
}

} // namespace

bool same_engine(const engine_spec& a, const engine_spec& b) {
  return tied(a) == tied(b);
}

std::vector<std::string> restart_needed(const topology& old, const topology& fresh,
                                        const std::string& node) {
  std::vector<std::string> out;
  if (tied_cluster(old) != tied_cluster(fresh))
    out.emplace_back("[cluster] differs");
  if (old.ca != fresh.ca || old.plaintext != fresh.plaintext)
    out.emplace_back("[tls] differs");
  if (tied(old.router) != tied(fresh.router))
    out.emplace_back("[router] differs");
  if (tied(old.gateway) != tied(fresh.gateway))
    out.emplace_back("[gateway] differs");
  const auto* a = old.find_node(node);
  const auto* b = fresh.find_node(node);
  if (!a || !b) {
    out.emplace_back("node '" + node + "' is no longer in the file");
    return out;
  }
  auto differs = [&](bool d, const char* what) {
    if (d)
      out.emplace_back("node '" + node + "': " + what + " differs");
  };
  differs(a->host != b->host || a->port != b->port, "host or port");
  differs(a->roles.agent != b->roles.agent || a->roles.control != b->roles.control, "roles");
  differs(a->http_host != b->http_host || a->http_port != b->http_port, "http");
  differs(a->admin_host != b->admin_host || a->admin_port != b->admin_port, "admin");
  differs(a->cert != b->cert || a->key != b->key, "cert or key");
  return out;
}

std::string engine_changes::summary() const {
  std::string out;
  auto part = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty())
      return;
    if (!out.empty())
      out += "; ";
    out += what;
    for (std::size_t i = 0; i < names.size(); ++i)
      out += (i == 0 ? " " : ", ") + names[i];
  };
  part("added", added);
  part("removed", removed);
  part("changed", changed);
  return out.empty() ? "no engine changed" : out;
}

engine_changes compare_engines(const topology& old, const topology& fresh) {
  return compare(old, fresh, nullptr);
}

engine_changes compare_engines(const topology& old, const topology& fresh,
                               const std::string& node) {
  return compare(old, fresh, &node);
}

} // namespace llmgw::config
