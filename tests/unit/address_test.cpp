// The one parser of "HOST:PORT" and engine URLs (wire/address.hpp), which
// both the topology loader and the HTTP client use.
#include "wire/address.hpp"

#include <gtest/gtest.h>

using namespace llmgw::wire;

TEST(address, host_and_port) {
  auto hp = parse_host_port("10.0.0.1:8000");
  ASSERT_TRUE(hp);
  EXPECT_EQ(hp->host, "10.0.0.1");
  EXPECT_EQ(hp->port, 8000);
  auto v6 = parse_host_port("[::1]:65535");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 65535);
  for (const char* bad : {"", "host", ":80", "host:", "host:0", "host:65536", "host:123456",
                          "host:8a", "host:-1", "host: 80"})
    EXPECT_FALSE(parse_host_port(bad)) << bad;
}

TEST(address, engine_urls_are_http_host_port_without_a_path) {
  auto u = parse_http_url("http://gpu-7.example:8000/");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->host, "gpu-7.example");
  EXPECT_EQ(u->port, 8000);
  EXPECT_TRUE(parse_http_url("http://[fe80::1]:8000"));
  for (const char* bad : {"https://x:1", "http://x:1/v1", "http://x:1//", "http://x", "x:1",
                          "HTTP://x:1", "http://:1"})
    EXPECT_FALSE(parse_http_url(bad)) << bad;
}

TEST(address, loopback_hosts) {
  for (const char* h : {"localhost", "127.0.0.1", "127.1.2.3", "::1"})
    EXPECT_TRUE(is_loopback(h)) << h;
  for (const char* h :
       {"10.0.0.1", "localhost.example", "::2", "128.0.0.1", "", "127.example.com", "127."})
    EXPECT_FALSE(is_loopback(h)) << h;
}
