// `llmgw hash` and `llmgw events` as an operator runs them: real processes,
// fed with what vLLM's own publisher produced (golden/vllm-captures/).
#include "tests/integration/replay_service.hpp"
#include "tests/support/captures.hpp"
#include "tests/support/child_process.hpp"
#include "wire/kv_events.hpp"
#include "wire/zmq_message.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <csignal>
#include <map>
#include <thread>

using namespace std::chrono_literals;
namespace json = boost::json;
using llmgw::test::child_process;

namespace {

struct capture_frame {
  std::string topic;
  std::uint64_t seq;
  std::string payload;
};

/// A capture's frames: vLLM's by name, or any recording by its path.
std::vector<capture_frame> load_frames(const std::string& name) {
  auto doc =
    llmgw::test::read_json(name.find('/') == std::string::npos ? llmgw::test::capture_path(name)
                                                               : llmgw::test::source_path(name));
  std::vector<capture_frame> out;
  for (const auto& f : doc.at("frames").as_array())
    out.push_back({llmgw::test::from_hex(json::value_to<std::string>(f.at("topic_hex"))),
                   static_cast<std::uint64_t>(f.at("seq").as_int64()),
                   llmgw::test::from_hex(json::value_to<std::string>(f.at("payload_hex")))});
  return out;
}

std::uint64_t u64(const json::value& v) {
  return json::value_to<std::uint64_t>(v);
}

std::size_t events_in(const capture_frame& f) {
  return llmgw::wire::decode_batch(f.payload)->events.size();
}

/// The endpoint `llmgw events` reports on stderr once it has bound.
std::string listening_endpoint(child_process& proc) {
  auto line = proc.read_stderr_line(10s);
  EXPECT_TRUE(line) << "llmgw events printed nothing on stderr";
  if (!line)
    return {};
  auto at = line->find("tcp://");
  EXPECT_NE(at, std::string::npos) << *line;
  return at == std::string::npos ? std::string{} : line->substr(at);
}

/// A publisher like vLLM's: connects to the subscriber. XPUB, so the test can
/// wait for the subscription instead of sleeping.
class test_publisher {
public:
  explicit test_publisher(const std::string& endpoint) : socket_(ctx_, zmq::socket_type::xpub) {
    socket_.set(zmq::sockopt::linger, 1000);
    socket_.connect(endpoint);
    zmq::message_t sub;
    socket_.set(zmq::sockopt::rcvtimeo, 10000);
    auto got = socket_.recv(sub);
    EXPECT_TRUE(got) << "no subscription arrived";
  }

  void send(const capture_frame& f, std::uint64_t seq) {
    auto seq_bytes = llmgw::wire::encode_seq(seq);
    std::array<zmq::const_buffer, 3> parts = {zmq::buffer(f.topic), zmq::buffer(seq_bytes),
                                              zmq::buffer(f.payload)};
    zmq::send_multipart(socket_, parts);
  }

private:
  zmq::context_t ctx_;
  zmq::socket_t socket_;
};

std::vector<json::object> read_json_lines(child_process& proc, std::size_t count) {
  std::vector<json::object> out;
  while (out.size() < count) {
    auto line = proc.read_stdout_line(10s);
    if (!line)
      break;
    boost::system::error_code ec;
    auto v = json::parse(*line, ec);
    EXPECT_FALSE(ec) << "not JSON: " << *line;
    if (!ec && v.is_object())
      out.push_back(v.as_object());
  }
  return out;
}

} // namespace

TEST(llmgw_hash, prints_the_same_chain_as_vllm) {
  auto doc = llmgw::test::read_json(llmgw::test::capture_path("S3_lora_salt.map.int.json"));
  std::size_t requests = 0;
  for (const auto& r : doc.at("requests").as_array()) {
    const auto& req = r.as_object();
    std::vector<std::string> argv = {LLMGW_BINARY, "hash", "--seed", "0", "--block-size", "16"};
    if (!req.at("lora_name").is_null())
      argv.insert(argv.end(), {"--lora", json::value_to<std::string>(req.at("lora_name"))});
    if (!req.at("cache_salt").is_null())
      argv.insert(argv.end(), {"--salt", json::value_to<std::string>(req.at("cache_salt"))});
    child_process proc(argv);
    proc.write_stdin_and_close(json::serialize(req.at("tokens")));
    auto out = proc.read_stdout_all(10s);
    ASSERT_EQ(proc.wait(10s), 0);
    std::string want;
    const auto& keys = req.at("block_hashes_u64").as_array();
    const auto& hexes = req.at("block_hashes_hex").as_array();
    for (std::size_t i = 0; i < keys.size(); ++i)
      want += std::to_string(i) + " " + std::to_string(json::value_to<std::uint64_t>(keys[i])) + " "
              + json::value_to<std::string>(hexes[i]) + "\n";
    EXPECT_EQ(out, want) << "request " << req.at("id");
    ++requests;
  }
  EXPECT_EQ(requests, 9u);
}

