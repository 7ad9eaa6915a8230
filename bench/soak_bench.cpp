// llmgw-bench soak: a local cluster (two control nodes, two agents, four
// llmgw-sim engines, mutual TLS, through `llmgw up`) under a sustained load
// of block events and a steady request rate, for minutes. Each engine
// publishes its real events and `--sim-event-churn` more a second (stores
// of random blocks, removes of the oldest); once a minute one engine's
// cache is cleared (POST /reset_prefix_cache, a real AllBlocksCleared).
// Every minute it prints the block events the control nodes took, requests
// answered and every process's resident memory. Requests cycle through
// 400 prompts, so caches keyed by prompt fill early and then hold. At the end it freezes the
// engines (SIGSTOP: no more events) and checks that both control nodes'
// views of every replica equal the agents' mirrors (fingerprints).
#include "bench/bench.hpp"
#include "bench/local_up.hpp"
#include "net/http_client.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace llmgw::bench {

namespace {

namespace json = boost::json;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

const char* const agents[] = {"agent-a", "agent-b"};
const char* const controls[] = {"control-1", "control-2"};

struct soak_cluster : up_cluster {
  std::map<std::string, std::string> admin;     ///< node -> http://host:port
  std::vector<std::string> gateways;            ///< control nodes' gateways
  std::map<std::string, std::uint16_t> engines; ///< replica -> port
};

std::string topology(soak_cluster& c, std::size_t churn_per_engine) {
  std::ostringstream t;
  t << "[cluster]\nname = \"soak\"\nhash_seed = \"0\"\nblock_size = 16\nflush_interval_ms = 100\n\n"
    << "[tls]\nca = \"certs/ca.pem\"\n\n";
  for (const char* n : controls) {
    auto http = free_port();
    auto admin = free_port();
    t << fmt::format("[[node]]\nname = \"{}\"\nhost = \"127.0.0.1\"\nport = {}\n"
                     "roles = [\"control\"]\nhttp = \"127.0.0.1:{}\"\nadmin = \"127.0.0.1:{}\"\n"
                     "cert = \"certs/{}.pem\"\nkey = \"certs/{}.key\"\n\n",
                     n, free_port(), http, admin, n, n);
    c.gateways.push_back(fmt::format("http://127.0.0.1:{}", http));
    c.admin[n] = fmt::format("http://127.0.0.1:{}", admin);
  }
  for (const char* n : agents) {
    auto admin = free_port();
    c.admin[n] = fmt::format("http://127.0.0.1:{}", admin);
    t << fmt::format(
      "[[node]]\nname = \"{}\"\nhost = \"127.0.0.1\"\nroles = [\"agent\"]\n"
      "admin = \"127.0.0.1:{}\"\ncert = \"certs/{}.pem\"\nkey = \"certs/{}.key\"\n\n",
      n, admin, n, n);
    for (int i = 0; i < 2; ++i) {
      auto replica = fmt::format("{}{}", n[6], i);
      auto port = free_port();
      c.engines[replica] = port;
      t << fmt::format(
        "[[node.engine]]\nreplica = \"{}\"\nmodel = \"soak\"\nurl = \"http://127.0.0.1:{}\"\n"
        "kv_events = true\nlaunch = [\"llmgw-sim\", \"serve\", \"soak\", \"--port\", \"{}\", "
        "\"--num-gpu-blocks\", \"2048\", \"--enable-prompt-tokens-details\", "
        "\"--sim-event-churn\", \"{}\"]\n\n",
        replica, port, port, churn_per_engine);
    }
  }
  return t.str();
}

/// GET on a node's admin listener, synchronously ("" if no answer).
std::string get(http_client& http, const std::string& base, const std::string& target) {
  std::promise<http_response> p;
  http.request("GET", base, target, "", 10s, [&p](http_response r) { p.set_value(std::move(r)); });
  auto r = p.get_future().get();
  return r.status == 200 ? r.body : std::string{};
}

/// Block events the control node took from the agents' mirrors so far
/// (hashes stored and removed, summed over replicas), and stream gaps.
std::pair<std::uint64_t, std::uint64_t> events_and_gaps(http_client& http,
                                                        const std::string& admin) {
  auto body = get(http, admin, "/v1/kv/replicas");
  std::uint64_t events = 0, gaps = 0;
  boost::system::error_code ec;
  auto doc = json::parse(body, ec);
  if (ec || !doc.is_object())
    return {0, 0};
  for (const auto& r : doc.at("replicas").as_array())
    for (const auto& x : r.at("ranks").as_array())
      if (const auto* a = x.as_object().if_contains("agent")) {
        events += json::value_to<std::uint64_t>(a->at("stored"))
                  + json::value_to<std::uint64_t>(a->at("removed"));
        gaps += json::value_to<std::uint64_t>(a->at("resets").at("gap"));
      }
  return {events, gaps};
}

/// Replica -> fingerprint, from a control node's view or an agent's mirrors.
std::map<std::string, std::string> fingerprints(http_client& http, const std::string& admin,
                                                bool agent) {
  std::map<std::string, std::string> out;
  boost::system::error_code ec;
  auto doc = json::parse(get(http, admin, agent ? "/v1/kv/mirrors" : "/v1/kv/replicas"), ec);
  if (ec || !doc.is_object())
    return out;
  for (const auto& r : doc.at(agent ? "mirrors" : "replicas").as_array()) {
    const auto& o = r.as_object();
    auto name = json::value_to<std::string>(o.at("replica"));
    if (agent) {
      out[name] = json::value_to<std::string>(o.at("fingerprint"));
    } else if (!o.at("ranks").as_array().empty()) {
      const auto& rank = o.at("ranks").as_array()[0].as_object();
      if (rank.at("has_state").as_bool())
        out[name] = json::value_to<std::string>(rank.at("fingerprint"));
    }
  }
  return out;
}

} // namespace

