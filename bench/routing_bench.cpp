// llmgw-bench routing: the same seeded workload through every routing
// policy, each on a fresh local cluster of llmgw-sim engines (brought up by
// `llmgw up`), and what each policy made of it: the share of prompt tokens
// served from cache, time to first token, completed requests per second,
// and how the load spread over the replicas.
//
// Policies: round robin, least outstanding requests and consistent-hash
// session affinity are routed by this client straight to the engines (as a
// simple load balancer would); llmgw with KV events off (tier 1 only) and
// llmgw go through the gateway.
//
// The workload (seeded, identical for every policy): sessions arrive as a
// Poisson process. Most are multi-turn chats about a shared document (its
// popularity Zipf-distributed, or one hot document taking a set share),
// each turn resending the whole history; the rest are one-off prompts.
// Each turn is sent when the previous answer has come back.
#include "bench/bench.hpp"
#include "bench/local_up.hpp"
#include "net/http_client.hpp"
#include "wire/openai_request.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <netinet/in.h>
#include <queue>
#include <random>
#include <sstream>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace llmgw::bench {

namespace {

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Scenarios and policies

enum class policy {
  round_robin,
  least_outstanding,
  session_hash,
  llmgw_tier1,
  llmgw,
  llmgw_attached, ///< llmgw, every engine started by the operator at vLLM's defaults
  llmgw_sglang,   ///< the same with every engine an SGLang (llmgw-sim --sim-as sglang)
};

const char* name_of(policy p) {
  switch (p) {
  case policy::round_robin:
    return "round-robin";
  case policy::least_outstanding:
    return "least-outstanding";
  case policy::session_hash:
    return "session-hash";
  case policy::llmgw_tier1:
    return "llmgw-tier1";
  case policy::llmgw:
    return "llmgw";
  case policy::llmgw_attached:
    return "llmgw-attached";
  case policy::llmgw_sglang:
    return "llmgw-sglang";
  }
  return "?";
}

bool through_gateway(policy p) {
  return p == policy::llmgw_tier1 || p == policy::llmgw || p == policy::llmgw_attached
         || p == policy::llmgw_sglang;
}

struct scenario {
  std::string name;
  std::string what;
  std::size_t engines = 4;
  std::size_t gpu_blocks = 27500; ///< per engine
  std::size_t controls = 1;       ///< gateways; requests alternate between them
  // Workload:
  std::size_t sessions = 160;
  double sessions_per_s = 4;
  std::size_t documents = 24;
  std::size_t doc_tokens = 3000;
  double zipf_s = 1.1;
  double hot_share = 0;            ///< >0: document 0 takes this share of the chats
  std::size_t hot_user_tokens = 0; ///< >0: each turn about document 0 is this long
  double one_off_share = 0.1;      ///< sessions that are one prompt of their own
  std::size_t turns_min = 2, turns_max = 8;
  std::size_t user_tokens = 150;
  std::size_t max_tokens = 24;
  // (e): a burst of sessions sharing a new long prefix.
  std::size_t burst = 0;
  double burst_at_s = 0;
  std::size_t burst_tokens = 6000;
  // (d): one engine killed (the agent restarts it) at this time.
  double restart_at_s = -1;
};

/// Times an engine step takes, scaled (the sims are slowed so that two
/// cores running every process keep up with the simulated GPUs).
struct engine_rates {
  double scale = 4;
  double step_ms() const { return 5 * scale; }
  double us_per_token() const { return 40 * scale; }
  double ns_per_context_token() const { return 39 * scale; }
};

// ---------------------------------------------------------------------------
// The workload

/// Text of about `tokens` llmgw-sim tokens (4 bytes each): words of 3
/// letters and a space, drawn from `rng`.
std::string text_of(std::mt19937_64& rng, std::size_t tokens) {
  static const char letters[] = "abcdefghijklmnopqrstuvwxyz";
  std::string s;
  s.reserve(tokens * 4);
  for (std::size_t i = 0; i < tokens; ++i) {
    for (int c = 0; c < 3; ++c)
      s += letters[rng() % 26];
    s += ' ';
  }
  return s;
}

struct session_spec {
  double at_s = 0;
  std::string id;
  std::string system; ///< a shared document, a burst prefix, or the one-off prompt
  std::vector<std::string> users;
  std::int64_t doc = -1; ///< -1: not a shared document
};

std::vector<session_spec> make_workload(const scenario& sc, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> docs;
  for (std::size_t d = 0; d < sc.documents; ++d)
    docs.push_back(fmt::format("Document {}: ", d) + text_of(rng, sc.doc_tokens));
  std::vector<double> weights;
  for (std::size_t d = 0; d < sc.documents; ++d)
    weights.push_back(1.0 / std::pow(static_cast<double>(d + 1), sc.zipf_s));
  std::discrete_distribution<std::size_t> zipf(weights.begin(), weights.end());
  std::exponential_distribution<double> gap(sc.sessions_per_s);
  std::uniform_real_distribution<double> unit(0, 1);
  std::vector<session_spec> out;
  double t = 0;
  for (std::size_t i = 0; i < sc.sessions; ++i) {
    t += gap(rng);
    session_spec s;
    s.at_s = t;
    s.id = fmt::format("s{}", i);
    if (unit(rng) < sc.one_off_share) {
      s.system = "Task: " + text_of(rng, sc.doc_tokens / 2);
      s.users.push_back(text_of(rng, sc.user_tokens));
    } else {
      auto d = sc.hot_share > 0 && unit(rng) < sc.hot_share ? 0 : zipf(rng);
      s.doc = static_cast<std::int64_t>(d);
      s.system = docs[d];
      auto turns = sc.turns_min + rng() % (sc.turns_max - sc.turns_min + 1);
      auto length = d == 0 && sc.hot_user_tokens > 0 ? sc.hot_user_tokens : sc.user_tokens;
      for (std::size_t k = 0; k < turns; ++k)
        s.users.push_back(fmt::format("User {} asks: ", i) + text_of(rng, length));
    }
    out.push_back(std::move(s));
  }
  if (sc.burst > 0) {
    auto prefix = "Shared brief: " + text_of(rng, sc.burst_tokens);
    for (std::size_t i = 0; i < sc.burst; ++i) {
      session_spec s;
      s.at_s = sc.burst_at_s + 0.002 * static_cast<double>(i);
      s.id = fmt::format("burst{}", i);
      s.system = prefix;
      s.users.push_back(fmt::format("Burst {}: ", i) + text_of(rng, sc.user_tokens));
      out.push_back(std::move(s));
    }
  }
  std::sort(out.begin(), out.end(),
            [](const session_spec& a, const session_spec& b) { return a.at_s < b.at_s; });
  return out;
}

// ---------------------------------------------------------------------------
// A local cluster through `llmgw up`

struct cluster : up_cluster {
  std::vector<std::string> gateways;
  std::vector<std::string> engines; ///< base URLs, replica i = "e<i>"
  std::vector<std::uint16_t> engine_ports;
};

/// Writes the topology and starts `llmgw up`; false (with why) if it did
/// not come up.
bool start_cluster(const scenario& sc, policy p, const engine_rates& rates, bool engine_load,
                   cluster& c, std::string& error) {
  bool sglang = p == policy::llmgw_sglang;
  bool attached = p == policy::llmgw_attached || sglang;
  bool events = p == policy::llmgw || attached;
  std::ostringstream t;
  t << "[cluster]\nname = \"bench\"\nhash_seed = \"0\"\nblock_size = 16\nflush_interval_ms = 50\n\n"
    << "[tls]\nca = \"certs/ca.pem\"\n\n"
    << "[router]\n"
    << fmt::format("prefill_ms_per_token = {}\nstep_ms = {}\ndecode_ms_per_request = {}\n",
                   rates.us_per_token() / 1000, rates.step_ms(), 0.15 * rates.scale)
    << (engine_load ? "\n" : "engine_load_max_age_ms = 0\n\n");
  for (std::size_t k = 0; k < sc.controls; ++k) {
    auto http = free_port();
    t << fmt::format("[[node]]\nname = \"control-{}\"\nhost = \"127.0.0.1\"\nport = {}\n"
                     "roles = [\"control\"]\nhttp = \"127.0.0.1:{}\"\n"
                     "cert = \"certs/control-{}.pem\"\nkey = \"certs/control-{}.key\"\n\n",
                     k, free_port(), http, k, k);
    c.gateways.push_back(fmt::format("http://127.0.0.1:{}", http));
  }
  t << "[[node]]\nname = \"agent\"\nhost = \"127.0.0.1\"\nroles = [\"agent\"]\n"
    << "cert = \"certs/agent.pem\"\nkey = \"certs/agent.key\"\n\n";
  for (std::size_t i = 0; i < sc.engines; ++i) {
    auto port = free_port();
    c.engine_ports.push_back(port);
    c.engines.push_back(fmt::format("http://127.0.0.1:{}", port));
    if (attached) {
      // As an operator starts vLLM: its publisher binds tcp://*:PORT, it
      // hashes with its default sha256, PYTHONHASHSEED unset; the agent
      // connects and keys the blocks by the cluster's hash. (SGLang: the
      // same, with SGLang's stream and page ids.)
      auto events_port = free_port();
      t << fmt::format("[[node.engine]]\nreplica = \"e{}\"\nmodel = \"bench\"\nurl = "
                       "\"http://127.0.0.1:{}\"\nkv_events = true\nevents = "
                       "\"tcp://127.0.0.1:{}\"\n{}\n",
                       i, port, events_port, sglang ? "engine = \"sglang\"\n" : "");
      auto sim = (fs::path(exe_dir()).parent_path() / "apps" / "llmgw-sim").string();
      std::vector<std::string> as;
      if (sglang)
        as = {"--sim-as", "sglang", "--page-size", "16"};
      auto argv = std::vector<std::string>{
        sim,
        "serve",
        "bench",
        "--port",
        std::to_string(port),
        "--num-gpu-blocks",
        std::to_string(sc.gpu_blocks),
        "--max-model-len",
        "65536",
        "--enable-prompt-tokens-details",
        "--sim-step-ms",
        fmt::format("{}", rates.step_ms()),
        "--sim-us-per-token",
        fmt::format("{}", rates.us_per_token()),
        "--sim-ns-per-context-token",
        fmt::format("{}", rates.ns_per_context_token()),
        "--prefix-caching-hash-algo",
        "sha256",
        "--kv-events-config",
        fmt::format("{{{}\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:{}\"}}",
                    sglang ? "" : "\"enable_kv_cache_events\": true, ", events_port)};
      argv.insert(argv.end(), as.begin(), as.end());
      auto pid = spawn(argv, fmt::format("/tmp/llmgw-bench-sim-{}.log", port), true);
      if (pid == 0) {
        error = "cannot start " + sim;
        return false;
      }
      c.attached.push_back(pid);
      continue;
    }
    t << fmt::format(
      "[[node.engine]]\nreplica = \"e{}\"\nmodel = \"bench\"\nurl = \"http://127.0.0.1:{}\"\n"
      "kv_events = {}\nlaunch = [\"llmgw-sim\", \"serve\", \"bench\", \"--port\", \"{}\", "
      "\"--num-gpu-blocks\", \"{}\", \"--max-model-len\", \"65536\", "
      "\"--enable-prompt-tokens-details\", \"--sim-step-ms\", \"{}\", \"--sim-us-per-token\", "
      "\"{}\", \"--sim-ns-per-context-token\", \"{}\"]\n\n",
      i, port, events ? "true" : "false", port, sc.gpu_blocks, rates.step_ms(),
      rates.us_per_token(), rates.ns_per_context_token());
  }
  return start_up(t.str(), c, error);
}

// ---------------------------------------------------------------------------
// Running the workload

struct request_result {
  bool ok = false;
  double ttft_ms = 0;
  double total_ms = 0;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t cached_tokens = 0;
  std::string replica;
  bool burst = false;
  std::int64_t doc = -1;
  double sent_s = 0;
  double done_s = 0;
};

/// One answer's stream, as it comes.
struct call_state {
  std::size_t session = 0;
  clock_type::time_point sent;
  std::optional<clock_type::time_point> first;
  int status = 0;
  std::string replica;
  std::string body;
  std::size_t engine = SIZE_MAX; ///< direct policies: the engine called
};

/// Jump consistent hash (Lamping and Veach, 2014): a key to one of `n`
/// buckets, moving few keys when n changes.
std::size_t jump_hash(std::uint64_t key, std::size_t n) {
  std::int64_t b = -1, j = 0;
  while (j < static_cast<std::int64_t>(n)) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<std::int64_t>(
      static_cast<double>(b + 1)
      * (static_cast<double>(1LL << 31) / static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<std::size_t>(b);
}

std::vector<request_result> run_workload(const std::vector<session_spec>& work, policy p,
                                         cluster& c, const scenario& sc) {
  struct session_run {
    json::array messages;
    std::size_t turn = 0;
  };
  std::vector<session_run> runs(work.size());
  for (std::size_t i = 0; i < work.size(); ++i)
    runs[i].messages.push_back(json::object{{"role", "system"}, {"content", work[i].system}});
  std::vector<request_result> results;
  std::mutex mtx;
  std::condition_variable cv;
  std::deque<std::shared_ptr<call_state>> done;
  std::vector<std::size_t> in_flight(c.engines.size(), 0);
  std::size_t rr = 0, gateway_turn = 0;
  bool restarted = sc.restart_at_s < 0;
  auto start = clock_type::now();
  auto seconds = [&](clock_type::time_point t) {
    return std::chrono::duration<double>(t - start).count();
  };
  http_client http;
  // (time, session): turns due.
  using due_t = std::pair<clock_type::time_point, std::size_t>;
  std::priority_queue<due_t, std::vector<due_t>, std::greater<>> due;
  for (std::size_t i = 0; i < work.size(); ++i)
    due.push({start + std::chrono::microseconds(static_cast<std::int64_t>(work[i].at_s * 1e6)), i});
  auto send = [&](std::size_t s) {
    auto& run = runs[s];
    run.messages.push_back(json::object{{"role", "user"}, {"content", work[s].users[run.turn]}});
    json::object body{{"model", "bench"},
                      {"messages", run.messages},
                      {"max_tokens", sc.max_tokens},
                      {"stream", true},
                      {"stream_options", json::object{{"include_usage", true}}}};
    auto st = std::make_shared<call_state>();
    st->session = s;
    std::string base;
    if (through_gateway(p)) {
      base = c.gateways[gateway_turn++ % c.gateways.size()];
    } else {
      std::size_t e = 0;
      if (p == policy::round_robin) {
        e = rr++ % c.engines.size();
      } else if (p == policy::least_outstanding) {
        for (std::size_t k = 1; k < c.engines.size(); ++k) {
          auto cand = (rr + k) % c.engines.size();
          if (in_flight[cand] < in_flight[e])
            e = cand;
        }
        ++rr;
      } else {
        e = jump_hash(std::hash<std::string>{}(work[s].id), c.engines.size());
      }
      ++in_flight[e];
      st->engine = e;
      st->replica = fmt::format("e{}", e);
      base = c.engines[e];
    }
    st->sent = clock_type::now();
    http_call_handlers h;
    h.on_head = [st](int status, const std::vector<std::pair<std::string, std::string>>& hs) {
      st->status = status;
      for (const auto& [k, v] : hs)
        if (k == "x-llmgw-replica" || k == "X-llmgw-replica")
          st->replica = v;
    };
    h.on_data = [st](const std::string& d) {
      if (!st->first && d.find("\"delta\"") != std::string::npos)
        st->first = clock_type::now();
      st->body += d;
    };
    h.on_done = [&, st](const http_error&) {
      std::lock_guard<std::mutex> g(mtx);
      done.push_back(st);
      cv.notify_all();
    };
    return std::make_tuple(base, json::serialize(body), std::move(h));
  };
  std::size_t finished_sessions = 0;
  std::unique_lock<std::mutex> g(mtx);
  while (finished_sessions < work.size()) {
    auto now = clock_type::now();
    if (!restarted && seconds(now) >= sc.restart_at_s) {
      restarted = true;
      if (auto pid = sim_pid(c.engine_ports[0]))
        ::kill(pid, SIGKILL); // the agent starts it again, with an empty cache
    }
    while (!due.empty() && due.top().first <= now) {
      auto s = due.top().second;
      due.pop();
      g.unlock();
      auto [base, body, h] = send(s);
      http.call("POST", base, "/v1/chat/completions", std::move(body),
                {{"content-type", "application/json"}}, 5s, 600s, std::move(h));
      g.lock();
    }
    if (done.empty()) {
      auto until = due.empty() ? now + 100ms : std::min(due.top().first, now + 100ms);
      cv.wait_until(g, until);
      continue;
    }
    auto st = done.front();
    done.pop_front();
    auto s = st->session;
    request_result r;
    r.sent_s = seconds(st->sent);
    r.done_s = seconds(clock_type::now());
    r.total_ms = 1e3 * std::chrono::duration<double>(clock_type::now() - st->sent).count();
    r.ttft_ms =
      st->first ? 1e3 * std::chrono::duration<double>(*st->first - st->sent).count() : r.total_ms;
    r.replica = st->replica;
    r.burst = work[s].id.rfind("burst", 0) == 0;
    r.doc = work[s].doc;
    auto answer = wire::read_streamed_answer(st->body);
    r.prompt_tokens = answer.prompt_tokens;
    r.cached_tokens = answer.cached_tokens;
    auto content = std::move(answer.content);
    r.ok = st->status == 200 && answer.has_usage;
    if (st->engine != SIZE_MAX)
      --in_flight[st->engine];
    results.push_back(r);
    auto& run = runs[s];
    run.messages.push_back(json::object{{"role", "assistant"}, {"content", content}});
    if (r.ok && ++run.turn < work[s].users.size())
      due.push({clock_type::now(), s});
    else
      ++finished_sessions;
  }
  return results;
}

// ---------------------------------------------------------------------------
// Reporting

struct summary {
  policy p{};
  std::size_t requests = 0, failed = 0;
  double cached_ratio = 0;
  double p50 = 0, p90 = 0, p99 = 0;
  double rps = 0;
  double spread = 0; ///< the busiest replica's prompt tokens over the mean
  std::map<std::string, std::uint64_t> tokens_by_replica;
  std::size_t hot_replicas = 0; ///< replicas that served a tenth of document 0's requests
  double burst_p90 = 0;
};

double quantile(std::vector<double> xs, double q) {
  if (xs.empty())
    return 0;
  std::sort(xs.begin(), xs.end());
  auto idx = static_cast<std::size_t>(std::ceil(q * static_cast<double>(xs.size()))) - 1;
  return xs[std::min(idx, xs.size() - 1)];
}

summary summarize(policy p, const std::vector<request_result>& rs, std::size_t engines) {
  summary s;
  s.p = p;
  std::vector<double> ttft, burst;
  std::uint64_t prompt = 0, cached = 0;
  double first = 1e300, last = 0;
  std::map<std::string, std::size_t> hot;
  for (const auto& r : rs) {
    ++s.requests;
    if (!r.ok) {
      ++s.failed;
      continue;
    }
    ttft.push_back(r.ttft_ms);
    if (r.burst)
      burst.push_back(r.ttft_ms);
    prompt += r.prompt_tokens;
    cached += r.cached_tokens;
    s.tokens_by_replica[r.replica] += r.prompt_tokens;
    if (r.doc == 0)
      ++hot[r.replica];
    first = std::min(first, r.sent_s);
    last = std::max(last, r.done_s);
  }
  s.cached_ratio = prompt ? static_cast<double>(cached) / static_cast<double>(prompt) : 0;
  s.p50 = quantile(ttft, 0.5);
  s.p90 = quantile(ttft, 0.9);
  s.p99 = quantile(ttft, 0.99);
  s.burst_p90 = quantile(burst, 0.9);
  s.rps = last > first ? static_cast<double>(s.requests - s.failed) / (last - first) : 0;
  std::uint64_t most = 0;
  for (const auto& [r, t] : s.tokens_by_replica)
    most = std::max(most, t);
  s.spread = prompt ? static_cast<double>(most) / (static_cast<double>(prompt) / engines) : 0;
  std::size_t hot_total = 0;
  for (const auto& [r, n] : hot)
    hot_total += n;
  for (const auto& [r, n] : hot)
    s.hot_replicas += n * 10 >= hot_total;
  return s;
}

/// The sum of every sample of family `name` in Prometheus text.
double sum_of(const std::string& text, const std::string& name) {
  double total = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, name.size(), name) == 0 && line.size() > name.size()
        && (line[name.size()] == '{' || line[name.size()] == ' '))
      total += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  return total;
}

/// The index's accuracy on the run's traffic, from the gateways' own
/// counters: answers whose engine reported its cached tokens where the
/// index predicted some, what the index predicted for them, what the
/// engines found, how many fell short, the blocks those answers dropped
/// from the index, and how often a replica became distrusted.
std::string index_accuracy(const cluster& c) {
  http_client http;
  double answers = 0, predicted = 0, reported = 0, short_ = 0, dropped = 0, distrusts = 0;
  for (const auto& g : c.gateways) {
    std::promise<std::string> got;
    auto text = got.get_future();
    http.request("GET", g, "/metrics", {}, 5s, [&got](http_response r) {
      got.set_value(r.status == 200 ? std::move(r.body) : std::string{});
    });
    auto t = text.get();
    answers += sum_of(t, "llmgw_kv_checked_answers_total");
    predicted += sum_of(t, "llmgw_kv_predicted_cached_tokens_total");
    reported += sum_of(t, "llmgw_kv_reported_cached_tokens_total");
    short_ += sum_of(t, "llmgw_kv_prediction_shortfalls_total");
    dropped += sum_of(t, "llmgw_kv_shortfall_dropped_blocks_total");
    distrusts += sum_of(t, "llmgw_kv_distrusts_total");
  }
  if (answers == 0)
    return "no checked answers";
  return fmt::format("{:.0f} checked answers: the engines found {:.3f} of the {:.0f} cached "
                     "tokens the index predicted; {:.0f} ({:.1f}%) found fewer, dropping {:.0f} "
                     "blocks; {:.0f} distrusts",
                     answers, predicted > 0 ? reported / predicted : 0, predicted, short_,
                     100 * short_ / answers, dropped, distrusts);
}

scenario scenario_named(const std::string& name) {
  scenario sc;
  sc.name = name;
  if (name == "a") {
    sc.what = "shared documents and multi-turn chats; the caches hold the working set";
  } else if (name == "b") {
    sc.what = "the same with caches too small for the working set (cache pressure)";
    sc.gpu_blocks = 800; // 12,800 tokens each: four documents of the 24
  } else if (name == "c") {
    sc.what = "two control nodes; requests alternate between their gateways";
    sc.controls = 2;
  } else if (name == "d") {
    sc.what = "one engine killed mid-run (its agent starts it again, empty)";
    sc.restart_at_s = 20;
  } else if (name == "e") {
    sc.what = "a burst of 24 sessions sharing a new 6000-token prefix, over background chats";
    sc.burst = 24;
    sc.burst_at_s = 15;
    sc.sessions = 100;
  } else if (name == "f") {
    sc.what = "one hot document takes half the chats, each of its turns 1000 new tokens: more "
              "prefill than one engine can do";
    sc.hot_share = 0.5;
    sc.hot_user_tokens = 1000;
    sc.sessions_per_s = 6;
    sc.sessions = 200;
  } else {
    sc.name.clear();
  }
  return sc;
}

} // namespace

