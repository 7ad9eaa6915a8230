// The topology file: what a valid one gives, and one test per kind of bad
// configuration, each checking the message and the line it points at.
#include "config/node_identity.hpp"
#include "config/pki.hpp"
#include "config/topology.hpp"
#include "wire/address.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <regex>

using namespace llmgw;
using namespace llmgw::config;

namespace {

/// A folder with a CA, four node certificates, and a second CA's node.
struct pki_dir {
  std::string dir;
  pki_dir() {
    char tmpl[] = "/tmp/llmgw-topology-XXXXXX";
    dir = ::mkdtemp(tmpl);
    EXPECT_EQ(ensure_ca(dir), "");
    for (const char* n : {"control-1", "control-2", "agent-a", "agent-b"})
      EXPECT_EQ(issue_node_certificate(dir, n, {"127.0.0.1"}), "");
    EXPECT_EQ(ensure_ca(dir + "/other"), "");
    EXPECT_EQ(issue_node_certificate(dir + "/other", "stranger", {}), "");
  }
  ~pki_dir() { std::system(("rm -rf " + dir).c_str()); }
};

const pki_dir& pki() {
  static pki_dir instance;
  return instance;
}

/// A valid topology; tests replace parts of it. Line numbers matter: the
/// tests below name them.
std::string valid_text() {
  return R"([cluster]
name = "test"
hash_seed = "0"
block_size = 16

[tls]
ca = "ca.pem"

[[node]]
name = "control-1"
host = "127.0.0.1"
port = 7100
roles = ["control"]
http = "127.0.0.1:8080"
cert = "control-1.pem"
key = "control-1.key"

[[node]]
name = "agent-a"
host = "127.0.0.1"
roles = ["agent"]
cert = "agent-a.pem"
key = "agent-a.key"

[[node.engine]]
replica = "a0"
model = "llama"
url = "http://127.0.0.1:8001"
kv_events = true
events_port = 5557
)";
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "the test's base text lacks: " << from;
  if (at != std::string::npos)
    text.replace(at, from.size(), to);
  return text;
}

topology_result parse(const std::string& text) {
  return parse_topology(text, pki().dir + "/cluster.toml");
}

/// The problems as "LINE: message" strings.
std::vector<std::string> problems_of(const std::string& text) {
  auto r = parse(text);
  EXPECT_FALSE(r.value) << "expected the topology to be refused";
  std::vector<std::string> out;
  for (const auto& p : r.problems)
    out.push_back(std::to_string(p.line) + ": " + p.message);
  return out;
}

/// True when some problem is on `line` (0: any) and contains `text`.
::testing::AssertionResult has_problem(const std::vector<std::string>& problems, int line,
                                       const std::string& text) {
  for (const auto& p : problems) {
    auto colon = p.find(':');
    int l = std::stoi(p.substr(0, colon));
    if ((line == 0 || l == line) && p.find(text) != std::string::npos)
      return ::testing::AssertionSuccess();
  }
  std::string all;
  for (const auto& p : problems)
    all += "\n  " + p;
  return ::testing::AssertionFailure()
         << "no problem on line " << line << " containing '" << text << "'; got:" << all;
}

} // namespace

