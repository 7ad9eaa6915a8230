// Node identity without actors: the key exchange, the transcript, proofs and
// certificate checks, fingerprints, and MACs.
#include "config/node_identity.hpp"
#include "config/pki.hpp"
#include "net/node_port_guard.hpp"
#include "tests/support/captures.hpp"
#include "tests/support/credentials.hpp"

#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw;
using namespace llmgw::config;
using namespace llmgw::wire;

namespace {

session_transcript between(const key_share& agent, const key_share& control) {
  return {"agent-a",       "control-1",         7, agent.nonce(), agent.public_key(),
          control.nonce(), control.public_key()};
}

} // namespace

TEST(node_identity, both_sides_derive_the_same_key_and_only_for_their_transcript) {
  auto agent = key_share::make();
  auto control = key_share::make();
  ASSERT_TRUE(agent && control);
  EXPECT_EQ(agent->nonce().size(), 32u);
  EXPECT_EQ(agent->public_key().size(), 32u);
  EXPECT_NE(agent->nonce(), control->nonce());
  auto t = between(*agent, *control);
  auto k1 = agent->session_key(control->public_key(), t);
  auto k2 = control->session_key(agent->public_key(), t);
  ASSERT_TRUE(k1 && k2);
  EXPECT_EQ(k1->size(), 32u);
  EXPECT_EQ(*k1, *k2);
  auto other = t;
  other.control = "control-2";
  EXPECT_NE(other.digest(), t.digest());
  EXPECT_NE(*agent->session_key(control->public_key(), other), *k1)
    << "the names are part of the key";
  auto third = key_share::make();
  EXPECT_NE(*agent->session_key(third->public_key(), t), *k1);
}

TEST(node_identity, a_bad_key_share_is_refused) {
  auto agent = key_share::make();
  auto t = between(*agent, *agent);
  EXPECT_FALSE(agent->session_key("short", t));
  // The all-zero point has low order: the shared secret would be zero.
  auto zero = agent->session_key(std::string(32, '\0'), t);
  EXPECT_FALSE(zero);
}

TEST(node_identity, transcripts_differ_when_any_field_differs) {
  session_transcript t{"a", "c", 1, "n1", "s1", "n2", "s2"};
  auto base = t.digest();
  EXPECT_EQ(base.size(), 32u);
  auto moved = t;
  moved.agent = "ac"; // "a"+"c" vs "ac"+"": lengths are part of the form
  moved.control = "";
  EXPECT_NE(moved.digest(), base);
  moved = t;
  moved.session = 2;
  EXPECT_NE(moved.digest(), base);
  EXPECT_NE(proof_input(proof_role::agent, t), proof_input(proof_role::control, t));
}

TEST(node_identity, peers_are_checked_for_ca_name_fingerprint_and_signature) {
  auto& creds = test::test_credentials();
  auto a = creds.of("agent-a");
  auto b = creds.of("agent-b");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->name(), "agent-a");
  std::string data = "what was signed";
  auto sig = b->sign(data);
  EXPECT_TRUE(a->check_peer(b->certificate(), "agent-b", {}, data, sig));
  EXPECT_TRUE(a->check_peer(b->certificate(), "agent-b", {b->fingerprint()}, data, sig));
  EXPECT_EQ(a->check_peer(b->certificate(), "agent-a", {}, data, sig).reason, "name");
  EXPECT_EQ(a->check_peer(b->certificate(), "agent-b", {a->fingerprint()}, data, sig).reason,
            "fingerprint");
  EXPECT_EQ(a->check_peer(b->certificate(), "agent-b", {}, data + "!", sig).reason, "signature");
  EXPECT_EQ(a->check_peer(b->certificate(), "agent-b", {}, data, a->sign(data)).reason,
            "signature");
  EXPECT_EQ(a->check_peer("not der", "agent-b", {}, data, sig).reason, "certificate");
  EXPECT_EQ(a->check_peer(b->certificate() + "x", "agent-b", {}, data, sig).reason, "certificate")
    << "bytes after the certificate";
  auto files = credentials_in(creds.stranger, "agent-b");
  auto stranger = node_identity::load("agent-b", files.cert, files.key, creds.stranger + "/ca.pem");
  ASSERT_TRUE(stranger);
  EXPECT_EQ(
    a->check_peer((*stranger)->certificate(), "agent-b", {}, data, (*stranger)->sign(data)).reason,
    "certificate");
}

