// The byte form an update's MAC covers: every field but the MAC, integers
// big-endian at fixed width, strings and lists with their length first, so
// no two updates share a form.
#include "messages/kv_messages.hpp"

#include "config/node_identity.hpp"

namespace llmgw {

namespace {

void put(std::string& out, std::uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8)
    out += static_cast<char>((v >> shift) & 0xff);
}

void put(std::string& out, const std::string& s) {
  put(out, s.size());
  out += s;
}

void put(std::string& out, const std::vector<kv::block_ref>& blocks) {
  put(out, blocks.size());
  for (const auto& b : blocks) {
    put(out, b.key);
    out += static_cast<char>(b.where);
  }
}

} // namespace

std::string update_mac(std::string_view key, const replica_update& u) {
  std::string bytes;
  bytes.reserve(192 + u.node.size() + u.replica.size() + 9 * (u.added.size() + u.removed.size()));
  put(bytes, u.node);
  put(bytes, u.replica);
  put(bytes, u.dp_rank);
  put(bytes, u.session);
  put(bytes, u.seq);
  put(bytes, u.epoch);
  bytes += static_cast<char>(u.reset);
  bytes += static_cast<char>(u.parity);
  bytes += static_cast<char>(u.partial);
  bytes += static_cast<char>(u.hybrid);
  put(bytes, u.added);
  put(bytes, u.removed);
  const auto& t = u.totals;
  for (auto v : {t.batches, t.stored, t.removed, t.ignored_removes, t.verified_blocks,
                 t.translated_blocks, t.untranslated_blocks})
    put(bytes, v);
  for (auto v : t.resets)
    put(bytes, v);
  put(bytes, u.parity_reason);
  return config::session_mac(key, bytes);
}

std::string load_report_mac(std::string_view key, const load_report& r) {
  std::string bytes;
  bytes.reserve(64 + r.node.size() + 48 * r.loads.size());
  bytes += 'L'; // never the byte form of an update
  put(bytes, r.node);
  put(bytes, r.session);
  put(bytes, r.seq);
  put(bytes, r.loads.size());
  for (const auto& l : r.loads) {
    put(bytes, l.replica);
    put(bytes, l.running);
    put(bytes, l.waiting);
    put(bytes, static_cast<std::uint64_t>(static_cast<std::int64_t>(l.kv_usage_permille)));
    put(bytes, l.age_ms);
  }
  return config::session_mac(key, bytes);
}

} // namespace llmgw
