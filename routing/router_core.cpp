#include "routing/router_core.hpp"

#include <algorithm>

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
    tree_(topo.router.tier1_capacity, topo.router.tier1_ttl) {
  for (const auto& n : topo.nodes)
    for (const auto& e : n.engines)
      replicas_.push_back({e.replica, n.name, e.model, e.lora, e.url, e.kv_events, 0, {}});
  replica_holders_.resize(replicas_.size());
}

void router_core::remember(const route_decision& d, const std::vector<std::uint64_t>& chunks,
                           std::chrono::steady_clock::time_point now) {
  if (chunks.empty() || d.replica.empty())
    return;
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (replicas_[i].name == d.replica) {
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

void router_core::finished(const std::string& replica) {
  for (auto& r : replicas_)
    if (r.name == replica && r.outstanding > 0)
      --r.outstanding;
}

void router_core::mark_down(const std::string& replica,
                            std::chrono::steady_clock::time_point until) {
  for (auto& r : replicas_)
    if (r.name == replica)
      r.down_until = until;
}

void router_core::forget_sent(const std::string& replica) {
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (replicas_[i].name == replica)
      tree_.forget(static_cast<tree_replica>(i));
}

route_decision router_core::decide(const route_query& q,
                                   std::chrono::steady_clock::time_point now) {
  route_decision d;
  d.prompt_blocks = q.tokenized ? static_cast<std::uint32_t>(q.keys.size()) : 0;
  d.prompt_chunks = static_cast<std::uint32_t>(q.chunks.size());
  candidates_.clear();
  for (std::size_t i = 0; i < replicas_.size(); ++i)
    if (config::serves(replicas_[i].model, replicas_[i].lora, q.model)
        && std::find(q.exclude.begin(), q.exclude.end(), replicas_[i].name) == q.exclude.end())
      candidates_.push_back(i);
  if (candidates_.empty()) {
    bool served = std::any_of(replicas_.begin(), replicas_.end(), [&](const replica_entry& r) {
      return config::serves(r.model, r.lora, q.model);
    });
    d.failure = served ? route_failure::all_excluded : route_failure::unknown_model;
    d.error = served ? "every replica serving model '" + q.model + "' was tried"
                     : "no replica serves model '" + q.model + "'";
    if (!q.dry_run)
      ++counters_.no_replica;
    return d;
  }
  // Replicas marked down are left out unless every candidate is down.
  auto is_down = [&](std::size_t i) { return replicas_[i].down_until > now; };
  if (!std::all_of(candidates_.begin(), candidates_.end(), is_down))
    candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(), is_down),
                      candidates_.end());
  auto& scores = d.scores;
  scores.resize(candidates_.size());
  std::uint32_t min_load = UINT32_MAX;
  for (std::size_t c = 0; c < candidates_.size(); ++c) {
    const auto& r = replicas_[candidates_[c]];
    scores[c].replica = r.name;
    scores[c].outstanding = r.outstanding;
    scores[c].down = r.down_until > now;
    min_load = std::min(min_load, r.outstanding);
  }
  std::size_t hot = 0;
  for (auto& s : scores) {
    s.hot = s.outstanding > min_load + settings_.hot_spot_threshold;
    hot += s.hot;
  }
  // Tier 2: one walk over every trusted rank of every candidate.
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
    scores[c].trusted = holders_.size() > before;
    holder_owner_.resize(holders_.size(), c);
  }
  if (q.tokenized && !q.keys.empty()) {
    std::array<double, 3> weights{1.0, settings_.cpu_weight, settings_.storage_weight};
    kv_.blocks().walk(q.keys.data(), q.keys.size(), holders_, weights, walk_);
    auto n = static_cast<double>(q.keys.size());
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
  bool any_kv_found = std::any_of(scores.begin(), scores.end(),
                                  [](const replica_score& s) { return s.trusted && s.kv > 0; });
  bool all_complete = std::all_of(scores.begin(), scores.end(),
                                  [](const replica_score& s) { return s.trusted && !s.partial; });
  if (!q.chunks.empty() && (q.dry_run || !any_kv_found || !all_complete)) {
    tree_.expire(now); // entries past the TTL must not score, even with no inserts lately
    tree_candidates_.clear();
    for (auto i : candidates_)
      tree_candidates_.push_back(static_cast<tree_replica>(i));
    tree_.walk(q.chunks, tree_candidates_, matched_);
    for (std::size_t c = 0; c < scores.size(); ++c)
      scores[c].approx = static_cast<double>(matched_[c]) / static_cast<double>(q.chunks.size());
  }
  // Choose among the candidates the guard keeps (all of them if it keeps none).
  auto in_pool = [&](const replica_score& s) { return !s.hot || hot == scores.size(); };
  bool any_kv = std::any_of(scores.begin(), scores.end(), [&](const replica_score& s) {
    return in_pool(s) && s.trusted && s.kv > 0;
  });
  // Whether tier 2 scores `s`: a partial state only where it knows more
  // than tier 1 does.
  auto by_kv = [&](const replica_score& s) {
    return any_kv && s.trusted && !(s.partial && s.approx > s.kv);
  };
  auto score_of = [&](const replica_score& s) { return by_kv(s) ? s.kv : s.approx; };
  double best = 0;
  for (const auto& s : scores)
    if (in_pool(s))
      best = std::max(best, score_of(s));
  std::vector<std::size_t> ties;
  if (best > 0) {
    for (std::size_t c = 0; c < scores.size(); ++c)
      if (in_pool(scores[c]) && score_of(scores[c]) >= best - settings_.tie_margin)
        ties.push_back(c);
    // Least loaded first, then the higher score.
    std::stable_sort(ties.begin(), ties.end(), [&](std::size_t a, std::size_t b) {
      if (scores[a].outstanding != scores[b].outstanding)
        return scores[a].outstanding < scores[b].outstanding;
      return score_of(scores[a]) > score_of(scores[b]);
    });
    ties.resize(1);
  } else {
    for (std::size_t c = 0; c < scores.size(); ++c)
      if (scores[c].outstanding == min_load)
        ties.push_back(c);
  }
  auto chosen = ties[ties.size() == 1 ? 0 : turn_++ % ties.size()];
  const auto& s = scores[chosen];
  auto& r = replicas_[candidates_[chosen]];
  d.replica = r.name;
  d.url = r.url;
  if (best > 0) {
    d.tier = by_kv(s) ? route_tier::kv : route_tier::approx;
    d.score = score_of(s);
    if (d.tier == route_tier::kv) {
      d.dp_rank = s.dp_rank;
      // vLLM looks up at most prompt_tokens - 1 tokens, in whole blocks.
      auto most = q.prompt_tokens > 0 ? (q.prompt_tokens - 1) / block_size_ : 0;
      d.predicted_cached_tokens = std::min<std::uint64_t>(s.kv_blocks, most) * block_size_;
    }
  } else {
    d.tier = route_tier::load;
  }
  if (!q.dry_run) {
    ++counters_.decisions[static_cast<int>(d.tier)];
    counters_.hot_skips += hot == scores.size() ? 0 : hot;
    ++r.outstanding;
  }
  return d;
}

} // namespace llmgw::routing