int run_routing_bench(const std::vector<std::string>& scenarios,
                      const std::vector<std::string>& policies, std::uint64_t seed,
                      double time_scale, double load, bool engine_load) {
  std::vector<policy> ps;
  for (auto p : {policy::round_robin, policy::least_outstanding, policy::session_hash,
                 policy::llmgw_tier1, policy::llmgw, policy::llmgw_attached, policy::llmgw_sglang})
    if ((policies.empty() && p != policy::llmgw_attached && p != policy::llmgw_sglang)
        || std::find(policies.begin(), policies.end(), name_of(p)) != policies.end())
      ps.push_back(p);
  engine_rates rates;
  rates.scale = time_scale;
  int code = 0;
  for (const auto& name : scenarios) {
    auto sc = scenario_named(name);
    if (sc.name.empty()) {
      fmt::print(stderr, "llmgw-bench routing: no scenario '{}' (a to f)\n", name);
      return 2;
    }
    sc.sessions_per_s *= load;
    auto work = make_workload(sc, seed);
    std::size_t requests = 0;
    for (const auto& w : work)
      requests += w.users.size();
    fmt::print("\nscenario ({}): {}\n  {} engines x {} KV blocks, {} sessions ({} requests) at "
               "{:.1f}/s, engine times x{} (step {} ms, {} us per token)\n",
               sc.name, sc.what, sc.engines, sc.gpu_blocks, work.size(), requests,
               sc.sessions_per_s, rates.scale, rates.step_ms(), rates.us_per_token());
    fmt::print("  {:<18} {:>7} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>6}{}\n", "policy", "cached",
               "ttft p50", "p90 ms", "p99 ms", "req/s", "spread", "failed", "hot",
               sc.burst ? "   burst p90" : "");
    for (auto p : ps) {
      cluster c;
      std::string error;
      if (!start_cluster(sc, p, rates, engine_load, c, error)) {
        fmt::print(stderr, "  {}: {}\n", name_of(p), error);
        code = 1;
        continue;
      }
      auto rs = run_workload(work, p, c, sc);
      auto accuracy = p == policy::llmgw || p == policy::llmgw_attached || p == policy::llmgw_sglang
                        ? index_accuracy(c)
                        : std::string{};
      c.stop();
      auto s = summarize(p, rs, sc.engines);
      fmt::print("  {:<18} {:>7.3f} {:>8.0f} {:>9.0f} {:>9.0f} {:>9.2f} {:>7.2f} {:>7} {:>6}{}\n",
                 name_of(p), s.cached_ratio, s.p50, s.p90, s.p99, s.rps, s.spread, s.failed,
                 s.hot_replicas, sc.burst ? fmt::format("   {:>9.0f}", s.burst_p90) : "");
      if (!accuracy.empty())
        fmt::print("    index: {}\n", accuracy);
      std::fflush(stdout);
      std::error_code ec;
      fs::remove_all(c.dir, ec);
    }
  }
  return code;
}

} // namespace llmgw::bench
