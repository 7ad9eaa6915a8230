#include "config/topology.hpp"

#include "config/node_identity.hpp"
#include "wire/address.hpp"

#include <fmt/format.h>
#include <toml.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string_view>
#include <sys/stat.h>
#include <unistd.h>

namespace llmgw::config {

const node_spec* topology::find_node(const std::string& node_name) const {
  for (const auto& n : nodes)
    if (n.name == node_name)
      return &n;
  return nullptr;
}

const node_spec* topology::owner_of(const std::string& replica) const {
  for (const auto& n : nodes)
    for (const auto& e : n.engines)
      if (e.replica == replica)
        return &n;
  return nullptr;
}

bool serves(const std::string& model, const std::vector<std::string>& lora,
            const std::string& name) {
  return name == model || std::find(lora.begin(), lora.end(), name) != lora.end();
}

const char* to_string(engine_kind kind) noexcept {
  switch (kind) {
  case engine_kind::vllm:
    return "vllm";
  case engine_kind::sglang:
    return "sglang";
  case engine_kind::trtllm:
    return "trtllm";
  }
  return "unknown";
}

const char* block_size_flag(engine_kind kind) noexcept {
  switch (kind) {
  case engine_kind::vllm:
    return "--block-size";
  case engine_kind::sglang:
    return "--page-size";
  case engine_kind::trtllm:
    return "kv_cache_config.tokens_per_block:";
  }
  return "--block-size";
}

wire::event_dialect dialect_of(engine_kind kind) noexcept {
  switch (kind) {
  case engine_kind::vllm:
    return wire::event_dialect::vllm;
  case engine_kind::sglang:
    return wire::event_dialect::sglang;
  case engine_kind::trtllm:
    return wire::event_dialect::trtllm;
  }
  return wire::event_dialect::vllm;
}

std::vector<std::string> events_notes(const engine_spec& e) {
  std::vector<std::string> out;
  if (!e.kv_events || !e.launch.empty())
    return out;
  auto ranks =
    e.dp_size > 1 ? fmt::format(" (rank r at port + r, {} ranks)", e.dp_size) : std::string{};
  if (!e.events.empty()) {
    if (e.kind == engine_kind::sglang)
      out.push_back(fmt::format(
        "kv events: the agent connects to {}{}; SGLang must bind there, as it does for its "
        "default endpoint tcp://*:5557 and, since 2026, for tcp://0.0.0.0:PORT "
        "(tcp://127.0.0.1:5557 makes it connect out instead, and nothing arrives); under "
        "attention DP the port is offset by the attention-DP rank, else by the DP rank",
        e.events, ranks));
    else if (e.kind == engine_kind::trtllm)
      out.push_back(fmt::format(
        "kv events: the agent connects to {}{}, where TensorRT-LLM's ZMQ publisher binds (it "
        "always binds; its ranks at base port + global rank). Its releases' other path, "
        "polling POST /kv_cache_events, is not read by llmgw",
        e.events, ranks));
    else
      out.push_back(fmt::format(
        "kv events: the agent connects to {}{}; the engine must bind there, as vLLM does for "
        "its default endpoint tcp://*:5557 (an endpoint naming a host, tcp://127.0.0.1:5557 or "
        "tcp://0.0.0.0:5557, makes vLLM connect out instead, and nothing arrives)",
        e.events, ranks));
    auto at = wire::parse_tcp_endpoint(e.events);
    if (at && !wire::is_loopback(at->host))
      out.push_back(fmt::format(
        "warning: {}'s KV events come from {} across the network in plaintext and "
        "unauthenticated: whoever can reach that port reads its prompts' token ids, and "
        "whoever can answer for that address feeds its mirror; run the agent on the engine's "
        "host or in its pod (SECURITY.md)",
        e.replica, at->host));
  } else {
    out.push_back(fmt::format(
      "kv events: the agent binds tcp://127.0.0.1:{}{}; start the engine with an endpoint that "
      "connects there, --kv-events-config '{{\"endpoint\": \"tcp://127.0.0.1:{}\", ...}}' "
      "(vLLM binds only for '*', '::', ipc:// and inproc://, so its default tcp://*:5557 would "
      "not meet the agent: for an engine that binds, set events = \"tcp://HOST:PORT\")",
      e.events_port, ranks, e.events_port));
  }
  if (e.kind != engine_kind::vllm && !e.lora.empty())
    out.push_back(fmt::format(
      "warning: {} publishes no LoRA adapter with its blocks: {}'s adapter blocks are keyed as "
      "its base model's, and the router may predict hits for base-model prompts there that "
      "the engine does not have (docs/vllm.md, \"Other engines\")",
      to_string(e.kind), e.replica));
  if (!e.replay_endpoint.empty()) {
    auto at = wire::parse_tcp_endpoint(e.replay_endpoint);
    if (at && !wire::is_loopback(at->host))
      out.push_back(fmt::format("warning: {}'s replay endpoint {} is reached across the network "
                                "in plaintext and unauthenticated",
                                e.replica, e.replay_endpoint));
  }
  return out;
}

bool topology::is_adapter(const std::string& name) const {
  for (const auto& n : nodes)
    for (const auto& e : n.engines)
      if (std::find(e.lora.begin(), e.lora.end(), name) != e.lora.end())
        return true;
  return false;
}

const engine_spec* topology::find_engine(const std::string& replica) const {
  for (const auto& n : nodes)
    for (const auto& e : n.engines)
      if (e.replica == replica)
        return &e;
  return nullptr;
}

std::vector<const node_spec*> topology::controls() const {
  std::vector<const node_spec*> out;
  for (const auto& n : nodes)
    if (n.roles.control)
      out.push_back(&n);
  return out;
}

std::string config_problem::to_string() const {
  if (line == 0)
    return fmt::format("{}: {}", file, message);
  return fmt::format("{}:{}:{}: {}", file, line, column, message);
}

namespace {

using table = toml::table;

/// Collects problems while walking the document; never stops at the first.
class checker {
public:
  explicit checker(std::string file, std::string folder)
    : file_(std::move(file)), folder_(std::move(folder)) {}