TEST(topology, a_valid_file_gives_every_value) {
  auto text = valid_text() + R"(lora = ["sql", "chat"]
dp_size = 2
topic = "kv"

[[node.engine]]
replica = "a1"
model = "llama"
url = "http://127.0.0.1:8002"
launch = ["vllm", "serve", "llama"]

[router]
cpu_weight = 0.25
tie_margin = 0.1
prefill_ms_per_token = 0.5
step_ms = 8
tier1_ttl_s = 60
tokenize_cache_mib = 64
distrust_shortfall_share = 0.25

[gateway]
max_body_bytes = 1048576
request_timeout_ms = 120000
max_attempts = 2
)";
  auto r = parse(text);
  ASSERT_TRUE(r.value) << (r.problems.empty() ? "" : r.problems[0].to_string());
  const auto& t = *r.value;
  EXPECT_EQ(t.name, "test");
  EXPECT_EQ(t.seed, "0");
  EXPECT_EQ(t.block_size, 16u);
  EXPECT_EQ(t.flush_interval.count(), 250);
  EXPECT_EQ(t.ca, pki().dir + "/ca.pem") << "relative to the file's folder";
  EXPECT_FALSE(t.plaintext);
  ASSERT_EQ(t.nodes.size(), 2u);
  EXPECT_TRUE(t.nodes[0].roles.control);
  EXPECT_FALSE(t.nodes[0].roles.agent);
  EXPECT_EQ(t.nodes[0].http_host, "127.0.0.1");
  EXPECT_EQ(t.nodes[0].http_port, 8080);
  EXPECT_EQ(t.nodes[0].port, 7100);
  EXPECT_EQ(t.nodes[1].key, pki().dir + "/agent-a.key");
  ASSERT_EQ(t.nodes[1].engines.size(), 2u);
  const auto& e = t.nodes[1].engines[0];
  EXPECT_EQ(e.replica, "a0");
  EXPECT_EQ(e.lora, (std::vector<std::string>{"sql", "chat"}));
  EXPECT_EQ(e.dp_size, 2u);
  EXPECT_EQ(e.topic, "kv");
  EXPECT_EQ(e.events_port, 5557);
  EXPECT_TRUE(e.kv_events);
  EXPECT_TRUE(e.launch.empty());
  EXPECT_EQ(t.nodes[1].engines[1].launch.size(), 3u);
  EXPECT_FALSE(t.nodes[1].engines[1].kv_events);
  EXPECT_DOUBLE_EQ(t.router.cpu_weight, 0.25);
  EXPECT_DOUBLE_EQ(t.router.tie_margin, 0.1);
  EXPECT_DOUBLE_EQ(t.router.prefill_ms_per_token, 0.5);
  EXPECT_DOUBLE_EQ(t.router.step_ms, 8);
  EXPECT_DOUBLE_EQ(t.router.decode_ms_per_request, 0.1) << "the default stays";
  EXPECT_EQ(t.router.tier1_ttl.count(), 60);
  EXPECT_EQ(t.router.tokenize_cache_mib, 64u);
  EXPECT_DOUBLE_EQ(t.router.distrust_shortfall_share, 0.25);
  EXPECT_EQ(t.router.tokenize_cache_entries, 4096u) << "defaults stay";
  EXPECT_EQ(t.gateway.max_body_bytes, 1048576u);
  EXPECT_EQ(t.gateway.request_timeout.count(), 120000);
  EXPECT_EQ(t.gateway.max_attempts, 2u);
  EXPECT_EQ(t.gateway.max_connections, 4096u) << "defaults stay";
  EXPECT_EQ(t.owner_of("a1"), &t.nodes[1]);
  EXPECT_EQ(t.owner_of("zz"), nullptr);
  EXPECT_EQ(t.controls().size(), 1u);
}

TEST(topology, every_problem_is_listed_at_once) {
  auto text = replace(valid_text(), "block_size = 16", "block_size = \"16\"\ncolour = 3");
  text = replace(text, "roles = [\"agent\"]", "roles = [\"agent\", \"gpu\"]");
  auto p = problems_of(text);
  EXPECT_TRUE(has_problem(p, 4, "cluster.block_size must be an integer, not a string"));
  EXPECT_TRUE(has_problem(p, 5, "unknown key 'colour' in [cluster]"));
  EXPECT_TRUE(has_problem(p, 22, "unknown role 'gpu'"));
  EXPECT_EQ(p.size(), 3u);
}

TEST(topology, not_toml_names_the_line) {
  auto r = parse(replace(valid_text(), "port = 7100", "port = = 7100"));
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].message.find("not valid TOML"), std::string::npos);
  EXPECT_NE(r.problems[0].message.find("12 | port = = 7100"), std::string::npos)
    << r.problems[0].message;
}

TEST(topology, unknown_keys_everywhere) {
  auto text = replace(valid_text(), "events_port = 5557", "events_port = 5557\nmodel_path = \"x\"");
  text = replace(text, "http = \"127.0.0.1:8080\"", "http = \"127.0.0.1:8080\"\nweight = 2");
  text += "\n[metrics]\nport = 1\n";
  auto p = problems_of(text);
  EXPECT_TRUE(has_problem(p, 15, "unknown key 'weight' in node[0]"));
  EXPECT_TRUE(has_problem(p, 32, "unknown key 'model_path' in node 'agent-a' engine[0]"));
  EXPECT_TRUE(has_problem(p, 0, "unknown key 'metrics' in the top level"));
}

