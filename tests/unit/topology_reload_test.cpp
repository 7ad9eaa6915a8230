// A reload of the topology (SIGHUP): what it may change on a running node
// (config/topology_change), and how the router puts the new replicas in
// force while unchanged ones keep their state (router_core::apply_topology).
#include "config/topology_change.hpp"
#include "routing/router_core.hpp"

#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw::routing;

namespace {

config::engine_spec engine(const std::string& replica) {
  config::engine_spec e;
  e.replica = replica;
  e.model = "llama";
  e.url = "http://127.0.0.1:9/" + replica;
  e.kv_events = true;
  e.canary = false; // its engines do not answer completions here
  return e;
}

/// A control node c1 and agents a1 (r0, r1) and a2 (r2).
config::topology cluster() {
  config::topology t;
  t.block_size = 4;
  t.router.speculative_ttl = std::chrono::milliseconds(0);
  config::node_spec c;
  c.name = "c1";
  c.roles.control = true;
  c.host = "127.0.0.1";
  c.port = 7000;
  c.http_host = "127.0.0.1";
  c.http_port = 8000;
  t.nodes.push_back(c);
  config::node_spec a1;
  a1.name = "a1";
  a1.roles.agent = true;
  a1.engines = {engine("r0"), engine("r1")};
  t.nodes.push_back(a1);
  config::node_spec a2;
  a2.name = "a2";
  a2.roles.agent = true;
  a2.engines = {engine("r2")};
  t.nodes.push_back(a2);
  return t;
}

config::node_spec& node(config::topology& t, const std::string& name) {
  for (auto& n : t.nodes)
    if (n.name == name)
      return n;
  throw std::runtime_error("no node " + name);
}

const auto t0 = std::chrono::steady_clock::now();

void hold(router_core& rc, const std::string& replica, std::vector<kv::block_ref> blocks) {
  rc.kv().apply({replica, 0, 1, true, kv::parity_state::verified, &blocks, nullptr}, t0);
}

std::vector<kv::block_ref> gpu(std::initializer_list<wire::block_key> keys) {
  std::vector<kv::block_ref> out;
  for (auto k : keys)
    out.push_back({k, kv::medium::gpu});
  return out;
}

bool has_state(const router_core& rc, const std::string& replica) {
  for (auto h : rc.kv().holders_of(replica))
    if (rc.kv().info(h).has_state)
      return true;
  return false;
}

route_query query(std::vector<wire::block_key> keys, std::string text = {}) {
  route_query q;
  q.model = "llama";
  q.tokenized = true;
  q.keys = std::move(keys);
  q.chunks = chunk_hashes(text, 8);
  return q;
}

std::vector<std::string> live_replicas(const router_core& rc) {
  std::vector<std::string> out;
  for (const auto& r : rc.replicas())
    if (!r.retired)
      out.push_back(r.name);
  return out;
}

} // namespace

TEST(topology_change, engines_added_removed_and_changed_are_told_apart) {
  auto old = cluster();
  auto fresh = cluster();
  node(fresh, "a1").engines[1].url = "http://127.0.0.1:9/moved"; // r1 changed
  node(fresh, "a2").engines.clear();                             // r2 removed
  node(fresh, "a2").engines.push_back(engine("r3"));             // r3 added
  auto c = config::compare_engines(old, fresh);
  EXPECT_EQ(c.added, std::vector<std::string>{"r3"});
  EXPECT_EQ(c.removed, std::vector<std::string>{"r2"});
  EXPECT_EQ(c.changed, std::vector<std::string>{"r1"});
  EXPECT_EQ(c.summary(), "added r3; removed r2; changed r1");
  auto mine = config::compare_engines(old, fresh, "a2");
  EXPECT_EQ(mine.added, std::vector<std::string>{"r3"});
  EXPECT_TRUE(mine.changed.empty()) << "r1 is a1's";
  EXPECT_TRUE(config::compare_engines(old, cluster()).empty());
}

TEST(topology_change, an_engine_that_becomes_another_engines_kind_is_changed) {
  // Its events are decoded in another dialect and its blocks keyed anew:
  // its subscriber and mirror must start over.
  auto fresh = cluster();
  node(fresh, "a1").engines[1].kind = config::engine_kind::sglang;
  EXPECT_EQ(config::compare_engines(cluster(), fresh).changed, std::vector<std::string>{"r1"});
}

