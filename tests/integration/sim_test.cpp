// llmgw-sim as a process, seen from outside as llmgw sees vLLM: the hashes it
// publishes are llmgw's hashes of its own /tokenize output, its replay
// endpoint answers, data-parallel ranks publish on port + rank, and a
// repeated prompt reports cached tokens.
#include "net/http_client.hpp"
#include "net/zmq_parts.hpp"
#include "tests/integration/test_cluster.hpp"
#include "tests/support/child_process.hpp"
#include "wire/block_hash.hpp"
#include "wire/kv_events.hpp"
#include "wire/zmq_message.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <csignal>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

using namespace std::chrono_literals;
using namespace llmgw;
namespace json = boost::json;

namespace {

/// A subscriber bound where the sim publishes (vLLM's PUB connects to it).
/// It receives on its own thread all the time: a bound SUB attaches a new
/// peer (and sends it the subscription) only when its thread calls into the
/// socket, so an idle one would miss what is published meanwhile.
class events_sink {
public:
  /// Bound on `port` (0: any); ok() says whether binding worked.
  explicit events_sink(std::uint16_t port = 0) : sub_(ctx_, zmq::socket_type::sub) {
    sub_.set(zmq::sockopt::subscribe, "");
    sub_.set(zmq::sockopt::linger, 0);
    try {
      sub_.bind("tcp://127.0.0.1:" + (port ? std::to_string(port) : std::string("*")));
      endpoint_ = sub_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t&) {
      return;
    }
    thread_ = std::thread([this] {
      while (!stop_) {
        zmq::pollitem_t item{sub_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(10)) == 0)
          continue;
        std::vector<zmq::message_t> parts;
        while (receive_now(sub_, parts)) {
          auto msg = wire::split_live_message(views_of(parts));
          if (!msg)
            continue;
          auto b = wire::decode_batch(msg->payload);
          std::lock_guard<std::mutex> g(mtx_);
          seqs_.push_back(msg->seq);
          if (b)
            batches_.push_back(std::move(*b));
          else
            ++bad_;
        }
      }
    });
  }
  ~events_sink() {
    stop_ = true;
    if (thread_.joinable())
      thread_.join();
  }
  bool ok() const { return !endpoint_.empty(); }
  const std::string& endpoint() const { return endpoint_; }
  std::uint16_t port() const {
    return static_cast<std::uint16_t>(std::stoi(endpoint_.substr(endpoint_.rfind(':') + 1)));
  }
  /// What arrived since the last call, after waiting `wait` for stragglers.
  std::vector<wire::event_batch> drain(std::chrono::milliseconds wait) {
    std::this_thread::sleep_for(wait);
    std::lock_guard<std::mutex> g(mtx_);
    EXPECT_EQ(bad_, 0u) << "every payload decodes";
    return std::exchange(batches_, {});
  }
  std::vector<std::uint64_t> seqs() {
    std::lock_guard<std::mutex> g(mtx_);
    return seqs_;
  }

private:
  zmq::context_t ctx_;
  zmq::socket_t sub_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::mutex mtx_;
  std::vector<wire::event_batch> batches_;
  std::vector<std::uint64_t> seqs_;
  std::size_t bad_ = 0;
  std::thread thread_;
};

struct sim_process {
  std::uint16_t port = test::free_port();
  std::unique_ptr<test::child_process> proc;
  http_client http;

  sim_process(const std::string& events_endpoint, const std::string& replay,
              std::vector<std::string> extra = {}) {
    json::object cfg{
      {"enable_kv_cache_events", true}, {"publisher", "zmq"}, {"endpoint", events_endpoint}};
    if (!replay.empty())
      cfg["replay_endpoint"] = replay;
    std::vector<std::string> argv = {"/usr/bin/env",
                                     "PYTHONHASHSEED=0",
                                     LLMGW_SIM,
                                     "serve",
                                     "m",
                                     "--port",
                                     std::to_string(port),
                                     "--enable-prompt-tokens-details",
                                     "--sim-step-ms",
                                     "0.5",
                                     "--prefix-caching-hash-algo",
                                     "sha256_cbor",
                                     "--kv-events-config",
                                     json::serialize(cfg)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc = std::make_unique<test::child_process>(argv);
    EXPECT_TRUE(test::test_cluster::eventually([&] { return get("/health").status == 200; }, 10s));
  }
  ~sim_process() {
    proc->signal(SIGTERM);
    EXPECT_EQ(proc->wait(10s), std::optional<int>(0)) << "SIGTERM stops the sim cleanly";
  }
  http_response request(const std::string& method, const std::string& target,
                        const std::string& body,
                        std::vector<std::pair<std::string, std::string>> headers = {}) {
    std::promise<http_response> p;
    http_response out;
    std::mutex mtx;
    http.call(method, "http://127.0.0.1:" + std::to_string(port), target, body, std::move(headers),
              1s, 10s,
              {[&](int s, std::vector<std::pair<std::string, std::string>>) {
                 std::lock_guard<std::mutex> g(mtx);
                 out.status = s;
               },
               [&](std::string d) {
                 std::lock_guard<std::mutex> g(mtx);
                 out.body += d;
               },
               [&](const http_error& e) {
                 // Copied under the lock, handed over after it: once the
                 // promise is set, this function returns and `mtx` is gone.
                 http_response done;
                 {
                   std::lock_guard<std::mutex> g(mtx);
                   out.error = e.message;
                   out.failure = e.kind;
                   done = out;
                 }
                 p.set_value(std::move(done));
               }});
    return p.get_future().get();
  }
  http_response get(const std::string& target) { return request("GET", target, ""); }
};

std::vector<std::uint32_t> tokens_of(const json::value& tokenize_answer) {
  std::vector<std::uint32_t> out;
  for (const auto& t : tokenize_answer.at("tokens").as_array())
    out.push_back(static_cast<std::uint32_t>(t.as_int64()));
  return out;
}

} // namespace

