// What SGLang publishes for the cache llmgw-sim simulates (`--sim-as sglang`):
// the simulated cache produces vLLM's events (its hits follow the same rules
// SGLang's radix cache does for whole pages), and this rewrites each batch as
// SGLang's publisher and event code write it (golden/sglang-captures/):
// - one BlockStored per page, its id SHA-256 over the parent page's digest
//   and the page's tokens as little-endian uint32 (a salted chain's first
//   page seeded with SHA-256 of "sglang-cache-salt-v1\0" and the salt), the
//   digest's first 8 bytes as a signed int64; no parent id on a chain's
//   first page; lora_id always nil (SGLang publishes no LoRA); the salt on
//   every page of a salted chain;
// - one BlockRemoved for the pages a vLLM removal names;
// - "CPU_PINNED" for host copies, which carry their tokens.
// Pure code; one per publisher (rank).
#pragma once

#include "wire/block_hash.hpp"
#include "wire/kv_events.hpp"

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmgw::sim {

/// SGLang's id of a page: SHA-256(prior digest, if any, then the tokens as
/// little-endian uint32), and the id its events carry (the first 8 bytes,
/// big-endian, as the key of a signed int64).
wire::digest sglang_page_digest(wire::sha256& sha, const wire::digest* prior,
                                const std::uint32_t* tokens, std::size_t count);
wire::block_key sglang_page_id(const wire::digest& d) noexcept;

/// The prior digest of a salted chain's first page.
wire::digest sglang_salt_root(wire::sha256& sha, const std::string& salt);

class sglang_stream {
public:
  /// SGLang's events for one batch of the simulated cache's (vLLM's) events.
  std::vector<wire::kv_event> convert(const std::vector<wire::kv_event>& events);

  /// Pages known (stored on some medium and not removed from all).
  std::size_t pages() const noexcept { return pages_.size(); }

private:
  struct page {
    wire::digest digest{};
    std::optional<std::string> salt;
    std::vector<std::uint32_t> tokens; ///< for host copies, published with tokens
    std::uint32_t copies = 0;          ///< media holding it
  };
  void stored(const wire::kv_event& ev, std::vector<wire::kv_event>& out);
  void removed(const wire::kv_event& ev, std::vector<wire::kv_event>& out);

  std::unordered_map<wire::block_key, page> pages_; ///< by the simulated cache's key
  wire::sha256 sha_;
};

} // namespace llmgw::sim
