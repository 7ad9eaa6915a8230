#include "apps/llmgw-sim/sim_cache.hpp"

#include <algorithm>
#include <random>

namespace llmgw::sim {

std::string random_seed() {
  std::random_device rd;
  return "random-" + std::to_string(rd()) + std::to_string(rd());
}

kv_cache::kv_cache(cache_config cfg)
  : cfg_(std::move(cfg)), hasher_(cfg_.seed.empty() ? random_seed() : cfg_.seed, cfg_.block_size),
    blocks_(cfg_.blocks) {
  for (std::uint32_t i = 0; i < blocks_.size(); ++i) {
    free_.push_back(i);
    blocks_[i].in_free = true;
    blocks_[i].free_at = std::prev(free_.end());
  }
}

wire::block_hash kv_cache::wire_hash(const wire::digest& d) const {
  wire::block_hash h;
  h.key = wire::key_of(d);
  if (!cfg_.int_hashes) {
    h.digest_size = 32;
    h.digest = d;
  }
  return h;
}

void kv_cache::take_from_free(std::uint32_t id) {
  auto& b = blocks_[id];
  if (b.in_free) {
    free_.erase(b.free_at);
    b.in_free = false;
  }
}

void kv_cache::store(allocation& a, std::size_t first, std::size_t count,
                     std::vector<wire::kv_event>& out) {
  if (count == 0)
    return;
  auto bs = cfg_.block_size;
  wire::kv_event ev;
  ev.kind = wire::event_kind::block_stored;
  if (first > 0)
    ev.parent_block_hash = wire_hash(a.last);
  ev.block_size = static_cast<std::uint32_t>(bs);
  ev.lora_id = a.lora_id;
  ev.medium = "GPU";
  ev.lora_name = a.extras.lora_name;
  ev.cache_salt = a.extras.cache_salt; // not in vLLM's shapes; SGLang's carries it
  ev.group_idx = 0;
  ev.kv_cache_spec_kind = "full_attention";
  std::vector<wire::block_extra> extras;
  for (std::size_t i = first; i < first + count; ++i) {
    const auto* toks = a.tokens.data() + i * bs;
    auto extra = a.extras.for_block(i, static_cast<std::int64_t>(i * bs),
                                    static_cast<std::int64_t>((i + 1) * bs));
    auto d = hasher_.hash_one(i == 0 ? hasher_.root() : a.last, toks, bs, extra);
    auto& b = blocks_[a.blocks[i]];
    b.hashed = true;
    b.key = wire::key_of(d);
    b.digest = d;
    cached_.emplace(b.key, a.blocks[i]); // a second copy of a hash keeps the first as the hit
    ev.block_hashes.push_back(wire_hash(d));
    ev.token_ids.insert(ev.token_ids.end(), toks, toks + bs);
    extras.push_back(extra);
    a.last = d;
  }
  if (cfg_.publish_extra_keys)
    ev.extra_keys = std::move(extras);
  a.hashed = first + count;
  out.push_back(std::move(ev));
}

allocation kv_cache::start(const std::vector<std::uint32_t>& prompt,
                           const wire::extra_key_recipe& extras,
                           std::optional<std::int64_t> lora_id) {
  allocation a;
  a.tokens = prompt;
  a.prompt_tokens = prompt.size();
  a.extras = extras;
  a.lora_id = lora_id;
  return a;
}

prefix_hit kv_cache::lookup(const allocation& a) {
  prefix_hit hit;
  if (a.tokens.empty())
    return hit;
  auto bs = cfg_.block_size;
  // Never the last token: at most (len - 1) / B blocks can be hits.
  auto max_hits = (a.tokens.size() - 1) / bs;
  hasher_.hash_into(a.tokens, a.extras, chain_);
  for (std::size_t i = 0; i < std::min(max_hits, chain_.size()); ++i) {
    const auto& link = chain_[i];
    auto it = cached_.find(link.key);
    if (it == cached_.end() || blocks_[it->second].digest != link.full)
      break;
    hit.blocks.push_back(it->second);
    hit.last = link.full;
  }
  return hit;
}

std::size_t kv_cache::blocks_needed(const allocation& a, std::size_t upto) const noexcept {
  auto want = (upto + cfg_.block_size - 1) / cfg_.block_size;
  return want > a.blocks.size() ? want - a.blocks.size() : 0;
}

std::uint32_t kv_cache::take_fresh(std::vector<wire::kv_event>& out) {
  auto id = free_.front();
  take_from_free(id);
  auto& b = blocks_[id];
  if (b.hashed) { // reusing a cached free block evicts it
    wire::kv_event ev;
    ev.kind = wire::event_kind::block_removed;
    ev.block_hashes = {wire_hash(b.digest)};
    ev.medium = "GPU";
    ev.group_idx = 0;
    out.push_back(std::move(ev));
    auto it = cached_.find(b.key);
    if (it != cached_.end() && it->second == id)
      cached_.erase(it);
    b.hashed = false;
  }
  b.refs = 1;
  ++used_;
  return id;
}

bool kv_cache::allocate(allocation& a, const prefix_hit& hit, std::size_t upto,
                        std::vector<wire::kv_event>& out) {
  bool first = a.blocks.empty();
  auto hits = first ? hit.blocks.size() : 0;
  auto want = (upto + cfg_.block_size - 1) / cfg_.block_size;
  auto fresh = want > a.blocks.size() + hits ? want - a.blocks.size() - hits : 0;
  std::size_t hits_in_free = 0;
  for (std::size_t i = 0; i < hits; ++i)
    hits_in_free += blocks_[hit.blocks[i]].in_free;
  if (free_.size() - hits_in_free < fresh)
    return false;
  if (first) {
    queried_ += a.tokens.size();
    hits_ += hits * cfg_.block_size;
    a.cached_tokens = hits * cfg_.block_size;
    for (auto id : hit.blocks) {
      take_from_free(id);
      if (blocks_[id].refs++ == 0)
        ++used_; // a cached free block is in use again
      a.blocks.push_back(id);
    }
    a.hashed = hits;
    if (hits > 0)
      a.last = hit.last;
  }
  for (std::size_t i = 0; i < fresh; ++i)
    a.blocks.push_back(take_fresh(out));
  return true;
}

void kv_cache::commit(allocation& a, std::size_t upto, std::vector<wire::kv_event>& out) {
  auto full =
    std::min({upto, a.tokens.size(), a.blocks.size() * cfg_.block_size}) / cfg_.block_size;
  if (full > a.hashed)
    store(a, a.hashed, full - a.hashed, out);
}

std::optional<allocation> kv_cache::admit(const std::vector<std::uint32_t>& prompt,
                                          const wire::extra_key_recipe& extras,
                                          std::optional<std::int64_t> lora_id, std::size_t max_new,
                                          std::vector<wire::kv_event>& out) {
  if (prompt.empty())
    return std::nullopt;
  auto a = start(prompt, extras, lora_id);
  if (!allocate(a, lookup(a), prompt.size() + max_new, out))
    return std::nullopt;
  commit(a, prompt.size(), out);
  return a;
}

void kv_cache::append(allocation& a, std::uint32_t token, std::vector<wire::kv_event>& out) {
  a.tokens.push_back(token);
  commit(a, a.tokens.size(), out);
}

void kv_cache::release(allocation& a) {
  for (auto it = a.blocks.rbegin(); it != a.blocks.rend(); ++it) {
    auto& b = blocks_[*it];
    if (b.refs > 0 && --b.refs == 0) {
      free_.push_back(*it);
      b.in_free = true;
      b.free_at = std::prev(free_.end());
      --used_;
    }
  }
  a.blocks.clear();
  a.hashed = 0;
}

std::vector<wire::block_key> kv_cache::hashed_keys() const {
  std::vector<wire::block_key> out;
  for (const auto& b : blocks_)
    if (b.hashed)
      out.push_back(b.key);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool kv_cache::reset(std::vector<wire::kv_event>& out) {
  if (used_ > 0)
    return false;
  for (auto& b : blocks_)
    b.hashed = false;
  cached_.clear();
  wire::kv_event ev;
  ev.kind = wire::event_kind::all_blocks_cleared;
  out.push_back(std::move(ev));
  return true;
}

} // namespace llmgw::sim
