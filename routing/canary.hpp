// The parity self-test a control node runs on every engine with KV events:
// its canary. When the engine's KV state first arrives, and again after it
// restarts (a restart or exit in its agent's reset counts) or its agent
// comes back, the control node sends it one short completion: a prompt of
// random token ids (at least two full blocks and one token more, so its
// blocks are new to every cache) with max_tokens 1. The router computes
// that prompt's block keys the way it computes any request's. The canary
// passes when the engine's own events (no speculative entries) show those
// blocks on any rank of the replica; it fails when they have not appeared
// canary_timeout after the engine first answered one of its prompts, or the
// engine refused the request (a 4xx but 408 and 429). An engine that does
// not answer yet (it is starting: the agent's state arrives before the
// engine listens), or answers 5xx, 408 or 429, gets a new prompt every
// second, except while the gateway has it marked down (its health probes
// fail: vLLM listens only once its model is loaded).
// While the engine has answered but its blocks have not appeared, another
// prompt follows every second (four flush intervals, if longer), any of
// whose blocks pass it: an engine's first event batch can be lost (a PUB
// socket drops what it publishes before the subscription reaches it), and
// only a later batch reveals the gap that the replay endpoint fills. A
// replica whose canary has not passed is scored by tier 1, as a distrusted
// one is: whatever its agent says of parity, the router has not yet seen
// a prompt it sent come back under the keys it would route on. A failed
// canary is sent again (a new prompt) canary_retry after it failed.
//
// What it catches that no per-block check can: an engine hashing with
// another seed or algorithm whose events carry no tokens to check (parity
// "unknown"), an events endpoint that belongs to another engine than the
// replica's URL (its blocks then appear under the other replica: the
// failure names it), and events that never arrive.
#pragma once

#include "wire/block_hash.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace llmgw::routing {

/// Where a replica's canary stands.
enum class canary_state : std::uint8_t {
  off,     ///< no KV events, or `canary = false`: routed on its KV state unchecked
  waiting, ///< to be sent once its KV state is there
  sent,    ///< sent; its blocks have not appeared yet
  passed,  ///< its blocks appeared under the router's keys
  failed,  ///< they did not, or the engine refused it: tier 1 until one passes
};

/// "off", "waiting", "sent", "passed", "failed".
const char* to_string(canary_state s) noexcept;

/// Whether a replica in state `s` may be routed on its KV state.
inline bool canary_allows_kv(canary_state s) noexcept {
  return s == canary_state::off || s == canary_state::passed;
}

/// One replica's canary.
struct canary_record {
  canary_state state = canary_state::off;
  std::uint64_t id = 0; ///< the prompt sent last (an answer for another is late)
  /// The full blocks of every prompt of this round (first send to pass or
  /// fail), as the router keys them; at most max_canary_prompts, newest last.
  std::vector<std::vector<wire::block_key>> keys;
  std::chrono::steady_clock::time_point sent_at{};   ///< the round's first prompt
  std::chrono::steady_clock::time_point resent_at{}; ///< its last
  std::chrono::steady_clock::time_point retry_at{};  ///< failed: when to send the next one
  bool answered = false;                             ///< the engine answered the last prompt (200)
  bool answered_any = false;                         ///< it answered one of this round's
  bool unanswered = false; ///< the last prompt got no answer, or a 5xx, 408 or 429
  bool heard = false;      ///< the engine answered one of this round's, whatever the status
  std::chrono::steady_clock::time_point heard_at{}; ///< when first: the timeout runs from here
  std::string last_error;                           ///< what that was
  std::string reason;                               ///< failed: why, in words
  std::int32_t rank = -1;                           ///< passed: the rank whose events showed it
  double seconds = 0; ///< passed: from sending to its blocks appearing
  std::uint64_t attempts = 0;
  std::uint64_t passes = 0;
  std::uint64_t failures = 0;
};

/// The prompts of one round a canary keeps looking for.
inline constexpr std::size_t max_canary_prompts = 16;

/// A canary to send: POST `body` to `url` + /v1/completions, then report
/// the answer with router_core::canary_answered(replica, id, ...).
struct canary_job {
  std::string replica;
  std::uint64_t id = 0;
  std::string url;
  std::string body;
  bool follow_up = false; ///< another prompt of a round already sent
};

/// How many tokens a canary prompt has at block size `block_size`: whole
/// blocks for at least 32 tokens (two at least), and one token more, since
/// an engine never caches a prompt's last token.
std::size_t canary_prompt_tokens(std::size_t block_size) noexcept;

/// The prompt for `nonce`: canary_prompt_tokens() ids in [1000, 9192), a
/// range inside every tokenizer's vocabulary that names no special token of
/// the common ones.
std::vector<std::uint32_t> canary_prompt(std::uint64_t nonce, std::size_t block_size);

/// The completion request carrying `tokens` for `model`: one token, greedy,
/// not streamed.
std::string canary_body(const std::string& model, const std::vector<std::uint32_t>& tokens);

} // namespace llmgw::routing
