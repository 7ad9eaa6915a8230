// The gateway's own overhead: the same requests against an upstream
// directly, through llmgw's gateway, and through Debian's nginx proxying the
// same upstream, interleaved round by round in one run.
//
// The upstream answers /v1/completions at once with a fixed body, so what is
// measured is the proxies. The gateway runs in this process with its real
// router, control and tokenizer actors; requests carry token-id prompts (512
// tokens by default: the router hashes 32 blocks and walks its index) or
// text prompts (tokenized through the upstream's /tokenize, then cached).
// With --prompt-tokens 16 the routing work nearly vanishes, which shows the
// HTTP path's own cost beside nginx's. nginx runs as
// its own process (keep-alive to the upstream, no buffering).
//
// Open loop: `rate` requests/s spread over 8 keep-alive connections, each
// request's latency counted from when it was due (so a stall is not hidden
// by the requests it delays), after a second of quiet. Then closed loop: 8
// connections as fast as they go, for requests/s.
#include "actors/control.hpp"
#include "actors/registration.hpp"
#include "actors/router.hpp"
#include "actors/tokenizer.hpp"
#include "bench/bench.hpp"
#include "gateway/gateway.hpp"
#include "net/http_server.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>
#include <caf/all.hpp>
#include <fmt/format.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

namespace llmgw::bench {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

struct bench_sys_config : caf::actor_system_config {
  bench_sys_config() {
    register_message_types(*this);
    set("scheduler.max-threads", 2);
    set("logger.verbosity", caf::atom("quiet"));
    // As llmgw node sets it (apps/llmgw/node_command.cpp).
    set("work-stealing.moderate-poll-attempts", std::size_t{1});
    set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::milliseconds(100)});
  }
};

std::uint16_t pick_port() {
  asio::io_context io;
  tcp::acceptor a(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  return a.local_endpoint().port();
}

/// One keep-alive connection sending requests synchronously.
class connection {
public:
  connection(std::uint16_t port, std::string body)
    : socket_(io_), port_(port), body_(std::move(body)) {
    open();
    req_.method(http::verb::post);
    req_.target("/v1/completions");
    req_.version(11);
    req_.set(http::field::host, "127.0.0.1");
    req_.set(http::field::content_type, "application/json");
    req_.keep_alive(true);
    req_.body() = body_;
    req_.prepare_payload();
  }
  /// Sends one request; false if it failed or did not answer 200. A
  /// connection the server closed (nginx does after 1000 requests) is opened
  /// again, as clients do.
  bool send() {
    for (int attempt = 0; attempt < 2; ++attempt) {
      beast::error_code ec;
      http::write(socket_, req_, ec);
      http::response<http::string_body> res;
      if (!ec)
        http::read(socket_, buffer_, res, ec);
      if (!ec)
        return res.result_int() == 200;
      open();
    }
    return false;
  }

private:
  void open() {
    beast::error_code ignored;
    socket_.close(ignored);
    buffer_.clear();
    socket_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_));
    socket_.set_option(tcp::no_delay(true));
  }

  asio::io_context io_;
  tcp::socket socket_;
  std::uint16_t port_;
  std::string body_;
  http::request<http::string_body> req_;
  beast::flat_buffer buffer_;
};

struct load_result {
  std::vector<double> latencies; ///< seconds, from when each request was due
  std::size_t failed = 0;
  double seconds = 0;
};

/// `rate` requests/s (0: as fast as they go) over `connections` connections.
load_result run_load(std::uint16_t port, const std::string& body, double rate,
                     std::size_t connections, std::chrono::milliseconds duration) {
  load_result out;
  std::mutex mtx;
  std::vector<std::thread> threads;
  auto start = std::chrono::steady_clock::now() + 50ms;
  auto end = start + duration;
  for (std::size_t c = 0; c < connections; ++c)
    threads.emplace_back([&, c] {
      connection conn(port, body);
      conn.send(); // warm: connect, first-time paths
      std::vector<double> mine;
      std::size_t failed = 0;
      auto interval = rate > 0 ? std::chrono::duration<double>(connections / rate)
                               : std::chrono::duration<double>(0);
      auto due = start
                 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   interval * (static_cast<double>(c) / connections));
      while (due < end) {
        if (rate > 0)
          std::this_thread::sleep_until(due);
        auto from = rate > 0 ? due : std::chrono::steady_clock::now();
        if (!conn.send())
          ++failed;
        mine.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - from).count());
        due = rate > 0
                ? due + std::chrono::duration_cast<std::chrono::steady_clock::duration>(interval)
                : std::chrono::steady_clock::now();
      }
      std::lock_guard<std::mutex> g(mtx);
      out.latencies.insert(out.latencies.end(), mine.begin(), mine.end());
      out.failed += failed;
    });
  for (auto& t : threads)
    t.join();
  out.seconds = std::chrono::duration<double>(end - start).count();
  return out;
}