TEST(topology, wrong_types) {
  auto text = replace(valid_text(), "port = 7100", "port = \"7100\"");
  text = replace(text, "kv_events = true", "kv_events = \"yes\"");
  text = replace(text, "roles = [\"control\"]", "roles = \"control\"");
  auto p = problems_of(text);
  EXPECT_TRUE(has_problem(p, 12, "port must be an integer, not a string"));
  EXPECT_TRUE(has_problem(p, 13, "roles must be an array of strings, not a string"));
  EXPECT_TRUE(has_problem(p, 29, "kv_events must be true or false"));
}

TEST(topology, missing_values) {
  auto text = replace(valid_text(), "model = \"llama\"\n", "");
  text = replace(text, "name = \"test\"\n", "");
  auto p = problems_of(text);
  EXPECT_TRUE(has_problem(p, 0, "[cluster] needs 'name'"));
  EXPECT_TRUE(has_problem(p, 0, "needs 'model'"));
  EXPECT_TRUE(has_problem(problems_of("[tls]\nplaintext = true\n"), 0, "missing [cluster]"));
}

TEST(topology, seeds_vllm_cannot_reproduce_are_refused) {
  EXPECT_TRUE(has_problem(problems_of(replace(valid_text(), "\"0\"", "\"random\"")), 3,
                          "must be a decimal integer"));
  EXPECT_TRUE(has_problem(problems_of(replace(valid_text(), "\"0\"", "\"4294967296\"")), 3,
                          "must be a decimal integer"));
  EXPECT_TRUE(has_problem(problems_of(replace(valid_text(), "\"0\"", "0")), 3,
                          "must be a string (PYTHONHASHSEED is text): write \"0\""));
}

TEST(topology, numbers_out_of_range) {
  auto text = replace(valid_text(), "port = 7100", "port = 70000");
  text = replace(text, "block_size = 16", "block_size = 0");
  auto p = problems_of(text);
  EXPECT_TRUE(has_problem(p, 12, "port = 70000 is out of range [0, 65535]"));
  EXPECT_TRUE(has_problem(p, 4, "block_size = 0 is out of range"));
  EXPECT_TRUE(has_problem(
    problems_of(replace(valid_text(), "block_size = 16", "block_size = 16\nheartbeat_ms = 3000")),
    1, "connection_timeout_ms (5000) must exceed twice heartbeat_ms"));
  EXPECT_TRUE(has_problem(problems_of(valid_text() + "[router]\ntokenize_cache_mib = -1\n"), 0,
                          "tokenize_cache_mib = -1 is out of range [0, 1048576]"));
  EXPECT_TRUE(has_problem(problems_of(valid_text() + "[router]\nprefill_ms_per_token = 0\n"), 0,
                          "prefill_ms_per_token = 0 must be between 0.0001 and 100"));
  EXPECT_TRUE(has_problem(problems_of(valid_text() + "[router]\nhot_spot_threshold = 16\n"), 0,
                          "router.hot_spot_threshold is gone"));
  EXPECT_TRUE(has_problem(problems_of(valid_text() + "[gateway]\nhealth_interval_ms = 10\n"), 0,
                          "health_interval_ms = 10 probes too often"));
  EXPECT_TRUE(has_problem(problems_of(valid_text() + "[gateway]\nfirst_byte_timeout_ms = 50\n"), 0,
                          "first_byte_timeout_ms = 50 is shorter than any engine answers"));
  auto none = parse(valid_text() + "[gateway]\nfirst_byte_timeout_ms = 0\n");
  ASSERT_TRUE(none.value) << "0: no first-byte deadline";
  EXPECT_EQ(none.value->gateway.first_byte_timeout.count(), 0);
  EXPECT_TRUE(has_problem(problems_of(valid_text() + "[router]\ndistrust_shortfall_share = 1.5\n"),
                          0, "distrust_shortfall_share = 1.5 must be between 0 and 1"));
}

TEST(topology, duplicate_names_and_addresses) {
  auto text = valid_text() + R"(
[[node]]
name = "agent-a"
host = "127.0.0.1"
port = 7100
roles = ["control"]
http = "127.0.0.1:8080"
cert = "agent-b.pem"
key = "agent-b.key"

[[node.engine]]
replica = "a0"
model = "llama"
url = "http://127.0.0.1:8003"
)";
  auto p = problems_of(text);
  EXPECT_TRUE(has_problem(p, 0, "node name 'agent-a' is used twice"));
  EXPECT_TRUE(has_problem(p, 0, "127.0.0.1:7100 is already node 'control-1''s address"));
  EXPECT_TRUE(has_problem(p, 0, "http 127.0.0.1:8080 is already used by node 'control-1'"));
  EXPECT_TRUE(has_problem(p, 0, "has engines but not the agent role"));
  EXPECT_TRUE(has_problem(p, 41, "replica 'a0' is defined twice"));
}

