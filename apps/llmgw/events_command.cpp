// `llmgw events --bind tcp://127.0.0.1:PORT [--replay tcp://HOST:PORT] [--topic T]`
//
// Binds a SUB socket that vLLM's publisher connects to (start vLLM with
// --kv-events-config '{"endpoint": "tcp://127.0.0.1:PORT", ...}') and prints
// one JSON object per event per line. A jump in seq prints a "gap" line (or,
// with --replay, is filled from vLLM's replay buffer first); a step back
// prints a "restart" line; a payload that does not decode prints a
// "decode_error" line and counts as a gap. SIGINT/SIGTERM end it cleanly.
#include "apps/llmgw/commands.hpp"
#include "net/zmq_parts.hpp"
#include "wire/event_json.hpp"
#include "wire/kv_events.hpp"
#include "wire/zmq_message.hpp"

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

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
  std::string bind;
  std::string replay;
  std::string topic;
  int replay_timeout_ms = 1000;
};

void print_line(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void print_batch(std::uint64_t seq, std::string_view payload, bool replayed) {
  auto batch = wire::decode_batch(payload);
  if (!batch) {
    boost::json::object obj;
    obj["seq"] = seq;
    obj["type"] = "decode_error";
    obj["error"] = to_string(batch.err().code);
    obj["message"] = batch.err().message;
    print_line(boost::json::serialize(obj));
    return;
  }
  for (const auto& ev : batch->events) {
    auto line = wire::event_to_json(seq, *batch, ev);
    if (replayed) // keep the object valid: insert before the closing brace
      line.insert(line.size() - 1, ",\"replayed\":true");
    print_line(line);
  }
}

/// Asks the replay endpoint for [from, until) and prints what it returns; the
/// first seq not recovered (== until when all were).
std::uint64_t fill_by_replay(zmq::context_t& ctx, const events_options& opts, std::uint64_t from,
                             std::uint64_t until) {
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(opts.replay);
  auto start = wire::replay_request(from);
  std::array<zmq::const_buffer, 2> request = {zmq::const_buffer("", 0),
                                              zmq::const_buffer(start.data(), start.size())};
  if (!zmq::send_multipart(dealer, request))
    return from;
  auto next = from;
  std::vector<zmq::message_t> parts;
  while (!stop_requested.load()) {
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(opts.replay_timeout_ms)) == 0)
      break; // replay endpoint silent: give up on the rest
    if (!receive_now(dealer, parts))
      continue;
    auto reply = wire::split_replay_reply(views_of(parts));
    if (!reply) {
      fmt::print(stderr, "llmgw events: replay: {}\n", reply.err().message);
      break;
    }
    if (reply->end)
      break;
    if (reply->seq != next || reply->seq >= until)
      continue; // before what we asked for, or already seen live
    print_batch(reply->seq, reply->payload, true);
    ++next;
  }
  return next;
}

void print_gap(std::uint64_t expected, std::uint64_t got) {
  boost::json::object obj;
  obj["type"] = "gap";
  obj["expected"] = expected;
  obj["got"] = got;
  obj["lost"] = got - expected;
  print_line(boost::json::serialize(obj));
}

int run_events(events_options opts) {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::rcvhwm, 0);
  sub.set(zmq::sockopt::subscribe, opts.topic);
  auto endpoint = opts.bind;
  if (endpoint.size() > 2 && endpoint.compare(endpoint.size() - 2, 2, ":0") == 0)
    endpoint.replace(endpoint.size() - 1, 1, "*"); // port 0: let the kernel pick
  try {
    sub.bind(endpoint);
  } catch (const zmq::error_t& e) {
    fmt::print(stderr, "llmgw events: cannot bind {}: {}\n", opts.bind, e.what());
    return 1;
  }
  fmt::print(stderr, "llmgw events: listening on {}\n", sub.get(zmq::sockopt::last_endpoint));

  wire::seq_tracker tracker;
  std::vector<zmq::message_t> parts;
  while (!stop_requested.load()) {
    zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0)
        continue;
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR)
        continue;
      throw;
    }
    while (receive_now(sub, parts)) {
      auto msg = wire::split_live_message(views_of(parts));
      if (!msg) {
        fmt::print(stderr, "llmgw events: {}\n", msg.err().message);
        continue;
      }
      auto expected = tracker.expected();
      switch (tracker.observe(msg->seq)) {
      case wire::seq_verdict::first:
      case wire::seq_verdict::next:
        break;
      case wire::seq_verdict::gap: {
        auto recovered = *expected;
        if (!opts.replay.empty())
          recovered = fill_by_replay(ctx, opts, *expected, msg->seq);
        if (recovered < msg->seq)
          print_gap(recovered, msg->seq);
        break;
      }
      case wire::seq_verdict::restart: {
        boost::json::object obj;
        obj["type"] = "restart";
        obj["expected"] = *expected;
        obj["got"] = msg->seq;
        print_line(boost::json::serialize(obj));
        break;
      }
      }
      print_batch(msg->seq, msg->payload, false);
    }
  }
  fmt::print(stderr, "llmgw events: stopped\n");
  return 0;
}

} // namespace

void add_events_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<events_options>();
  auto* cmd = app.add_subcommand("events", "Print a vLLM engine's KV cache events as JSON lines");
  cmd
    ->add_option("--bind", opts->bind,
                 "SUB endpoint to bind, e.g. tcp://127.0.0.1:5557 (port 0: any)")
    ->required();
  cmd->add_option("--replay", opts->replay, "the engine's replay endpoint, to fill gaps");
  cmd->add_option("--topic", opts->topic, "topic to subscribe to (default: all)");
  cmd
    ->add_option("--replay-timeout-ms", opts->replay_timeout_ms,
                 "how long to wait for a replay reply")
    ->check(CLI::Range(1, 60000))
    ->capture_default_str();
  cmd->callback([opts, &exit_code] { exit_code = run_events(*opts); });
}

} // namespace llmgw::apps
