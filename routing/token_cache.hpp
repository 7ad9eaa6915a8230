// Tokenizations already done, keyed by the model and the whole /tokenize
// body, least recently used out. Shared by a control node's tokenizer actor,
// which fills it, and its gateway, which looks a prompt up on the HTTP
// thread before asking the tokenizer: a repeated prompt costs no hop to
// another thread. Every access holds one mutex.
//
// Exact: an entry keeps the model and body it was made from and is found
// only by the same bytes. The 64-bit hash only picks the bucket, so two
// bodies that hash alike (by chance or crafted by a client) each get their
// own tokens. Bounded twice: by entries and by bytes (model, body, tokens
// and a fixed overhead per entry), since one 128k-token prompt holds as
// much as a thousand short ones.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace llmgw::routing {

class token_cache {
public:
  using hash_function = std::uint64_t (*)(std::string_view model, std::string_view body);

  /// XXH3 of the model, then of the body seeded with that.
  static std::uint64_t xxh3(std::string_view model, std::string_view body);

  /// Holds up to `max_entries` tokenizations and `max_bytes` bytes of them
  /// (either 0: nothing). `hash` only picks buckets (tests force
  /// collisions with it).
  token_cache(std::size_t max_entries, std::size_t max_bytes, hash_function hash = xxh3);

  /// The tokens of `body` for `model` into `out`, counted as a hit or a
  /// miss.
  bool lookup(std::string_view model, std::string_view body, std::vector<std::uint32_t>& out);

  /// The same, not counted (a second look after a counted miss).
  bool peek(std::string_view model, std::string_view body, std::vector<std::uint32_t>& out);

  /// Keeps `tokens` for `body` and `model`, evicting the least recently
  /// used entries until both bounds hold. An entry larger than the byte
  /// bound by itself is not kept.
  void insert(std::string_view model, std::string_view body,
              const std::vector<std::uint32_t>& tokens);

  /// What an entry is charged: its bytes and a fixed overhead.
  static std::size_t cost(std::string_view model, std::string_view body, std::size_t tokens);

  struct counts {
    std::uint64_t hits = 0;
    std::uint64_t misses = 0;
    std::size_t entries = 0;
    std::size_t bytes = 0;
  };
  counts stats() const;

private:
  struct entry {
    std::uint64_t hash;
    std::string model;
    std::string body;
    std::vector<std::uint32_t> tokens;
  };
  using lru_list = std::list<entry>; ///< most recent first

  lru_list::iterator find_locked(std::uint64_t h, std::string_view model, std::string_view body);
  /// Found: copied to `out` and made the most recent.
  bool take_locked(std::uint64_t h, std::string_view model, std::string_view body,
                   std::vector<std::uint32_t>& out);
  void evict_locked();

  hash_function hash_;
  mutable std::mutex mtx_;
  std::size_t max_entries_;
  std::size_t max_bytes_;
  std::size_t bytes_ = 0;
  lru_list lru_;
  std::unordered_multimap<std::uint64_t, lru_list::iterator> by_hash_;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
};

} // namespace llmgw::routing