TEST(topology, wildcard_http_addresses_clash_only_on_one_host) {
  auto two = valid_text() + R"(
[[node]]
name = "control-2"
host = "127.0.0.2"
port = 7100
roles = ["control"]
http = "0.0.0.0:8080"
cert = "control-2.pem"
key = "control-2.key"
)";
  two = replace(two, "http = \"127.0.0.1:8080\"", "http = \"0.0.0.0:8080\"");
  EXPECT_TRUE(parse(two).value) << "different machines";
  auto p = problems_of(replace(two, "host = \"127.0.0.2\"", "host = \"127.0.0.1\""));
  EXPECT_TRUE(has_problem(p, 0, "http 127.0.0.1:8080 is already used by node 'control-1'"));
}

TEST(topology, tls_files_are_checked_before_anything_starts) {
  auto p = problems_of(replace(valid_text(), "key = \"control-1.key\"", "key = \"agent-a.key\""));
  EXPECT_TRUE(has_problem(p, 15, "does not belong to certificate"));
  p = problems_of(replace(valid_text(), "cert = \"agent-a.pem\"\nkey = \"agent-a.key\"",
                          "cert = \"other/stranger.pem\"\nkey = \"other/stranger.key\""));
  EXPECT_TRUE(has_problem(p, 22, "is not valid under CA"));
  p = problems_of(replace(valid_text(), "ca = \"ca.pem\"", "ca = \"missing.pem\""));
  EXPECT_TRUE(has_problem(p, 7, "cannot read CA file"));
  p = problems_of(replace(valid_text(), "cert = \"control-1.pem\"", "cert = \"nope.pem\""));
  EXPECT_TRUE(has_problem(p, 15, "cannot read certificate"));
  p = problems_of(replace(valid_text(), "cert = \"control-1.pem\"", "cert = \"control-1.key\""));
  EXPECT_TRUE(has_problem(p, 15, "is not a PEM certificate"));
  p = problems_of(replace(valid_text(), "cert = \"control-1.pem\"\n", ""));
  EXPECT_TRUE(has_problem(p, 0, "node 'control-1' needs cert and key"));
}

TEST(topology, a_certificate_must_name_its_node_and_be_among_its_fingerprints) {
  // agent-b's own pair, given to agent-a: other nodes would refuse it.
  auto p = problems_of(replace(valid_text(), "cert = \"agent-a.pem\"\nkey = \"agent-a.key\"",
                               "cert = \"agent-b.pem\"\nkey = \"agent-b.key\""));
  EXPECT_TRUE(has_problem(p, 22, "does not name node 'agent-a'"));
  auto id = node_identity::load("agent-a", pki().dir + "/agent-a.pem", pki().dir + "/agent-a.key",
                                pki().dir + "/ca.pem");
  ASSERT_TRUE(id);
  auto fp = (*id)->fingerprint();
  // Listed in another form (upper case, colons): the same certificate.
  std::string colons = "SHA256:";
  for (std::size_t i = 7; i < fp.size(); i += 2)
    colons += (i > 7 ? ":" : "") + fp.substr(i, 2);
  for (auto& c : colons)
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  auto listed = parse(replace(valid_text(), "key = \"agent-a.key\"\n",
                              "key = \"agent-a.key\"\nfingerprints = [\"" + colons + "\"]\n"));
  ASSERT_TRUE(listed.value);
  EXPECT_EQ(listed.value->find_node("agent-a")->fingerprints, std::vector<std::string>{fp});
  auto revoked = std::string("sha256:") + std::string(64, 'a');
  p = problems_of(replace(valid_text(), "key = \"agent-a.key\"\n",
                          "key = \"agent-a.key\"\nfingerprints = [\"" + revoked + "\"]\n"));
  EXPECT_TRUE(has_problem(p, 24, "is not among its fingerprints: other nodes would refuse it"));
  p = problems_of(replace(valid_text(), "key = \"agent-a.key\"\n",
                          "key = \"agent-a.key\"\nfingerprints = [\"sha256:12\"]\n"));
  EXPECT_TRUE(has_problem(p, 24, "fingerprint 'sha256:12' is not a SHA-256 fingerprint"));
}

