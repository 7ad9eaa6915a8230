// The canary (routing/canary.hpp) as router_core runs it: when it is sent,
// what passes it, what fails it and with which reason, when it is sent
// again, and that a replica is scored by tier 1 until it passes.
#include "routing/router_core.hpp"
#include "routing/router_report.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <set>

using namespace llmgw;
using namespace llmgw::routing;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t bs = 4;

config::topology two_replicas(bool canary_b = true) {
  config::topology t;
  t.block_size = bs;
  t.seed = "0";
  t.router.speculative_ttl = 0ms;
  t.router.canary_timeout = 10000ms;
  t.flush_interval = 250ms;
  t.router.canary_retry = 5000ms;
  config::node_spec n;
  n.name = "agent";
  n.roles.agent = true;
  for (const char* name : {"a", "b"}) {
    config::engine_spec e;
    e.replica = name;
    e.model = "m";
    e.url = std::string("http://127.0.0.1:") + (name[0] == 'a' ? "8001" : "8002");
    e.kv_events = true;
    e.canary = name[0] == 'a' || canary_b;
    n.engines.push_back(e);
  }
  config::engine_spec plain; // no KV events: no canary
  plain.replica = "c";
  plain.model = "m";
  plain.url = "http://127.0.0.1:8003";
  n.engines.push_back(plain);
  t.nodes.push_back(n);
  return t;
}

const auto t0 = std::chrono::steady_clock::now();

std::vector<kv::block_ref> gpu(const std::vector<wire::block_key>& keys) {
  std::vector<kv::block_ref> out;
  for (auto k : keys)
    out.push_back({k, kv::medium::gpu});
  return out;
}

/// A full copy of `blocks` for `replica`'s rank.
void full_copy(router_core& rc, const std::string& replica, std::vector<kv::block_ref> blocks,
               std::uint32_t rank = 0, std::uint64_t epoch = 1) {
  rc.kv().apply({replica, rank, epoch, true, kv::parity_state::unknown, &blocks, nullptr}, t0);
}

/// The engine's events store `blocks` for `replica`'s rank.
void store(router_core& rc, const std::string& replica, std::vector<kv::block_ref> blocks,
           std::uint32_t rank = 0, std::uint64_t epoch = 1) {
  rc.kv().apply({replica, rank, epoch, false, kv::parity_state::unknown, &blocks, nullptr}, t0);
}

/// The keys the router computes for `tokens` (what a request of them routes on).
std::vector<wire::block_key> keys_of(const std::vector<std::uint32_t>& tokens) {
  wire::block_hasher h("0", bs);
  std::vector<wire::block_key> out;
  for (const auto& b : h.hash(tokens))
    out.push_back(b.key);
  return out;
}

const canary_record& canary_of(const router_core& rc, const std::string& replica) {
  for (const auto& r : rc.replicas())
    if (!r.retired && r.name == replica)
      return r.canary;
  static canary_record none;
  ADD_FAILURE() << replica << " is not a replica";
  return none;
}

/// The prompt a job carries, read back from its body.
std::vector<std::uint32_t> prompt_of(const canary_job& job) {
  auto v = boost::json::parse(job.body).as_object();
  EXPECT_EQ(v.at("model").as_string(), "m");
  EXPECT_EQ(v.at("max_tokens").as_int64(), 1);
  std::vector<std::uint32_t> out;
  for (const auto& t : v.at("prompt").as_array())
    out.push_back(static_cast<std::uint32_t>(t.as_int64()));
  return out;
}

route_query query(const std::vector<wire::block_key>& keys) {
  route_query q;
  q.model = "m";
  q.tokenized = true;
  q.keys = keys;
  q.prompt_tokens = keys.size() * bs + 1;
  return q;
}

} // namespace

TEST(canary, prompts_are_new_blocks_in_vocabulary_and_one_token_past_whole_blocks) {
  EXPECT_EQ(canary_prompt_tokens(16), 33u) << "two blocks of 16 and one token";
  EXPECT_EQ(canary_prompt_tokens(4), 33u) << "32 tokens at least";
  EXPECT_EQ(canary_prompt_tokens(1), 33u);
  EXPECT_EQ(canary_prompt_tokens(64), 129u);
  auto a = canary_prompt(7, 16);
  auto b = canary_prompt(8, 16);
  ASSERT_EQ(a.size(), 33u);
  EXPECT_NE(a, b) << "consecutive nonces give other prompts";
  EXPECT_EQ(a, canary_prompt(7, 16));
  for (auto t : a) {
    EXPECT_GE(t, 1000u);
    EXPECT_LT(t, 9192u);
  }
  std::set<std::uint32_t> distinct(a.begin(), a.end());
  EXPECT_GT(distinct.size(), 20u) << "not a constant";
}

