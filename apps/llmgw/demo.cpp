#include "apps/llmgw/demo.hpp"

#include "net/http_client.hpp"
#include "wire/openai_request.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

namespace llmgw::apps {

namespace json = boost::json;
using namespace std::chrono_literals;

namespace {

/// A long, deterministic system prompt: what many users of one product share.
std::string system_prompt(std::size_t i) {
  static const char* topics[] = {"a bank's customer support", "a SQL tutoring service",
                                 "a travel agency", "a hospital's front desk", "a code review bot"};
  std::string s = fmt::format("You are the assistant of {}. ", topics[i % 5]);
  for (int rule = 1; s.size() < 2400; ++rule)
    s += fmt::format("Rule {}: answer politely, cite policy section {}.{}, never invent facts, "
                     "and keep answers short. ",
                     rule, i + 1, rule);
  return s;
}

struct one_answer {
  bool ok = false;
  std::string replica;
  std::string tier;
  std::string content;
  std::int64_t prompt_tokens = 0;
  std::int64_t cached_tokens = 0;
  double ms = 0;      ///< until the answer was complete
  double ttft_ms = 0; ///< until its first token
  std::string error;
};

one_answer chat(http_client& http, const std::string& base, json::object body) {
  one_answer a;
  std::promise<void> done;
  std::mutex mtx;
  int status = 0;
  std::string text;
  std::optional<std::chrono::steady_clock::time_point> first;
  body["stream"] = true;
  body["stream_options"] = json::object{{"include_usage", true}};
  auto start = std::chrono::steady_clock::now();
  http.call("POST", base, "/v1/chat/completions", json::serialize(body),
            {{"Content-Type", "application/json"}}, 2s, 60s,
            {[&](int s, const std::vector<std::pair<std::string, std::string>>& hs) {
               std::lock_guard<std::mutex> g(mtx);
               status = s;
               for (auto& [k, v] : hs) {
                 if (k == "x-llmgw-replica")
                   a.replica = v;
                 if (k == "x-llmgw-tier")
                   a.tier = v;
               }
             },
             [&](const std::string& d) {
               std::lock_guard<std::mutex> g(mtx);
               if (!first && d.find("\"delta\"") != std::string::npos)
                 first = std::chrono::steady_clock::now();
               text += d;
             },
             [&](const http_error& e) {
               std::lock_guard<std::mutex> g(mtx);
               a.error = e.message;
               done.set_value();
             }});
  done.get_future().wait();
  a.ms =
    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard<std::mutex> g(mtx);
  if (!a.error.empty() || status != 200) {
    if (a.error.empty())
      a.error = fmt::format("HTTP {}: {}", status, text.substr(0, 200));
    return a;
  }
  auto answer = wire::read_streamed_answer(text);
  if (!answer.has_usage) {
    a.error = "no usage in the stream: " + text.substr(0, 200);
    return a;
  }
  a.content = std::move(answer.content);
  a.prompt_tokens = static_cast<std::int64_t>(answer.prompt_tokens);
  a.cached_tokens = static_cast<std::int64_t>(answer.cached_tokens);
  a.ttft_ms = first ? std::chrono::duration<double, std::milli>(*first - start).count() : a.ms;
  a.ok = true;
  return a;
}

/// The q-quantile (0..1) of `xs`, nearest rank.
double quantile(std::vector<double> xs, double q) {
  if (xs.empty())
    return 0;
  std::sort(xs.begin(), xs.end());
  auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(xs.size())));
  return xs[std::min(xs.size(), std::max<std::size_t>(rank, 1)) - 1];
}

struct tally {
  std::size_t requests = 0;
  std::map<std::string, std::size_t> tiers;
  std::int64_t prompt = 0;
  std::int64_t cached = 0;
  double ms = 0;
  std::vector<double> ttft;
  void add(const one_answer& a) {
    ++requests;
    ++tiers[a.tier];
    prompt += a.prompt_tokens;
    cached += a.cached_tokens;
    ms += a.ms;
    ttft.push_back(a.ttft_ms);
  }
  void merge(const tally& t) {
    requests += t.requests;
    prompt += t.prompt;
    cached += t.cached;
    ms += t.ms;
    for (const auto& [tier, n] : t.tiers)
      tiers[tier] += n;
    ttft.insert(ttft.end(), t.ttft.begin(), t.ttft.end());
  }
  double ratio() const {
    return prompt ? static_cast<double>(cached) / static_cast<double>(prompt) : 0;
  }
  double mean() const { return requests ? ms / static_cast<double>(requests) : 0; }
};