TEST(llmgw_sim, publishes_the_hashes_llmgw_computes_from_its_tokenize) {
  events_sink sink;
  sim_process sim(sink.endpoint(), "");
  std::this_thread::sleep_for(200ms); // the PUB connects: a slow joiner would miss the first batch
  std::string prompt(300, 'x');
  for (std::size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<char>('a' + i % 26);
  for (const char* salt : {"", "tenant-1"}) {
    json::object tok_body{{"model", "m"}, {"prompt", prompt}, {"add_special_tokens", true}};
    auto tok = sim.request("POST", "/tokenize", json::serialize(tok_body));
    ASSERT_EQ(tok.status, 200) << tok.body;
    auto tokens = tokens_of(json::parse(tok.body));
    json::object body{{"model", "m"}, {"prompt", prompt}, {"max_tokens", 1}};
    if (*salt)
      body["cache_salt"] = salt;
    auto r = sim.request("POST", "/v1/completions", json::serialize(body));
    ASSERT_EQ(r.status, 200) << r.body;
    auto batches = sink.drain(300ms);
    ASSERT_EQ(batches.size(), 1u);
    const auto& ev = batches[0].events.at(0);
    wire::block_hasher h("0", 16);
    wire::extra_key_recipe extras;
    if (*salt)
      extras.cache_salt = salt;
    auto want = h.hash(tokens, extras);
    ASSERT_EQ(ev.block_hashes.size(), want.size());
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(ev.block_hashes[i].key, want[i].key) << "block " << i << " salt '" << salt << "'";
  }
  EXPECT_EQ(sink.seqs(), (std::vector<std::uint64_t>{0, 1})) << "seq from 0, +1 per batch";
}

TEST(llmgw_sim, a_repeated_prompt_reports_cached_tokens_and_replay_answers) {
  events_sink sink;
  auto replay_port = test::free_port();
  auto replay = "tcp://127.0.0.1:" + std::to_string(replay_port);
  sim_process sim(sink.endpoint(), replay);
  std::this_thread::sleep_for(200ms);
  json::object body{{"model", "m"}, {"prompt", std::string(200, 'q')}, {"max_tokens", 2}};
  auto first = json::parse(sim.request("POST", "/v1/completions", json::serialize(body)).body);
  auto second = json::parse(sim.request("POST", "/v1/completions", json::serialize(body)).body);
  EXPECT_EQ(first.at("usage").at("prompt_tokens_details").at("cached_tokens"), 0);
  auto prompt_tokens = second.at("usage").at("prompt_tokens").as_int64();
  EXPECT_EQ(second.at("usage").at("prompt_tokens_details").at("cached_tokens"),
            (prompt_tokens - 1) / 16 * 16)
    << "every full block but one ending at the last prompt token";
  auto live = sink.drain(300ms);
  ASSERT_FALSE(live.empty());
  // vLLM's replay: a DEALER asks from seq 0 and gets every batch again.
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 2000);
  dealer.connect(replay);
  auto start = wire::replay_request(0);
  std::array<zmq::const_buffer, 2> ask = {zmq::buffer("", 0), zmq::buffer(start)};
  zmq::send_multipart(dealer, ask);
  std::size_t replayed = 0;
  for (;;) {
    std::vector<zmq::message_t> parts;
    ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(parts))) << "the replay answers";
    auto reply = wire::split_replay_reply(views_of(parts));
    ASSERT_TRUE(reply) << reply.err().message;
    if (reply->end)
      break;
    ++replayed;
  }
  EXPECT_EQ(replayed, live.size());
}