TEST(canary, is_sent_once_the_state_arrives_and_passes_when_its_blocks_come_back) {
  router_core rc(two_replicas());
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::waiting);
  EXPECT_EQ(canary_of(rc, "c").state, canary_state::off) << "no KV events";
  EXPECT_TRUE(rc.canary_tick(t0).empty()) << "no KV state yet: nothing to check it against";

  std::vector<wire::block_key> held{101, 102, 103};
  full_copy(rc, "a", gpu(held));
  auto jobs = rc.canary_tick(t0);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].replica, "a");
  EXPECT_EQ(jobs[0].url, "http://127.0.0.1:8001");
  auto prompt = prompt_of(jobs[0]);
  EXPECT_EQ(prompt.size(), canary_prompt_tokens(bs));
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent);
  EXPECT_TRUE(rc.canary_tick(t0 + 10ms).empty()) << "one at a time";

  // Until it passes, tier 1 scores it, though the index holds the prefix.
  auto d = rc.decide(query(held), t0);
  EXPECT_NE(d.tier, route_tier::kv);
  for (const auto& s : d.scores) {
    if (s.replica == "a") {
      EXPECT_FALSE(s.trusted);
      EXPECT_EQ(s.canary, canary_state::sent);
    }
  }
  rc.finished(progress_of(d), false);

  // The engine's answer alone does not pass it; its blocks do.
  rc.canary_answered("a", jobs[0].id, 200, "", t0 + 20ms);
  rc.canary_tick(t0 + 30ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent);
  auto keys = keys_of(prompt);
  ASSERT_EQ(keys.size(), prompt.size() / bs);
  store(rc, "a", gpu({keys[0]}));
  rc.canary_tick(t0 + 40ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent) << "one block of two";
  store(rc, "a", gpu({keys.begin() + 1, keys.end()}));
  std::vector<std::string> news;
  rc.canary_tick(t0 + 50ms, &news);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::passed);
  EXPECT_EQ(canary_of(rc, "a").rank, 0);
  EXPECT_NEAR(canary_of(rc, "a").seconds, 0.05, 1e-9);
  ASSERT_EQ(news.size(), 1u);
  EXPECT_NE(news[0].find("passed"), std::string::npos) << news[0];
  EXPECT_EQ(rc.counters().canaries_passed, 1u);

  d = rc.decide(query(held), t0 + 60ms);
  EXPECT_EQ(d.tier, route_tier::kv);
  EXPECT_EQ(d.replica, "a");
}

TEST(canary, an_answered_one_whose_blocks_were_lost_is_followed_by_another_prompt) {
  router_core rc(two_replicas()); // flush interval 250 ms: one more prompt a second
  full_copy(rc, "a", {});
  auto first = rc.canary_tick(t0);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_TRUE(rc.canary_tick(t0 + 1500ms).empty()) << "not answered yet: nothing to follow";
  // A second prompt arrives at once after a late answer... once a second passed since the last.
  rc.canary_answered("a", first[0].id, 200, "", t0 + 1600ms);
  auto second = rc.canary_tick(t0 + 1600ms);
  ASSERT_EQ(second.size(), 1u) << "answered, a second since it was sent, its blocks not seen";
  EXPECT_NE(prompt_of(second[0]), prompt_of(first[0]));
  EXPECT_TRUE(rc.canary_tick(t0 + 1700ms).empty()) << "the second is not answered yet";
  EXPECT_EQ(canary_of(rc, "a").attempts, 1u) << "one round";
  // The first prompt's batch is replayed (its gap revealed by the second's): it passes.
  store(rc, "a", gpu(keys_of(prompt_of(first[0]))));
  rc.canary_tick(t0 + 1800ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::passed);
  EXPECT_NEAR(canary_of(rc, "a").seconds, 1.8, 1e-9) << "from the round's first prompt";
}

