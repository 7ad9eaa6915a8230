// The tokenizer: turns a prompt into the engine's own tokens by asking one
// healthy replica of the model, so the router can hash exactly the blocks
// the engine caches. It asks the render endpoint of the request's kind
// first (the whole request in, the tokens the engine will see out); a
// replica that has none (404, 405 or 501: vLLM without --enable-scale-out,
// or older) is asked /tokenize from then on, this request included. Replicas take turns; one that
// fails or times out is skipped for a while. Answers go into a
// routing::token_cache, shared with the node's gateway (which looks there
// first, on its own thread). HTTP runs on the client's own thread; answers
// come back as messages.
#pragma once

#include "actors/interfaces.hpp"
#include "config/topology.hpp"
#include "net/http_client.hpp"

#include "routing/token_cache.hpp"

#include <chrono>
#include <map>
#include <memory>

namespace llmgw {

struct tokenizer_state {
  struct replica {
    std::string name;
    std::string model;
    std::vector<std::string> lora;
    std::string url;
    std::chrono::steady_clock::time_point bad_until{};
    bool no_render = false; ///< it answered a render call with "no such endpoint"
  };
  std::vector<replica> replicas;
  std::chrono::milliseconds timeout{500};
  std::chrono::milliseconds bad_for{5000};
  std::shared_ptr<routing::token_cache> cache;
  std::uint64_t turn = 0;
  std::uint64_t next_id = 0;
  struct waiting {
    caf::typed_response_promise<tokenize_reply> promise;
    tokenize_request request;
    std::chrono::steady_clock::time_point start;
  };
  std::map<std::uint64_t, waiting> pending; ///< request id -> who waits, for what
  std::unique_ptr<http_client> http;
  static inline const char* name = "tokenizer";
};

/// A tokenizer filling `cache` (the gateway of the same node reads it).
tokenizer_actor::behavior_type tokenizer(tokenizer_actor::stateful_pointer<tokenizer_state> self,
                                         const config::topology& topo,
                                         std::shared_ptr<routing::token_cache> cache);

} // namespace llmgw
