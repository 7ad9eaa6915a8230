#include "config/engine_command.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw::config;

TEST(engine_command, adds_seed_hash_algo_and_events_config) {
  engine_launch_options o;
  o.command = {"vllm", "serve", "Qwen/Qwen3-8B", "--block-size", "16"};
  o.seed = "0";
  o.block_size = 32;
  o.kv_events = true;
  o.events_endpoint = "tcp://127.0.0.1:41000";
  o.replay_endpoint = "tcp://127.0.0.1:41001";
  o.topic = "kv";
  auto l = make_engine_launch(o);
  ASSERT_EQ(l.argv.size(), 9u);
  EXPECT_EQ(l.argv[3], "--prefix-caching-hash-algo");
  EXPECT_EQ(l.argv[4], "sha256_cbor");
  EXPECT_EQ(l.argv[5], "--block-size") << "the cluster's, replacing the command's 16";
  EXPECT_EQ(l.argv[6], "32");
  EXPECT_EQ(l.argv[7], "--kv-events-config");
  auto cfg = boost::json::parse(l.argv[8]).as_object();
  EXPECT_EQ(cfg.at("enable_kv_cache_events").as_bool(), true);
  EXPECT_EQ(cfg.at("publisher").as_string(), "zmq");
  EXPECT_EQ(cfg.at("endpoint").as_string(), "tcp://127.0.0.1:41000");
  EXPECT_EQ(cfg.at("replay_endpoint").as_string(), "tcp://127.0.0.1:41001");
  EXPECT_EQ(cfg.at("topic").as_string(), "kv");
  ASSERT_EQ(l.env.size(), 1u);
  EXPECT_EQ(l.env[0], std::make_pair(std::string("PYTHONHASHSEED"), std::string("0")));
}

TEST(engine_command, replaces_the_operators_own_flags) {
  engine_launch_options o;
  o.command = {
    "vllm",   "serve", "m", "--prefix-caching-hash-algo", "sha256", "--kv-events-config={}",
    "--port", "8000"};
  o.seed = "7";
  auto l = make_engine_launch(o);
  EXPECT_EQ(l.argv, (std::vector<std::string>{"vllm", "serve", "m", "--port", "8000",
                                              "--prefix-caching-hash-algo", "sha256_cbor"}))
    << "without kv_events no events config is passed, and the operator's is dropped";
}

TEST(engine_command, sglang_gets_its_page_size_and_events_config_and_no_hash_algorithm) {
  engine_launch_options o;
  o.kind = engine_kind::sglang;
  o.command = {"python3", "-m", "sglang.launch_server", "--model-path", "m", "--page-size", "1"};
  o.seed = "0";
  o.block_size = 16;
  o.kv_events = true;
  o.events_endpoint = "tcp://127.0.0.1:41000";
  auto l = make_engine_launch(o);
  ASSERT_EQ(l.argv.size(), 9u);
  EXPECT_EQ(l.argv[5], "--page-size") << "the cluster's, replacing the command's 1";
  EXPECT_EQ(l.argv[6], "16");
  EXPECT_EQ(l.argv[7], "--kv-events-config");
  auto cfg = boost::json::parse(l.argv[8]).as_object();
  EXPECT_FALSE(cfg.contains("enable_kv_cache_events"));
  EXPECT_EQ(cfg.at("endpoint").as_string(), "tcp://127.0.0.1:41000");
  for (const auto& a : l.argv)
    EXPECT_EQ(a.find("prefix-caching"), std::string::npos) << a;
}