TEST(topology, plaintext_only_on_loopback) {
  auto text = replace(valid_text(), "ca = \"ca.pem\"", "plaintext = true");
  for (const char* f : {"cert = \"control-1.pem\"\n", "key = \"control-1.key\"\n",
                        "cert = \"agent-a.pem\"\n", "key = \"agent-a.key\"\n"})
    text = replace(text, f, "");
  EXPECT_TRUE(parse(text).value) << "loopback-only plaintext is allowed";
  auto p = problems_of(replace(text, "host = \"127.0.0.1\"\nroles = [\"agent\"]",
                               "host = \"10.0.0.7\"\nroles = [\"agent\"]"));
  EXPECT_TRUE(has_problem(p, 0, "node 'agent-a' is on 10.0.0.7 but [tls] plaintext = true"));
  p = problems_of(replace(valid_text(), "[tls]\nca = \"ca.pem\"\n", ""));
  EXPECT_TRUE(has_problem(p, 0, "missing [tls]"));
}

TEST(topology, roles_need_what_they_use) {
  auto p = problems_of(replace(valid_text(), "http = \"127.0.0.1:8080\"\n", ""));
  EXPECT_TRUE(has_problem(p, 0, "is a control node: it needs http"));
  p = problems_of(replace(valid_text(), "roles = [\"control\"]", "roles = [\"agent\"]"));
  EXPECT_TRUE(has_problem(p, 0, "no node has the control role"));
  EXPECT_TRUE(has_problem(p, 14, "http is only for control nodes"));
  p = problems_of(replace(valid_text(), "port = 7100\n", ""));
  EXPECT_TRUE(has_problem(p, 0, "needs a port agents connect to"));
  p = problems_of(replace(valid_text(), "http = \"127.0.0.1:8080\"", "http = \"8080\""));
  EXPECT_TRUE(has_problem(p, 14, "must be HOST:PORT"));
}

TEST(topology, engines_are_checked) {
  auto p = problems_of(replace(valid_text(), "events_port = 5557\n", ""));
  EXPECT_TRUE(has_problem(p, 25, "is attached with kv_events = true: set events = "));
  p = problems_of(replace(valid_text(), "http://127.0.0.1:8001", "https://gpu/v1"));
  EXPECT_TRUE(has_problem(p, 28, "must be http://HOST:PORT"));
  p = problems_of(valid_text() + "launch = []\n");
  EXPECT_TRUE(has_problem(p, 31, "launch is empty"));
  p =
    problems_of(valid_text() + "launch = [\"vllm\"]\nreplay_endpoint = \"tcp://127.0.0.1:5558\"\n");
  EXPECT_TRUE(has_problem(p, 32, "replay_endpoint is for attached engines"));
  p = problems_of(valid_text() + "lora = [\"x\", \"x\"]\nreplica_id = 1\n");
  EXPECT_TRUE(has_problem(p, 31, "lists 'x' twice"));
  EXPECT_TRUE(has_problem(p, 32, "unknown key 'replica_id'"));
  p = problems_of(replace(valid_text(), "replica = \"a0\"", "replica = \"a 0\""));
  EXPECT_TRUE(has_problem(p, 26, "replica 'a 0': use letters"));
}