TEST(canary, the_last_prompt_of_a_round_passes_it_too) {
  router_core rc(two_replicas());
  full_copy(rc, "a", {});
  auto job = rc.canary_tick(t0)[0];
  for (int i = 1; i <= 3; ++i) {
    rc.canary_answered("a", job.id, 200, "", t0 + i * 1000ms);
    auto next = rc.canary_tick(t0 + i * 1000ms);
    ASSERT_EQ(next.size(), 1u) << i;
    job = next[0];
  }
  store(rc, "a", gpu(keys_of(prompt_of(job))));
  rc.canary_tick(t0 + 3100ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::passed);
}

TEST(canary, an_engine_not_answering_yet_gets_another_prompt_and_its_timeout_waits) {
  router_core rc(two_replicas()); // canary_timeout 10 s
  full_copy(rc, "a", {});
  auto job = rc.canary_tick(t0)[0];
  rc.canary_answered("a", job.id, 0, "connect: Connection refused", t0 + 1ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent) << "not a failure: it is starting";
  EXPECT_TRUE(rc.canary_tick(t0 + 999ms).empty());
  auto next = rc.canary_tick(t0 + 1000ms);
  ASSERT_EQ(next.size(), 1u) << "a second later, another prompt";
  EXPECT_TRUE(next[0].follow_up);
  rc.canary_answered("a", next[0].id, 0, "connect: Connection refused", t0 + 1000ms);
  std::size_t prompts = 2;
  // Still loading a model, for longer than the timeout: no failure, since
  // the engine has not answered at all.
  for (auto t = 2000ms; t < 20000ms; t += 1000ms) {
    for (auto& j : rc.canary_tick(t0 + t)) {
      rc.canary_answered("a", j.id, 0, "connect: Connection refused", t0 + t);
      ++prompts;
    }
  }
  EXPECT_EQ(prompts, 20u) << "one a second";
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent);
  EXPECT_EQ(canary_of(rc, "a").last_error, "connect: Connection refused");
  // While its health probes mark it down, no more prompts.
  rc.probe_result("a", false, t0 + 20s);
  rc.probe_result("a", false, t0 + 20s);
  EXPECT_TRUE(rc.canary_tick(t0 + 25s).empty()) << "marked down";
  rc.probe_result("a", true, t0 + 26s);
  next = rc.canary_tick(t0 + 26s);
  ASSERT_EQ(next.size(), 1u) << "up again";
  // It answers, with errors only: the timeout runs from its first answer.
  rc.canary_answered("a", next[0].id, 503, "/v1/completions answered 503: loading", t0 + 26s);
  for (auto t = 27s; t < 36s; t += 1s) {
    auto jobs = rc.canary_tick(t0 + t);
    ASSERT_EQ(jobs.size(), 1u) << "a 5xx gets another prompt too";
    rc.canary_answered("a", jobs[0].id, 429, "/v1/completions answered 429: busy", t0 + t);
  }
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent) << "429 is no refusal";
  rc.canary_tick(t0 + 35999ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent);
  rc.canary_tick(t0 + 36s);
  const auto& c = canary_of(rc, "a");
  EXPECT_EQ(c.state, canary_state::failed);
  EXPECT_EQ(c.attempts, 1u) << "one round";
  EXPECT_NE(c.reason.find("answered no canary completion with 200 in 10000 ms (last: "
                          "/v1/completions answered 429: busy)"),
            std::string::npos)
    << c.reason;
}

TEST(canary, switched_on_or_off_by_a_reload_keeps_the_replicas_state) {
  auto topo = two_replicas();
  router_core rc(topo);
  std::vector<wire::block_key> held{5, 6};
  full_copy(rc, "b", gpu(held));
  ASSERT_EQ(rc.canary_tick(t0).size(), 1u);
  topo.nodes[0].engines[1].canary = false;
  rc.apply_topology(topo);
  EXPECT_EQ(canary_of(rc, "b").state, canary_state::off);
  auto d = rc.decide(query(held), t0);
  EXPECT_EQ(d.tier, route_tier::kv) << "its KV state survived the reload";
  EXPECT_EQ(d.replica, "b");
  rc.finished(progress_of(d), false);
  topo.nodes[0].engines[1].canary = true;
  rc.apply_topology(topo);
  EXPECT_EQ(canary_of(rc, "b").state, canary_state::waiting);
  auto jobs = rc.canary_tick(t0 + 1ms);
  ASSERT_EQ(jobs.size(), 1u) << "its state is there: sent at once";
  EXPECT_EQ(jobs[0].replica, "b");
}