TEST(node_identity, loading_refuses_a_certificate_that_names_another_node) {
  auto& creds = test::test_credentials();
  auto files = credentials_in(creds.dir, "agent-b");
  auto wrong = node_identity::load("agent-a", files.cert, files.key, creds.ca());
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.err().message.find("does not name node 'agent-a'"), std::string::npos);
  EXPECT_EQ(certificate_names(files.cert, "agent-b"), "");
  EXPECT_NE(certificate_names(files.cert, "agent-a"), "");
}

TEST(node_identity, fingerprints_are_normalized) {
  auto fp = fingerprint_of("abc");
  EXPECT_EQ(fp.rfind("sha256:", 0), 0u);
  EXPECT_EQ(fp.size(), 7u + 64u);
  std::string colons;
  for (std::size_t i = 7; i < fp.size(); i += 2)
    colons += (i > 7 ? ":" : "") + fp.substr(i, 2);
  EXPECT_EQ(normalize_fingerprint(colons), fp);
  EXPECT_EQ(normalize_fingerprint("SHA256:" + colons), fp);
  EXPECT_EQ(normalize_fingerprint(fp.substr(7)), fp);
  EXPECT_EQ(normalize_fingerprint("sha256:12"), "");
  EXPECT_EQ(normalize_fingerprint(std::string(64, 'g')), "");
}

