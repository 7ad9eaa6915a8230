// `llmgw events --endpoint tcp://127.0.0.1:PORT [--replay tcp://HOST:PORT] [--topic T]`
// `llmgw events --connect tcp://HOST:PORT ...` (an engine that binds, as vLLM
// does at its default endpoint tcp://*:5557)
//
// Follows an engine's KV event stream as an agent does (net/kv_event_socket
// and kv::event_stream: the same sockets, gap, replay and restart handling)
// and prints one JSON object per event per line. A tcp endpoint is bound
// (vLLM's publisher connects: start vLLM with --kv-events-config
// '{"endpoint": "tcp://127.0.0.1:PORT", ...}'); an ipc:// endpoint is
// connected to. A gap that replay cannot fill prints a "gap" line, a step
// back a "restart" line, a payload that does not decode a "decode_error"
// line, events of types llmgw does not know a "skipped" line; replayed
// events carry "replayed": true. Attached to an engine already running, it
// first prints, with --replay, what the engine's buffer still holds, and a
// "gap" line for the history before it (or for all of it, without
// --replay). SIGINT/SIGTERM end it cleanly.
#include "apps/llmgw/commands.hpp"
#include "config/topology.hpp"
#include "net/kv_event_socket.hpp"
#include "wire/address.hpp"
#include "wire/event_json.hpp"
#include "wire/kv_events.hpp"

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>

namespace llmgw::apps {

namespace {

std::atomic<bool> stop_requested{false};

extern "C" void on_stop_signal(int) {
  stop_requested.store(true);
}

struct events_options {
  std::string endpoint;
  std::string connect;
  std::string replay;
  std::string topic;
  std::string engine = "vllm"; ///< whose stream: vllm, sglang, trtllm
  int replay_timeout_ms = 1000;
};

void print_line(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

/// One line per event of an applied batch, and one for the events of
/// types llmgw does not know (skipped).
void print_batch(const kv::stream_action& a) {
  if (a.batch.skipped > 0) {
    boost::json::object obj;
    obj["seq"] = a.seq;
    obj["type"] = "skipped";
    obj["count"] = a.batch.skipped;
    boost::json::array types;
    for (const auto& t : a.batch.skipped_types)
      types.emplace_back(t);
    obj["event_types"] = std::move(types);
    print_line(boost::json::serialize(obj));
  }
  for (const auto& ev : a.batch.events) {
    auto line = wire::event_to_json(a.seq, a.batch, ev);
    if (a.replayed) // keep the object valid: insert before the closing brace
      line.insert(line.size() - 1, ",\"replayed\":true");
    print_line(line);
  }
}

/// The line of a reset: a gap not filled, a restart, or a bad payload.
void print_reset(const kv::stream_action& a) {
  boost::json::object obj;
  if (a.decode_failure) {
    obj["seq"] = a.seq;
    obj["type"] = "decode_error";
    obj["error"] = to_string(a.decode_failure->code);
    obj["message"] = a.decode_failure->message;
  } else {
    obj["type"] = kv::to_string(a.reason);
    obj["expected"] = a.expected;
    obj["got"] = a.seq;
    if (a.reason == kv::reset_reason::gap)
      obj["lost"] = a.seq - a.expected;
  }
  print_line(boost::json::serialize(obj));
}

int run_events(const events_options& opts) {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  kv_event_socket_options so;
  so.endpoint = opts.connect.empty() ? opts.endpoint : opts.connect;
  so.engine_binds = !opts.connect.empty();
  so.topic = opts.topic;
  so.replay = opts.replay;
  so.queue_messages = 100000; // an operator's tool: vLLM's own high-water mark
  kv_event_socket socket(so);
  if (!socket.error().empty()) {
    fmt::print(stderr, "llmgw events: {}\n", socket.error());
    return 1;
  }
  fmt::print(stderr, "llmgw events: {} {}\n", so.engine_binds ? "connected to" : "listening on",
             socket.endpoint());

  kv::event_stream::config cfg;
  cfg.replay_available = socket.has_replay();
  cfg.replay_timeout = std::chrono::milliseconds(opts.replay_timeout_ms);
  cfg.dialect = config::dialect_of(opts.engine == "sglang"   ? config::engine_kind::sglang
                                   : opts.engine == "trtllm" ? config::engine_kind::trtllm
                                                             : config::engine_kind::vllm);
  kv::event_stream stream(cfg);
  kv_event_socket::handlers handlers;
  handlers.act = [](kv::stream_action& a) {
    if (a.what == kv::stream_action::kind::apply)
      print_batch(a);
    else if (a.what == kv::stream_action::kind::reset)
      print_reset(a);
  };
  handlers.bad_frame = [](const char* which, const error& e) {
    fmt::print(stderr, "llmgw events: {}: {}\n", which, e.message);
  };
  while (!stop_requested.load()) {
    socket.wait(std::chrono::milliseconds(100));
    socket.pump(stream, std::chrono::steady_clock::now(), handlers);
  }
  fmt::print(stderr, "llmgw events: stopped\n");
  return 0;
}

} // namespace

void add_events_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<events_options>();
  auto* cmd = app.add_subcommand("events", "Print a vLLM engine's KV cache events as JSON lines");
  auto* bind = cmd->add_option("--endpoint,--bind", opts->endpoint,
                               "the engine's events endpoint: a tcp address to bind (port 0: "
                               "any), or an ipc:// path to connect to");
  auto* connect = cmd->add_option("--connect", opts->connect,
                                  "tcp://HOST:PORT of an engine whose publisher binds (vLLM's "
                                  "default endpoint tcp://*:5557)");
  bind->excludes(connect);
  connect->excludes(bind);

  cmd->add_option("--replay", opts->replay, "the engine's replay endpoint, to fill gaps");
  cmd->add_option("--topic", opts->topic, "topic to subscribe to (default: all)");
  cmd->add_option("--engine", opts->engine, "whose stream it is: vllm, sglang or trtllm")
    ->check(CLI::IsMember({"vllm", "sglang", "trtllm"}))
    ->capture_default_str();
  cmd
    ->add_option("--replay-timeout-ms", opts->replay_timeout_ms,
                 "how long to wait for the replay endpoint")
    ->check(CLI::Range(1, 60000))
    ->capture_default_str();
  cmd->callback([opts, &exit_code] {
    if (opts->endpoint.empty() == opts->connect.empty()) {
      fmt::print(stderr, "llmgw events: give --endpoint (to bind) or --connect (to an engine "
                         "that binds)\n");
      exit_code = 2;
      return;
    }
    auto at = wire::parse_tcp_endpoint(opts->connect);
    if (!opts->connect.empty() && (!at || wire::is_wildcard(at->host))) {
      fmt::print(stderr,
                 "llmgw events: --connect '{}' must be tcp://HOST:PORT (the engine's address; "
                 "'*' is where it binds, not where to reach it)\n",
                 opts->connect);
      exit_code = 2;
      return;
    }
    if (at)
      opts->connect = wire::tcp_endpoint(*at); // as ZeroMQ reads it
    exit_code = run_events(*opts);
  });
}

} // namespace llmgw::apps