TEST(topology_change, an_engine_that_moves_to_another_node_is_changed) {
  auto old = cluster();
  auto fresh = cluster();
  node(fresh, "a2").engines.push_back(node(fresh, "a1").engines[0]); // r0 to a2
  node(fresh, "a1").engines.erase(node(fresh, "a1").engines.begin());
  auto c = config::compare_engines(old, fresh);
  EXPECT_EQ(c.changed, std::vector<std::string>{"r0"});
  EXPECT_TRUE(c.added.empty() && c.removed.empty());
}

TEST(topology_change, what_a_node_reads_only_at_start_needs_a_restart) {
  auto old = cluster();
  EXPECT_TRUE(config::restart_needed(old, cluster(), "c1").empty());
  auto fresh = cluster();
  node(fresh, "a1").engines.push_back(engine("r9"));
  fresh.nodes.push_back(config::node_spec{});
  fresh.nodes.back().name = "a3";
  EXPECT_TRUE(config::restart_needed(old, fresh, "c1").empty())
    << "engines and other nodes change live";

  fresh = cluster();
  fresh.router.tie_margin = 0.5;
  fresh.gateway.max_attempts = 9;
  node(fresh, "c1").http_port = 8001;
  auto needs = config::restart_needed(old, fresh, "c1");
  ASSERT_EQ(needs.size(), 3u);
  EXPECT_EQ(needs[0], "[router] differs");
  EXPECT_EQ(needs[1], "[gateway] differs");
  EXPECT_EQ(needs[2], "node 'c1': http differs");
  EXPECT_TRUE(config::restart_needed(old, fresh, "a1").size() == 2u)
    << "c1's http is not a1's business";

  fresh = cluster();
  fresh.gateway.first_byte_timeout = std::chrono::milliseconds(5000);
  EXPECT_EQ(config::restart_needed(old, fresh, "c1"), std::vector<std::string>{"[gateway] differs"})
    << "every [gateway] setting is read at start";

  fresh = cluster();
  fresh.block_size = 16;
  EXPECT_EQ(config::restart_needed(old, fresh, "a1"),
            std::vector<std::string>{"[cluster] differs"});
  fresh = cluster();
  fresh.nodes.erase(fresh.nodes.begin() + 1);
  EXPECT_EQ(config::restart_needed(old, fresh, "a1"),
            std::vector<std::string>{"node 'a1' is no longer in the file"});
}

TEST(router_reload, a_removed_replica_is_never_chosen_again_and_its_state_is_gone) {
  router_core rc(cluster());
  std::vector<wire::block_key> prompt;
  std::vector<kv::block_ref> all;
  for (wire::block_key k = 1; k <= 200; ++k) {
    prompt.push_back(k);
    all.push_back({k, kv::medium::gpu});
  }
  hold(rc, "r0", gpu({1}));
  hold(rc, "r2", all);
  ASSERT_EQ(rc.decide(query(prompt), t0).replica, "r2") << "it holds the whole prompt";
  auto fresh = cluster();
  node(fresh, "a2").engines.clear();
  rc.apply_topology(fresh);
  EXPECT_FALSE(rc.configured("r2"));
  EXPECT_FALSE(has_state(rc, "r2")) << "its blocks left the index";
  EXPECT_TRUE(has_state(rc, "r0")) << "an unchanged replica keeps its state";
  for (int i = 0; i < 6; ++i) {
    auto d = rc.decide(query(prompt), t0);
    EXPECT_TRUE(d.replica == "r0" || d.replica == "r1") << d.replica;
    EXPECT_EQ(d.scores.size(), 2u) << "r2 is no candidate";
  }
  EXPECT_EQ(live_replicas(rc), (std::vector<std::string>{"r0", "r1"}));
  // A request in flight there reports its end: ignored, nothing breaks.
  rc.finished({"r2", 10, 1, 0, 0}, false);
  EXPECT_EQ(rc.unready_reason(t0), "");
}