TEST(topology, an_engine_that_binds_is_reached_at_its_address) {
  auto text = replace(valid_text(), "events_port = 5557\n", "");
  auto t = parse(text
                 + "events = \"tcp://10.0.0.5:5557\"\ndp_size = 2\n"
                   "replay_endpoint = \"tcp://10.0.0.5:5600\"\n");
  ASSERT_TRUE(t.value);
  const auto& e = t.value->find_node("agent-a")->engines.at(0);
  EXPECT_EQ(e.events, "tcp://10.0.0.5:5557");
  EXPECT_TRUE(e.translate_keys) << "the default: keyed by the cluster's hash";
  auto notes = events_notes(e);
  ASSERT_EQ(notes.size(), 3u);
  EXPECT_NE(notes[0].find("connects to tcp://10.0.0.5:5557 (rank r at port + r, 2 ranks)"),
            std::string::npos)
    << notes[0];
  EXPECT_NE(notes[0].find("tcp://127.0.0.1:5557 or tcp://0.0.0.0:5557, makes vLLM connect out"),
            std::string::npos)
    << "the trap is explained";
  EXPECT_EQ(notes[1].rfind("warning: a0's KV events come from 10.0.0.5", 0), 0u) << notes[1];
  EXPECT_NE(notes[1].find("plaintext and unauthenticated"), std::string::npos);
  EXPECT_EQ(notes[2].rfind("warning: a0's replay endpoint", 0), 0u) << notes[2];
  auto local = parse(text + "events = \"tcp://[::1]:5557\"\n");
  ASSERT_TRUE(local.value);
  EXPECT_EQ(events_notes(local.value->find_node("agent-a")->engines.at(0)).size(), 1u)
    << "loopback: no warning";

  auto p = problems_of(text + "events = \"tcp://*:5557\"\n");
  EXPECT_TRUE(has_problem(p, 30,
                          "is where vLLM binds, not where to reach it: write its host, "
                          "e.g. tcp://127.0.0.1:5557"));
  p = problems_of(text + "events = \"ipc:///tmp/x\"\n");
  EXPECT_TRUE(has_problem(p, 30, "must be tcp://HOST:PORT"));
  p = problems_of(valid_text() + "events = \"tcp://10.0.0.5:5557\"\n");
  EXPECT_TRUE(has_problem(p, 31,
                          "sets both events (the engine binds, the agent connects) and "
                          "events_port"));
  p = problems_of(replace(text, "kv_events = true\n", "") + "events = \"tcp://h:5557\"\n");
  EXPECT_TRUE(has_problem(p, 29, "events names where its KV events are: set kv_events = true"));
  p = problems_of(text + "events = \"tcp://h:65535\"\ndp_size = 2\n");
  EXPECT_TRUE(has_problem(p, 30, "the events port + dp_size - 1 exceeds 65535"));
  p = problems_of(text + "events = \"tcp://h:5557\"\nreplay_endpoint = \"tcp://*:5558\"\n");
  EXPECT_TRUE(has_problem(p, 31, "must be tcp://HOST:PORT with the engine's address"));
}

TEST(topology, block_keys_say_whose_hashes_key_the_blocks) {
  auto t = parse(valid_text() + "block_keys = \"engine\"\n");
  ASSERT_TRUE(t.value);
  EXPECT_FALSE(t.value->find_node("agent-a")->engines.at(0).translate_keys);
  t = parse(valid_text() + "block_keys = \"translate\"\n");
  ASSERT_TRUE(t.value);
  EXPECT_TRUE(t.value->find_node("agent-a")->engines.at(0).translate_keys);
  auto p = problems_of(valid_text() + "block_keys = \"sha256\"\n");
  EXPECT_TRUE(has_problem(p, 31, "block_keys 'sha256': \"translate\""));
}

TEST(topology, an_engine_that_connects_out_is_told_where) {
  auto t = parse(valid_text());
  ASSERT_TRUE(t.value);
  auto notes = events_notes(t.value->find_node("agent-a")->engines.at(0));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("the agent binds tcp://127.0.0.1:5557; start the engine with an "
                          "endpoint that connects there"),
            std::string::npos)
    << notes[0];
  EXPECT_NE(notes[0].find("its default tcp://*:5557 would not meet the agent"), std::string::npos);
}

TEST(topology, overlapping_event_ports_on_one_node) {
  auto text = valid_text() + R"(dp_size = 4

[[node.engine]]
replica = "a1"
model = "llama"
url = "http://127.0.0.1:8002"
kv_events = true
events_port = 5560
)";
  auto p = problems_of(text);
  EXPECT_TRUE(has_problem(p, 33,
                          "replica 'a1' events ports 5560..5560 overlap replica 'a0''s "
                          "events ports 5557..5560 on loopback"));
  EXPECT_TRUE(parse(replace(text, "events_port = 5560", "events_port = 5561")).value);
  // The agent connecting to a port it binds itself for another engine.
  p = problems_of(replace(text, "events_port = 5560", "events = \"tcp://localhost:5559\""));
  EXPECT_TRUE(has_problem(p, 33, "replica 'a1' events ports 5559..5559 overlap"));
  // Two engines at one remote engine's ranks, or its events and replay.
  auto remote = replace(replace(text, "events_port = 5560", "events = \"tcp://10.0.0.5:5558\""),
                        "events_port = 5557", "events = \"tcp://10.0.0.5:5557\"");
  p = problems_of(remote);
  EXPECT_TRUE(has_problem(p, 33,
                          "replica 'a1' events ports 5558..5558 overlap replica 'a0''s "
                          "events ports 5557..5560 at 10.0.0.5"));
  p = problems_of(replace(remote, "events = \"tcp://10.0.0.5:5558\"",
                          "events = \"tcp://10.0.0.6:5557\"\nreplay_endpoint = "
                          "\"tcp://10.0.0.5:5559\""));
  EXPECT_TRUE(has_problem(p, 33, "replay ports 5559..5559 overlap replica 'a0''s events ports"));
  EXPECT_TRUE(parse(replace(remote, "tcp://10.0.0.5:5558", "tcp://10.0.0.6:5557")).value)
    << "another host: no clash";
}

