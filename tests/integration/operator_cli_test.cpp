// The operator's commands for a cluster as a user runs them: llmgw certs,
// llmgw check, and llmgw node refusing what it cannot run.
#include "tests/integration/test_cluster.hpp"
#include "tests/support/child_process.hpp"

#include <gtest/gtest.h>

#include <fstream>

using namespace std::chrono_literals;
using llmgw::test::child_process;

TEST(llmgw_check, lists_every_problem_with_its_line_and_fails) {
  llmgw::test::test_cluster c(
    {{"control-1", true, false, "127.0.0.1", {}},
     {"agent-a", false, true, "127.0.0.1", {{"a0", "S1_basic.map.int.json"}}}});
  child_process ok({LLMGW_BINARY, "check", "--config", c.topology_path()});
  auto summary = ok.read_stdout_all(10s);
  EXPECT_EQ(ok.wait(10s), 0);
  EXPECT_NE(
    summary.find("cluster 'test', 2 nodes, 1 engine, block size 16, seed \"0\", mutual TLS"),
    std::string::npos)
    << summary;
  EXPECT_NE(summary.find("engine a0 model m"), std::string::npos);

  auto bad = c.dir() + "/bad.toml";
  std::ofstream(bad) << "[cluster]\nname = \"x\"\nhash_seed = \"random\"\nblock_size = 16\n"
                        "colour = \"blue\"\n\n[tls]\nplaintext = true\n\n[[node]]\n"
                        "name = \"a\"\nhost = \"10.1.2.3\"\nroles = [\"agent\"]\n";
  child_process proc({LLMGW_BINARY, "check", "--config", bad});
  auto err = proc.read_stderr_all(5s);
  EXPECT_EQ(proc.wait(10s), 2);
  EXPECT_NE(err.find("has 4 problems"), std::string::npos) << err;
  EXPECT_NE(err.find(bad + ":3:13: cluster.hash_seed 'random' must be a decimal integer"),
            std::string::npos)
    << err;
  EXPECT_NE(err.find(bad + ":5:10: unknown key 'colour' in [cluster]"), std::string::npos) << err;
  EXPECT_NE(err.find("no node has the control role"), std::string::npos) << err;
  EXPECT_NE(err.find("node 'a' is on 10.1.2.3 but [tls] plaintext = true"), std::string::npos)
    << err;
}

TEST(llmgw_node, refuses_what_it_cannot_run) {
  llmgw::test::test_cluster c({{"control-1", true, false, "127.0.0.1", {}}});
  child_process unknown({LLMGW_BINARY, "node", "--config", c.topology_path(), "--node", "nope"});
  auto err = unknown.read_stderr_all(5s);
  EXPECT_EQ(unknown.wait(10s), 2);
  EXPECT_NE(err.find("no node 'nope' in"), std::string::npos) << err;
  EXPECT_NE(err.find("(nodes: control-1)"), std::string::npos) << err;

  // A key that does not belong to its certificate: refused before CAF starts
  // (CAF would hang in the handshake).
  std::ifstream in(c.topology_path());
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto at = text.find("key = \"control-1.key\"");
  ASSERT_NE(at, std::string::npos);
  llmgw::test::test_cluster other({{"stranger", true, false, "127.0.0.1", {}}});
  text.replace(at, 21, "key = \"" + other.dir() + "/stranger.key\"");
  auto swapped = c.dir() + "/swapped.toml";
  std::ofstream(swapped) << text;
  child_process mismatch({LLMGW_BINARY, "node", "--config", swapped, "--node", "control-1"});
  err = mismatch.read_stderr_all(5s);
  EXPECT_EQ(mismatch.wait(10s), 2);
  EXPECT_NE(err.find("does not belong to certificate"), std::string::npos) << err;
}