TEST(llmgw_hash, rejects_bad_input_with_the_position) {
  child_process proc({LLMGW_BINARY, "hash", "--seed", "0"});
  proc.write_stdin_and_close("[1, 2, -3]");
  auto err = proc.read_stderr_line(10s);
  EXPECT_EQ(proc.wait(10s), 2);
  ASSERT_TRUE(err);
  EXPECT_NE(err->find("element 2 is -3"), std::string::npos) << *err;

  child_process not_json({LLMGW_BINARY, "hash", "--seed", "0"});
  not_json.write_stdin_and_close("[1, 2");
  EXPECT_EQ(not_json.wait(10s), 2);
}

TEST(llmgw_events, prints_events_gaps_and_restarts) {
  auto frames = load_frames("S1_basic.map.int.json");
  child_process proc(
    {LLMGW_BINARY, "events", "--bind", "tcp://127.0.0.1:0", "--topic", "kv-events"});
  auto endpoint = listening_endpoint(proc);
  ASSERT_FALSE(endpoint.empty());
  test_publisher pub(endpoint);
  // seq 0..9 with seq 3 lost, then a restarted publisher sending 0 and 1.
  std::size_t expected_lines = 0;
  for (const auto& f : frames) {
    if (f.seq == 3)
      continue;
    pub.send(f, f.seq);
    expected_lines += events_in(f);
  }
  pub.send(frames[0], 0);
  pub.send(frames[1], 1);
  expected_lines += events_in(frames[0]) + events_in(frames[1]) + 2; // + gap + restart lines

  auto lines = read_json_lines(proc, expected_lines);
  ASSERT_EQ(lines.size(), expected_lines);
  std::map<std::string, int> types;
  for (const auto& l : lines)
    ++types[json::value_to<std::string>(l.at("type"))];
  EXPECT_EQ(types["gap"], 1);
  EXPECT_EQ(types["restart"], 1);
  for (const auto& l : lines) {
    auto type = json::value_to<std::string>(l.at("type"));
    if (type == "gap") {
      EXPECT_EQ(u64(l.at("expected")), 3u);
      EXPECT_EQ(u64(l.at("got")), 4u);
      EXPECT_EQ(u64(l.at("lost")), 1u);
    } else if (type == "restart") {
      EXPECT_EQ(u64(l.at("expected")), 10u);
      EXPECT_EQ(u64(l.at("got")), 0u);
    } else {
      EXPECT_NE(u64(l.at("seq")), 3u) << "seq 3 was never sent";
      EXPECT_EQ(l.at("dp_rank").to_number<int>(), 0);
    }
  }
  // The first event is S1's first store, field for field.
  auto first = llmgw::wire::decode_batch(frames[0].payload)->events[0];
  EXPECT_EQ(json::value_to<std::string>(lines[0].at("type")), "BlockStored");
  const auto& hashes = lines[0].at("block_hashes").as_array();
  ASSERT_EQ(hashes.size(), first.block_hashes.size());
  for (std::size_t i = 0; i < hashes.size(); ++i)
    EXPECT_EQ(json::value_to<std::uint64_t>(hashes[i]), first.block_hashes[i].key);
  EXPECT_EQ(lines[0].at("token_ids").as_array().size(), first.token_ids.size());
  EXPECT_EQ(json::value_to<std::string>(lines[0].at("medium")), "GPU");
  EXPECT_TRUE(lines[0].at("parent_block_hash").is_null());

  proc.signal(SIGTERM);
  EXPECT_EQ(proc.wait(5s), 0) << "SIGTERM ends llmgw events cleanly";
}

// vLLM at its default endpoint binds; `llmgw events --connect` goes to it.
TEST(llmgw_events, connects_to_an_engine_that_binds) {
  auto frames = load_frames("S1_basic.map.int.json");
  zmq::context_t ctx;
  zmq::socket_t pub(ctx, zmq::socket_type::xpub);
  pub.set(zmq::sockopt::linger, 1000);
  pub.set(zmq::sockopt::rcvtimeo, 10000);
  pub.bind("tcp://127.0.0.1:*");
  std::string endpoint = pub.get(zmq::sockopt::last_endpoint);
  child_process proc({LLMGW_BINARY, "events", "--connect", endpoint});
  auto said = proc.read_stderr_line(10s);
  ASSERT_TRUE(said);
  EXPECT_NE(said->find("connected to " + endpoint), std::string::npos) << *said;
  zmq::message_t sub;
  ASSERT_TRUE(pub.recv(sub)) << "llmgw events subscribed";
  auto seq = llmgw::wire::encode_seq(0);
  std::array<zmq::const_buffer, 3> parts = {zmq::buffer(frames[0].topic), zmq::buffer(seq),
                                            zmq::buffer(frames[0].payload)};
  zmq::send_multipart(pub, parts);
  auto lines = read_json_lines(proc, events_in(frames[0]));
  ASSERT_EQ(lines.size(), events_in(frames[0]));
  EXPECT_EQ(json::value_to<std::string>(lines[0].at("type")), "BlockStored");
  proc.signal(SIGTERM);
  EXPECT_EQ(proc.wait(5s), 0);

  child_process wildcard({LLMGW_BINARY, "events", "--connect", "tcp://*:5557"});
  auto err = wildcard.read_stderr_all(10s);
  EXPECT_EQ(wildcard.wait(10s), 2);
  EXPECT_NE(err.find("'*' is where it binds, not where to reach it"), std::string::npos) << err;
}

