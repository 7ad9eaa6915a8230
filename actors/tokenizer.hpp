// The tokenizer: turns a prompt into the engine's own tokens by asking one
// healthy replica of the model for /tokenize (vLLM's API), so the router can
// hash exactly the blocks the engine caches. Replicas take turns; one that
// fails or times out is skipped for a while. Recent answers are cached
// (least recently used out), keyed by the model and the whole /tokenize body.
// HTTP runs on the client's own thread; answers come back as messages.
#pragma once

#include "actors/http_client.hpp"
#include "actors/interfaces.hpp"
#include "wire/topology.hpp"

#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <unordered_map>

namespace llmgw {

struct tokenizer_state {
  struct replica {
    std::string name;
    std::string model;
    std::vector<std::string> lora;
    std::string url;
    std::chrono::steady_clock::time_point bad_until{};
  };
  struct cache_entry {
    std::vector<std::uint32_t> tokens;
    std::list<std::uint64_t>::iterator lru;
  };
  std::vector<replica> replicas;
  std::chrono::milliseconds timeout{500};
  std::chrono::milliseconds bad_for{5000};
  std::size_t cache_capacity = 4096;
  std::unordered_map<std::uint64_t, cache_entry> cache;
  std::list<std::uint64_t> lru; ///< most recent first
  std::uint64_t turn = 0;
  std::uint64_t next_id = 0;
  std::map<std::uint64_t, std::pair<caf::typed_response_promise<tokenize_reply>, std::uint64_t>>
    pending; ///< request id -> (promise, cache key)
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::unique_ptr<http_client> http;
  static inline const char* name = "tokenizer";
};

tokenizer_actor::behavior_type tokenizer(tokenizer_actor::stateful_pointer<tokenizer_state> self,
                                         const wire::topology& topo);

} // namespace llmgw
