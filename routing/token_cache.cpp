#include "routing/token_cache.hpp"

#include <xxhash.h>

namespace llmgw::routing {

namespace {

/// Per entry beyond its bytes, estimated for glibc on 64 bits: the list
/// node with the entry's three containers (112 bytes), the map node and its
/// bucket (40), and malloc's header on each of the five allocations.
constexpr std::size_t entry_overhead = 256;

} // namespace

token_cache::token_cache(std::size_t max_entries, std::size_t max_bytes, hash_function hash)
  : hash_(hash), max_entries_(max_entries), max_bytes_(max_bytes) {}

std::uint64_t token_cache::xxh3(std::string_view model, std::string_view body) {
  auto h = XXH3_64bits_withSeed(model.data(), model.size(), 0x746f6b);
  return XXH3_64bits_withSeed(body.data(), body.size(), h);
}

std::size_t token_cache::cost(std::string_view model, std::string_view body, std::size_t tokens) {
  return model.size() + body.size() + tokens * sizeof(std::uint32_t) + entry_overhead;
}

token_cache::lru_list::iterator token_cache::find_locked(std::uint64_t h, std::string_view model,
                                                         std::string_view body) {
  auto [first, last] = by_hash_.equal_range(h);
  for (auto it = first; it != last; ++it)
    if (it->second->model == model && it->second->body == body)
      return it->second;
  return lru_.end();
}

bool token_cache::take_locked(std::uint64_t h, std::string_view model, std::string_view body,
                              std::vector<std::uint32_t>& out) {
  auto it = find_locked(h, model, body);
  if (it == lru_.end())
    return false;
  lru_.splice(lru_.begin(), lru_, it);
  out = it->tokens;
  return true;
}

bool token_cache::lookup(std::string_view model, std::string_view body,
                         std::vector<std::uint32_t>& out) {
  auto h = hash_(model, body);
  std::lock_guard<std::mutex> g(mtx_);
  bool found = take_locked(h, model, body, out);
  ++(found ? hits_ : misses_);
  return found;
}

bool token_cache::peek(std::string_view model, std::string_view body,
                       std::vector<std::uint32_t>& out) {
  auto h = hash_(model, body);
  std::lock_guard<std::mutex> g(mtx_);
  return take_locked(h, model, body, out);
}

void token_cache::insert(std::string_view model, std::string_view body,
                         const std::vector<std::uint32_t>& tokens) {
  auto size = cost(model, body, tokens.size());
  auto h = hash_(model, body);
  std::lock_guard<std::mutex> g(mtx_);
  if (max_entries_ == 0 || size > max_bytes_ || find_locked(h, model, body) != lru_.end())
    return;
  lru_.push_front(entry{h, std::string(model), std::string(body), tokens});
  by_hash_.emplace(h, lru_.begin());
  bytes_ += size;
  evict_locked();
}

void token_cache::evict_locked() {
  while (!lru_.empty() && (lru_.size() > max_entries_ || bytes_ > max_bytes_)) {
    auto last = std::prev(lru_.end());
    auto [first, end] = by_hash_.equal_range(last->hash);
    for (auto it = first; it != end; ++it)
      if (it->second == last) {
        by_hash_.erase(it);
        break;
      }
    bytes_ -= cost(last->model, last->body, last->tokens.size());
    lru_.pop_back();
  }
}

token_cache::counts token_cache::stats() const {
  std::lock_guard<std::mutex> g(mtx_);
  return {hits_, misses_, lru_.size(), bytes_};
}

} // namespace llmgw::routing