/// One phase: every conversation, turn by turn, `parallel` at a time;
/// `target` picks where each request goes (and fills in the replica).
std::map<std::string, tally> phase(const demo_options& o,
                                   const std::function<std::string(std::string&)>& target,
                                   std::size_t& failed) {
  std::map<std::string, tally> per_replica;
  std::mutex mtx;
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> workers;
  for (std::size_t w = 0; w < o.parallel; ++w)
    workers.emplace_back([&] {
      http_client http;
      for (std::size_t c; (c = next++) < o.conversations;) {
        json::array messages{
          json::object{{"role", "system"}, {"content", system_prompt(c % o.system_prompts)}}};
        for (std::size_t t = 0; t < o.turns; ++t) {
          // Users paste what they ask about: each turn adds ~300 tokens of
          // history that only the replica holding the conversation has cached.
          std::string pasted;
          for (int line = 0; pasted.size() < 1200; ++line)
            pasted += fmt::format("case {} line {}: amount {} due {}. ", 1000 + c * 10 + t, line,
                                  (c * 37 + t * 11 + static_cast<std::size_t>(line) * 7) % 997,
                                  2026 + line % 3);
          messages.push_back(json::object{
            {"role", "user"},
            {"content", fmt::format("I am user {}. Question {}: what does rule {} mean here?\n{}",
                                    c, t + 1, t + 3, pasted)}});
          json::object body{{"model", o.model}, {"messages", messages}, {"max_tokens", 8}};
          std::string replica;
          auto base = target(replica);
          auto a = chat(http, base, body);
          std::lock_guard<std::mutex> g(mtx);
          if (!a.ok) {
            ++failed;
            fmt::print(stderr, "demo: a request to {} ({}) failed: {}\n",
                       replica.empty() ? std::string("the gateway") : replica, base, a.error);
            break;
          }
          if (a.replica.empty())
            a.replica = replica;
          per_replica[a.replica].add(a);
          messages.push_back(json::object{{"role", "assistant"}, {"content", a.content}});
        }
      }
    });
  for (auto& w : workers)
    w.join();
  return per_replica;
}

void reset_caches(const demo_options& o) {
  http_client http;
  for (const auto& e : o.engines) {
    std::promise<void> done;
    http.request("POST", e.url, "/reset_prefix_cache", "", 5s,
                 [&done](const http_response&) { done.set_value(); });
    done.get_future().wait();
  }
}

} // namespace

demo_summary run_demo(const demo_options& o) {
  demo_summary s;
  auto total_requests = o.conversations * o.turns;
  fmt::print("\ndemo: {} chat requests: {} conversations of {} turns over {} shared system "
             "prompts, {} at a time\n",
             total_requests, o.conversations, o.turns, o.system_prompts, o.parallel);
  reset_caches(o);
  std::size_t failed = 0;
  auto via_gateway = phase(
    o, [&](std::string&) { return o.gateway_url; }, failed);
  reset_caches(o);
  std::atomic<std::size_t> turn{0};
  auto round_robin = phase(
    o,
    [&](std::string& replica) {
      const auto& e = o.engines[turn++ % o.engines.size()];
      replica = e.replica;
      return e.url;
    },
    failed);
  tally all, rr;
  for (const auto& [r, t] : via_gateway)
    all.merge(t);
  for (const auto& [r, t] : round_robin)
    rr.merge(t);
  auto tiers_of = [](const tally& t, const char* tier) {
    auto it = t.tiers.find(tier);
    return it == t.tiers.end() ? std::size_t{0} : it->second;
  };
  fmt::print("\nthrough llmgw:\n{:<10} {:>8} {:>5} {:>7} {:>5} {:>11} {:>11} {:>7} {:>9} {:>9}\n",
             "replica", "requests", "kv", "approx", "load", "prompt tok", "cached tok", "cached",
             "ttft p50", "ttft p90");
  auto row = [&](const std::string& name, const tally& t) {
    fmt::print("{:<10} {:>8} {:>5} {:>7} {:>5} {:>11} {:>11} {:>6.0f}% {:>6.0f} ms {:>6.0f} ms\n",
               name, t.requests, tiers_of(t, "kv"), tiers_of(t, "approx"), tiers_of(t, "load"),
               t.prompt, t.cached, 100 * t.ratio(), quantile(t.ttft, 0.5), quantile(t.ttft, 0.9));
  };
  for (const auto& e : o.engines) {
    auto it = via_gateway.find(e.replica);
    row(e.replica, it == via_gateway.end() ? tally{} : it->second);
  }
  row("all", all);
  fmt::print("\nround-robin straight to the engines (the same traffic, caches reset first):\n");
  fmt::print("{:<10} {:>8} {:>31} {:>11} {:>6.0f}% {:>6.0f} ms {:>6.0f} ms\n", "all", rr.requests,
             rr.prompt, rr.cached, 100 * rr.ratio(), quantile(rr.ttft, 0.5),
             quantile(rr.ttft, 0.9));
  fmt::print("\nllmgw served {:.0f}% of prompt tokens from cache against {:.0f}% round-robin; "
             "time to first token p50 {:.0f} ms against {:.0f} ms, p90 {:.0f} ms against {:.0f} "
             "ms\n",
             100 * all.ratio(), 100 * rr.ratio(), quantile(all.ttft, 0.5), quantile(rr.ttft, 0.5),
             quantile(all.ttft, 0.9), quantile(rr.ttft, 0.9));
  s.requests = all.requests + rr.requests;
  s.failed = failed;
  s.gateway_cached_ratio = all.ratio();
  s.round_robin_cached_ratio = rr.ratio();
  s.gateway_mean_ms = all.mean();
  s.round_robin_mean_ms = rr.mean();
  s.gateway_ttft_p90_ms = quantile(all.ttft, 0.9);
  s.round_robin_ttft_p90_ms = quantile(rr.ttft, 0.9);
  s.kv_decisions = tiers_of(all, "kv");
  return s;
}

} // namespace llmgw::apps
