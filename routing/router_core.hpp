// The router's decision, as pure code: which replica gets a request, and why.
// routing::shared_router holds one, for the router actor and the gateways.
//
// Candidates are the replicas that serve the requested model (its name, or a
// LoRA adapter one of them serves) and are not marked down (if all are down,
// all are tried). Each is scored by what it holds of the prompt:
// - Tier 2 (kv): for candidates with trusted KV state, the weighted share of
//   the prompt's leading blocks held (best data-parallel rank; a CPU or
//   storage block counts `cpu_weight`/`storage_weight`).
// - Tier 1 (approx): for the others, or for everyone when tokenization failed
//   or tier 2 found nothing, the share of the prompt's leading text chunks the
//   router sent there (not computed when tier 2 decides alone, except for a
//   dry run, which reports every score).
// A routed prompt's blocks are entered at once as speculative for the chosen
// rank (replica_index::speculate) for `speculative_ttl`, unless the engine's
// events confirm them first.
// Then each candidate's cost is estimated: the time until the request's first
// token there, in milliseconds:
//   scale x (prefill_ms_per_token x (its uncached prompt tokens + the prompt
//   tokens sent there that have not started yet + others' waiting work)
//   + steps x (step_ms + decode_ms_per_request x requests decoding there))
// where steps is how many engine steps of max_batched_tokens that prefill
// takes (at least one), and scale is learnt per replica from the first
// tokens the gateway sees (observed time against this estimate). Where the
// engine's own load is known (its /metrics gauges, forwarded by its agent,
// no older than engine_load_max_age), it counts too: requests running there
// beyond this gateway's own unstarted ones decode alongside the prefill, and
// requests waiting there beyond this gateway's own are other gateways' work,
// each costing the mean prefill this router has seen. The least
// cost wins; costs within `tie_margin` of it count as ties and go to the one
// holding more of the prompt (less work for the fleet: a burst of one new
// prefix stays together), then to the least loaded, then in turn. Load is part of every decision: a
// cache hit on a replica with a long queue loses to a miss on an idle one when the queue costs more
// than the prefill it saves.
//
// The engine's answer checks the index: it says how many prompt tokens the
// engine found cached (usage.prompt_tokens_details.cached_tokens), against
// the leading blocks the engine's own events said the chosen rank held
// (predicted_cached_tokens; speculative entries do not count). Blocks
// claimed but not found, and not stored again since, are dropped from the
// index at once (replica_index::settle). When more than
// `distrust_shortfall_share` of a replica's last 32 checked answers fell
// short, its KV state is distrusted: it is scored by tier 1, while its
// answers are still checked against what the index would have predicted,
// until no more than a quarter of that share of the last 32 fall short, or
// its cache is emptied (forget_sent()), whichever comes first.
//
// A replica with KV events is also scored by tier 1 until its canary passes:
// a prompt the router sent whose blocks came back in the engine's events
// under the keys it routes on (routing/canary.hpp; canary_tick()).
#pragma once

