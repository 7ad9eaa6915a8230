#include "apps/llmgw-sim/sim_sglang.hpp"

namespace llmgw::sim {

wire::digest sglang_page_digest(wire::sha256& sha, const wire::digest* prior,
                                const std::uint32_t* tokens, std::size_t count) {
  std::string buf;
  buf.reserve(32 + 4 * count);
  if (prior)
    buf.append(reinterpret_cast<const char*>(prior->data()), prior->size());
  for (std::size_t i = 0; i < count; ++i) {
    auto t = tokens[i];
    char le[4] = {static_cast<char>(t & 0xff), static_cast<char>((t >> 8) & 0xff),
                  static_cast<char>((t >> 16) & 0xff), static_cast<char>((t >> 24) & 0xff)};
    buf.append(le, 4);
  }
  return sha(buf);
}

wire::block_key sglang_page_id(const wire::digest& d) noexcept {
  wire::block_key k = 0;
  for (std::size_t i = 0; i < 8; ++i)
    k = (k << 8) | d[i];
  return k;
}

wire::digest sglang_salt_root(wire::sha256& sha, const std::string& salt) {
  std::string buf = "sglang-cache-salt-v1";
  buf.push_back('\0');
  buf += salt;
  return sha(buf);
}

namespace {

wire::block_hash id_of(const wire::digest& d) {
  wire::block_hash h;
  h.key = sglang_page_id(d);
  return h;
}

std::string sglang_medium(const wire::kv_event& ev) {
  auto m = ev.medium_or_gpu();
  return m == "CPU" ? "CPU_PINNED" : std::string(m);
}

} // namespace

void sglang_stream::stored(const wire::kv_event& ev, std::vector<wire::kv_event>& out) {
  const auto n = ev.block_hashes.size();
  const bool with_tokens = ev.token_ids.size() == n * ev.block_size && ev.block_size > 0;
  const page* parent = nullptr;
  if (ev.parent_block_hash) {
    auto it = pages_.find(ev.parent_block_hash->key);
    if (it == pages_.end())
      return; // a chain SGLang would not have: no id to give its pages
    parent = &it->second;
  }
  for (std::size_t i = 0; i < n; ++i) {
    auto key = ev.block_hashes[i].key;
    auto it = pages_.find(key);
    if (it == pages_.end()) {
      if (!with_tokens)
        return; // a copy of a page never seen, and its children: SGLang has none
      page p;
      p.tokens.assign(ev.token_ids.begin() + i * ev.block_size,
                      ev.token_ids.begin() + (i + 1) * ev.block_size);
      p.salt = parent ? parent->salt : ev.cache_salt;
      std::optional<wire::digest> root;
      if (!parent && p.salt)
        root = sglang_salt_root(sha_, *p.salt);
      const wire::digest* prior = parent ? &parent->digest : root ? &*root : nullptr;
      p.digest = sglang_page_digest(sha_, prior, p.tokens.data(), p.tokens.size());
      it = pages_.emplace(key, std::move(p)).first;
    }
    auto& p = it->second;
    ++p.copies;
    wire::kv_event s;
    s.kind = wire::event_kind::block_stored;
    s.block_hashes = {id_of(p.digest)};
    if (parent)
      s.parent_block_hash = id_of(parent->digest);
    s.token_ids = p.tokens;
    s.block_size = static_cast<std::uint32_t>(p.tokens.size());
    s.medium = sglang_medium(ev);
    s.cache_salt = p.salt;
    out.push_back(std::move(s));
    parent = &p;
  }
}

void sglang_stream::removed(const wire::kv_event& ev, std::vector<wire::kv_event>& out) {
  wire::kv_event r;
  r.kind = wire::event_kind::block_removed;
  r.medium = sglang_medium(ev);
  for (const auto& h : ev.block_hashes) {
    auto it = pages_.find(h.key);
    if (it == pages_.end())
      continue;
    r.block_hashes.push_back(id_of(it->second.digest));
    if (--it->second.copies == 0)
      pages_.erase(it);
  }
  if (!r.block_hashes.empty())
    out.push_back(std::move(r));
}

std::vector<wire::kv_event> sglang_stream::convert(const std::vector<wire::kv_event>& events) {
  std::vector<wire::kv_event> out;
  for (const auto& ev : events) {
    switch (ev.kind) {
    case wire::event_kind::block_stored:
      stored(ev, out);
      break;
    case wire::event_kind::block_removed:
      removed(ev, out);
      break;
    case wire::event_kind::all_blocks_cleared:
      pages_.clear();
      out.push_back(ev);
      break;
    }
  }
  return out;
}

} // namespace llmgw::sim
