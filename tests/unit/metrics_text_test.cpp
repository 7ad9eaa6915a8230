// Prometheus text: the exact bytes of each kind of family.
#include "wire/metrics_text.hpp"

#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw::wire;

TEST(metrics_text, families_are_grouped_with_help_and_type) {
  metrics_text m;
  m.counter("llmgw_decisions_total", "Routing decisions.", 3, {{"tier", "kv"}});
  m.gauge("llmgw_blocks", "Blocks held.", 12.5, {{"replica", "r0"}});
  m.counter("llmgw_decisions_total", "Routing decisions.", 4, {{"tier", "load"}});
  m.gauge("llmgw_up", "Always 1.", 1);
  EXPECT_EQ(m.str(), "# HELP llmgw_decisions_total Routing decisions.\n"
                     "# TYPE llmgw_decisions_total counter\n"
                     "llmgw_decisions_total{tier=\"kv\"} 3\n"
                     "llmgw_decisions_total{tier=\"load\"} 4\n"
                     "# HELP llmgw_blocks Blocks held.\n"
                     "# TYPE llmgw_blocks gauge\n"
                     "llmgw_blocks{replica=\"r0\"} 12.5\n"
                     "# HELP llmgw_up Always 1.\n"
                     "# TYPE llmgw_up gauge\n"
                     "llmgw_up 1\n");
}

TEST(metrics_text, label_values_are_escaped) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  metrics_text m;
  m.gauge("x", "h", 1, {{"node", "we\"ird"}, {"r", "2"}});
  EXPECT_NE(m.str().find("x{node=\"we\\\"ird\",r=\"2\"} 1\n"), std::string::npos) << m.str();
}

TEST(metrics_text, histograms_have_cumulative_buckets_sum_and_count) {
  histogram h({0.001, 0.01, 0.1});
  for (double v : {0.0005, 0.002, 0.003, 0.5})
    h.observe(v);
  metrics_text m;
  m.histogram("lat_seconds", "Latency.", h, {{"tier", "kv"}});
  EXPECT_EQ(m.str(), "# HELP lat_seconds Latency.\n"
                     "# TYPE lat_seconds histogram\n"
                     "lat_seconds_bucket{tier=\"kv\",le=\"0.001\"} 1\n"
                     "lat_seconds_bucket{tier=\"kv\",le=\"0.01\"} 3\n"
                     "lat_seconds_bucket{tier=\"kv\",le=\"0.1\"} 3\n"
                     "lat_seconds_bucket{tier=\"kv\",le=\"+Inf\"} 4\n"
                     "lat_seconds_sum{tier=\"kv\"} 0.5055\n"
                     "lat_seconds_count{tier=\"kv\"} 4\n");
}

TEST(metrics_text, histogram_quantiles_interpolate_within_a_bucket) {
  histogram h({1, 2, 4});
  for (int i = 0; i < 10; ++i)
    h.observe(1.5); // all in (1, 2]
  EXPECT_DOUBLE_EQ(h.quantile(0.5), 1.5);
  EXPECT_DOUBLE_EQ(h.quantile(1.0), 2.0);
  h.observe(100);
  EXPECT_DOUBLE_EQ(h.quantile(1.0), 4.0) << "+Inf reports the largest finite bound";
  EXPECT_DOUBLE_EQ(histogram({1}).quantile(0.5), 0.0);
}
