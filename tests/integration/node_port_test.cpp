// A control node's CAF port against what CAF 0.17.6 leaves unbounded:
// connections that never finish TLS, too many handshakes at once, and a
// peer with a valid certificate whose BASP header announces 1 GiB. Real
// `llmgw node` processes; the limits are enforced by net/tls_hooks.cpp.
#include "config/pki.hpp"
#include "tests/integration/sockets.hpp"
#include "tests/integration/test_cluster.hpp"

#include <caf/binary_serializer.hpp>
#include <caf/node_id.hpp>
#include <caf/optional.hpp>

#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <arpa/inet.h>
#include <fstream>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

using namespace std::chrono_literals;
using llmgw::test::closed_by_peer;
using llmgw::test::connect_to;
using llmgw::test::test_cluster;

namespace {

/// A peer of the node port with a certificate of the cluster's CA: TLS as
/// CAF does it, then whatever bytes the test sends.
struct tls_peer {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = nullptr;
  int fd = -1;

  /// Connects with `name`'s certificate and key from `dir`; false if the
  /// TLS handshake fails.
  bool connect(std::uint16_t port, const std::string& dir, const std::string& name) {
    auto files = llmgw::config::credentials_in(dir, name);
    SSL_CTX_use_certificate_file(ctx, files.cert.c_str(), SSL_FILETYPE_PEM);
    SSL_CTX_use_PrivateKey_file(ctx, files.key.c_str(), SSL_FILETYPE_PEM);
    fd = llmgw::test::connect_to(port);
    ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    return SSL_connect(ssl) == 1;
  }

  bool send(const std::string& bytes) {
    return SSL_write(ssl, bytes.data(), static_cast<int>(bytes.size()))
           == static_cast<int>(bytes.size());
  }

  /// True if the node ends the connection (after what CAF sends first).
  bool dropped() {
    char buf[4096];
    int n;
    while ((n = SSL_read(ssl, buf, sizeof buf)) > 0) {
    }
    return n <= 0;
  }

  /// True if the node sends anything (its BASP handshake).
  bool answers() {
    char buf[64];
    return SSL_read(ssl, buf, sizeof buf) > 0;
  }

  ~tls_peer() {
    if (ssl)
      SSL_free(ssl);
    if (fd >= 0)
      ::close(fd);
    SSL_CTX_free(ctx);
  }
};

std::vector<llmgw::test::test_node_spec> one_control() {
  return {{"control-1", true, false, "127.0.0.1", {}}};
}

} // namespace

TEST(node_port, a_connection_that_never_starts_tls_is_closed_after_the_handshake_timeout) {
  test_cluster c(one_control(), "tls_handshake_timeout_ms = 300");
  c.start("control-1");
  ASSERT_TRUE(c.wait_ready("control-1", 10s)) << c.log_of("control-1");
  auto start = std::chrono::steady_clock::now();
  int fd = connect_to(c.caf_port("control-1"));
  EXPECT_TRUE(closed_by_peer(fd)) << "kept open past the handshake timeout";
  ::close(fd);
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 5s);
  EXPECT_EQ(c.metric("control-1", "llmgw_node_port_refused_total{reason=\"handshake_timeout\"}"),
            1);
  EXPECT_EQ(c.metric("control-1", "llmgw_node_port_pending_handshakes"), 0);
}

TEST(node_port, handshakes_in_progress_are_capped) {
  test_cluster c(one_control(), "max_pending_handshakes = 4\ntls_handshake_timeout_ms = 60000");
  c.start("control-1");
  ASSERT_TRUE(c.wait_ready("control-1", 10s)) << c.log_of("control-1");
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i)
    idle.push_back(connect_to(c.caf_port("control-1")));
  ASSERT_TRUE(test_cluster::eventually(
    [&] { return c.metric("control-1", "llmgw_node_port_pending_handshakes") == 4; }, 10s));
  int fifth = connect_to(c.caf_port("control-1"));
  EXPECT_TRUE(closed_by_peer(fifth)) << "over the cap: closed at once";
  ::close(fifth);
  EXPECT_EQ(c.metric("control-1", "llmgw_node_port_refused_total{reason=\"too_many_handshakes\"}"),
            1);
  EXPECT_EQ(c.metric("control-1", "llmgw_node_port_pending_handshakes"), 4)
    << "the four in progress are still there";
  for (int fd : idle)
    ::close(fd);
  EXPECT_TRUE(test_cluster::eventually(
    [&] { return c.metric("control-1", "llmgw_node_port_pending_handshakes") == 0; }, 10s))
    << "gone with their connections";
}

TEST(node_port, a_header_announcing_a_huge_payload_drops_the_peer_before_it_allocates) {
  test_cluster c(one_control());
  c.start("control-1");
  ASSERT_TRUE(c.wait_ready("control-1", 10s)) << c.log_of("control-1");
  auto before = llmgw::test::rss_mib(std::to_string(c.pid("control-1")));
  ASSERT_GT(before, 0);
  // A peer with a valid certificate of the cluster (TLS lets it in).
  tls_peer peer;
  ASSERT_TRUE(peer.connect(c.caf_port("control-1"), c.dir(), "control-1"));
  // A client handshake (valid: no actors named), as a peer sends first,
  // announcing a payload of 0x40000000 bytes: 1 GiB.
  std::string header(32, '\0');
  header[0] = 1;
  header[4] = 0x40;
  ASSERT_TRUE(peer.send(header));
  EXPECT_TRUE(peer.dropped());
  EXPECT_EQ(c.metric("control-1", "llmgw_node_port_refused_total{reason=\"payload_too_large\"}"),
            1);
  auto after = llmgw::test::rss_mib(std::to_string(c.pid("control-1")));
  std::fprintf(stderr, "control-1 resident: %.0f MiB before, %.0f MiB after\n", before, after);
  EXPECT_LT(after, before + 256) << "CAF did not size a buffer from the header";
  EXPECT_TRUE(c.wait_ready("control-1", 5s)) << "and serves on";
}