TEST(llmgw_sim, data_parallel_ranks_publish_on_port_plus_rank) {
  // Rank r publishes on the configured port + r: two sinks on consecutive ports.
  std::unique_ptr<events_sink> rank0, rank1;
  for (int attempt = 0; attempt < 50 && !(rank1 && rank1->ok()); ++attempt) {
    rank0 = std::make_unique<events_sink>();
    rank1 = std::make_unique<events_sink>(static_cast<std::uint16_t>(rank0->port() + 1));
  }
  ASSERT_TRUE(rank1 && rank1->ok()) << "no two consecutive free ports";
  sim_process sim(rank0->endpoint(), "", {"--data-parallel-size", "2"});
  std::this_thread::sleep_for(200ms);
  json::object body{{"model", "m"}, {"prompt", std::string(100, 'r')}, {"max_tokens", 1}};
  auto r =
    sim.request("POST", "/v1/completions", json::serialize(body), {{"X-data-parallel-rank", "1"}});
  ASSERT_EQ(r.status, 200);
  EXPECT_TRUE(rank0->drain(300ms).empty()) << "the header chose rank 1";
  auto on1 = rank1->drain(300ms);
  ASSERT_EQ(on1.size(), 1u);
  EXPECT_EQ(on1[0].data_parallel_rank, std::optional<std::int64_t>(1));
}

TEST(llmgw_sim, a_full_engine_queues_and_says_so_in_vllms_metrics) {
  events_sink sink;
  // One request at a time: the second waits for the first's 200 tokens.
  sim_process sim(sink.endpoint(), "", {"--max-num-seqs", "1"});
  json::object body{{"model", "m"}, {"prompt", std::string(100, 'w')}, {"max_tokens", 200}};
  auto one = std::async(std::launch::async, [&] {
    return sim.request("POST", "/v1/completions", json::serialize(body));
  });
  auto two = std::async(std::launch::async, [&] {
    return sim.request("POST", "/v1/completions", json::serialize(body));
  });
  EXPECT_EQ(one.get().status, 200);
  EXPECT_EQ(two.get().status, 200);
  auto m = sim.get("/metrics").body;
  EXPECT_NE(m.find("vllm:request_success_total{model_name=\"m\",engine=\"0\"} 2"),
            std::string::npos)
    << m;
  EXPECT_NE(m.find("vllm:time_to_first_token_seconds_count{model_name=\"m\",engine=\"0\"} 2"),
            std::string::npos)
    << m;
  EXPECT_NE(m.find("vllm:num_preemptions_total{model_name=\"m\",engine=\"0\"} 0"),
            std::string::npos)
    << m;
  // The second request's first token came after the first's 200 steps of
  // 0.5 ms at least: its time to first token is above 20 ms unless it
  // arrived 80 ms late.
  EXPECT_EQ(
    m.find("vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"0.02\"} 2"),
    std::string::npos)
    << m;
  EXPECT_NE(m.find("vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 0"), std::string::npos)
    << m;
}

// vLLM's api_server sends a stream's head before the engine schedules the
// request: a gateway sees 200 at once, and the first token only after the
// queue. The sim does the same (the gateway's hold of a stream's head until
// its first byte is tested against that).
TEST(llmgw_sim, a_streams_head_goes_out_before_it_is_scheduled) {
  events_sink sink;
  sim_process sim(sink.endpoint(), "", {"--max-num-seqs", "1"});
  json::object busy{{"model", "m"}, {"prompt", std::string(100, 'w')}, {"max_tokens", 2000}};
  auto one = std::async(std::launch::async, [&] {
    return sim.request("POST", "/v1/completions", json::serialize(busy));
  });
  ASSERT_TRUE(test::test_cluster::eventually(
    [&] {
      auto m = sim.get("/metrics").body;
      return m.find("vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 1")
             != std::string::npos;
    },
    10s))
    << "the first request runs, and holds the only seat";
  std::promise<std::string> head; // what had arrived of the stream's body then
  std::mutex mtx;
  std::string body;
  std::promise<void> done;
  json::object streamed{{"model", "m"}, {"prompt", "x"}, {"max_tokens", 2}, {"stream", true}};
  sim.http.call("POST", "http://127.0.0.1:" + std::to_string(sim.port), "/v1/completions",
                json::serialize(streamed), {}, 1s, 30s,
                {[&](int, std::vector<std::pair<std::string, std::string>>) {
                   std::lock_guard<std::mutex> g(mtx);
                   head.set_value(body);
                 },
                 [&](std::string d) {
                   std::lock_guard<std::mutex> g(mtx);
                   body += d;
                 },
                 [&](const http_error&) { done.set_value(); }});
  auto h = head.get_future();
  ASSERT_EQ(h.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(h.get(), "") << "no event before the head";
  EXPECT_EQ(one.wait_for(0s), std::future_status::timeout)
    << "the head came while the stream still waited for the seat";
  EXPECT_EQ(one.get().status, 200);
  ASSERT_EQ(done.get_future().wait_for(20s), std::future_status::ready);
  std::lock_guard<std::mutex> g(mtx);
  EXPECT_NE(body.find("data: [DONE]"), std::string::npos) << body;
}