TEST(topology, events_endpoints_are_addresses_to_reach) {
  auto text = replace(valid_text(), "events_port = 5557\n", "");
  for (const char* bad : {"tcp://0.0.0.0:5557", "tcp://[::]:5557"}) {
    auto p = problems_of(text + "events = \"" + bad + "\"\n");
    EXPECT_TRUE(has_problem(p, 30, "is where vLLM binds, not where to reach it")) << bad;
  }
  for (const char* bad :
       {"tcp://fe80::1:5557", "tcp://[:5557", "tcp://[]:5557", "tcp:// :5557", "tcp://h/x:5557"}) {
    auto p = problems_of(text + "events = \"" + bad + "\"\n");
    EXPECT_TRUE(has_problem(p, 30, "must be tcp://HOST:PORT")) << bad;
  }
  auto v6 = parse(text + "events = \"tcp://[fe80::1]:5557\"\n");
  ASSERT_TRUE(v6.value);
  auto at = wire::parse_tcp_endpoint(v6.value->find_node("agent-a")->engines.at(0).events);
  ASSERT_TRUE(at);
  EXPECT_EQ(at->host, "fe80::1");
  EXPECT_EQ(wire::tcp_endpoint(*at, 1), "tcp://[fe80::1]:5558");
}

TEST(topology, an_unreadable_file) {
  auto r = load_topology("/nonexistent/cluster.toml");
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].to_string(),
            "/nonexistent/cluster.toml: cannot read the file: No such file or directory");
}