TEST(llmgw_certs, makes_a_ca_and_node_certificates_that_check_accepts) {
  char tmpl[] = "/tmp/llmgw-certs-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  child_process proc(
    {LLMGW_BINARY, "certs", "--out", dir + "/pki", "--host", "10.0.0.9", "n1", "n2"});
  auto out = proc.read_stdout_all(10s);
  EXPECT_EQ(proc.wait(10s), 0);
  EXPECT_NE(out.find("n1: cert = \"" + dir + "/pki/n1.pem\""), std::string::npos) << out;
  EXPECT_NE(out.find(dir + "/pki/private/ca.key: no node needs it"), std::string::npos) << out;
  // The fingerprint it prints for n1, to list in the topology.
  auto at = out.find("fingerprints = [\"", out.find("n1: cert"));
  ASSERT_NE(at, std::string::npos) << out;
  auto n1_fingerprint = out.substr(at + 17, 7 + 64);
  auto topology = [&](const std::string& n1_extra) {
    std::ofstream(dir + "/t.toml")
      << "[cluster]\nname = \"c\"\nhash_seed = \"0\"\nblock_size = 16\n[tls]\nca = \"pki/ca.pem\"\n"
         "[[node]]\nname = \"n1\"\nhost = \"127.0.0.1\"\nport = 7000\nroles = [\"control\"]\n"
         "http = \"127.0.0.1:8000\"\ncert = \"pki/n1.pem\"\nkey = \"pki/n1.key\"\n"
      << n1_extra
      << "[[node]]\nname = \"n2\"\nhost = \"10.0.0.9\"\nroles = [\"agent\"]\n"
         "cert = \"pki/n2.pem\"\nkey = \"pki/n2.key\"\n";
  };
  topology("fingerprints = [\"" + n1_fingerprint + "\"]\n");
  child_process check({LLMGW_BINARY, "check", "--config", dir + "/t.toml"});
  check.read_stdout_all(10s);
  EXPECT_EQ(check.wait(10s), 0) << check.read_stderr_all(5s);
  topology("fingerprints = [\"sha256:" + std::string(64, '0') + "\"]\n"); // n1's revoked
  child_process revoked({LLMGW_BINARY, "check", "--config", dir + "/t.toml"});
  auto why = revoked.read_stderr_all(10s);
  EXPECT_EQ(revoked.wait(10s), 2);
  EXPECT_NE(why.find("is not among its fingerprints"), std::string::npos) << why;
  topology("");
  // Adding a node later keeps the CA: n1's certificate stays valid.
  child_process more({LLMGW_BINARY, "certs", "--out", dir + "/pki", "n3"});
  more.read_stdout_all(10s);
  EXPECT_EQ(more.wait(10s), 0);
  child_process again({LLMGW_BINARY, "check", "--config", dir + "/t.toml"});
  again.read_stdout_all(10s);
  EXPECT_EQ(again.wait(10s), 0);
  std::system(("rm -rf " + dir).c_str());
}

namespace {

/// `llmgw check` on a copy of deploy/topology/FILE with certificates for
/// `nodes`: its exit code and what it printed.
std::pair<std::optional<int>, std::string>
check_deploy_example(const std::string& file, const std::vector<std::string>& nodes) {
  char tmpl[] = "/tmp/llmgw-deploy-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  std::system(("cp " LLMGW_SOURCE_DIR "/deploy/topology/" + file + " " + dir).c_str());
  std::vector<std::string> argv = {LLMGW_BINARY, "certs", "--out", dir + "/certs"};
  argv.insert(argv.end(), nodes.begin(), nodes.end());
  child_process certs(argv);
  certs.read_stdout_all(10s);
  EXPECT_EQ(certs.wait(10s), 0);
  child_process check({LLMGW_BINARY, "check", "--config", dir + "/" + file});
  auto out = check.read_stdout_all(10s);
  auto code = check.wait(10s);
  if (code != 0)
    out += check.read_stderr_all(5s);
  std::system(("rm -rf " + dir).c_str());
  return {code, out};
}

} // namespace

TEST(deploy, the_example_topology_is_valid) {
  auto [code, out] =
    check_deploy_example("three-machines.toml", {"ctl-1", "ctl-2", "gpu-1", "gpu-2"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("cluster 'prod', 4 nodes, 4 engines"), std::string::npos) << out;
}

TEST(deploy, the_fleet_at_vllms_defaults_is_valid_and_says_how_each_engine_is_reached) {
  auto [code, out] = check_deploy_example("vllm-defaults.toml",
                                          {"ctl-1", "ctl-2", "gpu-1", "gpu-2", "gpu-3", "gpu-4"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("cluster 'fleet', 6 nodes, 4 engines"), std::string::npos) << out;
  EXPECT_NE(out.find("SGLang must bind there"), std::string::npos) << out;
  EXPECT_NE(out.find("kv events: the agent connects to tcp://127.0.0.1:5557 (rank r at port + r, "
                     "2 ranks)"),
            std::string::npos)
    << out;
  EXPECT_EQ(out.find("warning:"), std::string::npos) << "every engine beside its agent: " << out;
}