double pct(std::vector<double> xs, double p) {
  if (xs.empty())
    return 0;
  std::sort(xs.begin(), xs.end());
  return xs[std::min(xs.size() - 1, static_cast<std::size_t>(p * static_cast<double>(xs.size())))];
}

/// Nanoseconds on a CPU so far of a task (/proc/.../schedstat), 0 if gone.
std::uint64_t cpu_ns(const std::string& task_dir) {
  std::ifstream in(task_dir + "/schedstat");
  std::uint64_t ns = 0;
  in >> ns;
  return ns;
}

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

/// CPU time of this process's threads that proxy: the gateway's loops and
/// CAF's workers (the router, control and tokenizer actors run there).
std::uint64_t llmgw_cpu_ns() {
  std::uint64_t sum = 0;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    auto comm = first_line(t.path().string() + "/comm");
    if (comm == "llmgw-gateway" || comm.rfind("caf.", 0) == 0)
      sum += cpu_ns(t.path().string());
  }
  return sum;
}

/// CPU time of the processes whose parent is `parent` (nginx's workers).
std::uint64_t children_cpu_ns(pid_t parent) {
  std::uint64_t sum = 0;
  for (const auto& p : std::filesystem::directory_iterator("/proc")) {
    auto name = p.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    // /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces.
    auto stat = first_line(p.path().string() + "/stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos)
      continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent)
      sum += cpu_ns(p.path().string());
  }
  return sum;
}

