// Tokenizations already done, keyed by the model and the whole /tokenize
// body, least recently used out. Shared by a control node's tokenizer actor,
// which fills it, and its gateway, which looks a prompt up on the HTTP
// thread before asking the tokenizer: a repeated prompt costs no hop to
// another thread. Every access holds one mutex.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmgw::wire {

class token_cache {
public:
  /// Holds up to `capacity` tokenizations (0: none).
  explicit token_cache(std::size_t capacity);

  /// The key of a /tokenize body for a model.
  static std::uint64_t key(const std::string& model, const std::string& tokenize_body);

  /// The tokens under `key` into `out`, counted as a hit or a miss.
  bool lookup(std::uint64_t key, std::vector<std::uint32_t>& out);

  /// The same, not counted (a second look after a counted miss).
  bool peek(std::uint64_t key, std::vector<std::uint32_t>& out);

  /// Keeps `tokens` under `key`, evicting the least recently used entry
  /// when full.
  void insert(std::uint64_t key, const std::vector<std::uint32_t>& tokens);

  struct counts {
    std::uint64_t hits = 0;
    std::uint64_t misses = 0;
    std::size_t entries = 0;
  };
  counts stats() const;

private:
  bool find_locked(std::uint64_t key, std::vector<std::uint32_t>& out);

  struct entry {
    std::vector<std::uint32_t> tokens;
    std::list<std::uint64_t>::iterator lru;
  };
  mutable std::mutex mtx_;
  std::size_t capacity_;
  std::unordered_map<std::uint64_t, entry> entries_;
  std::list<std::uint64_t> lru_; ///< most recent first
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
};

} // namespace llmgw::wire