TEST(node_identity, the_mac_is_hmac_sha256) {
  // RFC 4231, test case 1, twice: the context is kept and re-keyed.
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(test::to_hex(session_mac(std::string(20, '\x0b'), "Hi There")),
              "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
}

TEST(node_identity, macs_depend_on_key_and_data) {
  auto key = std::string(32, 'k');
  auto m = session_mac(key, "update");
  EXPECT_EQ(m.size(), 32u);
  EXPECT_TRUE(same_mac(m, session_mac(key, "update")));
  EXPECT_FALSE(same_mac(m, session_mac(key, "updatf")));
  EXPECT_FALSE(same_mac(m, session_mac(std::string(32, 'K'), "update")));
  EXPECT_FALSE(same_mac(m, m.substr(1)));
}

namespace {

/// A BASP header as CAF 0.17.6 writes it, announcing `payload` bytes.
std::string basp_header(std::uint32_t payload) {
  std::string h(32, '\0');
  h[0] = 1; // an operation
  for (int i = 0; i < 4; ++i)
    h[4 + static_cast<std::size_t>(i)] = static_cast<char>((payload >> (24 - 8 * i)) & 0xff);
  return h;
}

bool feed(basp_frame_guard& g, const std::string& bytes, std::size_t piece) {
  for (std::size_t at = 0; at < bytes.size(); at += piece) {
    auto n = std::min(piece, bytes.size() - at);
    if (!g.feed(reinterpret_cast<const unsigned char*>(bytes.data() + at), n))
      return false;
  }
  return true;
}

} // namespace

TEST(basp_frame_guard, follows_the_framing_in_pieces_of_any_size) {
  std::string stream = basp_header(100) + std::string(100, 'p') + basp_header(0) + basp_header(5000)
                       + std::string(5000, 'q') + basp_header(3);
  for (std::size_t piece : {1u, 7u, 32u, 33u, 4096u, 100000u}) {
    basp_frame_guard g(200, 10000);
    EXPECT_TRUE(feed(g, stream, piece)) << "piece " << piece;
    EXPECT_EQ(g.refused_length(), 0u);
  }
}

TEST(basp_frame_guard, a_header_announcing_too_much_is_refused) {
  basp_frame_guard first(200, 1u << 30);
  EXPECT_FALSE(feed(first, basp_header(201), 5)) << "the first message has a tighter limit";
  EXPECT_EQ(first.refused_length(), 201u);
  basp_frame_guard later(200, 10000);
  auto stream = basp_header(10) + std::string(10, 'x') + basp_header(1u << 30);
  EXPECT_FALSE(feed(later, stream, 3));
  EXPECT_EQ(later.refused_length(), 1u << 30);
  EXPECT_FALSE(feed(later, basp_header(1), 32)) << "refused ever after";
  // The payload bytes of an allowed message are never read as a header.
  basp_frame_guard payload(200, 100);
  EXPECT_TRUE(feed(
    payload, basp_header(64) + basp_header(1u << 30).substr(0, 32) + std::string(32, '\0'), 9));
}

TEST(node_identity, a_host_name_in_a_certificate_names_no_node) {
  // Nodes named after their hosts: llmgw certs gives every certificate every
  // --host, so gpu-2's certificate lists gpu-1 as a host name.
  char tmpl[] = "/tmp/llmgw-hosts-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  ASSERT_EQ(ensure_ca(dir), "");
  ASSERT_EQ(issue_node_certificate(dir, "gpu-2", {"gpu-1", "gpu-2", "localhost"}), "");
  ASSERT_EQ(issue_node_certificate(dir, "gpu-1", {"gpu-1", "gpu-2", "localhost"}), "");
  auto two = node_identity::load("gpu-2", dir + "/gpu-2.pem", dir + "/gpu-2.key", dir + "/ca.pem");
  auto one = node_identity::load("gpu-1", dir + "/gpu-1.pem", dir + "/gpu-1.key", dir + "/ca.pem");
  ASSERT_TRUE(two && one);
  std::string data = "proof";
  EXPECT_EQ((*one)->check_peer((*two)->certificate(), "gpu-1", {}, data, (*two)->sign(data)).reason,
            "name")
    << "gpu-2's certificate must not pass as gpu-1";
  EXPECT_EQ(
    (*one)->check_peer((*two)->certificate(), "localhost", {}, data, (*two)->sign(data)).reason,
    "name");
  EXPECT_TRUE((*one)->check_peer((*two)->certificate(), "gpu-2", {}, data, (*two)->sign(data)));
  EXPECT_FALSE(
    node_identity::load("gpu-1", dir + "/gpu-2.pem", dir + "/gpu-2.key", dir + "/ca.pem"));
  std::system(("rm -rf " + dir).c_str());
}

TEST(basp_frame_guard, messages_that_speak_for_another_node_are_refused) {
  auto header = [](std::uint8_t operation, std::uint32_t payload) {
    auto h = basp_header(payload);
    h[0] = static_cast<char>(operation);
    return h;
  };
  std::string node_a(32, 'a'), node_b(32, 'b');
  std::string hello = header(1, 32) + node_a; // a client handshake naming node a
  basp_frame_guard ok(1024, 1024);
  EXPECT_TRUE(feed(ok,
                   hello + header(2, 4) + "data" + header(6, 0) + header(5, 70) + node_a
                     + std::string(38, 'x'),
                   3))
    << "a down message for the connection's own node";
  basp_frame_guard forged(1024, 1024);
  EXPECT_FALSE(feed(forged, hello + header(5, 70) + node_b + std::string(38, 'x'), 5));
  EXPECT_EQ(forged.why(), basp_frame_guard::verdict::forged_source);
  basp_frame_guard monitor(1024, 1024);
  EXPECT_FALSE(feed(monitor, hello + header(4, 64) + node_b + node_a, 64));
  EXPECT_EQ(monitor.why(), basp_frame_guard::verdict::forged_source);
  basp_frame_guard routed(1024, 1024);
  EXPECT_FALSE(feed(routed, hello + header(3, 64) + node_a + node_b, 1));
  EXPECT_EQ(routed.why(), basp_frame_guard::verdict::routed);
  basp_frame_guard direct(1024, 1024);
  EXPECT_FALSE(feed(direct, header(2, 4) + "data", 32));
  EXPECT_EQ(direct.why(), basp_frame_guard::verdict::not_handshake)
    << "no message before the handshake";
  basp_frame_guard short_down(1024, 1024);
  EXPECT_FALSE(feed(short_down, hello + header(5, 8) + "12345678", 32));
  EXPECT_EQ(short_down.why(), basp_frame_guard::verdict::forged_source);
}