TEST(canary, speculative_entries_do_not_pass_it) {
  auto topo = two_replicas();
  topo.router.speculative_ttl = 5000ms;
  router_core rc(topo);
  full_copy(rc, "a", {});
  auto jobs = rc.canary_tick(t0);
  ASSERT_EQ(jobs.size(), 1u);
  auto keys = keys_of(prompt_of(jobs[0]));
  // The router's own guess for the rank, as a request routed there makes it.
  rc.kv().speculate(*rc.kv().find("a", 0), keys.data(), keys.size(), t0 + 5s);
  rc.canary_tick(t0 + 1ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent);
}

TEST(canary, any_rank_passes_it) {
  router_core rc(two_replicas());
  full_copy(rc, "a", {}, 0);
  full_copy(rc, "a", {}, 1);
  auto jobs = rc.canary_tick(t0);
  ASSERT_EQ(jobs.size(), 1u) << "one canary per replica, not per rank";
  store(rc, "a", gpu(keys_of(prompt_of(jobs[0]))), 1);
  rc.canary_tick(t0 + 1ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::passed);
  EXPECT_EQ(canary_of(rc, "a").rank, 1);
}

TEST(canary, fails_on_blocks_under_other_keys_and_is_sent_again_later) {
  router_core rc(two_replicas());
  full_copy(rc, "a", {});
  auto jobs = rc.canary_tick(t0);
  ASSERT_EQ(jobs.size(), 1u);
  rc.canary_answered("a", jobs[0].id, 200, "", t0);
  // The engine hashes another way: it stores blocks, but not under our keys.
  auto keys = keys_of(prompt_of(jobs[0]));
  std::vector<wire::block_key> theirs;
  for (auto k : keys)
    theirs.push_back(k ^ 1);
  store(rc, "a", gpu(theirs));
  rc.canary_tick(t0 + 9999ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent) << "not yet overdue";
  std::vector<std::string> news;
  rc.canary_tick(t0 + 10000ms, &news);
  const auto& c = canary_of(rc, "a");
  EXPECT_EQ(c.state, canary_state::failed);
  EXPECT_NE(c.reason.find("did not show the prompt's 8 blocks"), std::string::npos) << c.reason;
  ASSERT_EQ(news.size(), 1u);
  EXPECT_NE(news[0].find("failed"), std::string::npos);
  EXPECT_EQ(rc.counters().canaries_failed, 1u);

  EXPECT_TRUE(rc.canary_tick(t0 + 14999ms).empty()) << "retried canary_retry after the failure";
  auto again = rc.canary_tick(t0 + 15000ms);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_NE(again[0].id, jobs[0].id);
  EXPECT_NE(prompt_of(again[0]), prompt_of(jobs[0])) << "a new prompt: the old one's blocks "
                                                        "may be cached by now";
  EXPECT_EQ(canary_of(rc, "a").attempts, 2u);
  EXPECT_EQ(canary_of(rc, "a").reason, c.reason) << "the last failure stays shown until a pass";
}

TEST(canary, names_the_replica_whose_events_showed_its_blocks) {
  router_core rc(two_replicas());
  full_copy(rc, "a", {});
  full_copy(rc, "b", {});
  auto jobs = rc.canary_tick(t0);
  ASSERT_EQ(jobs.size(), 2u);
  // Each URL's engine answers, and publishes into the other replica's events.
  for (const auto& job : jobs) {
    rc.canary_answered(job.replica, job.id, 200, "", t0);
    store(rc, job.replica == "a" ? "b" : "a", gpu(keys_of(prompt_of(job))));
  }
  rc.canary_tick(t0 + 10s);
  for (const auto& [mine, other] : {std::pair{"a", "b"}, {"b", "a"}}) {
    const auto& c = canary_of(rc, mine);
    EXPECT_EQ(c.state, canary_state::failed) << mine;
    EXPECT_NE(c.reason.find(std::string("appeared in replica ") + other + "'s events"),
              std::string::npos)
      << c.reason;
  }
}