#include "config/topology.hpp"
#include "routing/canary.hpp"
#include "routing/prefix_tree.hpp"
#include "routing/replica_index.hpp"

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace llmgw::routing {

/// Why a replica was chosen; a metric label.
enum class route_tier : std::uint8_t { kv, approx, load, none };
const char* to_string(route_tier t) noexcept;

/// What the router needs to know of a request.
struct route_query {
  std::string model;      ///< the request's "model": a served model or LoRA adapter
  bool tokenized = false; ///< false: tokenization failed or was not tried
  /// Where the tokens came from: "request" (token ids given), "cache",
  /// "render" or "tokenize" (asked of a replica), "" (none).
  std::string tokens_from;
  std::vector<wire::block_key> keys; ///< the prompt's block keys (full blocks), if tokenized
  std::size_t prompt_tokens = 0;     ///< the prompt's tokens, if tokenized
  std::vector<std::uint64_t> chunks; ///< tier-1 chunk hashes of the prompt text
  std::vector<std::string> exclude;  ///< replicas already tried for this request
  bool dry_run = false; ///< /v1/route: decide, but do not count load or remember the prompt
  // For the router's metrics:
  double tokenize_seconds = -1; ///< time tokenization took (-1: not tried)
  double hash_seconds = 0;      ///< time hashing the prompt took
};

/// One candidate's scores.
struct replica_score {
  std::string replica;
  bool trusted = false; ///< tier 2 knew its KV state, and it is not distrusted
  /// Tier 2 knows its KV state, but its answers showed the state wrong too
  /// often: scored by tier 1 (its kv and kv_blocks are what the index says).
  bool distrusted = false;
  /// Its canary has not passed (canary_allows_kv): scored by tier 1.
  canary_state canary = canary_state::off;
  /// Tier 2's state may miss blocks the engine holds (an unfilled gap): it
  /// is scored by the better of tier 2 and tier 1.
  bool partial = false;
  double kv = 0;                 ///< tier-2 score, 0..1
  std::uint32_t kv_blocks = 0;   ///< leading blocks held (best rank)
  std::int32_t dp_rank = -1;     ///< the rank holding them, -1 if none
  double approx = 0;             ///< tier-1 score, 0..1
  bool by_kv = false;            ///< scored by tier 2 (else by tier 1)
  std::uint32_t outstanding = 0; ///< requests in flight
  bool down = false;             ///< marked down after failures
  // The cost and its parts:
  std::uint64_t cached_tokens = 0;   ///< prompt tokens it should find cached
  std::uint64_t uncached_tokens = 0; ///< prompt tokens it would compute
  std::uint64_t queued_tokens = 0;   ///< prompt tokens sent there, not started yet
  std::uint32_t decoding = 0;        ///< requests started there, not finished
  double scale = 1;                  ///< learnt: observed / estimated first-token time
  double cost_ms = 0;                ///< estimated time to first token
  // The engine's own report, when fresh (engine_load):
  bool engine_load = false;
  std::uint32_t engine_running = 0;
  std::uint32_t engine_waiting = 0;
  std::int32_t engine_kv_usage_permille = -1; ///< -1: not reported
  std::uint64_t others_queued_tokens = 0;     ///< waiting work not sent by this gateway
};

/// Why a decision names no replica.
enum class route_failure : std::uint8_t {
  none,          ///< a replica was chosen
  unknown_model, ///< no replica serves the model (the gateway answers 404)
  all_excluded,  ///< every replica serving it was left out: tried already (503)
};

/// The decision.
struct route_decision {
  std::string replica; ///< empty when no replica serves the model
  std::string url;     ///< its base URL
  /// Which entry of that name (replica_entry::incarnation): a request's end
  /// is not counted against an entry a reload put in its place.
  std::uint64_t incarnation = 0;
  route_tier tier = route_tier::none;
  double score = 0;          ///< the winner's score in its tier
  std::int32_t dp_rank = -1; ///< tier kv: the rank holding the prefix
  std::uint32_t prompt_blocks = 0;
  std::string tokens_from; ///< route_query::tokens_from
  std::uint32_t prompt_chunks = 0;
  /// The prompt tokens the chosen rank should find cached by its engine's
  /// own events (speculative entries do not count), as vLLM counts them
  /// (whole blocks, never the prompt's last token); 0 when the index knows
  /// nothing of it. The engine's answer checks it (finished()).
  std::uint64_t predicted_cached_tokens = 0;
  watch_id watch = 0;                ///< the prediction, watched in the index until the answer
  std::uint64_t uncached_tokens = 0; ///< the chosen replica's prefill (for started/finished)
  double model_ms = 0;               ///< its estimated time to first token, before scaling
  double cost_ms = 0;                ///< and after
  std::vector<replica_score> scores; ///< every candidate
  route_failure failure = route_failure::none;
  std::string error;  ///< why there is no replica, in words
  double seconds = 0; ///< time deciding took (not hashing)
};

/// Counters the router exports.
struct router_counters {
  std::uint64_t decisions[4] = {}; ///< by route_tier
  std::uint64_t no_replica = 0;
  /// Decisions where the candidate holding the most of the prompt lost on
  /// cost (its queue cost more than the prefill it would save).
  std::uint64_t load_overrides = 0;
  std::uint64_t canaries_sent = 0;
  std::uint64_t canaries_passed = 0;
  std::uint64_t canaries_failed = 0;
};

/// What the gateway reports of a routed request, to keep each replica's load
/// and learnt rate current.
struct request_progress {
  std::string replica;
  std::uint64_t incarnation = 0;             ///< route_decision::incarnation (0: the one in force)
  std::uint64_t uncached_tokens = 0;         ///< route_decision::uncached_tokens
  double model_ms = 0;                       ///< route_decision::model_ms
  std::uint64_t predicted_cached_tokens = 0; ///< route_decision::predicted_cached_tokens
  watch_id watch = 0;                        ///< route_decision::watch
};

/// A decision's part of what the gateway reports.
request_progress progress_of(const route_decision& d);

class router_core {
public:
  explicit router_core(const config::topology& topo);

  /// Decides for one request. Unless dry_run, counts the request as
  /// outstanding on the chosen replica. Call remember() afterwards (after
  /// replying: the request need not wait for it).
  route_decision decide(const route_query& q, std::chrono::steady_clock::time_point now);

  /// Records in tier 1 that the decision's replica was sent the prompt.
  void remember(const route_decision& d, const std::vector<std::uint64_t>& chunks,
                std::chrono::steady_clock::time_point now);

  /// The first token of a request came back after `observed_ms`: its
  /// prefill is done (it now decodes), and the replica's scale learns from
  /// the time against the estimate.
  void first_token(const request_progress& p, double observed_ms,
                   std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

  /// A request finished (success or not); `started` if first_token() was
  /// called for it; `reported_cached` is what its engine said it found
  /// cached, if it said: it checks the decision's prediction.
  void finished(const request_progress& p, bool started,
                std::optional<std::uint64_t> reported_cached = std::nullopt,
                std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

  /// Marks `replica` down until `until`: it could not be reached (a
  /// health probe that succeeds ends the mark), or, with `unreachable`
  /// false, it answered server errors (its probe says nothing new: the mark
  /// lasts). With an `incarnation` (route_decision's), only that entry:
  /// the failure of a request sent before a reload replaced the replica
  /// says nothing of the new one.
  void mark_down(const std::string& replica, std::chrono::steady_clock::time_point until,
                 bool unreachable = true, std::uint64_t incarnation = 0);

  /// A health probe of `replica` succeeded (`ok`) or failed. Failed ones in
  /// a row (probe_failures_to_mark_down) mark it down until one succeeds; a
  /// success ends that mark and one for being unreachable (mark_down).
  /// Returns true when the replica went down or came back.
  bool probe_result(const std::string& replica, bool ok,
                    std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

  /// Empty when this router can route well: some replica is not avoided
  /// and either has KV state (a full copy from its agent) or, without KV
  /// events, has answered a health probe (or nothing probes it). Else why
  /// not, in words.
  std::string unready_reason(std::chrono::steady_clock::time_point now) const;

  /// Forgets what tier 1 remembers sending to `replica`: its engine's cache
  /// was emptied (a clear, a restart, an exit).
  void forget_sent(const std::string& replica);

  /// What the engine of `replica` reported of its load, read at `at`: its
  /// running and waiting requests and KV cache use (permille, -1 unknown).
  void engine_load(const std::string& replica, std::uint32_t running, std::uint32_t waiting,
                   std::int32_t kv_usage_permille, std::chrono::steady_clock::time_point at);

  /// Forgets the engine's load (its agent went away).
  void forget_engine_load(const std::string& replica);

  /// Puts a reloaded topology's replicas in force: a replica no longer in
  /// it, or whose entry or node changed, is retired (never chosen again, its
  /// KV state, tier-1 memory and load forgotten; a request in flight there
  /// still reports its end, which is ignored); one new to it (or changed)
  /// starts with no state, as at start. Unchanged replicas keep everything.
  /// The router's settings are not reloaded (config/topology_change.hpp).
  void apply_topology(const config::topology& topo);

  /// Whether `replica` is a replica of the topology in force (updates for
  /// any other, in flight when it was removed, are ignored).
  bool configured(const std::string& replica) const;

  /// Checks the canaries sent (passed when their blocks appeared on a rank
  /// of their replica, failed when they are canary_timeout old), then
  /// returns the ones to send now: for each replica waiting whose KV state
  /// is there, or failed and due again (routing/canary.hpp). Each canary
  /// that passed or failed here adds a line for the log to `news`.
  std::vector<canary_job> canary_tick(std::chrono::steady_clock::time_point now,
                                      std::vector<std::string>* news = nullptr);

  /// The engine's answer to canary `id` of `replica`: its HTTP `status`
  /// (0: none came; `error` says why). 200 leaves it to its blocks; no
  /// answer or a 5xx (an engine still starting, or restarting) is tried
  /// again with a new prompt until the canary's timeout; any other status
  /// fails it at once. An answer for another prompt is ignored.
  void canary_answered(const std::string& replica, std::uint64_t id, int status,
                       const std::string& error, std::chrono::steady_clock::time_point now);

  /// `replica`'s engine restarted, or its agent went away: its canary is
  /// sent again once its KV state is back, and until it passes it is
  /// scored by tier 1.
  void canary_again(const std::string& replica);

  /// Tier 1's memory of what was sent where (for its size in /metrics).
  const prefix_tree& tier1() const noexcept { return tree_; }

  /// The KV state: agents' changes go here.
  replica_index& kv() noexcept { return kv_; }
  const replica_index& kv() const noexcept { return kv_; }

  /// Every configured replica, in topology order.
  struct replica_entry {
    std::string name;
    std::string node;
    std::string model;
    std::vector<std::string> lora;
    std::string url;
    bool kv_events = false;
    std::uint32_t dp_size = 1; ///< the engine's data-parallel ranks
    /// Removed by a reload: its slot (and tier-1 index) waits for a new
    /// replica, and nothing is routed or reported for it.
    bool retired = false;
    /// Numbers the entries: one a reload makes for a changed replica is not
    /// the entry that requests in flight were sent to (0: none yet).
    std::uint64_t incarnation = 0;
    std::uint32_t outstanding = 0;
    std::chrono::steady_clock::time_point down_until{};
    bool down_unreachable = false;    ///< down_until is for being unreachable
    std::uint32_t probe_failures = 0; ///< health probes failed in a row
    bool probe_down = false;          ///< marked down by its probes, until one succeeds
    bool probe_ok_seen = false;       ///< a probe succeeded once
    /// Avoided: a failed request marked it (until down_until), or its probes.
    bool down(std::chrono::steady_clock::time_point now) const {
      return probe_down || down_until > now;
    }
    std::uint64_t queued_tokens = 0; ///< prompt tokens sent, first token not seen
    std::uint32_t decoding = 0;      ///< first token seen, not finished
    double scale = 1;                ///< learnt (first_token)
    // What the engine last reported of itself (engine_load):
    bool engine_load_known = false;
    std::chrono::steady_clock::time_point engine_load_at{}; ///< when it was read
    std::uint32_t engine_running = 0;
    std::uint32_t engine_waiting = 0;
    std::int32_t engine_kv_usage_permille = -1;
    // The index's predictions for it, checked against its answers:
    std::uint32_t check_history = 0;   ///< the last 32, a bit each, newest lowest (1: fell short)
    std::uint32_t checks_seen = 0;     ///< how many of those bits are answers (at most 32)
    bool distrusted = false;           ///< scored by tier 1 (see the top of this file)
    std::uint64_t distrusts = 0;       ///< times it became distrusted
    std::uint64_t shortfall_drops = 0; ///< blocks dropped because an answer lacked them
    std::uint64_t answers_checked = 0; ///< answers checked against the index's prediction
    std::uint64_t answers_short = 0;   ///< of those, fewer cached tokens than predicted
    bool canary_wanted = false;        ///< kv_events and engine_spec::canary
    canary_record canary;              ///< its parity self-test
    /// Of the last checked answers, how many fell short.
    std::uint32_t recent_shortfalls() const;
    /// When this gateway's requests were sent there, and when they left the
    /// engine's queue (first token, or ended before it), for as long as an
    /// engine's report counts: a report read at t counts the requests sent
    /// before t that had not left by t as its own waiting ones.
    std::deque<std::chrono::steady_clock::time_point> sent_at, left_at;
    /// The engine's report is recent enough to count.
    bool engine_load_fresh(std::chrono::steady_clock::time_point now,
                           std::chrono::milliseconds max_age) const {
      return engine_load_known && now - engine_load_at <= max_age;
    }
  };
  /// Every slot, retired ones too (skip those: replica_entry::retired).
  const std::vector<replica_entry>& replicas() const noexcept { return replicas_; }

  const router_counters& counters() const noexcept { return counters_; }
  const config::router_settings& settings() const noexcept { return settings_; }
  std::size_t block_size() const noexcept { return block_size_; }

private:
  /// Keeps replica_holders_ in step with the holders the index has seen.
  void refresh_holders();
  /// Retires slot `i` (apply_topology).
  void retire(std::size_t i);
  replica_entry* find(const std::string& replica);
  /// The entry `p`'s request was sent to, unless a reload replaced it.
  replica_entry* find(const request_progress& p);
  /// Notes in `times` that one of this gateway's requests was sent or left
  /// the queue at `now`, forgetting what no report can still need.
  void note(std::deque<std::chrono::steady_clock::time_point>& times,
            std::chrono::steady_clock::time_point now) const;
  /// Checks a prediction for `r` against what its engine reported.
  void check(replica_entry& r, const request_progress& p, std::uint64_t reported);
  /// Fills each score's cost and its parts; `prompt` in tokens.
  void estimate_costs(route_decision& d, std::uint64_t prompt,
                      std::chrono::steady_clock::time_point now) const;

  config::router_settings settings_;
  std::size_t block_size_;
  bool probed_; ///< the gateway probes every replica's health
  std::vector<replica_entry> replicas_;
  replica_index kv_;
  prefix_tree tree_;
  router_counters counters_;
  std::uint64_t turn_ = 0;         ///< rotates among equal choices
  std::uint64_t incarnations_ = 0; ///< entries made so far
  std::string seed_;               ///< the cluster's hash seed, for canary prompts' keys
  std::unique_ptr<wire::block_hasher> hasher_; ///< made at the first canary
  std::uint64_t canary_nonce_;                 ///< random at start; one more per canary
  std::uint64_t canary_ids_ = 0;               ///< canary prompts made
  /// An answered canary whose blocks have not appeared is followed by
  /// another prompt this often (routing/canary.hpp).
  std::chrono::milliseconds canary_resend_;
  /// The mean prefill (uncached tokens) of the requests routed, a moving
  /// average: what a request waiting at an engine is taken to cost.
  double mean_uncached_ = 0;
  bool routed_any_ = false;

  std::vector<std::vector<holder_id>> replica_holders_; ///< by replica index
  std::size_t known_holders_ = 0;

  // Scratch, reused between decisions.
  std::vector<std::size_t> candidates_;
  std::vector<holder_id> holders_;
  std::vector<std::size_t> holder_owner_; ///< index into candidates_
  std::vector<walk_score> walk_;
  std::vector<tree_replica> tree_candidates_;
  std::vector<std::uint32_t> matched_;
};

} // namespace llmgw::routing
