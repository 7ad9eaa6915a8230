// The router's decision and index, on one thread.
//
// Decision latency, excluding tokenization: hashing the prompt's blocks
// (what every request costs at least), tier-1 chunk hashes, and
// router_core::decide over R replicas of one model. Measured side by side
// with hashing alone, alternating sample by sample, so the ratio is taken on
// the same machine state. Cluster: each replica holds `blocks_per_replica`
// blocks of its own, plus a shared system prompt; the prompt being routed
// shares its leading blocks with a quarter of the replicas (to depths up to
// the whole prompt), so the walk is long and involves many holders.
//
// Index updates: agents' changes (16 added + 16 removed blocks each) applied
// through the router's own update path; memory: heap bytes of the block index
// per (block, replica) entry, for keys held once and for a shared mix.
#include "actors/router.hpp"
#include "bench/bench.hpp"
#include "routing/router_core.hpp"
#include "wire/block_hash.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <random>

namespace llmgw::bench {

namespace {

config::topology cluster_of(std::size_t replicas) {
  config::topology t;
  t.seed = "0";
  t.block_size = 16;
  config::node_spec n;
  n.name = "agent";
  for (std::size_t i = 0; i < replicas; ++i) {
    config::engine_spec e;
    e.replica = "r" + std::to_string(i);
    e.model = "m";
    e.url = "http://127.0.0.1:1";
    e.kv_events = true;
    e.canary = false; // its engines do not answer completions here
    n.engines.push_back(e);
  }
  t.nodes.push_back(n);
  return t;
}

std::vector<std::uint32_t> random_tokens(std::size_t n, std::mt19937_64& rng) {
  std::vector<std::uint32_t> t(n);
  for (auto& x : t)
    x = static_cast<std::uint32_t>(rng() % 128000);
  return t;
}

double percentile(std::vector<double> xs, double p) {
  std::sort(xs.begin(), xs.end());
  auto i = static_cast<std::size_t>(p * static_cast<double>(xs.size() - 1) + 0.5);
  return xs[std::min(i, xs.size() - 1)];
}

struct latency_result {
  double hash_p50 = 0, hash_p99 = 0, decide_p50 = 0, decide_p99 = 0;
};

latency_result decision_latency(std::size_t replicas, std::size_t prompt_tokens,
                                std::size_t blocks_per_replica, int samples) {
  std::mt19937_64 rng(42 + replicas + prompt_tokens);
  auto topo = cluster_of(replicas);
  routing::router_core core(topo);
  wire::block_hasher hasher(topo.seed, topo.block_size);
  auto prompt = random_tokens(prompt_tokens, rng);
  std::string text(prompt_tokens * 4, 'x'); // ~4 bytes of text per token
  for (auto& ch : text)
    ch = static_cast<char>('a' + rng() % 26);
  std::vector<wire::hashed_block> blocks;
  hasher.hash_into(prompt, {}, blocks);
  auto system_prompt = random_tokens(64 * 16, rng);
  std::vector<wire::hashed_block> system_blocks;
  hasher.hash_into(system_prompt, {}, system_blocks);
  auto now = std::chrono::steady_clock::now();
  for (std::size_t r = 0; r < replicas; ++r) {
    std::vector<kv::block_ref> held;
    held.reserve(blocks_per_replica + system_blocks.size() + blocks.size());
    for (std::size_t i = 0; i < blocks_per_replica; ++i)
      held.push_back({rng(), kv::medium::gpu});
    for (const auto& b : system_blocks)
      held.push_back({b.key, kv::medium::gpu});
    if (r % 4 == 0) { // a quarter share the prompt, to growing depths
      auto depth = blocks.size() * (r / 4 + 1) / (replicas / 4 + 1);
      for (std::size_t i = 0; i < depth; ++i)
        held.push_back({blocks[i].key, i % 7 == 6 ? kv::medium::cpu : kv::medium::gpu});
    }
    core.kv().apply(
      {"r" + std::to_string(r), 0, 1, true, kv::parity_state::verified, &held, nullptr}, now);
  }
  std::vector<double> hash_only, decision;
  std::vector<wire::hashed_block> scratch;
  for (int s = 0; s < samples; ++s) {
    hash_only.push_back(time_once([&] { hasher.hash_into(prompt, {}, scratch); }));
    routing::route_decision d;
    decision.push_back(time_once([&] {
      routing::route_query q;
      q.model = "m";
      q.tokenized = true;
      hasher.hash_into(prompt, {}, scratch);
      q.keys.reserve(scratch.size());
      for (const auto& b : scratch)
        q.keys.push_back(b.key);
      q.chunks = routing::chunk_hashes(text, 64);
      d = core.decide(q, now);
    }));
    core.finished(progress_of(d), false); // keep the load flat between samples
    if (d.tier != routing::route_tier::kv)
      std::abort(); // the prompt is held: anything else measures the wrong path
  }
  return {percentile(hash_only, 0.5), percentile(hash_only, 0.99), percentile(decision, 0.5),
          percentile(decision, 0.99)};
}

double updates_per_second(std::size_t replicas, int rounds) {
  std::mt19937_64 rng(7);
  auto topo = cluster_of(replicas);
  routing::shared_router shared(topo);
  // As the router actor applies a change: holding the lock the gateway shares.
  auto apply = [&shared](const replica_update& u, std::chrono::steady_clock::time_point at) {
    shared.with([&](routing::router_core& core, routing::router_stats& stats) {
      apply_update(core, stats, u, at);
    });
  };
  auto now = std::chrono::steady_clock::now();
  // Full copies first: 20k blocks per replica.
  std::vector<std::vector<kv::block_ref>> held(replicas);
  for (std::size_t r = 0; r < replicas; ++r) {
    replica_update u;
    u.replica = "r" + std::to_string(r);
    u.reset = true;
    for (int i = 0; i < 20000; ++i)
      u.added.push_back({rng(), kv::medium::gpu});
    held[r] = u.added;
    apply(u, now);
  }
  // Churn: each update replaces 16 of the replica's blocks by 16 new ones.
  const int per_round = 20000;
  std::vector<replica_update> updates(per_round);
  for (int i = 0; i < per_round; ++i) {
    auto r = static_cast<std::size_t>(i) % replicas;
    auto& u = updates[static_cast<std::size_t>(i)];
    u.replica = "r" + std::to_string(r);
    u.epoch = 0;
    for (int k = 0; k < 16; ++k) {
      auto& slot = held[r][rng() % held[r].size()];
      u.removed.push_back(slot);
      slot = {rng(), kv::medium::gpu};
      u.added.push_back(slot);
    }
  }
  std::vector<double> rates;
  for (int round = 0; round < rounds; ++round) {
    auto secs = time_once([&] {
      for (const auto& u : updates)
        apply(u, now);
    });
    rates.push_back(per_round / secs);
    // Undo, so every round starts from the same index (not timed).
    for (auto it = updates.rbegin(); it != updates.rend(); ++it) {
      replica_update back = *it;
      std::swap(back.added, back.removed);
      apply(back, now);
    }
  }
  return median(rates);
}

/// The control node's check of an update's MAC (config/node_identity.hpp),
/// per update: a churn update (16 + 16 blocks) and a full copy of 20k
/// blocks, in updates per second.
std::pair<double, double> macs_per_second(int rounds) {
  std::mt19937_64 rng(5);
  auto make = [&](std::size_t added, std::size_t removed) {
    replica_update u;
    u.node = "agent-a";
    u.replica = "r0";
    u.session = rng();
    for (std::size_t i = 0; i < added; ++i)
      u.added.push_back({rng(), kv::medium::gpu});
    for (std::size_t i = 0; i < removed; ++i)
      u.removed.push_back({rng(), kv::medium::gpu});
    return u;
  };
  const std::string key(32, 'k');
  auto churn = make(16, 16);
  auto full = make(20000, 0);
  std::vector<double> small, large;
  std::size_t sink = 0;
  for (int round = 0; round < rounds; ++round) {
    small.push_back(20000 / time_once([&] {
                      for (int i = 0; i < 20000; ++i) {
                        churn.seq = static_cast<std::uint64_t>(i);
                        sink += update_mac(key, churn).size();
                      }
                    }));
    large.push_back(200 / time_once([&] {
                      for (int i = 0; i < 200; ++i) {
                        full.seq = static_cast<std::uint64_t>(i);
                        sink += update_mac(key, full).size();
                      }
                    }));
  }
  if (sink == 0)
    std::abort(); // keeps the work from being optimized away
  return {median(small), median(large)};
}

/// Index bytes per entry for `replicas` each holding `blocks` blocks, a
/// `shared` fraction of them held by every replica.
double bytes_per_entry(std::size_t replicas, std::size_t blocks, double shared) {
  std::mt19937_64 rng(11);
  routing::block_index idx;
  std::vector<wire::block_key> common(static_cast<std::size_t>(blocks * shared));
  for (auto& k : common)
    k = rng();
  for (std::size_t r = 0; r < replicas; ++r) {
    for (auto k : common)
      idx.add(k, static_cast<routing::holder_id>(r), kv::medium::gpu);
    for (std::size_t i = common.size(); i < blocks; ++i)
      idx.add(rng(), static_cast<routing::holder_id>(r), kv::medium::gpu);
  }
  return static_cast<double>(idx.memory_bytes()) / static_cast<double>(idx.entries());
}

} // namespace

int run_router_bench(int rounds) {
  fmt::print("router decision, excluding tokenization (hash + tier-1 chunks + decide), "
             "{} samples each\n",
             rounds * 20);
  double ratio_8k_64 = 0;
  for (std::size_t tokens : {1024u, 8192u})
    for (std::size_t replicas : {8u, 64u, 512u}) {
      auto r = decision_latency(replicas, tokens, replicas >= 512 ? 5000 : 20000, rounds * 20);
      auto name = fmt::format("{}k tokens, {} replicas", tokens / 1024, replicas);
      report(name + ": hash p50 / p99", r.hash_p50 * 1e6, "µs",
             fmt::format("{:.1f}", r.hash_p99 * 1e6));
      report(
        name + ": decision p50 / p99", r.decide_p50 * 1e6, "µs",
        fmt::format("{:.1f}  (p99 ratio {:.2f}x)", r.decide_p99 * 1e6, r.decide_p99 / r.hash_p99));
      if (tokens == 8192 && replicas == 64)
        ratio_8k_64 = r.decide_p99 / r.hash_p99;
    }
  report("target: 8k tokens, 64 replicas, p99 decision / p99 hash", ratio_8k_64, "x",
         ratio_8k_64 <= 1.5 ? "(<= 1.5: met)" : "(> 1.5: NOT met)");
  for (std::size_t replicas : {8u, 64u})
    report(fmt::format("index updates applied ({} replicas, 16+16 blocks each)", replicas),
           updates_per_second(replicas, rounds), "updates/s");
  auto [churn_macs, full_macs] = macs_per_second(rounds);
  report("update MACs checked (16+16 blocks each)", churn_macs, "updates/s");
  report("update MACs checked (a full copy of 20k blocks)", full_macs, "updates/s");
  report("index bytes per (block, replica) entry, keys held once", bytes_per_entry(64, 20000, 0.0),
         "B", "(target <= 32)");
  report("index bytes per (block, replica) entry, 30% shared by all",
         bytes_per_entry(64, 20000, 0.3), "B");
  return 0;
}

} // namespace llmgw::bench