  std::vector<config_problem> problems;

  void problem(const toml::value& where, std::string message) {
    auto loc = where.location();
    problems.push_back({file_, static_cast<std::uint32_t>(loc.line()),
                        static_cast<std::uint32_t>(loc.column()), std::move(message)});
  }

  void problem(std::string message) { problems.push_back({file_, 0, 0, std::move(message)}); }

  /// Reports keys of `t` (named `what`) that are not in `known`.
  void only_keys(const toml::value& t, const std::string& what,
                 std::initializer_list<const char*> known) {
    for (const auto& entry : t.as_table()) {
      const auto& key = entry.first;
      const auto& value = entry.second;
      bool ok = std::any_of(known.begin(), known.end(), [&](const char* k) { return key == k; });
      if (!ok) {
        std::string list;
        for (const char* k : known)
          list += (list.empty() ? "" : ", ") + std::string(k);
        problem(value, fmt::format("unknown key '{}' in {} (known: {})", key, what, list));
      }
    }
  }

  /// The value at `key` when it is present and of the right kind.
  const toml::value* find(const toml::value& t, const std::string& key) {
    const auto& tab = t.as_table();
    auto it = tab.find(key);
    return it == tab.end() ? nullptr : &it->second;
  }

  void read(const toml::value& t, const std::string& what, const std::string& key, std::string& out,
            bool required) {
    auto* v = find(t, key);
    if (!v) {
      if (required)
        problem(t, fmt::format("{} needs '{}' (a string)", what, key));
      return;
    }
    if (!v->is_string()) {
      problem(*v, fmt::format("{}.{} must be a string, not {}", what, key, type_name(*v)));
      return;
    }
    out = v->as_string().str;
    if (required && out.empty())
      problem(*v, fmt::format("{}.{} must not be empty", what, key));
  }

  void read(const toml::value& t, const std::string& what, const std::string& key, bool& out) {
    auto* v = find(t, key);
    if (!v)
      return;
    if (!v->is_boolean()) {
      problem(*v, fmt::format("{}.{} must be true or false, not {}", what, key, type_name(*v)));
      return;
    }
    out = v->as_boolean();
  }

  /// An integer in [lo, hi]; returns whether the key was present and valid.
  bool read_int(const toml::value& t, const std::string& what, const std::string& key,
                std::int64_t lo, std::int64_t hi, std::int64_t& out, bool required = false) {
    auto* v = find(t, key);
    if (!v) {
      if (required)
        problem(t, fmt::format("{} needs '{}' (an integer)", what, key));
      return false;
    }
    if (!v->is_integer()) {
      problem(*v, fmt::format("{}.{} must be an integer, not {}", what, key, type_name(*v)));
      return false;
    }
    auto x = v->as_integer();
    if (x < lo || x > hi) {
      problem(*v, fmt::format("{}.{} = {} is out of range [{}, {}]", what, key, x, lo, hi));
      return false;
    }
    out = x;
    return true;
  }

  template <class T>
  void read_number(const toml::value& t, const std::string& what, const std::string& key,
                   std::int64_t lo, std::int64_t hi, T& out, bool required = false) {
    std::int64_t x = 0;
    if (read_int(t, what, key, lo, hi, x, required))
      out = static_cast<T>(x);
  }

  void read_ms(const toml::value& t, const std::string& what, const std::string& key,
               std::int64_t lo, std::int64_t hi, std::chrono::milliseconds& out) {
    std::int64_t x = 0;
    if (read_int(t, what, key, lo, hi, x))
      out = std::chrono::milliseconds(x);
  }

  void read_fraction(const toml::value& t, const std::string& what, const std::string& key,
                     double& out) {
    read_real(t, what, key, 0, 1, out);
  }

  /// A number (integer or not) in [lo, hi].
  void read_real(const toml::value& t, const std::string& what, const std::string& key, double lo,
                 double hi, double& out) {
    auto* v = find(t, key);
    if (!v)
      return;
    double x = 0;
    if (v->is_floating())
      x = v->as_floating();
    else if (v->is_integer())
      x = static_cast<double>(v->as_integer());
    else {
      problem(*v, fmt::format("{}.{} must be a number, not {}", what, key, type_name(*v)));
      return;
    }
    if (!(x >= lo && x <= hi)) {
      problem(*v, fmt::format("{}.{} = {} must be between {} and {}", what, key, x, lo, hi));
      return;
    }
    out = x;
  }

  void read_strings(const toml::value& t, const std::string& what, const std::string& key,
                    std::vector<std::string>& out) {
    auto* v = find(t, key);
    if (!v)
      return;
    if (!v->is_array()) {
      problem(*v,
              fmt::format("{}.{} must be an array of strings, not {}", what, key, type_name(*v)));
      return;
    }
    for (const auto& item : v->as_array()) {
      if (!item.is_string()) {
        problem(item, fmt::format("{}.{}: every element must be a string, not {}", what, key,
                                  type_name(item)));
        continue;
      }
      if (item.as_string().str.empty()) {
        problem(item, fmt::format("{}.{}: empty string", what, key));
        continue;
      }
      out.push_back(item.as_string().str);
    }
  }

  /// A path relative to the topology file's folder.
  std::string resolve(const std::string& p) const {
    if (p.empty() || p[0] == '/' || folder_.empty())
      return p;
    return folder_ + "/" + p;
  }