int run_soak_bench(double minutes, double events_per_second, double request_rate) {
  soak_cluster c;
  auto churn = static_cast<std::size_t>(events_per_second / 4);
  std::string error;
  if (!start_up(topology(c, churn), c, error)) {
    fmt::print(stderr, "llmgw-bench soak: {}\n", error);
    return 1;
  }
  fmt::print("# soak: {} min, {} block events/s asked ({} per engine beside their own), {} "
             "requests/s; cluster in {}\n",
             minutes, events_per_second, churn, request_rate, c.dir);
  std::map<std::string, pid_t> pids;
  for (const auto& [name, url] : c.admin)
    pids[name] = pid_with("--node " + name);
  for (const auto& [replica, port] : c.engines)
    pids[replica] = sim_pid(port);

  std::atomic<std::uint64_t> ok{0}, failed{0}, sent{0}; // before the client: its calls count
  std::atomic<bool> stopping{false};
  http_client http;
  std::thread traffic([&] {
    auto next = clock_type::now();
    auto gap = std::chrono::duration_cast<clock_type::duration>(
      std::chrono::duration<double>(1.0 / request_rate));
    for (std::uint64_t n = 0; !stopping; ++n) {
      // 400 prompts in turn (8 documents, 50 questions): the caches keyed
      // by prompt fill in the first minutes and then hold, so what grows
      // after that is not a cache filling. Prompts never seen twice are
      // measured apart (BENCHMARKS.md, control-node memory).
      std::string prompt;
      for (int w = 0; w < 300; ++w)
        prompt += fmt::format("doc{}word{} ", n % 8, w);
      prompt += fmt::format("question {}", (n / 8) % 50);
      json::object body{{"model", "soak"}, {"prompt", prompt}, {"max_tokens", 4}};
      ++sent;
      http.post_json(c.gateways[n % 2], "/v1/completions", json::serialize(body), 30s,
                     [&](const http_response& r) { (r.status == 200 ? ok : failed) += 1; });
      next += gap;
      std::this_thread::sleep_until(next);
    }
  });

  fmt::print("{:>6} {:>12} {:>8} {:>8} {:>6}  resident MiB: {}\n", "minute", "events/s", "ok",
             "failed", "gaps",
             fmt::join(std::vector<std::string>{"control-1", "control-2", "agent-a", "agent-b",
                                                "a0", "a1", "b0", "b1"},
                       " "));
  std::map<std::string, std::vector<double>> rss;
  auto [events_before, gaps_before] = events_and_gaps(http, c.admin["control-1"]);
  auto start = clock_type::now();
  std::vector<double> rates;
  std::size_t cleared = 0;
  for (int minute = 1; minute <= static_cast<int>(std::lround(minutes)); ++minute) {
    std::this_thread::sleep_until(start + std::chrono::minutes(minute));
    auto [events, gaps] = events_and_gaps(http, c.admin["control-1"]);
    double rate = static_cast<double>(events - events_before) / 60.0;
    rates.push_back(rate);
    events_before = events;
    std::vector<std::string> mib;
    for (const char* n : {"control-1", "control-2", "agent-a", "agent-b", "a0", "a1", "b0", "b1"}) {
      double m = static_cast<double>(rss_kib(pids[n])) / 1024.0;
      rss[n].push_back(m);
      mib.push_back(fmt::format("{:.1f}", m));
    }
    fmt::print("{:>6} {:>12.0f} {:>8} {:>8} {:>6}  {}\n", minute, rate, ok.load(), failed.load(),
               gaps - gaps_before, fmt::join(mib, " "));
    std::fflush(stdout);
    // A real clear, in turn: the engine empties its cache and says so.
    auto replica = std::string(minute % 2 ? "a" : "b") + std::to_string((minute / 2) % 2);
    // vLLM refuses while requests run (409): try again, up to 5 s.
    for (int attempt = 0; attempt < 100; ++attempt) {
      std::promise<int> p;
      http.request("POST", fmt::format("http://127.0.0.1:{}", c.engines[replica]),
                   "/reset_prefix_cache", "", 5s,
                   [&p](const http_response& r) { p.set_value(r.status); });
      if (p.get_future().get() == 200) {
        ++cleared;
        break;
      }
      std::this_thread::sleep_for(50ms);
    }
  }
  stopping = true;
  traffic.join();
  // No more events: freeze the engines, then compare.
  for (const auto& [replica, port] : c.engines)
    ::kill(pids[replica], SIGSTOP);
  bool equal = false;
  auto deadline = clock_type::now() + 30s;
  std::map<std::string, std::string> mirrors;
  while (!equal && clock_type::now() < deadline) {
    std::this_thread::sleep_for(200ms);
    mirrors.clear();
    for (const char* a : agents)
      for (const auto& kv : fingerprints(http, c.admin[a], true))
        mirrors.insert(kv);
    equal = mirrors.size() == 4;
    for (const char* n : controls)
      equal = equal && fingerprints(http, c.admin[n], false) == mirrors;
  }
  for (const auto& [replica, port] : c.engines)
    ::kill(pids[replica], SIGCONT);
  fmt::print("# {} of {} requests answered 200, {} failed; {} of {} clears done\n", ok.load(),
             sent.load(), failed.load(), cleared, rates.size());
  fmt::print("# block events/s taken by control-1: median {:.0f} a minute (asked {:.0f})\n",
             median(rates), events_per_second);
  for (const auto& [name, v] : rss)
    if (!v.empty())
      fmt::print("# {:<10} resident MiB: first minute {:.1f}, last {:.1f} ({:+.1f})\n", name,
                 v.front(), v.back(), v.back() - v.front());
  fmt::print("# control nodes' views equal the agents' mirrors after the engines froze: {}\n",
             equal ? "yes" : "NO");
  return equal ? 0 : 1;
}

} // namespace llmgw::bench
