// Every registered message crosses a real CAF connection intact: two actor
// systems in this process, the second connected to the first over loopback,
// both configured only by register_message_types().
#include "actors/registration.hpp"
#include "messages/kv_messages.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <gtest/gtest.h>

#include <chrono>

using namespace std::chrono_literals;

namespace {

struct node_config : caf::actor_system_config {
  node_config() {
    load<caf::io::middleman>();
    llmgw::register_message_types(*this);
    set("scheduler.max-threads", 2);
  }
};

/// Echoes updates back, and answers each with an ack for its seq.
caf::behavior echo(caf::event_based_actor*) {
  return {
    [](const llmgw::replica_update& u) {
      return caf::make_message(u, llmgw::session_ack{u.session, u.seq});
    },
    [](const llmgw::agent_hello& h) { return h; },
    [](const llmgw::control_proof& p) { return p; },
    [](const llmgw::agent_proof& p) { return p; },
  };
}

llmgw::replica_update sample_update() {
  llmgw::replica_update u;
  u.node = "agent-a";
  u.replica = "llama-0";
  u.dp_rank = 3;
  u.session = 0xfeedfacecafebeefu;
  u.seq = 42;
  u.epoch = 7;
  u.reset = true;
  u.parity = static_cast<std::uint8_t>(llmgw::kv::parity_state::untranslatable);
  u.partial = true;
  u.added = {{16284813627505341992u, llmgw::kv::medium::gpu}, {1, llmgw::kv::medium::cpu}};
  u.removed = {{~std::uint64_t{0}, llmgw::kv::medium::storage}};
  u.totals.batches = 11;
  u.totals.stored = 12;
  u.totals.removed = 13;
  u.totals.ignored_removes = 14;
  u.totals.verified_blocks = 15;
  u.totals.translated_blocks = 16;
  u.totals.untranslated_blocks = 17;
  for (int i = 0; i < 5; ++i)
    u.totals.resets[i] = 20u + static_cast<unsigned>(i);
  u.mac = std::string("\x00\xff mac", 6);
  return u;
}

} // namespace

TEST(messages, cross_a_real_connection_intact) {
  node_config server_cfg;
  caf::actor_system server{server_cfg};
  auto server_actor = server.spawn(echo);
  auto port = server.middleman().publish(server_actor, 0, "127.0.0.1");
  ASSERT_TRUE(port) << server.render(port.error());

  node_config client_cfg;
  caf::actor_system client{client_cfg};
  auto remote = client.middleman().remote_actor("127.0.0.1", *port);
  ASSERT_TRUE(remote) << client.render(remote.error());

  caf::scoped_actor self{client};
  auto sent = sample_update();
  bool got_update = false;
  self->request(*remote, 10s, sent)
    .receive(
      [&](const llmgw::replica_update& u, const llmgw::session_ack& ack) {
        got_update = true;
        EXPECT_EQ(u.node, sent.node);
        EXPECT_EQ(u.replica, sent.replica);
        EXPECT_EQ(u.dp_rank, 3u);
        EXPECT_EQ(u.session, sent.session);
        EXPECT_EQ(u.seq, sent.seq);
        EXPECT_EQ(u.epoch, sent.epoch);
        EXPECT_EQ(u.reset, sent.reset);
        EXPECT_EQ(u.parity, sent.parity);
        EXPECT_EQ(u.partial, sent.partial);
        EXPECT_EQ(u.added, sent.added);
        EXPECT_EQ(u.removed, sent.removed);
        EXPECT_EQ(u.totals.batches, 11u);
        EXPECT_EQ(u.totals.stored, 12u);
        EXPECT_EQ(u.mac, sent.mac);
        EXPECT_EQ(u.totals.removed, 13u);
        EXPECT_EQ(u.totals.ignored_removes, 14u);
        EXPECT_EQ(u.totals.verified_blocks, 15u);
        EXPECT_EQ(u.totals.translated_blocks, 16u);
        EXPECT_EQ(u.totals.untranslated_blocks, 17u);
        for (int i = 0; i < 5; ++i)
          EXPECT_EQ(u.totals.resets[i], 20u + static_cast<unsigned>(i));
        EXPECT_EQ(ack.session, sent.session);
        EXPECT_EQ(ack.seq, 42u);
      },
      [&](const caf::error& err) { ADD_FAILURE() << client.render(err); });
  EXPECT_TRUE(got_update);

  llmgw::agent_hello hello{
    "agent-b", 3, {"r1", "r2"}, std::string(32, '\x01'), std::string(32, '\x02')};
  bool got_hello = false;
  self->request(*remote, 10s, hello)
    .receive(
      [&](const llmgw::agent_hello& h) {
        got_hello = true;
        EXPECT_EQ(h.node, "agent-b");
        EXPECT_EQ(h.session, 3u);
        EXPECT_EQ(h.replicas, hello.replicas);
        EXPECT_EQ(h.nonce, hello.nonce);
        EXPECT_EQ(h.key_share, hello.key_share);
      },
      [&](const caf::error& err) { ADD_FAILURE() << client.render(err); });
  EXPECT_TRUE(got_hello);

  llmgw::control_proof proof{9, "control-1", "nonce", "share", std::string("cert\0der", 8), "sig"};
  bool got_proof = false;
  self->request(*remote, 10s, proof)
    .receive(
      [&](const llmgw::control_proof& p) {
        got_proof = true;
        EXPECT_EQ(p.session, 9u);
        EXPECT_EQ(p.node, "control-1");
        EXPECT_EQ(p.nonce, "nonce");
        EXPECT_EQ(p.key_share, "share");
        EXPECT_EQ(p.certificate, proof.certificate);
        EXPECT_EQ(p.signature, "sig");
      },
      [&](const caf::error& err) { ADD_FAILURE() << client.render(err); });
  EXPECT_TRUE(got_proof);
  llmgw::agent_proof mine{10, std::string("der\0", 4), "signed"};
  bool got_mine = false;
  self->request(*remote, 10s, mine)
    .receive(
      [&](const llmgw::agent_proof& p) {
        got_mine = true;
        EXPECT_EQ(p.session, 10u);
        EXPECT_EQ(p.certificate, mine.certificate);
        EXPECT_EQ(p.signature, "signed");
      },
      [&](const caf::error& err) { ADD_FAILURE() << client.render(err); });
  EXPECT_TRUE(got_mine);
  self->send_exit(server_actor, caf::exit_reason::user_shutdown);
}
