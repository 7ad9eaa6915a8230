// A real subscriber and mirror (actors, on their own threads) fed over TCP
// loopback by a publisher that connects like vLLM's and sends the captured
// frames: the mirror must end in each capture's expected state, and reset
// exactly when the stream says so.
#include "actors/agent.hpp"
#include "actors/control_connector.hpp"
#include "actors/forwarder.hpp"
#include "actors/mirror.hpp"
#include "actors/registration.hpp"
#include "actors/subscriber.hpp"
#include "tests/integration/replay_service.hpp"
#include "tests/support/captures.hpp"
#include "tests/support/eventually.hpp"
#include "tests/support/loopback_control.hpp"
#include "wire/block_hash.hpp"
#include "wire/zmq_message.hpp"

#include <boost/json.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <gtest/gtest.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <map>
#include <mutex>
#include <set>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace std::chrono_literals;
namespace json = boost::json;
using namespace llmgw;

namespace {

struct frame {
  std::string topic;
  std::uint64_t seq;
  std::string payload;
};

struct capture_data {
  std::vector<frame> frames;
  std::set<kv::block_ref> expected;
  std::int64_t clears = 0;
  std::string topic;
};

capture_data load(const std::string& name) {
  capture_data c;
  auto doc = llmgw::test::read_json(llmgw::test::capture_path(name));
  c.topic = json::value_to<std::string>(doc.at("topic"));
  for (const auto& f : doc.at("frames").as_array())
    c.frames.push_back({llmgw::test::from_hex(json::value_to<std::string>(f.at("topic_hex"))),
                        static_cast<std::uint64_t>(f.at("seq").as_int64()),
                        llmgw::test::from_hex(json::value_to<std::string>(f.at("payload_hex")))});
  c.expected = llmgw::test::capture_final_blocks(doc);
  c.clears = doc.at("expected").at("counts").at("AllBlocksCleared").as_int64();
  return c;
}

struct sys_config : caf::actor_system_config {
  sys_config() {
    register_message_types(*this);
    set("scheduler.max-threads", 2);
  }
};

/// Publisher side, as vLLM's: XPUB (so a test can wait for the
/// subscription instead of sleeping). It connects to the agent (an
/// endpoint naming a host, in vLLM's config), or binds (`tcp://*:PORT`,
/// vLLM's default; here on loopback) and the agent connects.
class publisher {
public:
  /// Connects to `endpoint` and waits for the subscription.
  explicit publisher(const std::string& endpoint) : socket_(ctx_, zmq::socket_type::xpub) {
    setup();
    socket_.connect(endpoint);
    endpoint_ = endpoint;
    EXPECT_TRUE(subscribed()) << "no subscription arrived";
  }
  struct bind_at {
    std::string endpoint = "tcp://127.0.0.1:*";
  };
  /// Binds (throws zmq::error_t if the port is taken); subscribed() waits.
  explicit publisher(const bind_at& at) : socket_(ctx_, zmq::socket_type::xpub) {
    setup();
    socket_.bind(at.endpoint);
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  }
  const std::string& endpoint() const { return endpoint_; }
  int port() const { return std::stoi(endpoint_.substr(endpoint_.rfind(':') + 1)); }
  /// Waits (bounded) for the subscriber's subscription.
  bool subscribed() {
    zmq::message_t sub;
    return static_cast<bool>(socket_.recv(sub));
  }
  void send(const frame& f, std::uint64_t seq) {
    auto s = wire::encode_seq(seq);
    std::array<zmq::const_buffer, 3> parts = {zmq::buffer(f.topic), zmq::buffer(s),
                                              zmq::buffer(f.payload)};
    zmq::send_multipart(socket_, parts);
  }

private:
  void setup() {
    socket_.set(zmq::sockopt::linger, 2000);
    socket_.set(zmq::sockopt::sndhwm, 0);
    socket_.set(zmq::sockopt::rcvtimeo, 10000);
  }
  zmq::context_t ctx_;
  zmq::socket_t socket_;
  std::string endpoint_;
};

/// A subscriber and mirror in a real actor system.
struct agent_path {
  sys_config cfg;
  caf::actor_system sys{cfg};
  mirror_actor mirror;
  caf::actor sub;
  std::shared_ptr<subscriber_stats> stats = std::make_shared<subscriber_stats>();
  std::string endpoint;

