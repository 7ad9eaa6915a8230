// Certificates for tests of node identity: a cluster CA with certificates for
// control-1, control-2, agent-a and agent-b, and a second CA with one for
// agent-b (a stranger's), made once per test process in a fresh folder.
#pragma once

#include "config/node_identity.hpp"
#include "config/pki.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>

namespace llmgw::test {

struct credentials {
  std::string dir;      ///< the cluster CA's folder: ca.pem, NAME.pem, NAME.key
  std::string stranger; ///< another CA's folder, with agent-b's certificate

  std::string ca() const { return dir + "/ca.pem"; }

  /// The identity of node `name` under the cluster CA (loaded once).
  std::shared_ptr<const config::node_identity> of(const std::string& name) {
    auto& id = loaded[name];
    if (!id) {
      auto files = config::credentials_in(dir, name);
      auto r = config::node_identity::load(name, files.cert, files.key, ca());
      EXPECT_TRUE(r) << (r ? "" : r.err().message);
      if (r)
        id = *r;
    }
    return id;
  }

  std::map<std::string, std::shared_ptr<const config::node_identity>> loaded;

  credentials() = default;
  credentials(credentials&& o) noexcept
    : dir(std::move(o.dir)), stranger(std::move(o.stranger)), loaded(std::move(o.loaded)) {
    o.dir.clear();
  }
  ~credentials() {
    if (!dir.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }
};

/// The process's credentials (made on first use).
inline credentials& test_credentials() {
  static credentials c = [] {
    credentials out;
    char tmpl[] = "/tmp/llmgw-creds-XXXXXX";
    out.dir = ::mkdtemp(tmpl);
    out.stranger = out.dir + "/stranger";
    EXPECT_EQ(config::ensure_ca(out.dir), "");
    for (const char* name : {"control-1", "control-2", "agent-a", "agent-b"})
      EXPECT_EQ(config::issue_node_certificate(out.dir, name, {"127.0.0.1"}), "");
    EXPECT_EQ(config::ensure_ca(out.stranger), "");
    EXPECT_EQ(config::issue_node_certificate(out.stranger, "agent-b", {"127.0.0.1"}), "");
    return out;
  }();
  return c;
}

} // namespace llmgw::test
