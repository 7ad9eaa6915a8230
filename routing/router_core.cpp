#include "routing/router_core.hpp"

#include <algorithm>
#include <bitset>
#include <cmath>
#include <random>

namespace llmgw::routing {

const char* to_string(route_tier t) noexcept {
  switch (t) {
  case route_tier::kv:
    return "kv";
  case route_tier::approx:
    return "approx";
  case route_tier::load:
    return "load";
  case route_tier::none:
    return "none";
  }
  return "?";
}

router_core::router_core(const config::topology& topo)
  : settings_(topo.router), block_size_(topo.block_size),
    probed_(topo.gateway.health_interval.count() > 0),
    tree_(topo.router.tier1_capacity, topo.router.tier1_ttl), seed_(topo.seed),
    canary_nonce_(std::random_device{}() * 0x9e3779b97f4a7c15ULL ^ std::random_device{}()),
    canary_resend_(std::max(std::chrono::milliseconds(1000), 4 * topo.flush_interval)) {
  // Agents read their engines once per flush interval (100 ms at least): a
  // reading must count for two of them, or none would count between reads.
  auto& age = settings_.engine_load_max_age;
  if (age.count() > 0)
    age = std::max(age, 2 * std::max(topo.flush_interval, std::chrono::milliseconds(100)));
  apply_topology(topo);
}

namespace {

router_core::replica_entry entry_of(const config::node_spec& n, const config::engine_spec& e) {
  router_core::replica_entry r;
  r.name = e.replica;
  r.node = n.name;
  r.model = e.model;
  r.lora = e.lora;
  r.url = e.url;
  r.kv_events = e.kv_events;
  r.dp_size = e.dp_size;
  r.canary_wanted = e.kv_events && e.canary;
  r.canary.state = r.canary_wanted ? canary_state::waiting : canary_state::off;
  return r;
}

bool same_entry(const router_core::replica_entry& a, const router_core::replica_entry& b) {
  return a.name == b.name && a.node == b.node && a.model == b.model && a.lora == b.lora
         && a.url == b.url && a.kv_events == b.kv_events && a.dp_size == b.dp_size;
}

} // namespace

void router_core::retire(std::size_t i) {
  auto& r = replicas_[i];
  kv_.drop_replica(r.name);
  tree_.forget(static_cast<tree_replica>(i));
  replica_entry empty;
  empty.name = std::move(r.name); // kept: a new replica of that name takes this slot again
  empty.retired = true;
  r = std::move(empty);
}

void router_core::apply_topology(const config::topology& topo) {
  std::vector<replica_entry> wanted;
  for (const auto& n : topo.nodes)
    for (const auto& e : n.engines)
      wanted.push_back(entry_of(n, e));
  auto is_wanted = [&](const replica_entry& r) {
    return std::any_of(wanted.begin(), wanted.end(),
                       [&](const replica_entry& w) { return same_entry(w, r); });
  };
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (!replicas_[i].retired && !is_wanted(replicas_[i]))
      retire(i);
  for (auto& w : wanted) {
    auto live = std::find_if(replicas_.begin(), replicas_.end(), [&](const replica_entry& r) {
      return !r.retired && r.name == w.name;
    });
    if (live != replicas_.end()) {
      // Unchanged: keeps its state. Its canary may have been switched.
      if (live->canary_wanted != w.canary_wanted) {
        live->canary_wanted = w.canary_wanted;
        live->canary.state = w.canary_wanted ? canary_state::waiting : canary_state::off;
        live->canary.id = 0;
      }
      continue;
    }
    w.incarnation = ++incarnations_;
    // The slot it had, else any free one, else a new one.
    auto slot = std::find_if(replicas_.begin(), replicas_.end(),
                             [&](const replica_entry& r) { return r.retired && r.name == w.name; });
    if (slot == replicas_.end())
      slot = std::find_if(replicas_.begin(), replicas_.end(),
                          [](const replica_entry& r) { return r.retired; });
    if (slot == replicas_.end())
      replicas_.push_back(std::move(w));
    else
      *slot = std::move(w);
  }
  replica_holders_.assign(replicas_.size(), {});
  known_holders_ = static_cast<std::size_t>(-1); // rebuilt on the next decision
}

bool router_core::configured(const std::string& replica) const {
  return std::any_of(replicas_.begin(), replicas_.end(),
                     [&](const replica_entry& r) { return !r.retired && r.name == replica; });
}

void router_core::remember(const route_decision& d, const std::vector<std::uint64_t>& chunks,
                           std::chrono::steady_clock::time_point now) {
  if (chunks.empty() || d.replica.empty())
    return;
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (!replicas_[i].retired && replicas_[i].name == d.replica
        && replicas_[i].incarnation == d.incarnation) {
      tree_.insert(static_cast<tree_replica>(i), chunks, now);
      return;
    }
}

void router_core::refresh_holders() {
  if (known_holders_ == kv_.holder_count())
    return;
  // New (replica, rank) pairs appeared: rebuild replica -> holders.
  replica_holders_.assign(replicas_.size(), {});
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    replica_holders_[i] = kv_.holders_of(replicas_[i].name);
  known_holders_ = kv_.holder_count();
}

request_progress progress_of(const route_decision& d) {
  return {d.replica, d.incarnation, d.uncached_tokens, d.model_ms, d.predicted_cached_tokens,
          d.watch};
}

namespace {
constexpr std::uint32_t check_window = 32; ///< the checked answers distrust looks at
/// Health probes failed in a row that mark a replica down: one can be a
/// hiccup (a pause, a lost packet); two at the probe interval are not.
constexpr std::uint32_t probe_failures_to_mark_down = 2;
} // namespace

std::uint32_t router_core::replica_entry::recent_shortfalls() const {
  return static_cast<std::uint32_t>(std::bitset<32>(check_history).count());
}

router_core::replica_entry* router_core::find(const std::string& replica) {
  for (auto& r : replicas_)
    if (!r.retired && r.name == replica)
      return &r;
  return nullptr;
}

router_core::replica_entry* router_core::find(const request_progress& p) {
  auto* r = find(p.replica);
  return r && (p.incarnation == 0 || r->incarnation == p.incarnation) ? r : nullptr;
}

void router_core::note(std::deque<std::chrono::steady_clock::time_point>& times,
                       std::chrono::steady_clock::time_point now) const {
  if (settings_.engine_load_max_age.count() == 0)
    return;
  times.push_back(now);
  // A report counts for engine_load_max_age; the bound keeps a flood small.
  while (!times.empty()
         && (times.front() + settings_.engine_load_max_age < now || times.size() > 65536))
    times.pop_front();
}

void router_core::first_token(const request_progress& p, double observed_ms,
                              std::chrono::steady_clock::time_point now) {
  auto* r = find(p);
  if (!r)
    return;
  r->queued_tokens -= std::min(r->queued_tokens, p.uncached_tokens);
  ++r->decoding;
  note(r->left_at, now);
  if (p.model_ms > 0 && observed_ms >= 0) {
    // A moving average of observed / estimated, bounded so one outlier (a
    // stalled connection, a GC pause) cannot swing decisions for long.
    auto ratio = std::clamp(observed_ms / p.model_ms, 0.1, 10.0);
    r->scale = std::clamp(0.8 * r->scale + 0.2 * ratio, 0.1, 10.0);
  }
}

void router_core::finished(const request_progress& p, bool started,
                           std::optional<std::uint64_t> reported_cached,
                           std::chrono::steady_clock::time_point now) {
  auto* r = find(p);
  if (!r) {
    kv_.unwatch(p.watch);
    return;
  }
  if (p.watch != 0) {
    if (reported_cached)
      check(*r, p, *reported_cached);
    else
      kv_.unwatch(p.watch);
  }
  if (r->outstanding > 0)
    --r->outstanding;
  if (started) {
    if (r->decoding > 0)
      --r->decoding;
  } else {
    r->queued_tokens -= std::min(r->queued_tokens, p.uncached_tokens);
    note(r->left_at, now);
  }
}

void router_core::check(replica_entry& r, const request_progress& p, std::uint64_t reported) {
  auto dropped = kv_.settle(p.watch, reported / block_size_);
  if (!dropped)
    return; // the rank's state was reset since: the answer speaks of another
  r.shortfall_drops += *dropped;
  bool fell_short = reported < p.predicted_cached_tokens;
  ++r.answers_checked;
  r.answers_short += fell_short ? 1 : 0;
  r.check_history = (r.check_history << 1) | (fell_short ? 1u : 0u);
  r.checks_seen = std::min(r.checks_seen + 1, check_window);
  auto share = settings_.distrust_shortfall_share;
  auto shortfalls = r.recent_shortfalls();
  if (!r.distrusted) {
    if (share > 0 && r.checks_seen == check_window
        && shortfalls > static_cast<std::uint32_t>(share * check_window)) {
      r.distrusted = true;
      ++r.distrusts;
    }
  } else if (share <= 0 || shortfalls <= static_cast<std::uint32_t>(share * check_window / 4)) {
    r.distrusted = false;
  }
}

void router_core::engine_load(const std::string& replica, std::uint32_t running,
                              std::uint32_t waiting, std::int32_t kv_usage_permille,
                              std::chrono::steady_clock::time_point at) {
  auto* r = find(replica);
  if (!r || (r->engine_load_known && at < r->engine_load_at))
    return; // unknown, or older than what is known
  r->engine_load_known = true;
  r->engine_load_at = at;
  r->engine_running = running;
  r->engine_waiting = waiting;
  r->engine_kv_usage_permille = kv_usage_permille;
}

void router_core::forget_engine_load(const std::string& replica) {
  if (auto* r = find(replica))
    r->engine_load_known = false;
}

void router_core::estimate_costs(route_decision& d, std::uint64_t prompt,
                                 std::chrono::steady_clock::time_point now) const {
  auto most_blocks = prompt > 0 ? (prompt - 1) / block_size_ : 0;
  auto budget = static_cast<double>(std::max<std::size_t>(settings_.max_batched_tokens, 1));
  for (std::size_t c = 0; c < d.scores.size(); ++c) {
    auto& s = d.scores[c];
    const auto& r = replicas_[candidates_[c]];
    double cached = 0;
    if (s.by_kv)
      cached = std::min(s.kv * d.prompt_blocks, static_cast<double>(most_blocks))
               * static_cast<double>(block_size_);
    else
      cached = std::min(s.approx * static_cast<double>(prompt),
                        static_cast<double>(prompt > 0 ? prompt - 1 : 0));
    s.cached_tokens = static_cast<std::uint64_t>(cached);
    s.uncached_tokens = prompt - std::min(prompt, s.cached_tokens);
    s.queued_tokens = r.queued_tokens;
    s.decoding = r.decoding;
    s.scale = r.scale;
    if (r.engine_load_fresh(now, settings_.engine_load_max_age)) {
      s.engine_load = true;
      s.engine_running = r.engine_running;
      s.engine_waiting = r.engine_waiting;
      s.engine_kv_usage_permille = r.engine_kv_usage_permille;
      // This gateway's requests that had not started when the engine was
      // read are in its counts (waiting, or running their prefill): those
      // not started now, plus those that started since, less those sent
      // since. The rest is work this gateway did not send.
      auto since = [&](const std::deque<std::chrono::steady_clock::time_point>& times) {
        return static_cast<std::uint32_t>(
          times.end() - std::upper_bound(times.begin(), times.end(), r.engine_load_at));
      };
      auto unstarted = r.outstanding - std::min(r.outstanding, r.decoding);
      auto sent = since(r.sent_at);
      auto mine = unstarted + since(r.left_at) - std::min(unstarted + since(r.left_at), sent);
      // Those are the newest there, so the engine (first come, first
      // served) has them waiting rather than running: what waits beyond
      // them is others' work. What runs beyond them decodes alongside.
      auto running = r.engine_running - std::min(r.engine_running, mine);
      s.decoding = std::max(s.decoding, running);
      auto others = r.engine_waiting - std::min(r.engine_waiting, mine);
      // Until this router has routed anything, this prompt is the best guess
      // of what a request costs.
      auto per_request = routed_any_ ? mean_uncached_ : static_cast<double>(prompt);
      s.others_queued_tokens =
        static_cast<std::uint64_t>(static_cast<double>(others) * per_request);
    }
    auto tokens = static_cast<double>(s.uncached_tokens + s.queued_tokens + s.others_queued_tokens);
    auto steps = std::max(1.0, std::ceil(tokens / budget));
    auto model = settings_.prefill_ms_per_token * tokens
                 + steps * (settings_.step_ms + settings_.decode_ms_per_request * s.decoding);
    s.cost_ms = model * s.scale;
  }
}

void router_core::mark_down(const std::string& replica, std::chrono::steady_clock::time_point until,
                            bool unreachable, std::uint64_t incarnation) {
  request_progress which;
  which.replica = replica;
  which.incarnation = incarnation;
  if (auto* r = find(which)) {
    r->down_until = until;
    r->down_unreachable = unreachable;
  }
}

bool router_core::probe_result(const std::string& replica, bool ok,
                               std::chrono::steady_clock::time_point now) {
  auto* r = find(replica);
  if (!r)
    return false;
  if (ok) {
    r->probe_ok_seen = true;
    bool was = r->down(now);
    r->probe_failures = 0;
    r->probe_down = false;
    if (r->down_unreachable)
      r->down_until = {}; // it can be reached again
    return was && !r->down(now);
  }
  ++r->probe_failures;
  if (r->probe_down || r->probe_failures < probe_failures_to_mark_down)
    return false;
  r->probe_down = true;
  return true;
}

std::string router_core::unready_reason(std::chrono::steady_clock::time_point now) const {
  std::size_t up = 0;
  std::size_t configured = 0;
  for (const auto& r : replicas_) {
    if (r.retired)
      continue;
    ++configured;
    if (r.down(now))
      continue;
    ++up;
    if (!r.kv_events) {
      if (r.probe_ok_seen || !probed_)
        return {};
      continue;
    }
    for (auto h : kv_.holders_of(r.name))
      if (kv_.info(h).has_state)
        return {};
  }
  if (configured == 0)
    return "the topology has no replicas";
  if (up == 0)
    return "every replica is avoided (failed requests or health probes)";
  return "no replica that is up has reported its KV state yet, nor answered a health probe";
}

void router_core::forget_sent(const std::string& replica) {
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (!replicas_[i].retired && replicas_[i].name == replica) {
      tree_.forget(static_cast<tree_replica>(i));
      // Its cache is empty, and so is the index's state of it: nothing
      // wrong is left there to distrust.
      auto& r = replicas_[i];
      r.distrusted = false;
      r.check_history = 0;
      r.checks_seen = 0;
    }
}

route_decision router_core::decide(const route_query& q,
                                   std::chrono::steady_clock::time_point now) {
  route_decision d;
  d.prompt_blocks = q.tokenized ? static_cast<std::uint32_t>(q.keys.size()) : 0;
  d.tokens_from = q.tokens_from;
  d.prompt_chunks = static_cast<std::uint32_t>(q.chunks.size());
  candidates_.clear();
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (!replicas_[i].retired && config::serves(replicas_[i].model, replicas_[i].lora, q.model)
        && std::find(q.exclude.begin(), q.exclude.end(), replicas_[i].name) == q.exclude.end())
      candidates_.push_back(i);
  if (candidates_.empty()) {
    bool served = std::any_of(replicas_.begin(), replicas_.end(), [&](const replica_entry& r) {
      return !r.retired && config::serves(r.model, r.lora, q.model);
    });
    d.failure = served ? route_failure::all_excluded : route_failure::unknown_model;
    d.error = served ? "every replica serving model '" + q.model + "' was tried"
                     : "no replica serves model '" + q.model + "'";
    if (!q.dry_run)
      ++counters_.no_replica;
    return d;
  }
  // Replicas marked down are left out unless every candidate is down.
  auto is_down = [&](std::size_t i) { return replicas_[i].down(now); };
  if (!std::all_of(candidates_.begin(), candidates_.end(), is_down))
    candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(), is_down),
                      candidates_.end());
  auto& scores = d.scores;
  scores.resize(candidates_.size());
  for (std::size_t c = 0; c < candidates_.size(); ++c) {
    const auto& r = replicas_[candidates_[c]];
    scores[c].replica = r.name;
    scores[c].outstanding = r.outstanding;
    scores[c].down = r.down(now);
  }
  // Tier 2: one walk over every trusted rank of every candidate.
  kv_.expire(now);
  holders_.clear();
  holder_owner_.clear();
  refresh_holders();
  for (std::size_t c = 0; c < candidates_.size(); ++c) {
    auto before = holders_.size();
    for (auto h : replica_holders_[candidates_[c]])
      if (kv_.trusted(h)) {
        holders_.push_back(h);
        scores[c].partial = scores[c].partial || kv_.info(h).partial;
      }
    // A distrusted replica is walked too: its answers keep checking what
    // the index would predict, but tier 1 scores it.
    scores[c].trusted = holders_.size() > before;
    scores[c].distrusted = scores[c].trusted && replicas_[candidates_[c]].distrusted;
    scores[c].trusted = scores[c].trusted && !scores[c].distrusted;
    // One whose canary has not passed: tier 1, and no prediction to check.
    scores[c].canary = replicas_[candidates_[c]].canary.state;
    scores[c].trusted = scores[c].trusted && canary_allows_kv(scores[c].canary);
    holder_owner_.resize(holders_.size(), c);
  }
  if (q.tokenized && !q.keys.empty()) {
    std::array<double, 3> weights{1.0, settings_.cpu_weight, settings_.storage_weight};
    kv_.blocks().walk(q.keys.data(), q.keys.size(), holders_, weights, walk_);
    auto n = static_cast<double>(q.keys.size());
    // vLLM looks up at most prompt_tokens - 1 tokens, in whole blocks.
    auto most = q.prompt_tokens > 0 ? (q.prompt_tokens - 1) / block_size_ : q.keys.size();
    for (auto& w : walk_) {
      // A hybrid model's hit ends where its other groups accept an end,
      // at most where the engine looks.
      if (!kv_.info(w.holder).hybrid)
        continue;
      auto hit = kv_.hit_blocks(w.holder, q.keys.data(), std::min<std::size_t>(w.blocks, most));
      if (hit != w.blocks) {
        w.blocks = static_cast<std::uint32_t>(hit);
        w.weighted = kv_.blocks().weigh(q.keys.data(), hit, w.holder, weights);
      }
    }
    for (std::size_t i = 0; i < walk_.size(); ++i) {
      auto& s = scores[holder_owner_[i]];
      auto share = walk_[i].weighted / n;
      if (walk_[i].blocks > 0 && share > s.kv) {
        s.kv = share;
        s.kv_blocks = walk_[i].blocks;
        s.dp_rank = static_cast<std::int32_t>(kv_.info(walk_[i].holder).dp_rank);
      }
    }
  }
  // Tier 1, where it can matter: for replicas tier 2 cannot see, when tier 2
  // found nothing, and for /v1/route's report.
  bool any_kv = std::any_of(scores.begin(), scores.end(),
                            [](const replica_score& s) { return s.trusted && s.kv > 0; });
  bool all_complete = std::all_of(scores.begin(), scores.end(),
                                  [](const replica_score& s) { return s.trusted && !s.partial; });
  if (!q.chunks.empty() && (q.dry_run || !any_kv || !all_complete)) {
    tree_.expire(now); // entries past the TTL must not score, even with no inserts lately
    tree_candidates_.clear();
    for (auto i : candidates_)
      tree_candidates_.push_back(static_cast<tree_replica>(i));
    tree_.walk(q.chunks, tree_candidates_, matched_);
    for (std::size_t c = 0; c < scores.size(); ++c)
      scores[c].approx = static_cast<double>(matched_[c]) / static_cast<double>(q.chunks.size());
  }
  // Whether tier 2 scores a candidate: a partial state only where it knows
  // more than tier 1 does.
  for (auto& s : scores)
    s.by_kv = any_kv && s.trusted && !(s.partial && s.approx > s.kv);
  auto score_of = [](const replica_score& s) { return s.by_kv ? s.kv : s.approx; };
  // The prompt's length in tokens; untokenized, about 4 bytes a token.
  std::uint64_t prompt = q.tokenized && q.prompt_tokens > 0
                           ? q.prompt_tokens
                           : q.chunks.size() * settings_.tier1_chunk_bytes / 4;
  if (q.tokenized && q.prompt_tokens == 0)
    prompt = q.keys.size() * block_size_;
  estimate_costs(d, prompt, now);
  // The least cost wins. Near-ties go to the one holding more of the prompt
  // (less work for the fleet), then to the least loaded, then in turn.
  double least = scores[0].cost_ms;
  for (const auto& s : scores)
    least = std::min(least, s.cost_ms);
  auto near = [&](const replica_score& s) {
    return s.cost_ms <= least * (1 + settings_.tie_margin) + 1e-9;
  };
  auto better = [](const replica_score& a, const replica_score& b) {
    if (a.cached_tokens != b.cached_tokens)
      return a.cached_tokens > b.cached_tokens;
    if (a.outstanding != b.outstanding)
      return a.outstanding < b.outstanding;
    return a.cost_ms < b.cost_ms;
  };
  std::optional<std::size_t> top;
  for (std::size_t c = 0; c < scores.size(); ++c)
    if (near(scores[c]) && (!top || better(scores[c], scores[*top])))
      top = c;
  std::vector<std::size_t> ties;
  for (std::size_t c = 0; c < scores.size(); ++c)
    if (near(scores[c]) && !better(scores[*top], scores[c]))
      ties.push_back(c);
  auto chosen = ties[ties.size() == 1 ? 0 : turn_++ % ties.size()];
  const auto& s = scores[chosen];
  auto& r = replicas_[candidates_[chosen]];
  d.replica = r.name;
  d.incarnation = r.incarnation;
  d.url = r.url;
  d.uncached_tokens = s.uncached_tokens;
  d.cost_ms = s.cost_ms;
  d.model_ms = s.scale > 0 ? s.cost_ms / s.scale : s.cost_ms;
  std::uint64_t most_cached = 0;
  for (const auto& x : scores)
    most_cached = std::max(most_cached, x.cached_tokens);
  if (s.cached_tokens > 0 && score_of(s) > 0) {
    d.tier = s.by_kv ? route_tier::kv : route_tier::approx;
    d.score = score_of(s);
    if (d.tier == route_tier::kv)
      d.dp_rank = s.dp_rank;
  } else {
    d.tier = route_tier::load;
  }
  if (q.tokenized && s.kv_blocks > 0 && s.dp_rank >= 0 && (s.trusted || s.distrusted)) {
    // What the engine's own events say the chosen rank holds: its answer
    // checks it. The engine must use that rank: with several, it is told
    // (a distrusted replica's too, or it would never be checked again).
    if (r.dp_size > 1)
      d.dp_rank = s.dp_rank;
    if (auto holder = kv_.find(r.name, static_cast<std::uint32_t>(s.dp_rank))) {
      // vLLM looks up at most prompt_tokens - 1 tokens, in whole blocks.
      auto most = q.prompt_tokens > 0 ? (q.prompt_tokens - 1) / block_size_ : 0;
      auto blocks =
        kv_.leading_confirmed(*holder, q.keys.data(), std::min<std::size_t>(s.kv_blocks, most));
      d.predicted_cached_tokens = blocks * block_size_;
      if (!q.dry_run)
        d.watch = kv_.watch(*holder, q.keys.data(), blocks);
    }
  }
  if (!q.dry_run && q.tokenized && !q.keys.empty() && settings_.speculative_ttl.count() > 0) {
    // The prompt's blocks count for the chosen rank at once: the requests
    // right behind this one find them before the engine's events can say so.
    const auto& ranks = replica_holders_[candidates_[chosen]];
    std::optional<holder_id> h;
    if (d.dp_rank >= 0)
      h = kv_.find(r.name, static_cast<std::uint32_t>(d.dp_rank));
    else if (ranks.size() == 1)
      h = ranks[0];
    if (h && kv_.trusted(*h)) {
      kv_.speculate(*h, q.keys.data(), q.keys.size(), now + settings_.speculative_ttl);
      if (kv_.info(*h).hybrid) {
        // Its prefill leaves every group holding the prompt's end.
        auto marker = kv::end_marker_of(q.keys.back());
        kv_.speculate(*h, &marker, 1, now + settings_.speculative_ttl);
      }
    }
  }
  if (!q.dry_run) {
    ++counters_.decisions[static_cast<int>(d.tier)];
    counters_.load_overrides += s.cached_tokens < most_cached;
    ++r.outstanding;
    r.queued_tokens += s.uncached_tokens;
    note(r.sent_at, now);
    auto uncached = static_cast<double>(s.uncached_tokens);
    mean_uncached_ = routed_any_ ? 0.9 * mean_uncached_ + 0.1 * uncached : uncached;
    routed_any_ = true;
  }
  return d;
}

} // namespace llmgw::routing