  explicit agent_path(const std::string& topic, const std::string& replay = "",
                      std::shared_ptr<replay_address> moves = nullptr,
                      std::chrono::milliseconds replay_timeout = 2000ms) {
    mirror = sys.spawn(llmgw::mirror, std::string("r0"), std::uint32_t{0},
                       std::optional<kv::parity_config>(kv::parity_config{"0", 16}), nullptr);
    subscriber_options opts;
    opts.replica = "r0";
    opts.topic = topic;
    opts.replay = replay;
    opts.replay_timeout = replay_timeout;
    opts.replay_moves = std::move(moves);
    auto bound = open_subscriber(opts);
    EXPECT_TRUE(bound.socket) << bound.error;
    endpoint = bound.endpoint;
    sub = sys.spawn<caf::detached>(subscriber, bound.socket, opts, mirror, stats);
  }

  ~agent_path() {
    caf::anon_send_exit(sub, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(mirror, caf::exit_reason::user_shutdown);
  }

  /// Waits (bounded) until the subscriber has read `n` live messages.
  bool wait_for_messages(std::uint64_t n) {
    test::eventually([&] { return stats->messages.load() >= n; }, 10s);
    return stats->messages.load() >= n;
  }

  /// The mirror's full state, as a new subscriber would get it.
  replica_update snapshot() {
    caf::scoped_actor self{sys};
    replica_update out;
    self->request(mirror, 10s, subscribe_atom::value, std::uint64_t{999})
      .receive([&](const replica_update& u) { out = u; },
               [&](const caf::error& e) { ADD_FAILURE() << sys.render(e); });
    return out;
  }
};

std::set<kv::block_ref> as_set(const replica_update& u) {
  return {u.added.begin(), u.added.end()};
}

/// What the block table holds after applying frames [from, end) to an empty one.
std::set<kv::block_ref> reference(const capture_data& c, std::size_t from) {
  kv::block_table t;
  for (std::size_t i = from; i < c.frames.size(); ++i)
    t.apply(*wire::decode_batch(c.frames[i].payload));
  auto held = t.held();
  return {held.begin(), held.end()};
}

} // namespace

class agent_stream_capture : public ::testing::TestWithParam<std::string> {};

TEST_P(agent_stream_capture, mirror_ends_in_the_expected_state) {
  auto c = load(GetParam());
  agent_path path(c.topic);
  publisher pub(path.endpoint);
  for (const auto& f : c.frames)
    pub.send(f, f.seq);
  ASSERT_TRUE(path.wait_for_messages(c.frames.size()));
  auto state = path.snapshot();
  EXPECT_EQ(as_set(state), c.expected);
  EXPECT_EQ(state.epoch, static_cast<std::uint64_t>(c.clears)) << "one reset per AllBlocksCleared";
  EXPECT_NE(state.parity, static_cast<std::uint8_t>(kv::parity_state::mismatch));
  EXPECT_EQ(path.stats->gaps.load(), 0u);
  EXPECT_EQ(path.stats->decode_errors.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(vllm_captures, agent_stream_capture,
                         ::testing::ValuesIn(llmgw::test::capture_names()), [](const auto& info) {
                           std::string name = info.param.substr(0, info.param.size() - 5);
                           for (auto& ch : name)
                             if (ch == '.')
                               ch = '_';
                           return name;
                         });

TEST(agent_stream, a_dropped_frame_resets_then_follows_the_next_events) {
  auto c = load("S1_basic.map.int.json");
  agent_path path(c.topic);
  publisher pub(path.endpoint);
  for (const auto& f : c.frames)
    if (f.seq != 4)
      pub.send(f, f.seq);
  ASSERT_TRUE(path.wait_for_messages(c.frames.size() - 1));
  auto state = path.snapshot();
  EXPECT_EQ(state.epoch, 1u);
  EXPECT_EQ(as_set(state), reference(c, 5)) << "exactly what frames 5.. stored and kept";
  EXPECT_EQ(path.stats->gaps.load(), 1u);
}

TEST(agent_stream, seq_back_to_zero_is_a_restart) {
  auto first = load("S1_basic.map.int.json");
  auto second = load("S6_dp.map.int.json");
  agent_path path("");
  publisher pub(path.endpoint);
  for (const auto& f : first.frames)
    pub.send(f, f.seq);
  for (const auto& f : second.frames)
    pub.send(f, f.seq);
  ASSERT_TRUE(path.wait_for_messages(first.frames.size() + second.frames.size()));
  auto state = path.snapshot();
  EXPECT_EQ(state.epoch, 1u);
  EXPECT_EQ(as_set(state), second.expected) << "nothing of the first publisher survives";
  EXPECT_EQ(path.stats->restarts.load(), 1u);
}

TEST(agent_stream, replay_fills_a_gap_without_reset) {
  auto c = load("S3_lora_salt.array.bytes.json");
  llmgw::test::replay_service<frame> replay(c.frames);

  agent_path path(c.topic, replay.endpoint());
  publisher pub(path.endpoint);
  for (const auto& f : c.frames)
    if (f.seq != 2 && f.seq != 3)
      pub.send(f, f.seq);
  ASSERT_TRUE(path.wait_for_messages(c.frames.size() - 2));
  test::eventually([&] { return path.stats->gaps_filled.load() != 0; }, 3s);
  auto state = path.snapshot();
  EXPECT_EQ(path.stats->gaps_filled.load(), 1u);
  EXPECT_EQ(state.epoch, 0u) << "filled by replay: no reset";
  EXPECT_EQ(as_set(state), c.expected);
}

// A replay endpoint that moved where the subscriber cannot connect fills
// no gap: the next gap resets at once, not after replay_timeout (a minute
// here) spent waiting for an answer that cannot come.
TEST(agent_stream, a_gap_after_the_replay_was_lost_resets_at_once) {
  auto c = load("S3_lora_salt.array.bytes.json");
  llmgw::test::replay_service<frame> replay(c.frames);
  auto moves = std::make_shared<replay_address>();
  agent_path path(c.topic, replay.endpoint(), moves, 60s);
  ASSERT_TRUE(test::eventually([&] { return path.stats->replay.load(); }, 10s))
    << "the subscriber connects to the replay endpoint first";
  moves->set("not an endpoint");
  ASSERT_TRUE(test::eventually([&] { return !path.stats->replay.load(); }, 10s))
    << "the subscriber reads the move between polls";
  publisher pub(path.endpoint);
  for (const auto& f : c.frames)
    if (f.seq != 2 && f.seq != 3)
      pub.send(f, f.seq);
  ASSERT_TRUE(path.wait_for_messages(c.frames.size() - 2));
  EXPECT_TRUE(test::eventually([&] { return path.snapshot().epoch == 1; }, 10s))
    << "the gap reset the mirror without waiting for a replay";
  EXPECT_EQ(path.stats->gaps_filled.load(), 0u);
  EXPECT_EQ(as_set(path.snapshot()), reference(c, 4)) << "what frames 4.. stored and kept";
}

// The whole agent path: publisher -> subscriber -> mirror -> forwarder ->
// (CAF over loopback) -> a control node's copy, for the churn capture.
namespace {} // namespace

TEST(agent_path, the_control_nodes_copy_equals_the_engines_blocks) {
  llmgw::test::loopback_control control;
  ASSERT_NE(control.port, 0) << control.error;
  auto copy = control.record;

  auto c = load("S2_churn.map.int.json");
  llmgw::test::loopback_node_config agent_cfg;
  caf::actor_system agent_sys{agent_cfg};
  auto m = agent_sys.spawn(mirror, std::string("r0"), std::uint32_t{0},
                           std::optional<kv::parity_config>(kv::parity_config{"0", 16}), nullptr);
  subscriber_options sopts;
  sopts.replica = "r0";
  sopts.topic = c.topic;
  auto bound = open_subscriber(sopts);
  ASSERT_TRUE(bound.socket) << bound.error;
  auto stats = std::make_shared<subscriber_stats>();
  auto sub = agent_sys.spawn<caf::detached>(subscriber, bound.socket, sopts, m, stats);
  forwarder_options fopts;
  fopts.node = "agent-a";
  fopts.control = "control-1";
  fopts.flush_interval = 50ms;
  auto fwd = agent_sys.spawn(forwarder, fopts, std::vector<mirror_entry>{{"r0", m}},
                             middleman_connector("127.0.0.1", control.port, 5s));
  {
    publisher pub(bound.endpoint);
    for (const auto& f : c.frames)
      pub.send(f, f.seq);
    test::eventually([&] { return stats->messages.load() >= c.frames.size(); }, 10s);
  }
  ASSERT_EQ(stats->messages.load(), c.frames.size());
  bool equal = test::eventually([&] { return copy->blocks_of("r0") == c.expected; }, 3s);
  EXPECT_TRUE(equal) << "the control node's copy must equal the capture's final state";
  {
    std::lock_guard<std::mutex> g(copy->mtx);
    EXPECT_LT(copy->updates.size(), c.frames.size())
      << "changes are batched per flush, not per event";
  }
  caf::anon_send_exit(sub, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(fwd, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(m, caf::exit_reason::user_shutdown);
}

TEST(agent_node, launches_an_engine_and_forwards_its_blocks) {
  llmgw::test::loopback_control control;
  ASSERT_NE(control.port, 0) << control.error;
  auto copy = control.record;

  auto capture = llmgw::test::capture_path("S3_lora_salt.map.int.json");
  auto c = load("S3_lora_salt.map.int.json");
  agent_config cfg;
  cfg.node = "agent-a";
  cfg.seed = "0";
  cfg.flush_interval = 50ms;
  agent_engine_config engine;
  engine.replica = "r0";
  engine.launch = {LLMGW_TEST_ENGINE, "--capture", capture, "--prefix-caching-hash-algo", "sha256"};
  engine.kv_events = true;
  engine.topic = c.topic;
  cfg.engines.push_back(engine);
  agent_engine_config attached; // already running elsewhere, no events
  attached.replica = "r1";
  cfg.engines.push_back(attached);
  cfg.controls.push_back({"control-1", "127.0.0.1", control.port, {}});

  llmgw::test::loopback_node_config agent_cfg;
  caf::actor_system agent_sys{agent_cfg};
  auto handles = start_agent(agent_sys, cfg);
  ASSERT_EQ(handles.events_endpoints.size(), 2u);
  // The launched engine publishes into the agent's private folder: no other
  // local user can connect a publisher there.
  EXPECT_EQ(handles.events_endpoints[0], "ipc://" + handles.runtime_dir + "/0.events");
  struct stat st {};
  ASSERT_EQ(::stat(handles.runtime_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, ::getuid());
  EXPECT_TRUE(handles.events_endpoints[1].empty());
  ASSERT_EQ(handles.subscribers.size(), 1u);
  EXPECT_TRUE(test::eventually([&] { return handles.subscribers[0].stats->replay.load(); }))
    << "a launched engine's gaps are filled from its replay endpoint";
  // Bounded generously for slow sanitizer builds.
  bool equal = test::eventually([&] { return copy->blocks_of("r0") == c.expected; }, 30s);
  {
    std::lock_guard<std::mutex> g(copy->mtx);
    EXPECT_TRUE(equal)
      << "the engine got the seed and flags, published, and the copy caught up; copy has "
      << copy->replicas[{"r0", 0}].size() << " blocks after " << copy->updates.size()
      << " updates, expected " << c.expected.size();
  }
  stop_agent(handles);
  agent_sys.await_all_actors_done();
  remove_runtime_dir(handles);
  EXPECT_NE(::access(handles.runtime_dir.c_str(), F_OK), 0) << "removed once the agent stopped";
}

TEST(agent_node, data_parallel_ranks_have_their_own_ports_and_mirrors) {
  llmgw::test::loopback_control control;
  ASSERT_NE(control.port, 0) << control.error;
  auto copy = control.record;

  auto rank0 = load("S1_basic.map.int.json");
  auto rank1 = load("S6_dp.map.int.json"); // recorded from a rank-1 publisher
  agent_config cfg;
  cfg.node = "agent-a";
  cfg.seed = "0";
  cfg.flush_interval = 50ms;
  agent_engine_config engine; // attached: the operator started it, 2 DP ranks
  engine.replica = "r0";
  engine.kv_events = true;
  engine.dp_size = 2;
  cfg.engines.push_back(engine);
  cfg.controls.push_back({"control-1", "127.0.0.1", control.port, {}});
  llmgw::test::loopback_node_config agent_cfg;
  caf::actor_system agent_sys{agent_cfg};
  auto handles = start_agent(agent_sys, cfg);
  ASSERT_EQ(handles.mirrors.size(), 2u) << "one mirror per rank";
  const auto& ep = handles.events_endpoints.at(0);
  ASSERT_FALSE(ep.empty());
  auto base = std::stoi(ep.substr(ep.rfind(':') + 1));
  {
    // vLLM's rank r publishes on the configured port + r.
    publisher p0(ep);
    publisher p1("tcp://127.0.0.1:" + std::to_string(base + 1));
    for (const auto& f : rank0.frames)
      p0.send(f, f.seq);
    for (const auto& f : rank1.frames)
      p1.send(f, f.seq);
    bool equal = test::eventually(
      [&] {
        return copy->blocks_of("r0", 0) == rank0.expected
               && copy->blocks_of("r0", 1) == rank1.expected;
      },
      10s);
    EXPECT_TRUE(equal) << "each rank's blocks arrive under its own rank";
  }
  stop_agent(handles);
}

namespace {

std::string loopback(int port) {
  return "tcp://127.0.0.1:" + std::to_string(port);
}

} // namespace

// vLLM at its defaults, as an operator runs it: each rank's publisher binds
// (tcp://*:5557 + rank) and the engine hashes its own way (here: the
// captures' seed "0" against the cluster's "1", which no key of the
// engine's survives). The agent connects to each rank, fills a gap from
// the rank's replay endpoint (offset per rank too), follows a publisher
// restart, and the control node's copy holds exactly the keys the router
// computes for the captured prompts.
TEST(agent_node, subscribes_where_engines_bind_and_keys_their_blocks_the_clusters_way) {
  llmgw::test::loopback_control control;
  ASSERT_NE(control.port, 0) << control.error;
  auto copy = control.record;

  auto rank0 = load("S3_lora_salt.map.int.json");
  auto rank1 = load("S6_dp.map.int.json"); // recorded from a rank-1 publisher
  std::unordered_map<wire::block_key, wire::block_key> keys;
  for (const char* name : {"S3_lora_salt.map.int.json", "S6_dp.map.int.json"})
    for (const auto& kv : llmgw::test::capture_router_keys(
           llmgw::test::read_json(llmgw::test::capture_path(name)), "1"))
      keys.insert(kv);
  auto want0 = llmgw::test::translated_blocks(rank0.expected, keys);
  auto want1 = llmgw::test::translated_blocks(rank1.expected, keys);
  ASSERT_FALSE(want0.empty());

  // Two ranks' publishers and replay services on consecutive ports, as
  // vLLM offsets both endpoints by the rank.
  std::unique_ptr<publisher> p0, p1;
  std::unique_ptr<llmgw::test::replay_service<frame>> r0, r1;
  for (int attempt = 0; attempt < 20 && !r1; ++attempt) {
    try {
      p0 = std::make_unique<publisher>(publisher::bind_at{});
      p1 = std::make_unique<publisher>(publisher::bind_at{loopback(p0->port() + 1)});
      r0 = std::make_unique<llmgw::test::replay_service<frame>>(rank0.frames);
      auto at = r0->endpoint();
      r1 = std::make_unique<llmgw::test::replay_service<frame>>(
        rank1.frames, loopback(std::stoi(at.substr(at.rfind(':') + 1)) + 1));
    } catch (const zmq::error_t&) {
      r1.reset(); // a port was taken: try other ones
    }
  }
  ASSERT_TRUE(r1) << "no two pairs of consecutive free ports";
  const int events_port = p0->port();

  agent_config cfg;
  cfg.node = "agent-a";
  cfg.seed = "1";
  cfg.flush_interval = 50ms;
  agent_engine_config engine; // attached: the operator started it
  engine.replica = "r0";
  engine.kv_events = true;
  engine.dp_size = 2;
  engine.events = p0->endpoint();
  engine.replay_endpoint = r0->endpoint();
  cfg.engines.push_back(engine);
  cfg.controls.push_back({"control-1", "127.0.0.1", control.port, {}});
  llmgw::test::loopback_node_config agent_cfg;
  caf::actor_system agent_sys{agent_cfg};
  auto handles = start_agent(agent_sys, cfg);
  ASSERT_EQ(handles.subscribers.size(), 2u);
  EXPECT_EQ(handles.events_endpoints.at(0), p0->endpoint()) << "where the agent connected";
  ASSERT_TRUE(p0->subscribed()) << "the agent connected to rank 0";
  ASSERT_TRUE(p1->subscribed()) << "the agent connected to rank 1, at the port + 1";
  for (const auto& f : rank0.frames)
    if (f.seq != 2)
      p0->send(f, f.seq); // a gap, which rank 0's replay fills
  for (const auto& f : rank1.frames)
    if (f.seq != 5)
      p1->send(f, f.seq); // and rank 1's from rank 1's, at the replay port + 1
  bool equal = test::eventually(
    [&] { return copy->blocks_of("r0", 0) == want0 && copy->blocks_of("r0", 1) == want1; }, 20s);
  EXPECT_TRUE(equal) << "both ranks' blocks under the router's keys: rank 0 has "
                     << copy->blocks_of("r0", 0).size() << " of " << want0.size() << ", rank 1 "
                     << copy->blocks_of("r0", 1).size() << " of " << want1.size();
  EXPECT_EQ(handles.subscribers[0].stats->gaps_filled.load(), 1u);
  EXPECT_EQ(handles.subscribers[1].stats->gaps_filled.load(), 1u);
  EXPECT_GE(r0->requests(), 1) << "rank 0's gap went to rank 0's replay endpoint";
  EXPECT_GE(r1->requests(), 1) << "rank 1's gap went to rank 1's";
  EXPECT_EQ(handles.mirror_views[0].view->parity.load(),
            static_cast<std::uint8_t>(kv::parity_state::translated));

  // The engine restarts: its publisher comes back on the same port with
  // seq from 0 and an empty cache; the agent reconnects by itself.
  p0.reset();
  p0 = std::make_unique<publisher>(publisher::bind_at{loopback(events_port)});
  ASSERT_TRUE(p0->subscribed()) << "the agent reconnected";
  for (std::size_t i = 0; i < 2; ++i)
    p0->send(rank0.frames[i], i);
  auto after = llmgw::test::translated_blocks(
    [&] {
      kv::block_table t;
      for (std::size_t i = 0; i < 2; ++i)
        t.apply(*wire::decode_batch(rank0.frames[i].payload));
      auto held = t.held();
      return std::set<kv::block_ref>(held.begin(), held.end());
    }(),
    keys);
  EXPECT_TRUE(test::eventually([&] { return copy->blocks_of("r0", 0) == after; }, 20s))
    << "nothing from before the restart survives; rank 0 has " << copy->blocks_of("r0", 0).size()
    << ", expected " << after.size();
  EXPECT_EQ(handles.subscribers[0].stats->restarts.load(), 1u);
  EXPECT_EQ(copy->blocks_of("r0", 1), want1) << "rank 1 is its own engine core: untouched";
  stop_agent(handles);
}

TEST(agent_stream, a_message_over_the_size_limit_cuts_its_publisher_off_unread) {
  auto c = load("S1_basic.map.int.json");
  agent_path path(c.topic);
  {
    publisher p(path.endpoint);
    p.send(c.frames[0], 0);
    ASSERT_TRUE(path.wait_for_messages(1));
    frame huge = c.frames[1];
    huge.payload.assign((8u << 20) + 1, 'x'); // one byte over the decoder's limit
    p.send(huge, 1);
  }
  // A second publisher's message is the point after which the first one's
  // would have been read.
  publisher again(path.endpoint);
  again.send(c.frames[1], 2);
  ASSERT_TRUE(path.wait_for_messages(2));
  EXPECT_EQ(path.stats->messages.load(), 2u) << "the oversized message was never received";
  EXPECT_EQ(path.stats->decode_errors.load(), 0u) << "nor held and handed to the decoder";
}

TEST(agent_node, an_attached_sglang_engines_pages_reach_the_control_node_under_the_routers_keys) {
  llmgw::test::loopback_control control;
  ASSERT_NE(control.port, 0) << control.error;
  auto copy = control.record;
  // Recorded from SGLang's own publisher and event code: its batches, its
  // signed page ids, a salted chain, a host copy, a reset.
  auto doc =
    llmgw::test::read_json(llmgw::test::source_path("golden/sglang-captures/G1_basic.json"));
  std::vector<frame> frames;
  for (const auto& f : doc.at("frames").as_array())
    frames.push_back({llmgw::test::from_hex(json::value_to<std::string>(f.at("topic_hex"))),
                      static_cast<std::uint64_t>(f.at("seq").as_int64()),
                      llmgw::test::from_hex(json::value_to<std::string>(f.at("payload_hex")))});
  // After the reset, the last batch stores the system prompt alone.
  const auto& system = doc.at("requests").as_array().back();
  std::vector<std::uint32_t> tokens;
  for (const auto& t : system.at("tokens").as_array())
    tokens.push_back(static_cast<std::uint32_t>(t.to_number<std::int64_t>()));
  std::set<kv::block_ref> want;
  for (const auto& b : wire::block_hasher("1", 16).hash(tokens))
    want.insert({b.key, kv::medium::gpu});
  ASSERT_EQ(want.size(), 3u);

  publisher pub{publisher::bind_at{}}; // SGLang's default: tcp://*:5557, it binds
  agent_config cfg;
  cfg.node = "agent-a";
  cfg.seed = "1";
  cfg.flush_interval = 50ms;
  agent_engine_config engine;
  engine.replica = "sg0";
  engine.kind = config::engine_kind::sglang;
  engine.kv_events = true;
  engine.events = pub.endpoint();
  engine.topic = json::value_to<std::string>(doc.at("topic"));
  cfg.engines.push_back(engine);
  cfg.controls.push_back({"control-1", "127.0.0.1", control.port, {}});
  llmgw::test::loopback_node_config agent_cfg;
  caf::actor_system agent_sys{agent_cfg};
  auto handles = start_agent(agent_sys, cfg);
  ASSERT_TRUE(pub.subscribed()) << "the agent connected to SGLang's publisher";
  for (const auto& f : frames)
    pub.send(f, f.seq);
  bool equal = test::eventually([&] { return copy->blocks_of("sg0", 0) == want; }, 20s);
  EXPECT_TRUE(equal) << "the control node holds " << copy->blocks_of("sg0", 0).size()
                     << " blocks, the router's keys of the system prompt are " << want.size();
  EXPECT_EQ(handles.subscribers.at(0).stats->decode_errors.load(), 0u);
  EXPECT_EQ(handles.mirror_views.at(0).view->parity.load(),
            static_cast<std::uint8_t>(kv::parity_state::translated));
  stop_agent(handles);
}