// An SGLang engine's stream, decoded as SGLang's: its signed page ids
// printed as the keys llmgw knows them by.
TEST(llmgw_events, reads_an_sglang_engines_stream) {
  auto frames = load_frames("golden/sglang-captures/G1_basic.json");
  zmq::context_t ctx;
  zmq::socket_t pub(ctx, zmq::socket_type::xpub);
  pub.set(zmq::sockopt::linger, 1000);
  pub.set(zmq::sockopt::rcvtimeo, 10000);
  pub.bind("tcp://127.0.0.1:*");
  std::string endpoint = pub.get(zmq::sockopt::last_endpoint);
  child_process proc({LLMGW_BINARY, "events", "--connect", endpoint, "--engine", "sglang"});
  ASSERT_TRUE(proc.read_stderr_line(10s));
  zmq::message_t sub;
  ASSERT_TRUE(pub.recv(sub)) << "llmgw events subscribed";
  auto seq = llmgw::wire::encode_seq(0);
  std::array<zmq::const_buffer, 3> parts = {zmq::buffer(frames[1].topic), zmq::buffer(seq),
                                            zmq::buffer(frames[1].payload)};
  zmq::send_multipart(pub, parts);
  auto want = llmgw::wire::decode_batch(frames[1].payload, {}, llmgw::wire::event_dialect::sglang);
  ASSERT_TRUE(want) << want.err().message;
  auto lines = read_json_lines(proc, want->events.size());
  ASSERT_EQ(lines.size(), want->events.size());
  EXPECT_EQ(json::value_to<std::string>(lines[0].at("type")), "BlockStored");
  EXPECT_EQ(u64(lines[0].at("block_hashes").at(0)), want->events[0].block_hashes[0].key);
  EXPECT_EQ(u64(lines[0].at("parent_block_hash")), want->events[0].parent_block_hash->key);
  proc.signal(SIGTERM);
  EXPECT_EQ(proc.wait(5s), 0);
}

TEST(llmgw_events, fills_a_gap_from_the_replay_endpoint) {
  auto frames = load_frames("S1_basic.array.bytes.json");
  llmgw::test::replay_service<capture_frame> replay(frames);

  child_process proc(
    {LLMGW_BINARY, "events", "--bind", "tcp://127.0.0.1:0", "--replay", replay.endpoint()});
  auto endpoint = listening_endpoint(proc);
  ASSERT_FALSE(endpoint.empty());
  std::size_t expected_lines = 0;
  {
    test_publisher pub(endpoint);
    for (const auto& f : frames) {
      expected_lines += events_in(f);
      if (f.seq == 3 || f.seq == 4)
        continue; // lost live, recovered by replay
      pub.send(f, f.seq);
    }
    auto lines = read_json_lines(proc, expected_lines);
    ASSERT_EQ(lines.size(), expected_lines);
    std::vector<std::uint64_t> order;
    std::size_t replayed = 0;
    for (const auto& l : lines) {
      ASSERT_NE(json::value_to<std::string>(l.at("type")), "gap") << "replay should have filled it";
      if (order.empty() || order.back() != u64(l.at("seq")))
        order.push_back(u64(l.at("seq")));
      if (l.contains("replayed"))
        ++replayed;
    }
    EXPECT_EQ(order, (std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})) << "in seq order";
    EXPECT_EQ(replayed, events_in(frames[3]) + events_in(frames[4]));
    EXPECT_EQ(replay.requests(), 1);
  }
  proc.signal(SIGINT);
  EXPECT_EQ(proc.wait(5s), 0);
}

TEST(llmgw_events, reports_undecodable_payloads) {
  auto frames = load_frames("S1_basic.map.int.json");
  child_process proc({LLMGW_BINARY, "events", "--bind", "tcp://127.0.0.1:0"});
  auto endpoint = listening_endpoint(proc);
  ASSERT_FALSE(endpoint.empty());
  test_publisher pub(endpoint);
  auto broken = frames[0];
  broken.payload.resize(broken.payload.size() / 2);
  pub.send(broken, 0);
  pub.send(frames[1], 1);
  auto lines = read_json_lines(proc, 1 + events_in(frames[1]));
  ASSERT_GE(lines.size(), 1u);
  EXPECT_EQ(json::value_to<std::string>(lines[0].at("type")), "decode_error");
  EXPECT_EQ(u64(lines[0].at("seq")), 0u);
  EXPECT_FALSE(json::value_to<std::string>(lines[0].at("message")).empty());
  ASSERT_EQ(lines.size(), 1 + events_in(frames[1])) << "the stream goes on after a bad payload";
  proc.signal(SIGTERM);
  EXPECT_EQ(proc.wait(5s), 0);
}