TEST(topology, hostile_files_are_refused_without_reading_them_whole) {
  // Nesting that overflowed toml11's stack: refused before parsing.
  auto deep = problems_of("a = " + std::string(100000, '[') + std::string(100000, ']') + "\n");
  EXPECT_TRUE(has_problem(deep, 1, "nest deeper than 32")) << "no crash, a problem";
  auto tables = problems_of("b = " + std::string(50000, '{') + "\n");
  EXPECT_TRUE(has_problem(tables, 1, "nest deeper than 32"));
  // Brackets in strings and comments are not nesting.
  auto text = valid_text() + "# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n";
  text = replace(text, "model = \"llama\"", "model = \"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"");
  EXPECT_TRUE(parse(text).value) << "brackets in a string or comment do not nest";
  char tmpl[] = "/tmp/llmgw-hostile-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  ASSERT_EQ(::symlink("/dev/zero", (dir + "/zero.toml").c_str()), 0);
  auto zero = load_topology(dir + "/zero.toml");
  ASSERT_EQ(zero.problems.size(), 1u);
  EXPECT_EQ(zero.problems[0].message, "not a regular file");
  auto folder = load_topology(dir);
  ASSERT_EQ(folder.problems.size(), 1u);
  EXPECT_EQ(folder.problems[0].message, "not a regular file");
  {
    std::ofstream big(dir + "/big.toml");
    big << std::string(max_topology_bytes + 1, '#');
  }
  auto huge = load_topology(dir + "/big.toml");
  ASSERT_EQ(huge.problems.size(), 1u);
  EXPECT_NE(huge.problems[0].message.find("a topology may have 4194304 at most"), std::string::npos)
    << huge.problems[0].message;
  auto missing = load_topology(dir + "/nope.toml");
  ASSERT_EQ(missing.problems.size(), 1u);
  EXPECT_EQ(missing.problems[0].message, "cannot read the file: No such file or directory");
  std::system(("rm -rf " + dir).c_str());
}

TEST(topology, dotted_keys_too_long_to_parse_in_time_are_refused) {
  // toml11 took minutes on this; refused before it parses.
  std::string dotted;
  for (int i = 0; i < 200000; ++i)
    dotted += "a.";
  auto key = problems_of(dotted + "b = 1\n");
  EXPECT_TRUE(has_problem(key, 1, "more than 64 dots outside strings on one line"));
  auto header = problems_of("[" + dotted + "b]\n");
  EXPECT_TRUE(has_problem(header, 1, "more than 64 dots"));
  auto text = replace(valid_text(), "model = \"llama\"",
                      "model = \"" + std::string(100, '.') + "\" # " + std::string(100, '.'));
  EXPECT_TRUE(parse(text).value) << "dots in strings and comments are fine";
}

TEST(topology, a_node_checks_its_own_key_and_needs_no_other_nodes) {
  // On control-1's host there is no agent-a key: holding it would be being
  // agent-a.
  auto text = replace(valid_text(), "key = \"agent-a.key\"", "key = \"not-here.key\"");
  auto all = parse(text);
  EXPECT_FALSE(all.value) << "llmgw check looks at every node's files";
  topology_options mine;
  mine.tls_files_of = "control-1";
  auto own = parse_topology(text, pki().dir + "/cluster.toml", mine);
  EXPECT_TRUE(own.value) << (own.problems.empty() ? "" : own.problems[0].to_string());
  mine.tls_files_of = "agent-a";
  EXPECT_FALSE(parse_topology(text, pki().dir + "/cluster.toml", mine).value);
}

TEST(topology, text_that_is_not_utf8_is_refused_before_toml11_reads_past_it) {
  // The fuzzer's finding: toml11 read past its buffer on this.
  auto p = problems_of("a = '\xdb'\n");
  EXPECT_TRUE(has_problem(p, 1, "not UTF-8 here"));
  p = problems_of("# fine\nname = \"\xc3\x28\"\n");
  EXPECT_TRUE(has_problem(p, 2, "not UTF-8 here"));
  auto text = replace(valid_text(), "model = \"llama\"", "model = \"llama \xc3\xa9\xe2\x82\xac\"");
  EXPECT_TRUE(parse(text).value) << "valid UTF-8 is fine";
}

TEST(topology, an_engine_names_whose_it_is_and_what_that_rules_out) {
  auto t = parse(valid_text() + "engine = \"sglang\"\n");
  ASSERT_TRUE(t.value) << (t.problems.empty() ? "" : t.problems[0].message);
  const auto& e = t.value->find_node("agent-a")->engines.at(0);
  EXPECT_EQ(e.kind, engine_kind::sglang);
  EXPECT_EQ(std::string(block_size_flag(e.kind)), "--page-size");
  EXPECT_EQ(parse(valid_text()).value->find_node("agent-a")->engines.at(0).kind, engine_kind::vllm);
  auto p = problems_of(valid_text() + "engine = \"tgi\"\n");
  EXPECT_TRUE(has_problem(p, 31, "engine 'tgi': \"vllm\" (the default), \"sglang\" or \"trtllm\""));
  p = problems_of(valid_text() + "engine = \"sglang\"\nblock_keys = \"engine\"\n");
  EXPECT_TRUE(has_problem(p, 32, "sglang never hashes blocks the cluster's way"));
  p = problems_of(replace(valid_text(), "events_port = 5557\n",
                          "launch = [\"trtllm-serve\", \"m\"]\nengine = \"trtllm\"\n"));
  EXPECT_TRUE(has_problem(p, 30, "TensorRT-LLM sets its KV events in trtllm-serve's YAML"));
}

TEST(topology, an_sglang_engine_that_binds_is_told_sglangs_rule) {
  auto t = parse(replace(valid_text(), "events_port = 5557\n",
                         "events = \"tcp://127.0.0.1:5557\"\nengine = \"sglang\"\n"));
  ASSERT_TRUE(t.value) << (t.problems.empty() ? "" : t.problems[0].message);
  auto notes = events_notes(t.value->find_node("agent-a")->engines.at(0));
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes[0].find("SGLang must bind there"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("tcp://0.0.0.0:PORT"), std::string::npos) << notes[0];
  t = parse(replace(valid_text(), "events_port = 5557\n",
                    "events = \"tcp://127.0.0.1:5557\"\nengine = \"sglang\"\nlora = [\"sql\"]\n"));
  ASSERT_TRUE(t.value);
  notes = events_notes(t.value->find_node("agent-a")->engines.at(0));
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[1].find("warning: sglang publishes no LoRA adapter with its blocks"),
            std::string::npos)
    << notes[1];
}