TEST(canary, a_refused_request_fails_it_at_once_and_late_answers_are_ignored) {
  router_core rc(two_replicas());
  full_copy(rc, "a", {});
  auto jobs = rc.canary_tick(t0);
  ASSERT_EQ(jobs.size(), 1u);
  rc.canary_answered("a", jobs[0].id + 1, 401, "401", t0 + 1ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent) << "an answer for another prompt";
  rc.canary_answered("a", jobs[0].id, 401, "/v1/completions answered 401: no key", t0 + 2ms);
  const auto& c = canary_of(rc, "a");
  EXPECT_EQ(c.state, canary_state::failed);
  EXPECT_NE(c.reason.find("answered 401"), std::string::npos) << c.reason;
  // Its blocks arriving now change nothing until it is sent again.
  store(rc, "a", gpu(keys_of(prompt_of(jobs[0]))));
  rc.canary_tick(t0 + 3ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::failed);
  // The next round (canary_retry 5 s later) takes no answer of the last.
  auto again = rc.canary_tick(t0 + 5002ms);
  ASSERT_EQ(again.size(), 1u);
  rc.canary_answered("a", jobs[0].id, 403, "late, from the round before", t0 + 5003ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent);
}

TEST(canary, an_engine_restart_or_a_lost_agent_sends_it_again) {
  router_core rc(two_replicas());
  full_copy(rc, "a", {});
  auto jobs = rc.canary_tick(t0);
  store(rc, "a", gpu(keys_of(prompt_of(jobs[0]))));
  rc.canary_tick(t0 + 1ms);
  ASSERT_EQ(canary_of(rc, "a").state, canary_state::passed);

  rc.canary_again("a"); // the router actor: a restart in the agent's totals
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::waiting);
  auto d = rc.decide(query({}), t0);
  for (const auto& s : d.scores) {
    if (s.replica == "a") {
      EXPECT_FALSE(s.trusted) << "not routed on its KV state until it passes again";
    }
  }
  rc.finished(progress_of(d), false);
  auto again = rc.canary_tick(t0 + 2ms);
  ASSERT_EQ(again.size(), 1u);
  // An answer to the first canary, arriving now, is for the engine before.
  rc.canary_answered("a", jobs[0].id, 401, "late", t0 + 3ms);
  EXPECT_EQ(canary_of(rc, "a").state, canary_state::sent);

  // Its agent goes away before the answer: sent again once state is back.
  rc.kv().drop_replica("a");
  rc.canary_again("a");
  EXPECT_TRUE(rc.canary_tick(t0 + 4ms).empty()) << "no state: nothing to check";
  full_copy(rc, "a", {}, 0, 2);
  EXPECT_EQ(rc.canary_tick(t0 + 5ms).size(), 1u);
  EXPECT_EQ(canary_of(rc, "a").attempts, 3u);
}

TEST(canary, off_for_an_engine_that_opts_out_and_shown_in_the_report) {
  router_core rc(two_replicas(false));
  EXPECT_EQ(canary_of(rc, "b").state, canary_state::off);
  std::vector<wire::block_key> held{7, 8};
  full_copy(rc, "b", gpu(held));
  full_copy(rc, "a", {});
  auto jobs = rc.canary_tick(t0);
  ASSERT_EQ(jobs.size(), 1u) << "only a's";
  auto d = rc.decide(query(held), t0);
  EXPECT_EQ(d.tier, route_tier::kv) << "b is routed on its KV state unchecked";
  EXPECT_EQ(d.replica, "b");
  rc.finished(progress_of(d), false);

  router_stats stats;
  auto v = boost::json::parse(kv_replicas_json(rc, stats, t0)).as_object();
  for (const auto& x : v.at("replicas").as_array()) {
    const auto& o = x.as_object();
    const auto& c = o.at("canary").as_object();
    if (o.at("replica") == "a") {
      EXPECT_EQ(c.at("state"), "sent");
      EXPECT_EQ(o.at("trusted"), false) << "its rank has state, its canary has not passed";
    }
    if (o.at("replica") == "b") {
      EXPECT_EQ(c.at("state"), "off");
      EXPECT_EQ(o.at("trusted"), true);
    }
  }
  wire::metrics_text m;
  append_router_metrics(m, rc, stats, t0);
  auto text = m.str();
  EXPECT_NE(text.find("llmgw_kv_canary{replica=\"a\",state=\"sent\"} 1"), std::string::npos)
    << text;
  EXPECT_EQ(text.find("llmgw_kv_canary{replica=\"b\""), std::string::npos) << "b has none";
}
