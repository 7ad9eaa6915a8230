#include "wire/token_cache.hpp"

#include <xxhash.h>

namespace llmgw::wire {

token_cache::token_cache(std::size_t capacity) : capacity_(capacity) {}

std::uint64_t token_cache::key(const std::string& model, const std::string& tokenize_body) {
  auto h = XXH3_64bits_withSeed(model.data(), model.size(), 0x746f6b);
  return XXH3_64bits_withSeed(tokenize_body.data(), tokenize_body.size(), h);
}

bool token_cache::find_locked(std::uint64_t key, std::vector<std::uint32_t>& out) {
  auto it = entries_.find(key);
  if (it == entries_.end())
    return false;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  out = it->second.tokens;
  return true;
}

bool token_cache::lookup(std::uint64_t key, std::vector<std::uint32_t>& out) {
  std::lock_guard<std::mutex> g(mtx_);
  bool found = find_locked(key, out);
  ++(found ? hits_ : misses_);
  return found;
}

bool token_cache::peek(std::uint64_t key, std::vector<std::uint32_t>& out) {
  std::lock_guard<std::mutex> g(mtx_);
  return find_locked(key, out);
}

void token_cache::insert(std::uint64_t key, const std::vector<std::uint32_t>& tokens) {
  std::lock_guard<std::mutex> g(mtx_);
  if (capacity_ == 0 || entries_.count(key) > 0)
    return;
  lru_.push_front(key);
  entries_[key] = {tokens, lru_.begin()};
  if (entries_.size() > capacity_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
}

token_cache::counts token_cache::stats() const {
  std::lock_guard<std::mutex> g(mtx_);
  return {hits_, misses_, entries_.size()};
}

} // namespace llmgw::wire