/// Debian's nginx proxying to the upstream, in its own folder; 0 if it
/// could not start.
struct nginx_process {
  pid_t pid = 0;
  std::uint16_t port = 0;
  std::string dir;
  nginx_process(std::uint16_t upstream) {
    if (::access("/usr/sbin/nginx", X_OK) != 0)
      return;
    char tmpl[] = "/tmp/llmgw-bench-nginx-XXXXXX";
    dir = ::mkdtemp(tmpl);
    port = pick_port();
    std::ofstream(dir + "/nginx.conf") << fmt::format(
      R"(daemon off;
worker_processes 2;
pid {0}/nginx.pid;
error_log {0}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {0}/body;
  proxy_temp_path {0}/proxy;
  fastcgi_temp_path {0}/fastcgi;
  uwsgi_temp_path {0}/uwsgi;
  scgi_temp_path {0}/scgi;
  upstream engine {{ server 127.0.0.1:{1}; keepalive 32; }}
  server {{
    listen 127.0.0.1:{2};
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
)",
      dir, upstream, port);
    pid = ::fork();
    if (pid == 0) {
      ::execl("/usr/sbin/nginx", "nginx", "-c", (dir + "/nginx.conf").c_str(), "-p", dir.c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // Wait until it accepts connections.
    for (int i = 0; i < 200; ++i) {
      try {
        connection probe(port, "{}");
        return;
      } catch (const std::exception&) {
        std::this_thread::sleep_for(10ms);
      }
    }
    fmt::print("nginx did not start; see {}/error.log\n", dir);
    port = 0;
  }
  ~nginx_process() {
    if (pid > 0) {
      ::kill(pid, SIGQUIT);
      ::waitpid(pid, nullptr, 0);
      std::system(("rm -rf " + dir).c_str());
    }
  }
};

} // namespace

int run_gateway_bench(int rounds, double rate, const std::string& only, int prompt_tokens) {
  // The upstream: answers at once.
  const std::string answer =
    R"({"id":"cmpl-1","object":"text_completion","created":1,"model":"m",)"
    R"("choices":[{"index":0,"text":" ok","finish_reason":"length"}],)"
    R"("usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}})";
  http_server upstream("127.0.0.1", 0, 2, {}, [&](http_request&& req, http_responder respond) {
    if (req.target == "/v1/completions/render" || req.target == "/v1/chat/completions/render") {
      respond(http_reply{404, "application/json", R"({"detail":"Not Found"})", {}});
      return; // no render endpoints: the tokenizer asks /tokenize from then on
    }
    if (req.target == "/tokenize") {
      boost::json::array tokens;
      for (int i = 0; i < prompt_tokens; ++i)
        tokens.push_back(i);
      respond(http_reply{200,
                         "application/json",
                         boost::json::serialize(boost::json::object{{"tokens", tokens}}),
                         {}});
      return;
    }
    respond(http_reply{200, "application/json", answer, {}});
  });
  auto topo = std::make_shared<config::topology>();
  topo->seed = "0";
  topo->block_size = 16;
  topo->plaintext = true;
  config::node_spec n;
  n.name = "agent";
  n.roles.agent = true;
  config::engine_spec e;
  e.replica = "r0";
  e.model = "m";
  e.url = "http://127.0.0.1:" + std::to_string(upstream.port());
  e.kv_events = true;
  e.canary = false; // its engines do not answer completions here
  n.engines.push_back(e);
  topo->nodes.push_back(n);
  bench_sys_config cfg;
  caf::actor_system sys{cfg};
  auto plane = spawn_control_plane(sys, control_options{"control", topo, {}, {}, 64});
  gateway gw(sys, topo, "127.0.0.1", 0, plane);
  // The same with two threads (two loops), as nginx runs two workers here.
  auto topo2 = std::make_shared<config::topology>(*topo);
  topo2->gateway.threads = 2;
  gateway gw2(sys, topo2, "127.0.0.1", 0, plane);
  nginx_process nginx(upstream.port());

  std::string ids;
  for (int i = 0; i < prompt_tokens; ++i)
    ids += (i ? "," : "") + std::to_string(i);
  const std::string body_ids = R"({"model":"m","max_tokens":1,"prompt":[)" + ids + "]}";
  const std::string body_text =
    R"({"model":"m","max_tokens":1,"prompt":")" + std::string(4 * prompt_tokens, 'p') + R"("})";
  struct target {
    std::string name;
    std::uint16_t port;
    std::string body;
  };
  std::vector<target> targets = {{"upstream directly", upstream.port(), body_ids},
                                 {"llmgw (token-id prompt)", gw.port(), body_ids},
                                 {"llmgw (text prompt)", gw.port(), body_text},
                                 {"llmgw 2 threads (token-id prompt)", gw2.port(), body_ids}};
  if (nginx.port)
    targets.push_back({"nginx", nginx.port, body_ids});
  if (!only.empty())
    targets.erase(
      std::remove_if(targets.begin() + 1, targets.end(),
                     [&](const target& t) { return t.name.find(only) == std::string::npos; }),
      targets.end());
  std::map<std::string, std::vector<double>> p50s, p99s, rps;
  std::map<std::string, std::size_t> failures;
  // The proxy's own CPU time per request, in the open-loop run: what it
  // costs, apart from how the machine's two cores were shared out. At 1,000
  // requests/s each request wakes the proxy on its own; under the closed
  // loop's full load the wakes are shared by several requests.
  std::map<std::string, std::vector<double>> cpu_per_request, cpu_per_request_loaded;
  auto proxy_cpu_ns = [&](const target& t) -> std::uint64_t {
    if (t.name == "nginx")
      return children_cpu_ns(nginx.pid);
    return t.name.rfind("llmgw", 0) == 0 ? llmgw_cpu_ns() : 0;
  };
  for (int r = 0; r < rounds; ++r)
    for (const auto& t : targets) {
      // A second of quiet first: right after a target's full-load run, the
      // next open-loop run on the same gateway saw its p99 rise by 60-100
      // us for under 1.5 s, whichever prompt kind came second.
      std::this_thread::sleep_for(1000ms);
      auto cpu_before = proxy_cpu_ns(t);
      auto open = run_load(t.port, t.body, rate, 8, 1500ms);
      auto cpu_after = proxy_cpu_ns(t);
      if (!open.latencies.empty())
        cpu_per_request[t.name].push_back(static_cast<double>(cpu_after - cpu_before) * 1e-9
                                          / static_cast<double>(open.latencies.size()));
      p50s[t.name].push_back(pct(open.latencies, 0.50));
      p99s[t.name].push_back(pct(open.latencies, 0.99));
      cpu_before = proxy_cpu_ns(t);
      auto closed = run_load(t.port, t.body, 0, 8, 700ms);
      cpu_after = proxy_cpu_ns(t);
      rps[t.name].push_back(static_cast<double>(closed.latencies.size()) / closed.seconds);
      if (!closed.latencies.empty())
        cpu_per_request_loaded[t.name].push_back(static_cast<double>(cpu_after - cpu_before) * 1e-9
                                                 / static_cast<double>(closed.latencies.size()));
      failures[t.name] += open.failed + closed.failed;
    }
  fmt::print("# llmgw-bench gateway --rounds {} --rate {} --prompt-tokens {} (medians of "
             "per-round figures; open loop at {} req/s over 8 keep-alive connections, latency "
             "from when each request was due; closed loop over 8 connections for req/s)\n",
             rounds, rate, prompt_tokens, rate);
  // Differences and ratios per round (the targets ran side by side in it),
  // then their medians: steadier on a noisy machine than medians subtracted.
  auto per_round = [&](const std::vector<double>& a, const std::vector<double>& b, auto op) {
    std::vector<double> out;
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
      out.push_back(op(a[i], b[i]));
    return median(out);
  };
  auto minus = [](double x, double y) { return x - y; };
  auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
  const auto& base50 = p50s["upstream directly"];
  const auto& base99 = p99s["upstream directly"];
  for (const auto& t : targets) {
    report(t.name + ": p50 / p99 latency", median(p50s[t.name]) * 1e6, "µs",
           fmt::format("{:.0f}", median(p99s[t.name]) * 1e6));
    if (t.name != "upstream directly")
      report(t.name + ": added p50 / p99", per_round(p50s[t.name], base50, minus) * 1e6, "µs",
             fmt::format("{:.0f}", per_round(p99s[t.name], base99, minus) * 1e6));
    report(t.name + ": closed-loop requests/s", median(rps[t.name]), "req/s",
           failures[t.name] ? fmt::format("({} failed)", failures[t.name]) : "");
    if (t.name != "upstream directly")
      report(t.name + ": proxy CPU per request (open / closed loop)",
             median(cpu_per_request[t.name]) * 1e6, "µs",
             fmt::format("{:.1f}", median(cpu_per_request_loaded[t.name]) * 1e6));
  }
  if (nginx.port && !p50s["nginx"].empty())
    for (const auto& t : targets) {
      if (t.name.rfind("llmgw", 0) != 0)
        continue;
      std::vector<double> added50, added99, nginx50, nginx99;
      for (std::size_t i = 0; i < base50.size(); ++i) {
        added50.push_back(p50s[t.name][i] - base50[i]);
        added99.push_back(p99s[t.name][i] - base99[i]);
        nginx50.push_back(p50s["nginx"][i] - base50[i]);
        nginx99.push_back(p99s["nginx"][i] - base99[i]);
      }
      report(t.name + " against nginx: added p50 / p99 difference",
             per_round(added50, nginx50, minus) * 1e6, "µs",
             fmt::format("{:.0f}", per_round(added99, nginx99, minus) * 1e6));
      report(t.name + " against nginx: closed-loop requests/s ratio",
             per_round(rps[t.name], rps["nginx"], ratio), "x");
      report(t.name + " against nginx: proxy CPU per request ratio (open / closed loop)",
             per_round(cpu_per_request[t.name], cpu_per_request["nginx"], ratio), "x",
             fmt::format("{:.3f}", per_round(cpu_per_request_loaded[t.name],
                                             cpu_per_request_loaded["nginx"], ratio)));
    }
  if (!nginx.port)
    fmt::print("nginx: not measured (/usr/sbin/nginx missing or did not start)\n");
  else if (failures["nginx"] > 0) {
    std::ifstream log(nginx.dir + "/error.log");
    std::string line;
    for (int i = 0; i < 5 && std::getline(log, line); ++i)
      fmt::print("nginx error.log: {}\n", line);
  }
  gw.stop();
  gw2.stop();
  stop_control_plane(plane);
  return 0;
}

} // namespace llmgw::bench
