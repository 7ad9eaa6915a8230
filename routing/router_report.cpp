#include "routing/router_report.hpp"

#include "base/log.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>

#include <algorithm>

namespace llmgw::routing {

namespace json = boost::json;

const char* to_string(drop_reason r) noexcept {
  return r == drop_reason::session ? "session" : "node_down";
}

namespace {

// Seconds: 10 µs .. 10 s, roughly x2.5 apart.
std::vector<double> latency_bounds() {
  return {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,   0.05,     0.1,     0.25,   0.5,     1,      2.5,   5,      10};
}

std::vector<double> share_bounds() {
  return {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1};
}

double seconds_since(std::chrono::steady_clock::time_point then,
                     std::chrono::steady_clock::time_point now) {
  return std::chrono::duration<double>(now - then).count();
}

} // namespace

router_stats::router_stats()
  : tokenize_seconds(latency_bounds()), decision_seconds(latency_bounds()),
    matched_share_kv(share_bounds()), matched_share_approx(share_bounds()) {}

std::string kv_replicas_json(const router_core& core, const router_stats& stats,
                             std::chrono::steady_clock::time_point now) {
  const auto& kv = core.kv();
  json::array replicas;
  for (const auto& r : core.replicas()) {
    if (r.retired)
      continue;
    json::object o;
    o["replica"] = r.name;
    o["node"] = r.node;
    o["model"] = r.model;
    o["kv_events"] = r.kv_events;
    o["outstanding"] = r.outstanding;
    o["queued_tokens"] = r.queued_tokens;
    o["decoding"] = r.decoding;
    o["cost_scale"] = r.scale;
    if (r.engine_load_known) {
      json::object e{
        {"running", r.engine_running},
        {"waiting", r.engine_waiting},
        {"age_ms", std::chrono::duration<double, std::milli>(now - r.engine_load_at).count()},
        {"counts", r.engine_load_fresh(now, core.settings().engine_load_max_age)}};
      if (r.engine_kv_usage_permille >= 0)
        e["kv_cache_usage"] = r.engine_kv_usage_permille / 1000.0;
      o["engine_load"] = std::move(e);
    }
    o["down"] = r.down(now);
    o["probe_down"] = r.probe_down;
    o["index_check"] = json::object{{"distrusted", r.distrusted},
                                    {"recent_answers", r.checks_seen},
                                    {"recent_shortfalls", r.recent_shortfalls()},
                                    {"distrusts", r.distrusts},
                                    {"dropped_blocks", r.shortfall_drops}};
    json::array ranks;
    std::uint64_t blocks = 0;
    bool trusted = false;
    for (auto h : kv.holders_of(r.name)) {
      const auto& info = kv.info(h);
      json::object x;
      x["dp_rank"] = info.dp_rank;
      x["blocks"] = kv.blocks().count(h) - info.speculative;
      x["speculative_blocks"] = info.speculative;
      x["speculative_confirmed"] = info.speculative_confirmed;
      x["speculative_expired"] = info.speculative_expired;
      x["epoch"] = info.epoch;
      x["has_state"] = info.has_state;
      x["trusted"] = kv.trusted(h);
      x["partial"] = info.partial;
      x["hybrid"] = info.hybrid;
      x["parity"] = to_string(info.parity);
      x["hash_mismatch"] = !kv::routable(info.parity);
      if (!info.parity_reason.empty())
        x["parity_reason"] = log::printable(info.parity_reason, 1024);
      x["updates"] = info.updates;
      x["resets"] = info.resets;
      x["fingerprint"] = fmt::format("{:016x}", info.fingerprint);
      if (info.updates > 0)
        x["seconds_since_update"] = seconds_since(info.last_update, now);
      else
        x["seconds_since_update"] = nullptr;
      if (h < stats.totals.size()) {
        const auto& t = stats.totals[h];
        json::object a, resets;
        a["batches"] = t.batches;
        a["stored"] = t.stored;
        a["removed"] = t.removed;
        a["verified_blocks"] = t.verified_blocks;
        a["translated_blocks"] = t.translated_blocks;
        a["untranslated_blocks"] = t.untranslated_blocks;
        for (std::size_t reason = 0; reason < kv::reset_reason_count; ++reason)
          resets[to_string(static_cast<kv::reset_reason>(reason))] = t.resets[reason];
        a["resets"] = std::move(resets);
        x["agent"] = std::move(a);
      }
      blocks += kv.blocks().count(h) - info.speculative;
      trusted = trusted || kv.trusted(h);
      ranks.push_back(std::move(x));
    }
    const auto& c = r.canary;
    json::object canary{{"state", to_string(c.state)},
                        {"attempts", c.attempts},
                        {"passes", c.passes},
                        {"failures", c.failures}};
    if (c.state == canary_state::passed) {
      canary["dp_rank"] = c.rank;
      canary["seconds"] = c.seconds;
    }
    if (!c.reason.empty())
      canary["reason"] = c.reason;
    if (c.state == canary_state::sent && !c.last_error.empty())
      canary["last_error"] = c.last_error; // why the engine has not answered yet
    if (c.state == canary_state::failed)
      canary["retry_in_seconds"] =
        std::max(0.0, std::chrono::duration<double>(c.retry_at - now).count());
    o["canary"] = std::move(canary);
    o["blocks"] = blocks;
    // Routed on its KV state: some rank is trusted and the canary allows it.
    o["trusted"] = trusted && canary_allows_kv(c.state);
    o["ranks"] = std::move(ranks);
    replicas.push_back(std::move(o));
  }
  json::object out;
  out["replicas"] = std::move(replicas);
  out["entries"] = kv.blocks().entries();
  out["index_bytes"] = kv.blocks().memory_bytes();
  return json::serialize(out);
}

std::string decision_json(const route_decision& d) {
  json::object o;
  if (d.replica.empty()) {
    o["replica"] = nullptr;
    o["error"] = d.error;
  } else {
    o["replica"] = d.replica;
    o["url"] = d.url;
  }
  o["tier"] = to_string(d.tier);
  o["score"] = d.score;
  if (d.dp_rank >= 0)
    o["dp_rank"] = d.dp_rank;
  o["prompt_blocks"] = d.prompt_blocks;
  o["tokens_from"] = d.tokens_from.empty() ? json::value(nullptr) : json::value(d.tokens_from);
  o["prompt_chunks"] = d.prompt_chunks;
  o["predicted_cached_tokens"] = d.predicted_cached_tokens;
  o["cost_ms"] = d.cost_ms;
  json::array scores;
  for (const auto& s : d.scores) {
    json::object x;
    x["replica"] = s.replica;
    x["trusted"] = s.trusted;
    x["distrusted"] = s.distrusted;
    x["canary"] = to_string(s.canary);
    x["partial"] = s.partial;
    x["kv"] = s.kv;
    x["kv_blocks"] = s.kv_blocks;
    if (s.dp_rank >= 0)
      x["dp_rank"] = s.dp_rank;
    x["approx"] = s.approx;
    x["scored_by"] = s.by_kv ? "kv" : "approx";
    x["outstanding"] = s.outstanding;
    x["down"] = s.down;
    x["cost_ms"] = s.cost_ms;
    x["cost"] = json::object{{"cached_tokens", s.cached_tokens},
                             {"uncached_tokens", s.uncached_tokens},
                             {"queued_tokens", s.queued_tokens},
                             {"decoding", s.decoding},
                             {"scale", s.scale}};
    if (s.engine_load) {
      auto& cost = x["cost"].as_object();
      cost["engine_running"] = s.engine_running;
      cost["engine_waiting"] = s.engine_waiting;
      cost["others_queued_tokens"] = s.others_queued_tokens;
      if (s.engine_kv_usage_permille >= 0)
        cost["engine_kv_cache_usage"] = s.engine_kv_usage_permille / 1000.0;
    }
    scores.push_back(std::move(x));
  }
  o["scores"] = std::move(scores);
  return json::serialize(o);
}

void append_router_metrics(wire::metrics_text& m, const router_core& core,
                           const router_stats& stats, std::chrono::steady_clock::time_point now) {
  const auto& c = core.counters();
  for (auto t : {route_tier::kv, route_tier::approx, route_tier::load})
    m.counter("llmgw_prefix_decisions_total",
              "Routing decisions by tier: kv (exact, from KV events), approx (prefix tree), load.",
              static_cast<double>(c.decisions[static_cast<int>(t)]), {{"tier", to_string(t)}});
  m.counter("llmgw_route_no_replica_total", "Requests no replica could take.",
            static_cast<double>(c.no_replica));
  m.counter("llmgw_route_load_overrides_total",
            "Decisions where the replica holding the most of the prompt cost more (its queue "
            "outweighed the prefill it would save).",
            static_cast<double>(c.load_overrides));
  m.histogram("llmgw_decision_seconds",
              "Time to decide, excluding tokenization: hashing the prompt and scoring.",
              stats.decision_seconds);
  m.histogram("llmgw_tokenize_seconds", "Time to tokenize a prompt through a replica.",
              stats.tokenize_seconds);
  m.counter("llmgw_tokenize_failures_total",
            "Tokenizations that failed or timed out (routed by tier 1).",
            static_cast<double>(stats.tokenize_failures));
  m.histogram("llmgw_prefix_matched_share", "Share of the prompt the chosen replica held.",
              stats.matched_share_kv, {{"tier", "kv"}});
  m.histogram("llmgw_prefix_matched_share", "Share of the prompt the chosen replica held.",
              stats.matched_share_approx, {{"tier", "approx"}});
  for (auto [reason, n] : {std::pair{"stale_epoch", stats.stale_updates},
                           {"before_full_copy", stats.unexpected_updates},
                           {"removed_replica", stats.removed_updates}})
    m.counter("llmgw_kv_updates_ignored_total",
              "Agent changes ignored: from an older epoch, before a full copy, or for a "
              "replica a reload removed since they were checked.",
              static_cast<double>(n), {{"reason", reason}});
  m.gauge("llmgw_kv_watched_predictions",
          "Predictions of cached tokens waiting for their answer (each routed request's).",
          static_cast<double>(core.kv().watching()));
  m.counter("llmgw_kv_watch_refusals_total",
            "Predictions not watched because too many were (answers that never came back).",
            static_cast<double>(core.kv().watch_refusals()));
  m.gauge("llmgw_kv_index_entries", "(block, replica rank, medium) entries in the block index.",
          static_cast<double>(core.kv().blocks().entries()));
  m.gauge("llmgw_kv_index_bytes", "Heap bytes of the block index.",
          static_cast<double>(core.kv().blocks().memory_bytes()));
  m.gauge("llmgw_tier1_nodes",
          "Distinct prompt chunks tier 1 remembers sending (router.tier1_capacity per replica "
          "at most).",
          static_cast<double>(core.tier1().nodes()));
  const auto& kv = core.kv();
  for (std::size_t i = 0; i < core.replicas().size(); ++i)
    if (!core.replicas()[i].retired)
      m.gauge("llmgw_tier1_chunks", "Prompt chunks tier 1 remembers sending to the replica.",
              static_cast<double>(core.tier1().size(static_cast<tree_replica>(i))),
              {{"replica", core.replicas()[i].name}});
  for (const auto& r : core.replicas()) {
    if (r.retired)
      continue;
    m.gauge("llmgw_replica_outstanding", "Requests in flight per replica.", r.outstanding,
            {{"replica", r.name}});
    m.gauge("llmgw_replica_up",
            "0 while the replica is avoided (failed requests, or failed health probes).",
            r.down(now) ? 0 : 1, {{"replica", r.name}});
    m.gauge("llmgw_replica_queued_tokens",
            "Prompt tokens this gateway sent per replica whose first token has not come back.",
            static_cast<double>(r.queued_tokens), {{"replica", r.name}});
    m.gauge("llmgw_replica_decoding", "Requests per replica past their first token.", r.decoding,
            {{"replica", r.name}});
    m.gauge("llmgw_replica_cost_scale",
            "Observed over estimated time to first token per replica (the cost model's "
            "correction, learnt).",
            r.scale, {{"replica", r.name}});
    {
      wire::metric_labels who{{"replica", r.name}};
      m.gauge("llmgw_kv_distrusted",
              "1 while the replica's answers find fewer cached tokens than the index predicts "
              "too often (router.distrust_shortfall_share): scored by tier 1.",
              r.distrusted ? 1 : 0, who);
      m.counter("llmgw_kv_distrusts_total", "Times the replica's KV state became distrusted.",
                static_cast<double>(r.distrusts), who);
      if (r.canary_wanted) {
        for (auto st : {canary_state::waiting, canary_state::sent, canary_state::passed,
                        canary_state::failed})
          m.gauge("llmgw_kv_canary",
                  "1 for the replica's canary state (waiting, sent, passed, failed), 0 for the "
                  "others: until a canary prompt's blocks come back in its events under "
                  "llmgw's keys, it is scored by tier 1.",
                  r.canary.state == st ? 1 : 0, {{"replica", r.name}, {"state", to_string(st)}});
        for (auto [result, n] :
             {std::pair{"passed", r.canary.passes}, {"failed", r.canary.failures}})
          m.counter("llmgw_kv_canaries_total", "Canaries finished per replica, by result.",
                    static_cast<double>(n), {{"replica", r.name}, {"result", result}});
      }
      m.counter("llmgw_kv_shortfall_dropped_blocks_total",
                "Blocks dropped from the index because the replica's answer showed its engine "
                "lacked them (and it had not stored them again since).",
                static_cast<double>(r.shortfall_drops), who);
      for (auto [outcome, n] :
           {std::pair{"met", r.answers_checked - r.answers_short}, {"short", r.answers_short}})
        m.counter("llmgw_kv_answers_checked_total",
                  "Answers whose cached tokens were checked against the index's prediction, "
                  "by outcome: met, or short (the engine had fewer cached: the routing "
                  "decision was made from state that was wrong, or went stale before the "
                  "request reached the engine).",
                  static_cast<double>(n), {{"replica", r.name}, {"outcome", outcome}});
    }
    if (r.engine_load_known) {
      wire::metric_labels who{{"replica", r.name}};
      m.gauge("llmgw_replica_engine_running",
              "Requests running per replica, as its engine last reported (all gateways').",
              r.engine_running, who);
      m.gauge("llmgw_replica_engine_waiting",
              "Requests waiting per replica, as its engine last reported (all gateways').",
              r.engine_waiting, who);
      m.gauge("llmgw_replica_engine_load_age_seconds",
              "Age of the engine's last load report; beyond router.engine_load_max_age_ms it "
              "does not count.",
              std::chrono::duration<double>(now - r.engine_load_at).count(), who);
    }
    for (auto h : kv.holders_of(r.name)) {
      const auto& info = kv.info(h);
      wire::metric_labels labels{{"replica", r.name}, {"dp_rank", std::to_string(info.dp_rank)}};
      m.gauge("llmgw_kv_blocks", "Blocks the index holds per replica rank (confirmed by events).",
              static_cast<double>(kv.blocks().count(h) - info.speculative), labels);
      m.gauge("llmgw_kv_speculative_blocks",
              "Blocks entered for a replica rank when a prompt was routed there, not yet "
              "confirmed by its events.",
              static_cast<double>(info.speculative), labels);
      auto outcome = [&](const char* o) {
        auto l = labels;
        l.emplace_back("outcome", o);
        return l;
      };
      m.counter("llmgw_kv_speculative_total", "Speculative blocks by outcome.",
                static_cast<double>(info.speculative_confirmed), outcome("confirmed"));
      m.counter("llmgw_kv_speculative_total", "Speculative blocks by outcome.",
                static_cast<double>(info.speculative_expired), outcome("expired"));
      m.gauge("llmgw_kv_trusted", "1 when the replica rank's KV state is routed on.",
              kv.trusted(h) ? 1 : 0, labels);
      m.gauge("llmgw_kv_partial",
              "1 when the engine may hold blocks the index does not know (a gap replay could "
              "not fill): scored by the better of the index and tier 1 until its cache is emptied.",
              info.partial ? 1 : 0, labels);
      m.gauge("llmgw_kv_hybrid",
              "1 when the engine serves a hybrid model (sliding-window or Mamba groups beside "
              "full attention): a prefix it holds counts up to its last end marker.",
              info.hybrid ? 1 : 0, labels);
      m.gauge("llmgw_kv_hash_mismatch",
              "1 when the engine's blocks cannot be keyed by llmgw's hashes (the agent's log says "
              "why): not routed on its KV state.",
              kv::routable(info.parity) ? 0 : 1, labels);
      m.gauge("llmgw_kv_keys_translated",
              "1 when the engine hashes blocks its own way and the agent keys them by llmgw's.",
              info.parity == kv::parity_state::translated ? 1 : 0, labels);
      m.counter("llmgw_kv_updates_total", "Agent changes applied per replica rank.",
                static_cast<double>(info.updates), labels);
      if (info.updates > 0)
        m.gauge("llmgw_kv_update_age_seconds",
                "Seconds since the replica rank's KV state last changed.",
                seconds_since(info.last_update, now), labels);
      if (h < stats.totals.size()) {
        const auto& t = stats.totals[h];
        auto with = [&](const char* k, const char* v) {
          auto l = labels;
          l.emplace_back(k, v);
          return l;
        };
        m.counter("llmgw_kv_events_total", "Block events the agent applied, by kind.",
                  static_cast<double>(t.stored), with("kind", "stored"));
        m.counter("llmgw_kv_events_total", "Block events the agent applied, by kind.",
                  static_cast<double>(t.removed), with("kind", "removed"));
        m.counter("llmgw_kv_event_batches_total", "Event batches the agent applied.",
                  static_cast<double>(t.batches), labels);
        m.counter("llmgw_kv_blocks_verified_total",
                  "Stored blocks whose hash the agent recomputed and found equal.",
                  static_cast<double>(t.verified_blocks), labels);
        m.counter("llmgw_kv_blocks_translated_total",
                  "Stored blocks the agent keyed by llmgw's hash of their tokens, not the "
                  "engine's.",
                  static_cast<double>(t.translated_blocks), labels);
        m.counter("llmgw_kv_blocks_untranslated_total",
                  "Stored blocks the agent left out: no llmgw key could be made (parent "
                  "unknown, or the engine cannot be translated).",
                  static_cast<double>(t.untranslated_blocks), labels);
        for (std::size_t reason = 0; reason < kv::reset_reason_count; ++reason)
          m.counter("llmgw_kv_resets_total",
                    "KV state resets by reason: the agent's (gap, restart, clear, engine_exit, "
                    "decode_error) and the router's (session, node_down).",
                    static_cast<double>(t.resets[reason]),
                    with("reason", to_string(static_cast<kv::reset_reason>(reason))));
      }
    }
    for (auto why : {drop_reason::session, drop_reason::node_down}) {
      auto it = stats.drops.find({r.name, why});
      m.counter("llmgw_kv_resets_total",
                "KV state resets by reason: the agent's (gap, restart, clear, engine_exit, "
                "decode_error) and the router's (session, node_down).",
                it == stats.drops.end() ? 0 : static_cast<double>(it->second),
                {{"replica", r.name}, {"reason", to_string(why)}});
    }
    auto mm = stats.mismatches.find(r.name);
    m.counter("llmgw_kv_hash_mismatches_total",
              "Times the replica's blocks were found unusable for routing: hashed differently "
              "(block_keys = engine) or not translatable.",
              mm == stats.mismatches.end() ? 0 : static_cast<double>(mm->second),
              {{"replica", r.name}});
  }
}

} // namespace llmgw::routing
