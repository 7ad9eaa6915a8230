// router_core's canaries (routing/canary.hpp): the prompts, and each
// replica's state from waiting to passed or failed.
#include "routing/router_core.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>

#include <algorithm>

namespace llmgw::routing {

const char* to_string(canary_state s) noexcept {
  switch (s) {
  case canary_state::off:
    return "off";
  case canary_state::waiting:
    return "waiting";
  case canary_state::sent:
    return "sent";
  case canary_state::passed:
    return "passed";
  case canary_state::failed:
    return "failed";
  }
  return "?";
}

std::size_t canary_prompt_tokens(std::size_t block_size) noexcept {
  auto bs = std::max<std::size_t>(block_size, 1);
  auto blocks = std::max<std::size_t>(2, (32 + bs - 1) / bs);
  return blocks * bs + 1;
}

namespace {

/// splitmix64: spreads consecutive nonces over the whole range.
std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr std::uint32_t first_canary_token = 1000;
constexpr std::uint32_t canary_token_range = 8192;

} // namespace

std::vector<std::uint32_t> canary_prompt(std::uint64_t nonce, std::size_t block_size) {
  std::vector<std::uint32_t> out(canary_prompt_tokens(block_size));
  auto state = mix(nonce);
  for (auto& t : out) {
    state = mix(state);
    t = first_canary_token + static_cast<std::uint32_t>(state % canary_token_range);
  }
  return out;
}

std::string canary_body(const std::string& model, const std::vector<std::uint32_t>& tokens) {
  boost::json::array prompt;
  prompt.reserve(tokens.size());
  for (auto t : tokens)
    prompt.emplace_back(t);
  boost::json::object o{{"model", model},
                        {"prompt", std::move(prompt)},
                        {"max_tokens", 1},
                        {"temperature", 0},
                        {"stream", false}};
  return boost::json::serialize(o);
}

void router_core::canary_again(const std::string& replica) {
  auto* r = find(replica);
  if (!r || !r->canary_wanted)
    return;
  r->canary.state = canary_state::waiting;
  r->canary.id = 0; // an answer still on its way is for the engine as it was
  r->canary.reason.clear();
  r->canary.answered = false;
  r->canary.answered_any = false;
  r->canary.unanswered = false;
}

void router_core::canary_answered(const std::string& replica, std::uint64_t id, int status,
                                  const std::string& error,
                                  std::chrono::steady_clock::time_point now) {
  auto* r = find(replica);
  if (!r || r->canary.state != canary_state::sent || r->canary.id != id)
    return;
  auto& c = r->canary;
  if (status != 0 && !c.heard) {
    c.heard = true; // the engine is up: the round's timeout runs from here
    c.heard_at = now;
  }
  if (status == 200) {
    c.answered = true;
    c.answered_any = true;
    return; // its blocks may still be on their way: canary_tick() looks
  }
  if (status == 0 || status >= 500 || status == 408 || status == 429) {
    c.unanswered = true; // starting, busy or failing: canary_tick() sends another
    c.last_error = error;
    return;
  }
  c.state = canary_state::failed;
  c.reason = "the engine refused the canary completion: " + error;
  c.retry_at = now + settings_.canary_retry;
  c.keys.clear();
  ++c.failures;
  ++counters_.canaries_failed;
}

std::vector<canary_job> router_core::canary_tick(std::chrono::steady_clock::time_point now,
                                                 std::vector<std::string>* news) {
  std::vector<canary_job> jobs;
  for (auto& r : replicas_) {
    auto& c = r.canary;
    if (r.retired || c.state == canary_state::off || c.state == canary_state::passed)
      continue;
    auto ranks = kv_.holders_of(r.name);
    bool follow_up = false;
    if (c.state == canary_state::sent) {
      auto shows = [&](holder_id h, std::size_t blocks) {
        for (const auto& k : c.keys)
          if (kv_.leading_confirmed(h, k.data(), std::min(blocks, k.size()))
              == std::min(blocks, k.size()))
            return true;
        return false;
      };
      for (auto h : ranks)
        if (kv_.info(h).has_state && shows(h, static_cast<std::size_t>(-1))) {
          c.state = canary_state::passed;
          c.reason.clear();
          c.last_error.clear();
          c.rank = static_cast<std::int32_t>(kv_.info(h).dp_rank);
          c.seconds = std::chrono::duration<double>(now - c.sent_at).count();
          ++c.passes;
          ++counters_.canaries_passed;
          if (news)
            news->push_back(fmt::format("replica {}: canary {} passed on rank {} after {:.3f} s",
                                        r.name, c.id, c.rank, c.seconds));
          break;
        }
      if (c.state == canary_state::sent && c.heard
          && now - c.heard_at >= settings_.canary_timeout) {
        // Where did its blocks go, if anywhere?
        std::string elsewhere;
        for (const auto& other : replicas_)
          if (!other.retired && other.name != r.name)
            for (auto h : kv_.holders_of(other.name))
              if (elsewhere.empty() && shows(h, 1))
                elsewhere = other.name;
        auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - c.heard_at);
        if (!elsewhere.empty())
          c.reason = fmt::format(
            "the canary prompt's blocks appeared in replica {}'s events, not in these: this "
            "replica's url and its events endpoint belong to different engines",
            elsewhere);
        else if (!c.answered_any)
          c.reason = fmt::format("the engine answered no canary completion with 200 in {} ms "
                                 "(last: {})",
                                 waited.count(), c.last_error);
        else
          c.reason = fmt::format(
            "the engine answered the canary completion, but its events did not show the "
            "prompt's {} blocks under llmgw's keys within {} ms: it hashes blocks another way "
            "(its seed or hash algorithm, see llmgw status's parity) or these events are "
            "another engine's",
            c.keys.back().size(), waited.count());
        c.state = canary_state::failed;
        c.retry_at = now + settings_.canary_retry;
        c.keys.clear();
        ++c.failures;
        ++counters_.canaries_failed;
        if (news)
          news->push_back(fmt::format("replica {}: canary {} failed: {} (routed by the prefix "
                                      "tree; sent again in {} ms)",
                                      r.name, c.id, c.reason, settings_.canary_retry.count()));
      }
      // Answered and still nothing, or not answered yet: another prompt
      // (see the top of canary.hpp), unless the engine is marked down.
      if (c.state != canary_state::sent || !(c.answered || c.unanswered)
          || now - c.resent_at < canary_resend_ || r.down(now))
        continue;
      follow_up = true;
    } else {
      bool due =
        c.state == canary_state::waiting || (c.state == canary_state::failed && now >= c.retry_at);
      bool has_state =
        std::any_of(ranks.begin(), ranks.end(), [&](holder_id h) { return kv_.info(h).has_state; });
      if (!due || !has_state || r.down(now))
        continue;
      c.keys.clear();
      c.state = canary_state::sent;
      c.sent_at = now;
      c.heard = false;
      c.answered_any = false;
      c.last_error.clear();
      c.rank = -1;
      ++c.attempts;
      ++counters_.canaries_sent;
    }
    if (!hasher_)
      hasher_ = std::make_unique<wire::block_hasher>(seed_, block_size_);
    auto tokens = canary_prompt(canary_nonce_ + ++canary_ids_, block_size_);
    if (c.keys.size() == max_canary_prompts)
      c.keys.erase(c.keys.begin());
    auto& keys = c.keys.emplace_back();
    for (const auto& b : hasher_->hash(tokens))
      keys.push_back(b.key);
    c.id = canary_ids_;
    c.resent_at = now;
    c.answered = false;
    c.unanswered = false;
    jobs.push_back({r.name, c.id, r.url, canary_body(r.model, tokens), follow_up});
  }
  return jobs;
}

} // namespace llmgw::routing