namespace {

/// A BASP header as CAF 0.17.6 writes it.
std::string basp_header(std::uint8_t operation, std::uint32_t payload, std::uint64_t source = 0) {
  std::string h(32, '\0');
  h[0] = static_cast<char>(operation);
  for (int i = 0; i < 4; ++i)
    h[4 + static_cast<std::size_t>(i)] = static_cast<char>((payload >> (24 - 8 * i)) & 0xff);
  for (int i = 0; i < 8; ++i)
    h[16 + static_cast<std::size_t>(i)] = static_cast<char>((source >> (56 - 8 * i)) & 0xff);
  return h;
}

/// A node id as CAF writes it.
std::string node_bytes(std::uint32_t pid, const std::string& host_hex) {
  std::vector<char> out;
  caf::binary_serializer sink{static_cast<caf::execution_unit*>(nullptr), out};
  auto id = caf::make_node_id(pid, host_hex);
  EXPECT_TRUE(id);
  EXPECT_FALSE(sink(*id));
  return std::string(out.begin(), out.end());
}

} // namespace

TEST(node_port, a_down_message_for_another_node_drops_the_peer) {
  test_cluster c({{"control-1", true, false, "127.0.0.1", {}},
                  {"agent-a", false, true, "127.0.0.1", {{"a0", "S1_basic.map.int.json"}}}});
  c.start("control-1");
  ASSERT_TRUE(c.wait_ready("control-1", 10s)) << c.log_of("control-1");
  c.start("agent-a");
  ASSERT_TRUE(test_cluster::eventually(
    [&] { return c.metric("control-1", "llmgw_agent_connected{node=\"agent-a\"}") == 1; }, 10s));
  // A peer with a valid certificate says who it is, then says an actor of
  // another node died: CAF would kill its proxy of that actor (an agent's
  // forwarder: its session would be dropped).
  tls_peer peer;
  ASSERT_TRUE(peer.connect(c.caf_port("control-1"), c.dir(), "control-1"));
  auto me = node_bytes(4242, "0123456789abcdef0123456789abcdef01234567");
  auto other = node_bytes(777, "fedcba9876543210fedcba9876543210fedcba98");
  ASSERT_EQ(me.size(), 32u);
  auto bytes = basp_header(1, static_cast<std::uint32_t>(me.size())) + me + basp_header(5, 70, 1)
               + other + std::string(38, '\0');
  ASSERT_TRUE(peer.send(bytes));
  EXPECT_TRUE(peer.dropped());
  EXPECT_EQ(c.metric("control-1", "llmgw_node_port_refused_total{reason=\"message\"}"), 1);
  EXPECT_NE(c.log_of("control-1").find("a monitor or down message for another node"),
            std::string::npos)
    << c.log_of("control-1");
  EXPECT_EQ(c.metric("control-1", "llmgw_agent_connected{node=\"agent-a\"}"), 1)
    << "the agent's session goes on";
}

namespace {

/// True if a peer with `name`'s certificate from `dir` gets past the TLS
/// handshake (the node answers with its BASP handshake).
bool tls_peer_admitted(test_cluster& c, const std::string& dir, const std::string& name) {
  tls_peer peer;
  return peer.connect(c.caf_port("control-1"), dir, name) && peer.answers();
}

} // namespace

TEST(node_port, only_the_topologys_certificates_get_past_tls) {
  std::vector<llmgw::test::test_node_spec> nodes{
    {"control-1", true, false, "127.0.0.1", {}},
    {"agent-a", false, true, "127.0.0.1", {{"a0", "S1_basic.map.int.json"}}}};
  test_cluster c(nodes);
  // The control node's topology revokes agent-a's certificate: it lists
  // another one.
  auto revoking = nodes;
  revoking[1].fingerprints = {"sha256:" + std::string(64, 'a')};
  auto file = c.write_topology(revoking, "revoking.toml");
  c.start("control-1", file);
  ASSERT_TRUE(c.wait_ready("control-1", 10s)) << c.log_of("control-1");
  // A certificate the cluster's CA issued for something that is no node.
  ASSERT_EQ(llmgw::config::issue_node_certificate(c.dir(), "intruder", {"127.0.0.1"}), "");
  EXPECT_FALSE(tls_peer_admitted(c, c.dir(), "intruder"));
  EXPECT_FALSE(tls_peer_admitted(c, c.dir(), "agent-a")) << "revoked";
  EXPECT_TRUE(tls_peer_admitted(c, c.dir(), "control-1")) << "a node of the topology";
  EXPECT_EQ(c.metric("control-1", "llmgw_node_port_refused_total{reason=\"certificate\"}"), 2);
  auto log = c.log_of("control-1");
  EXPECT_NE(log.find("the certificate names 'intruder', no node of the topology"),
            std::string::npos)
    << log;
  // (agent-a's refusal a moment later is not logged: once per burst)
  c.start("agent-a"); // its own topology lists no fingerprints: it tries
  EXPECT_TRUE(test_cluster::eventually(
    [&] {
      return c.metric("control-1", "llmgw_node_port_refused_total{reason=\"certificate\"}") >= 3;
    },
    10s))
    << "the revoked agent is cut off at TLS, again and again";
  EXPECT_EQ(c.metric("control-1", "llmgw_agent_connected{node=\"agent-a\"}"), 0);
}
