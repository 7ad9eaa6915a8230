// Reading an engine's load from its /metrics: vLLM's gauges per data-parallel
// rank, older names, and what a broken or hostile body gets.
#include "wire/engine_gauges.hpp"

#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw::wire;

namespace {

/// Two ranks as vLLM writes them (labels model_name and engine), among
/// families the reader must skip, some sharing the gauges' prefix.
const char* two_ranks =
  R"(# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B"} 0.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B"} 0.75
vllm:num_requests_running_extra{engine="0"} 99
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 0.0
python_gc_objects_collected_total{generation="0"} 1234.0
)";

} // namespace

TEST(engine_gauges, ranks_are_summed_and_usage_averaged) {
  auto g = read_engine_gauges(two_ranks);
  ASSERT_TRUE(g) << g.err().message;
  EXPECT_EQ(g->running, 7u);
  EXPECT_EQ(g->waiting, 5u);
  EXPECT_DOUBLE_EQ(g->kv_usage, 0.5);
  EXPECT_EQ(g->ranks, 2u);
}

TEST(engine_gauges, older_usage_name_labels_with_braces_and_timestamps) {
  auto g = read_engine_gauges("vllm:num_requests_running 2 1700000000000\n"
                              "vllm:num_requests_waiting{model_name=\"a}b\\\"c\"} 1\n"
                              "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n");
  ASSERT_TRUE(g) << g.err().message;
  EXPECT_EQ(g->running, 2u);
  EXPECT_EQ(g->waiting, 1u);
  EXPECT_DOUBLE_EQ(g->kv_usage, 0.5);
  auto no_usage = read_engine_gauges("vllm:num_requests_running 0\nvllm:num_requests_waiting 0");
  ASSERT_TRUE(no_usage);
  EXPECT_LT(no_usage->kv_usage, 0) << "unknown, not zero";
}

TEST(engine_gauges, bad_bodies_say_what_and_where) {
  struct bad {
    const char* body;
    errc code;
    const char* says;
  };
  for (const auto& b : {
         bad{"vllm:num_requests_waiting 0\n", errc::truncated, "no vllm:num_requests_running"},
         bad{"vllm:num_requests_running 0\n", errc::truncated, "no vllm:num_requests_waiting"},
         bad{"", errc::truncated, "no vllm:num_requests_running"},
         bad{"vllm:num_requests_running 1\nvllm:num_requests_waiting NaN\n", errc::bad_value,
             "line 2 (vllm:num_requests_waiting)"},
         bad{"vllm:num_requests_running -1\n", errc::bad_value, "line 1"},
         bad{"vllm:num_requests_running 1e7\n", errc::bad_value, "out of range"},
         bad{"vllm:num_requests_running 3x\n", errc::bad_value, "'3x'"},
         bad{"vllm:num_requests_running{engine=\"0\" 3\n", errc::truncated, "does not close"},
         bad{"vllm:num_requests_running{engine=\"0\"}\n", errc::truncated, "no value"},
         bad{"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
             "vllm:kv_cache_usage_perc 1.5\n",
             errc::bad_value, "line 3"},
         bad{"vllm:num_requests_running{engine=\"0\"} 600000\n"
             "vllm:num_requests_running{engine=\"1\"} 600000\nvllm:num_requests_waiting 0\n",
             errc::bad_value, "add up"},
       }) {
    auto g = read_engine_gauges(b.body);
    ASSERT_FALSE(g) << b.body;
    EXPECT_EQ(g.err().code, b.code) << b.body;
    EXPECT_NE(g.err().message.find(b.says), std::string::npos) << g.err().message;
  }
}

TEST(engine_gauges, sglangs_names_are_read_alike) {
  // SGLang with --enable-metrics, two DP ranks (its labels).
  auto g = read_engine_gauges(
    R"(# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 2.0
sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 1.0
sglang:num_queue_reqs{dp_rank="0",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 4.0
sglang:num_queue_reqs{dp_rank="1",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.0
sglang:token_usage{dp_rank="0",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.5
sglang:token_usage{dp_rank="1",engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 0.1
sglang:cache_hit_rate{dp_rank="0",model_name="m"} 0.9
)");
  ASSERT_TRUE(g) << g.err().message;
  EXPECT_EQ(g->running, 3u);
  EXPECT_EQ(g->waiting, 4u);
  EXPECT_DOUBLE_EQ(g->kv_usage, 0.3);
  EXPECT_EQ(g->ranks, 2u);
}