TEST(router_reload, an_added_replica_starts_empty_and_a_returning_name_starts_over) {
  router_core rc(cluster());
  hold(rc, "r2", gpu({1, 2}));
  auto without = cluster();
  node(without, "a2").engines.clear();
  rc.apply_topology(without);
  auto with_new = cluster();
  node(with_new, "a2").engines.push_back(engine("r3"));
  rc.apply_topology(with_new);
  EXPECT_TRUE(rc.configured("r2"));
  EXPECT_TRUE(rc.configured("r3"));
  EXPECT_FALSE(has_state(rc, "r2")) << "a replica back after its removal starts over";
  EXPECT_EQ(live_replicas(rc).size(), 4u);
  EXPECT_EQ(rc.replicas().size(), 4u) << "r2 took its old slot again";
  hold(rc, "r3", gpu({1, 2, 3}));
  auto d = rc.decide(query({1, 2, 3}), t0);
  EXPECT_EQ(d.replica, "r3");
  EXPECT_EQ(d.tier, route_tier::kv);
}

TEST(router_reload, a_changed_replica_starts_over_and_tier1_forgets_it) {
  router_core rc(cluster());
  hold(rc, "r1", gpu({1, 2}));
  hold(rc, "r0", gpu({7}));
  // Tier 1 remembers a prompt sent to r1.
  auto q = query({}, std::string(64, 'x'));
  q.tokenized = false;
  q.exclude = {"r2"}; // one of a1's
  auto d = rc.decide(q, t0);
  rc.remember(d, q.chunks, t0);
  std::size_t slot = 0;
  while (rc.replicas()[slot].name != d.replica)
    ++slot;
  ASSERT_GT(rc.tier1().size(static_cast<tree_replica>(slot)), 0u);
  auto fresh = cluster();
  for (auto& e : node(fresh, "a1").engines)
    if (e.replica == d.replica)
      e.url = "http://127.0.0.1:9/elsewhere";
  rc.apply_topology(fresh);
  EXPECT_EQ(rc.tier1().size(static_cast<tree_replica>(slot)), 0u);
  EXPECT_FALSE(has_state(rc, d.replica));
  for (const auto& r : rc.replicas()) {
    if (r.name == d.replica) {
      EXPECT_EQ(r.url, "http://127.0.0.1:9/elsewhere");
    }
  }
  auto other = d.replica == "r0" ? "r1" : "r0";
  EXPECT_TRUE(has_state(rc, other)) << "the other engine of the node is unchanged";
}

TEST(router_reload, a_request_sent_before_a_change_is_not_counted_against_the_new_entry) {
  router_core rc(cluster());
  auto q = query({1, 2, 3});
  q.exclude = {"r1", "r2"};
  auto before = rc.decide(q, t0);
  ASSERT_EQ(before.replica, "r0");
  rc.first_token(progress_of(before), 5, t0);
  auto fresh = cluster();
  node(fresh, "a1").engines[0].url = "http://127.0.0.1:9/elsewhere";
  rc.apply_topology(fresh);
  auto after = rc.decide(q, t0);
  ASSERT_EQ(after.replica, "r0");
  EXPECT_NE(after.incarnation, before.incarnation);
  auto r0 = [&]() -> const router_core::replica_entry& {
    for (const auto& r : rc.replicas())
      if (!r.retired && r.name == "r0")
        return r;
    throw std::runtime_error("no r0");
  };
  ASSERT_EQ(r0().outstanding, 1u);
  ASSERT_EQ(r0().decoding, 0u);
  // The old entry's request ends: the new entry's counts are its own.
  rc.finished(progress_of(before), true);
  EXPECT_EQ(r0().outstanding, 1u) << "the request sent to the old entry is not the new one's";
  rc.finished(progress_of(after), false);
  EXPECT_EQ(r0().outstanding, 0u);
  // The old entry's failure does not mark the new one down; its own does.
  auto later = t0 + std::chrono::hours(1);
  rc.mark_down("r0", later, false, before.incarnation);
  EXPECT_FALSE(r0().down(t0)) << "a request sent to the old entry failed";
  rc.mark_down("r0", later, false, after.incarnation);
  EXPECT_TRUE(r0().down(t0));
  // The unchanged replicas keep their entry: their requests end as usual.
  auto q2 = query({4});
  q2.exclude = {"r0", "r1"};
  auto on_r2 = rc.decide(q2, t0);
  ASSERT_EQ(on_r2.replica, "r2");
  rc.apply_topology(fresh); // the same file again: nothing changes
  auto r2_outstanding = [&] {
    for (const auto& r : rc.replicas())
      if (r.name == "r2")
        return r.outstanding;
    return 0u;
  };
  EXPECT_EQ(r2_outstanding(), 1u);
  rc.finished(progress_of(on_r2), false);
  EXPECT_EQ(r2_outstanding(), 0u);
}