  static const char* type_name(const toml::value& v) {
    switch (v.type()) {
    case toml::value_t::boolean:
      return "a boolean";
    case toml::value_t::integer:
      return "an integer";
    case toml::value_t::floating:
      return "a float";
    case toml::value_t::string:
      return "a string";
    case toml::value_t::array:
      return "an array";
    case toml::value_t::table:
      return "a table";
    case toml::value_t::empty:
      return "nothing";
    default:
      return "a date or time";
    }
  }

private:
  std::string file_;
  std::string folder_;
};

bool valid_name(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

/// "host:port" into `host` and `port`; false if it is not one.
bool split_host_port(const std::string& s, std::string& host, std::uint16_t& port) {
  auto hp = wire::parse_host_port(s);
  if (!hp)
    return false;
  host = std::move(hp->host);
  port = hp->port;
  return true;
}

/// What toml11 cannot parse safely or in time, with where it first is:
/// arrays and inline tables nested deeper than max_topology_nesting (its
/// parser recurses once per level: 100k levels overflowed its stack), and a
/// line with more than max_topology_dots dots outside strings (dotted keys:
/// its time grows with their square, 200k parts took minutes). Brackets and
/// dots in strings and comments do not count.
std::optional<config_problem> too_complex(std::string_view text, const std::string& path) {
  // TOML is UTF-8, and toml11 reads past the end of a literal string that
  // holds an invalid sequence (a heap overread the fuzzer found): checked
  // first, byte by byte.
  {
    std::uint32_t line = 1, column = 0;
    for (std::size_t i = 0; i < text.size();) {
      auto c = static_cast<unsigned char>(text[i]);
      ++column;
      std::size_t len = c < 0x80         ? 1
                        : (c >> 5) == 6  ? 2
                        : (c >> 4) == 14 ? 3
                        : (c >> 3) == 30 ? 4
                                         : 0;
      bool ok = len != 0 && i + len <= text.size();
      for (std::size_t k = 1; ok && k < len; ++k)
        ok = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
      if (ok && len == 2)
        ok = c >= 0xc2; // no overlong forms
      if (ok && len == 3) {
        auto c1 = static_cast<unsigned char>(text[i + 1]);
        ok = (c != 0xe0 || c1 >= 0xa0) && (c != 0xed || c1 < 0xa0); // overlong, surrogates
      }
      if (ok && len == 4) {
        auto c1 = static_cast<unsigned char>(text[i + 1]);
        ok = c <= 0xf4 && (c != 0xf0 || c1 >= 0x90) && (c != 0xf4 || c1 < 0x90);
      }
      if (!ok)
        return config_problem{path, line, column, "not UTF-8 here (a topology is UTF-8 text)"};
      if (c == '\n') {
        ++line;
        column = 0;
      }
      i += len;
    }
  }
  std::size_t depth = 0, dots = 0;
  std::uint32_t line = 1, column = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char ch = text[i];
    ++column;
    if (ch == '\n') {
      ++line;
      column = 0;
      dots = 0;
    } else if (ch == '.') {
      if (++dots > max_topology_dots)
        return config_problem{path, line, column,
                              fmt::format("more than {} dots outside strings on one line "
                                          "(dotted keys that long are not a topology)",
                                          max_topology_dots)};
    } else if (ch == '#') { // a comment, to the end of the line
      while (i + 1 < text.size() && text[i + 1] != '\n')
        ++i;
    } else if (ch == '"' || ch == '\'') {
      bool multi = text.compare(i, 3, std::string(3, ch)) == 0;
      bool basic = ch == '"';
      i += multi ? 3 : 1;
      for (; i < text.size(); ++i) { // to the closing quote(s)
        if (text[i] == '\n') {
          ++line;
          column = 0;
          if (!multi)
            break; // an unterminated string: toml11 reports it
        }
        if (basic && text[i] == '\\') {
          ++i;
          continue;
        }
        if (text[i] == ch && (!multi || text.compare(i, 3, std::string(3, ch)) == 0)) {
          i += multi ? 2 : 0;
          break;
        }
      }
    } else if (ch == '[' || ch == '{') {
      if (++depth > max_topology_nesting)
        return config_problem{
          path, line, column,
          fmt::format("arrays and inline tables nest deeper than {} here", max_topology_nesting)};
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

/// PYTHONHASHSEED as vLLM accepts it for reproducible hashes: 0..4294967295.
bool valid_seed(const std::string& s) {
  if (s.empty() || s.size() > 10 || !std::all_of(s.begin(), s.end(), ::isdigit))
    return false;
  return std::stoull(s) <= 4294967295ull;
}

void read_cluster(checker& c, const toml::value& doc, topology& out) {
  auto* cl = c.find(doc, "cluster");
  if (!cl) {
    c.problem("missing [cluster] (name, hash_seed, block_size)");
    return;
  }
  if (!cl->is_table()) {
    c.problem(*cl, "cluster must be a table");
    return;
  }
  c.only_keys(*cl, "[cluster]",
              {"name", "hash_seed", "block_size", "flush_interval_ms", "heartbeat_ms",
               "connection_timeout_ms", "check_agent_address", "tls_handshake_timeout_ms",
               "max_pending_handshakes"});
  c.read(*cl, "[cluster]", "name", out.name, true);
  auto* seed = c.find(*cl, "hash_seed");
  if (seed && seed->is_integer())
    c.problem(*seed, "cluster.hash_seed must be a string (PYTHONHASHSEED is text): write \""
                       + std::to_string(seed->as_integer()) + "\"");
  else {
    c.read(*cl, "[cluster]", "hash_seed", out.seed, true);
    if (!out.seed.empty() && !valid_seed(out.seed))
      c.problem(*seed, fmt::format("cluster.hash_seed '{}' must be a decimal integer in [0, "
                                   "4294967295] (\"random\" cannot be matched outside vLLM)",
                                   out.seed));
  }
  c.read_number(*cl, "cluster", "block_size", 1, 4096, out.block_size, true);
  c.read_ms(*cl, "cluster", "flush_interval_ms", 10, 60000, out.flush_interval);
  c.read_ms(*cl, "cluster", "heartbeat_ms", 100, 60000, out.heartbeat);
  c.read_ms(*cl, "cluster", "connection_timeout_ms", 200, 600000, out.connection_timeout);
  c.read(*cl, "[cluster]", "check_agent_address", out.check_agent_address);
  c.read_ms(*cl, "cluster", "tls_handshake_timeout_ms", 100, 600000, out.tls_handshake_timeout);
  c.read_number(*cl, "cluster", "max_pending_handshakes", 1, 100000, out.max_pending_handshakes);
  if (out.connection_timeout <= 2 * out.heartbeat)
    c.problem(*cl, fmt::format("cluster.connection_timeout_ms ({}) must exceed twice heartbeat_ms "
                               "({}), or healthy peers are dropped",
                               out.connection_timeout.count(), out.heartbeat.count()));
}

void read_tls(checker& c, const toml::value& doc, topology& out, bool check_files) {
  auto* tls = c.find(doc, "tls");
  if (!tls) {
    c.problem("missing [tls]: set ca = \"ca.pem\" (and cert/key per node), or plaintext = true "
              "for a cluster whose every host is loopback");
    return;
  }
  if (!tls->is_table()) {
    c.problem(*tls, "tls must be a table");
    return;
  }
  c.only_keys(*tls, "[tls]", {"ca", "plaintext"});
  c.read(*tls, "[tls]", "ca", out.ca, false);
  c.read(*tls, "[tls]", "plaintext", out.plaintext);
  if (out.plaintext && !out.ca.empty())
    c.problem(*tls, "[tls] has both ca and plaintext = true: choose one");
  else if (!out.plaintext && out.ca.empty())
    c.problem(*tls, "[tls] needs ca (or plaintext = true for a loopback-only cluster)");
  if (!out.ca.empty()) {
    out.ca = c.resolve(out.ca);
    if (check_files && !std::ifstream(out.ca))
      c.problem(*c.find(*tls, "ca"), fmt::format("cannot read CA file '{}'", out.ca));
  }
}

void read_router(checker& c, const toml::value& doc, router_settings& r) {
  auto* rt = c.find(doc, "router");
  if (!rt)
    return;
  if (!rt->is_table()) {
    c.problem(*rt, "router must be a table");
    return;
  }
  c.only_keys(*rt, "[router]",
              {"cpu_weight", "storage_weight", "tie_margin", "prefill_ms_per_token", "step_ms",
               "decode_ms_per_request", "max_batched_tokens", "hot_spot_threshold",
               "speculative_ttl_ms", "engine_load_max_age_ms", "distrust_shortfall_share",
               "tier1_chunk_bytes", "tier1_capacity", "tier1_ttl_s", "tokenize_timeout_ms",
               "tokenize_cache_entries", "tokenize_cache_mib", "canary_timeout_ms",
               "canary_retry_ms"});
  c.read_fraction(*rt, "router", "cpu_weight", r.cpu_weight);
  c.read_fraction(*rt, "router", "storage_weight", r.storage_weight);
  c.read_fraction(*rt, "router", "tie_margin", r.tie_margin);
  c.read_fraction(*rt, "router", "distrust_shortfall_share", r.distrust_shortfall_share);
  if (const auto* old = c.find(*rt, "hot_spot_threshold"))
    c.problem(*old, "router.hot_spot_threshold is gone: load is part of every decision's cost now "
                    "(prefill_ms_per_token, step_ms, decode_ms_per_request); remove it");
  c.read_real(*rt, "router", "prefill_ms_per_token", 0.0001, 100, r.prefill_ms_per_token);
  c.read_real(*rt, "router", "step_ms", 0, 10000, r.step_ms);
  c.read_real(*rt, "router", "decode_ms_per_request", 0, 1000, r.decode_ms_per_request);
  c.read_number(*rt, "router", "max_batched_tokens", 1, 100000000, r.max_batched_tokens);
  c.read_number(*rt, "router", "tier1_chunk_bytes", 8, 65536, r.tier1_chunk_bytes);
  c.read_number(*rt, "router", "tier1_capacity", 16, 100000000, r.tier1_capacity);
  std::int64_t ttl = 0;
  if (c.read_int(*rt, "router", "tier1_ttl_s", 1, std::int64_t{30} * 86400, ttl))
    r.tier1_ttl = std::chrono::seconds(ttl);
  c.read_ms(*rt, "router", "tokenize_timeout_ms", 10, 60000, r.tokenize_timeout);
  c.read_ms(*rt, "router", "speculative_ttl_ms", 0, 600000, r.speculative_ttl);
  c.read_ms(*rt, "router", "engine_load_max_age_ms", 0, 60000, r.engine_load_max_age);
  c.read_ms(*rt, "router", "canary_timeout_ms", 100, 600000, r.canary_timeout);
  c.read_ms(*rt, "router", "canary_retry_ms", 100, 3600000, r.canary_retry);
  c.read_number(*rt, "router", "tokenize_cache_entries", 0, 10000000, r.tokenize_cache_entries);
  c.read_number(*rt, "router", "tokenize_cache_mib", 0, 1048576, r.tokenize_cache_mib);
}

void read_gateway(checker& c, const toml::value& doc, gateway_settings& g) {
  auto* gw = c.find(doc, "gateway");
  if (!gw)
    return;
  if (!gw->is_table()) {
    c.problem(*gw, "gateway must be a table");
    return;
  }
  c.only_keys(*gw, "[gateway]",
              {"max_body_bytes", "max_header_bytes", "read_timeout_ms", "idle_timeout_ms",
               "request_timeout_ms", "connect_timeout_ms", "first_byte_timeout_ms",
               "max_connections", "max_connections_per_client", "max_buffered_body_mib",
               "max_attempts", "mark_down_ms", "health_interval_ms", "health_timeout_ms",
               "drain_timeout_ms", "threads"});
  c.read_number(*gw, "gateway", "max_body_bytes", 1024, std::int64_t{1} << 30, g.max_body_bytes);
  c.read_number(*gw, "gateway", "max_buffered_body_mib", 1, 1 << 20, g.max_buffered_body_mib);
  if (g.max_buffered_body_mib << 20 < g.max_body_bytes)
    c.problem(*gw, fmt::format("[gateway] max_buffered_body_mib = {} cannot hold one body of "
                               "max_body_bytes = {}",
                               g.max_buffered_body_mib, g.max_body_bytes));
  c.read_number(*gw, "gateway", "max_header_bytes", 1024, 1 << 20, g.max_header_bytes);
  c.read_ms(*gw, "gateway", "read_timeout_ms", 100, 3600000, g.read_timeout);
  c.read_ms(*gw, "gateway", "idle_timeout_ms", 100, 3600000, g.idle_timeout);
  c.read_ms(*gw, "gateway", "request_timeout_ms", 100, 86400000, g.request_timeout);
  c.read_ms(*gw, "gateway", "connect_timeout_ms", 10, 600000, g.connect_timeout);
  c.read_ms(*gw, "gateway", "first_byte_timeout_ms", 0, 86400000, g.first_byte_timeout);
  if (g.first_byte_timeout.count() > 0 && g.first_byte_timeout.count() < 100)
    c.problem(*c.find(*gw, "first_byte_timeout_ms"),
              fmt::format("[gateway] first_byte_timeout_ms = {} is shorter than any engine "
                          "answers: 0 (none) or at least 100",
                          g.first_byte_timeout.count()));
  c.read_number(*gw, "gateway", "max_connections", 1, 1000000, g.max_connections);
  c.read_number(*gw, "gateway", "max_connections_per_client", 0, 1000000,
                g.max_connections_per_client);
  c.read_number(*gw, "gateway", "max_attempts", 1, 16, g.max_attempts);
  c.read_ms(*gw, "gateway", "mark_down_ms", 0, 3600000, g.down_for);
  c.read_ms(*gw, "gateway", "health_interval_ms", 0, 3600000, g.health_interval);
  if (g.health_interval.count() > 0 && g.health_interval.count() < 100)
    c.problem(*c.find(*gw, "health_interval_ms"),
              fmt::format("[gateway] health_interval_ms = {} probes too often: 0 (never) or at "
                          "least 100",
                          g.health_interval.count()));
  c.read_ms(*gw, "gateway", "health_timeout_ms", 10, 600000, g.health_timeout);
  c.read_ms(*gw, "gateway", "drain_timeout_ms", 0, 3600000, g.drain_timeout);
  if (g.health_interval.count() > 0 && g.health_timeout > g.health_interval)
    c.problem(*gw, fmt::format("[gateway] health_timeout_ms = {} must not exceed "
                               "health_interval_ms = {}: a probe ends before the next",
                               g.health_timeout.count(), g.health_interval.count()));
  c.read_number(*gw, "gateway", "threads", 1, 256, g.threads);
}

void read_engine(checker& c, const toml::value& t, const std::string& where, engine_spec& e) {
  c.only_keys(t, where,
              {"replica", "model", "url", "lora", "kv_events", "events_port", "events", "topic",
               "dp_size", "launch", "replay", "replay_endpoint", "block_keys", "engine", "canary"});
  std::string kind;
  c.read(t, where, "engine", kind, false);
  if (kind == "sglang")
    e.kind = engine_kind::sglang;
  else if (kind == "trtllm")
    e.kind = engine_kind::trtllm;
  else if (!kind.empty() && kind != "vllm")
    c.problem(
      *c.find(t, "engine"),
      fmt::format("{}.engine '{}': \"vllm\" (the default), \"sglang\" or \"trtllm\"", where, kind));
  c.read(t, where, "replica", e.replica, true);
  if (!e.replica.empty() && !valid_name(e.replica))
    c.problem(*c.find(t, "replica"),
              fmt::format("replica '{}': use letters, digits, '-', '_' and '.'", e.replica));
  c.read(t, where, "model", e.model, true);
  c.read(t, where, "url", e.url, true);
  if (!e.url.empty()) {
    if (!wire::parse_http_url(e.url))
      c.problem(
        *c.find(t, "url"),
        fmt::format("{}.url '{}' must be http://HOST:PORT (the engine's base URL)", where, e.url));
  }
  c.read_strings(t, where, "lora", e.lora);
  std::set<std::string> seen;
  for (const auto& l : e.lora)
    if (!seen.insert(l).second)
      c.problem(*c.find(t, "lora"), fmt::format("{}.lora lists '{}' twice", where, l));
  c.read(t, where, "kv_events", e.kv_events);
  c.read(t, where, "canary", e.canary);
  c.read_number(t, where, "events_port", 0, 65535, e.events_port);
  c.read(t, where, "events", e.events, false);
  c.read(t, where, "topic", e.topic, false);
  c.read_number(t, where, "dp_size", 1, 1024, e.dp_size);
  auto* launch = c.find(t, "launch");
  c.read_strings(t, where, "launch", e.launch);
  if (launch && launch->is_array() && launch->as_array().empty())
    c.problem(*launch,
              fmt::format("{}.launch is empty: leave it out for an attached engine", where));
  c.read(t, where, "replay", e.replay);
  c.read(t, where, "replay_endpoint", e.replay_endpoint, false);
  if (!e.replay_endpoint.empty() && !e.launch.empty())
    c.problem(*c.find(t, "replay_endpoint"),
              fmt::format("{}.replay_endpoint is for attached engines; launched engines get one "
                          "from llmgw (replay = true)",
                          where));
  if (!e.replay_endpoint.empty()) {
    auto at = wire::parse_tcp_endpoint(e.replay_endpoint);
    if (!at || wire::is_wildcard(at->host))
      c.problem(*c.find(t, "replay_endpoint"),
                fmt::format("{}.replay_endpoint '{}' must be tcp://HOST:PORT with the engine's "
                            "address (vLLM binds its replay socket; '*' is no address to reach)",
                            where, e.replay_endpoint));
    else if (static_cast<std::uint32_t>(at->port) + e.dp_size - 1 > 65535)
      c.problem(*c.find(t, "replay_endpoint"),
                fmt::format("{}: replay_endpoint's port + dp_size - 1 exceeds 65535", where));
  }
  if (!e.events.empty()) {
    auto at = wire::parse_tcp_endpoint(e.events);
    auto* v = c.find(t, "events");
    if (e.events.rfind("tcp://*:", 0) == 0 || (at && wire::is_wildcard(at->host)))
      c.problem(*v, fmt::format("{}.events '{}' is where vLLM binds, not where to reach it: "
                                "write its host, e.g. tcp://127.0.0.1:{} (the agent connects "
                                "there)",
                                where, e.events, e.events.substr(e.events.rfind(':') + 1)));
    else if (!at)
      c.problem(*v, fmt::format("{}.events '{}' must be tcp://HOST:PORT: the address of a "
                                "publisher that binds (vLLM's default endpoint tcp://*:5557)",
                                where, e.events));
    else if (static_cast<std::uint32_t>(at->port) + e.dp_size - 1 > 65535)
      c.problem(*v, fmt::format("{}: the events port + dp_size - 1 exceeds 65535", where));
    if (!e.launch.empty())
      c.problem(*v, fmt::format("{}.events is for attached engines; llmgw tells a launched "
                                "engine where to publish",
                                where));
    if (c.find(t, "events_port"))
      c.problem(*v, fmt::format("{} sets both events (the engine binds, the agent connects) and "
                                "events_port (the agent binds, the engine connects): choose one",
                                where));
    if (!e.kv_events)
      c.problem(
        *v, fmt::format("{}.events names where its KV events are: set kv_events = true", where));
  }
  if (e.kv_events && e.launch.empty() && e.events_port == 0 && e.events.empty())
    c.problem(t, fmt::format("{} (replica '{}') is attached with kv_events = true: set events = "
                             "\"tcp://HOST:PORT\" where its publisher binds (vLLM's default "
                             "endpoint tcp://*:5557), or events_port to the port of an "
                             "endpoint it connects to (tcp://127.0.0.1:PORT)",
                             where, e.replica));
  if (static_cast<std::uint32_t>(e.events_port) + e.dp_size - 1 > 65535)
    c.problem(t, fmt::format("{}: events_port + dp_size - 1 exceeds 65535", where));
  if (e.kind == engine_kind::trtllm && !e.launch.empty())
    c.problem(*c.find(t, "launch"),
              fmt::format("{}: llmgw launches vLLM and SGLang; TensorRT-LLM sets its KV events "
                          "in trtllm-serve's YAML: start it yourself and attach it (events = "
                          "\"tcp://HOST:PORT\")",
                          where));
  std::string keys;
  c.read(t, where, "block_keys", keys, false);
  if (keys == "engine" && e.kind != engine_kind::vllm)
    c.problem(*c.find(t, "block_keys"),
              fmt::format("{}.block_keys = \"engine\": {} never hashes blocks the cluster's way "
                          "(sha256_cbor); its blocks must be translated (leave block_keys out)",
                          where, to_string(e.kind)));
  else if (keys == "engine")
    e.translate_keys = false;
  else if (!keys.empty() && keys != "translate")
    c.problem(*c.find(t, "block_keys"),
              fmt::format("{}.block_keys '{}': \"translate\" (key blocks by the cluster's hash "
                          "of their tokens, the default) or \"engine\" (use the engine's own "
                          "hashes, checked)",
                          where, keys));
}

void read_node(checker& c, const toml::value& t, std::size_t index, const topology& topo,
               node_spec& n, const topology_options& opts) {
  auto where = fmt::format("node[{}]", index);
  c.only_keys(
    t, where,
    {"name", "host", "port", "roles", "http", "admin", "cert", "key", "fingerprints", "engine"});
  c.read(t, where, "name", n.name, true);
  if (!n.name.empty()) {
    where = fmt::format("node '{}'", n.name);
    if (!valid_name(n.name))
      c.problem(*c.find(t, "name"),
                fmt::format("node name '{}': use letters, digits, '-', '_' and '.'", n.name));
  }
  c.read(t, where, "host", n.host, true);
  c.read_number(t, where, "port", 0, 65535, n.port);
  std::vector<std::string> roles;
  auto* roles_v = c.find(t, "roles");
  c.read_strings(t, where, "roles", roles);
  if (!roles_v)
    c.problem(t, fmt::format("{} needs roles (\"agent\", \"control\" or both)", where));
  for (const auto& r : roles) {
    if (r == "agent")
      n.roles.agent = true;
    else if (r == "control")
      n.roles.control = true;
    else
      c.problem(*roles_v, fmt::format("{}: unknown role '{}' (known: agent, control)", where, r));
  }
  if (roles_v && roles.empty() && roles_v->is_array())
    c.problem(*roles_v, fmt::format("{}: roles is empty", where));
  std::string http;
  c.read(t, where, "http", http, false);
  if (!http.empty() && !split_host_port(http, n.http_host, n.http_port))
    c.problem(*c.find(t, "http"),
              fmt::format("{}.http '{}' must be HOST:PORT with a port in 1..65535", where, http));
  if (n.roles.control && http.empty())
    c.problem(t, fmt::format("{} is a control node: it needs http = \"HOST:PORT\" for the "
                             "gateway",
                             where));
  if (!n.roles.control && !http.empty())
    c.problem(*c.find(t, "http"), fmt::format("{}.http is only for control nodes", where));
  std::string admin;
  c.read(t, where, "admin", admin, false);
  if (!admin.empty() && !split_host_port(admin, n.admin_host, n.admin_port))
    c.problem(*c.find(t, "admin"),
              fmt::format("{}.admin '{}' must be HOST:PORT with a port in 1..65535", where, admin));
  if (n.roles.control && n.port == 0)
    c.problem(t, fmt::format("{} is a control node: it needs a port agents connect to", where));
  c.read(t, where, "cert", n.cert, false);
  c.read(t, where, "key", n.key, false);
  std::vector<std::string> fingerprints;
  c.read_strings(t, where, "fingerprints", fingerprints);
  for (const auto& f : fingerprints) {
    auto normal = normalize_fingerprint(f);
    if (normal.empty())
      c.problem(*c.find(t, "fingerprints"),
                fmt::format("{}: fingerprint '{}' is not a SHA-256 fingerprint (64 hex digits, "
                            "optionally 'sha256:' first and colons between bytes)",
                            where, f));
    else
      n.fingerprints.push_back(std::move(normal));
  }
  if (!topo.plaintext) {
    if (n.cert.empty() || n.key.empty())
      c.problem(t, fmt::format("{} needs cert and key (PEM files signed by [tls] ca)", where));
    else if (!topo.ca.empty()) {
      n.cert = c.resolve(n.cert);
      n.key = c.resolve(n.key);
      if (opts.check_tls_files && (opts.tls_files_of.empty() || opts.tls_files_of == n.name)) {
        // What the node will load at start: the pair, the CA, its name.
        auto id = node_identity::load(n.name, n.cert, n.key, topo.ca);
        if (!id)
          c.problem(*c.find(t, "cert"), fmt::format("{}: {}", where, id.err().message));
        else if (!n.fingerprints.empty()
                 && std::find(n.fingerprints.begin(), n.fingerprints.end(), (*id)->fingerprint())
                      == n.fingerprints.end())
          c.problem(*c.find(t, "fingerprints"),
                    fmt::format("{}: its certificate '{}' ({}) is not among its fingerprints: "
                                "other nodes would refuse it",
                                where, n.cert, (*id)->fingerprint()));
      }
    }
  } else if (!n.cert.empty() || !n.key.empty()) {
    c.problem(t, fmt::format("{} has cert/key but [tls] plaintext = true", where));
  } else if (!fingerprints.empty()) {
    c.problem(*c.find(t, "fingerprints"),
              fmt::format("{} has fingerprints but [tls] plaintext = true: there are no "
                          "certificates",
                          where));
  }
  auto* engines = c.find(t, "engine");
  if (!engines)
    return;
  if (!engines->is_array()) {
    c.problem(*engines, fmt::format("{}: write engines as [[node.engine]] tables", where));
    return;
  }
  if (!n.roles.agent && !engines->as_array().empty())
    c.problem(*engines,
              fmt::format("{} has engines but not the agent role: add \"agent\" to roles", where));
  std::size_t i = 0;
  for (const auto& ev : engines->as_array()) {
    auto ew = fmt::format("{} engine[{}]", where, i++);
    if (!ev.is_table()) {
      c.problem(ev, fmt::format("{} must be a table", ew));
      n.engines.emplace_back(); // keeps indexes aligned with the file's
      continue;
    }
    engine_spec e;
    read_engine(c, ev, ew, e);
    n.engines.push_back(std::move(e));
  }
}

/// Checks across nodes; `values[i]` is the table topo.nodes[i] came from.
void check_cluster_wide(checker& c, const std::vector<const toml::value*>& values, topology& topo) {
  auto node_value = [&](std::size_t i) -> const toml::value& { return *values[i]; };
  std::map<std::string, std::size_t> names, replicas, caf_ports, http_ports;
  /// Ports of engines' events and replay endpoints: per node on loopback,
  /// cluster-wide on other hosts.
  struct port_range {
    std::string scope; ///< the node, for loopback; "" elsewhere
    std::string host;
    std::uint32_t lo, hi;
    const char* what;
    std::string replica;
  };
  std::vector<port_range> endpoints;
  bool any_control = false;
  for (std::size_t i = 0; i < topo.nodes.size(); ++i) {
    const auto& n = topo.nodes[i];
    any_control = any_control || n.roles.control;
    if (!n.name.empty() && !names.emplace(n.name, i).second)
      c.problem(node_value(i), fmt::format("node name '{}' is used twice", n.name));
    if (n.port != 0) {
      auto k = n.host + ":" + std::to_string(n.port);
      if (!caf_ports.emplace(k, i).second)
        c.problem(node_value(i), fmt::format("node '{}': {} is already node '{}''s address", n.name,
                                             k, topo.nodes[caf_ports[k]].name));
    }
    // A wildcard listen address is per machine: two listeners clash only on
    // the same host.
    for (auto [host, port, what] :
         {std::tuple{n.http_host, n.http_port, "http"}, {n.admin_host, n.admin_port, "admin"}}) {
      if (port == 0)
        continue;
      bool wildcard = host == "0.0.0.0" || host == "::";
      auto k = (wildcard ? n.host : host) + ":" + std::to_string(port);
      if (!http_ports.emplace(k, i).second)
        c.problem(node_value(i), fmt::format("node '{}': {} {} is already used by node '{}'",
                                             n.name, what, k, topo.nodes[http_ports[k]].name));
    }
    if (topo.plaintext && !n.host.empty() && !wire::is_loopback(n.host))
      c.problem(node_value(i),
                fmt::format("node '{}' is on {} but [tls] plaintext = true: plaintext is only "
                            "allowed when every node is on loopback",
                            n.name, n.host));
    for (std::size_t j = 0; j < n.engines.size(); ++j) {
      const auto& e = n.engines[j];
      const auto& engine_value = node_value(i).as_table().at("engine").as_array()[j];
      if (!e.replica.empty() && !replicas.emplace(e.replica, i).second)
        c.problem(engine_value,
                  fmt::format("replica '{}' is defined twice (nodes '{}' and '{}')", e.replica,
                              topo.nodes[replicas[e.replica]].name, n.name));
      // The ports each rank's events and replay use (each rank adds one):
      // two engines on one of them would share one engine's stream.
      if (!e.kv_events)
        continue;
      auto add = [&](const std::string& host, std::uint16_t port, const char* what) {
        bool local = wire::is_loopback(host);
        port_range r{local ? n.name : std::string{},
                     local ? "loopback" : host,
                     port,
                     static_cast<std::uint32_t>(port) + e.dp_size,
                     what,
                     e.replica};
        for (const auto& o : endpoints)
          if (o.scope == r.scope && o.host == r.host && r.lo < o.hi && o.lo < r.hi)
            c.problem(engine_value,
                      fmt::format("node '{}': replica '{}' {} {}..{} overlap replica '{}''s {} "
                                  "{}..{}{} (rank r uses port + r)",
                                  n.name, e.replica, what, r.lo, r.hi - 1, o.replica, o.what, o.lo,
                                  o.hi - 1, local ? " on loopback" : " at " + host));
        endpoints.push_back(std::move(r));
      };
      if (e.events_port != 0)
        add("127.0.0.1", e.events_port, "events ports");
      if (auto at = wire::parse_tcp_endpoint(e.events))
        add(at->host, at->port, "events ports");
      if (auto at = wire::parse_tcp_endpoint(e.replay_endpoint))
        add(at->host, at->port, "replay ports");
    }
  }
  if (!topo.nodes.empty() && !any_control)
    c.problem("no node has the control role: agents would have nowhere to send");
}

} // namespace

topology_result parse_topology(const std::string& text, const std::string& path,
                               const topology_options& opts) {
  topology_result out;
  auto slash = path.rfind('/');
  checker c(path, slash == std::string::npos ? std::string{} : path.substr(0, slash));
  if (auto problem = too_complex(text, path)) {
    out.problems.push_back(std::move(*problem));
    return out;
  }
  toml::value doc;
  try {
    std::istringstream in(text);
    doc = toml::parse(in, path);
  } catch (const std::exception& e) {
    // toml11 names the file, line and column itself.
    std::string msg = e.what();
    while (!msg.empty() && msg.back() == '\n')
      msg.pop_back();
    out.problems.push_back({path, 0, 0, "not valid TOML: " + msg});
    return out;
  }
  topology topo;
  topo.path = path;
  c.only_keys(doc, "the top level", {"cluster", "tls", "router", "gateway", "node"});
  read_cluster(c, doc, topo);
  read_tls(c, doc, topo, opts.check_tls_files);
  read_router(c, doc, topo.router);
  read_gateway(c, doc, topo.gateway);
  auto* nodes = c.find(doc, "node");
  if (!nodes || !nodes->is_array() || nodes->as_array().empty()) {
    if (nodes && !nodes->is_array())
      c.problem(*nodes, "write nodes as [[node]] tables");
    else
      c.problem("no [[node]]: a cluster needs at least one control node and one agent node");
  } else {
    std::size_t i = 0;
    std::vector<const toml::value*> values;
    for (const auto& nv : nodes->as_array()) {
      if (!nv.is_table()) {
        c.problem(nv, fmt::format("node[{}] must be a table", i++));
        continue;
      }
      node_spec n;
      read_node(c, nv, i++, topo, n, opts);
      topo.nodes.push_back(std::move(n));
      values.push_back(&nv);
    }
    check_cluster_wide(c, values, topo);
  }
  std::stable_sort(c.problems.begin(), c.problems.end(),
                   [](const config_problem& a, const config_problem& b) {
                     return std::tie(a.line, a.column) < std::tie(b.line, b.column);
                   });
  out.problems = std::move(c.problems);
  if (out.problems.empty())
    out.value = std::move(topo);
  return out;
}

topology_result load_topology(const std::string& path, const topology_options& opts) {
  topology_result out;
  auto fail = [&](std::string why) {
    out.problems.push_back({path, 0, 0, std::move(why)});
    return out;
  };
  // A device, a FIFO or /proc file (a symlink may point anywhere) could be
  // read forever: only a regular file, and no more of it than the cap.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return fail(fmt::format("cannot read the file: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail("not a regular file");
  }
  if (static_cast<std::size_t>(st.st_size) > max_topology_bytes) {
    ::close(fd);
    return fail(
      fmt::format("{} bytes: a topology may have {} at most", st.st_size, max_topology_bytes));
  }
  std::string text;
  char buf[65536];
  for (;;) {
    auto n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > max_topology_bytes) // it grew while read
      break;
  }
  ::close(fd);
  if (text.size() > max_topology_bytes)
    return fail(fmt::format("more than {} bytes: a topology may have no more", max_topology_bytes));
  return parse_topology(text, path, opts);
}

} // namespace llmgw::config
