// The private CA `llmgw certs` makes: where keys go and with what mode, how
// long each certificate lives, and that files are replaced, never written
// through a symlink.
#include "base/openssl.hpp"
#include "config/node_identity.hpp"
#include "config/pki.hpp"

#include <gtest/gtest.h>
#include <openssl/pem.h>

#include <filesystem>
#include <fstream>
#include <sys/stat.h>
#include <unistd.h>

using namespace llmgw;
using namespace llmgw::config;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/llmgw-pki-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode;
}

/// notAfter of a PEM certificate, as days from now.
int days_left(const std::string& path) {
  ssl::bio_ptr bio(BIO_new_file(path.c_str(), "r"));
  ssl::x509_ptr x(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  EXPECT_TRUE(x) << path;
  if (!x)
    return -1;
  int days = 0, secs = 0;
  ASN1_TIME_diff(&days, &secs, nullptr, X509_get0_notAfter(x.get()));
  return days;
}

} // namespace

TEST(pki, the_ca_key_is_kept_apart_and_every_key_is_private) {
  temp_dir d;
  ASSERT_EQ(ensure_ca(d.path), "");
  ASSERT_EQ(issue_node_certificate(d.path, "agent-a", {"127.0.0.1"}), "");
  EXPECT_FALSE(fs::exists(d.path + "/ca.key")) << "not beside the node files";
  EXPECT_EQ(ca_key_path(d.path), d.path + "/private/ca.key");
  EXPECT_EQ(mode_of(d.path + "/private") & 0777, 0700u);
  EXPECT_EQ(mode_of(ca_key_path(d.path)) & 0777, 0600u);
  EXPECT_EQ(mode_of(d.path + "/agent-a.key") & 0777, 0600u);
  EXPECT_EQ(mode_of(d.path + "/agent-a.pem") & 0777, 0644u);
  for (const auto& e : fs::directory_iterator(d.path))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << "left over: " << e.path();
}

TEST(pki, the_ca_outlives_its_node_certificates) {
  temp_dir d;
  ASSERT_EQ(ensure_ca(d.path), "");
  ASSERT_EQ(issue_node_certificate(d.path, "n", {}), "");
  EXPECT_GE(days_left(d.path + "/ca.pem"), 3649);
  EXPECT_GE(days_left(d.path + "/n.pem"), 824);
  EXPECT_LE(days_left(d.path + "/n.pem"), 825);
  temp_dir short_lived;
  ASSERT_EQ(ensure_ca(short_lived.path, 30), "");
  ASSERT_EQ(issue_node_certificate(short_lived.path, "n", {}, 825), "");
  EXPECT_LE(days_left(short_lived.path + "/n.pem"), days_left(short_lived.path + "/ca.pem"))
    << "a node certificate never outlives its CA";
}

TEST(pki, a_symlink_where_a_key_goes_is_replaced_not_followed) {
  temp_dir d;
  ASSERT_EQ(ensure_ca(d.path), "");
  auto victim = d.path + "/victim";
  std::ofstream(victim) << "precious\n";
  ASSERT_EQ(::symlink(victim.c_str(), (d.path + "/n.key").c_str()), 0);
  ASSERT_EQ(issue_node_certificate(d.path, "n", {}), "");
  std::ifstream in(victim);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "precious\n") << "the key was written through the symlink";
  EXPECT_TRUE(S_ISREG(mode_of(d.path + "/n.key")));
  EXPECT_TRUE(node_identity::load("n", d.path + "/n.pem", d.path + "/n.key", d.path + "/ca.pem"));
}

TEST(pki, a_ca_made_by_an_earlier_llmgw_is_still_used) {
  temp_dir d;
  ASSERT_EQ(ensure_ca(d.path), "");
  fs::rename(ca_key_path(d.path), d.path + "/ca.key"); // the old layout
  auto before = fs::last_write_time(d.path + "/ca.pem");
  ASSERT_EQ(ensure_ca(d.path), "");
  EXPECT_EQ(fs::last_write_time(d.path + "/ca.pem"), before) << "kept, not made anew";
  EXPECT_FALSE(fs::exists(ca_key_path(d.path)));
  ASSERT_EQ(issue_node_certificate(d.path, "n", {}), "");
  EXPECT_TRUE(node_identity::load("n", d.path + "/n.pem", d.path + "/n.key", d.path + "/ca.pem"));
}

TEST(pki, a_ca_whose_key_is_offline_is_never_replaced) {
  temp_dir d;
  ASSERT_EQ(ensure_ca(d.path), "");
  auto before = fs::last_write_time(d.path + "/ca.pem");
  fs::remove(ca_key_path(d.path)); // moved offline, as SECURITY.md says
  auto err = ensure_ca(d.path);
  EXPECT_NE(err.find("bring the CA's key back"), std::string::npos) << err;
  EXPECT_EQ(fs::last_write_time(d.path + "/ca.pem"), before) << "the CA was not made anew";
  EXPECT_NE(issue_node_certificate(d.path, "n", {}), "");
}

TEST(pki, two_cas_in_one_file_verify_each_their_own_nodes) {
  temp_dir old_ca, new_ca;
  ASSERT_EQ(ensure_ca(old_ca.path), "");
  ASSERT_EQ(ensure_ca(new_ca.path), "");
  ASSERT_EQ(issue_node_certificate(old_ca.path, "n", {}), "");
  ASSERT_EQ(issue_node_certificate(new_ca.path, "n", {}), "");
  // While rotating: both CAs in one file, either order.
  for (const auto& [first, second] :
       {std::pair{old_ca.path, new_ca.path}, std::pair{new_ca.path, old_ca.path}}) {
    auto both = first + "/both.pem";
    {
      std::ofstream out(both);
      std::ifstream a(first + "/ca.pem"), b(second + "/ca.pem");
      out << a.rdbuf() << b.rdbuf();
    }
    for (const auto& dir : {old_ca.path, new_ca.path})
      EXPECT_TRUE(node_identity::load("n", dir + "/n.pem", dir + "/n.key", both))
        << dir << " under " << both;
  }
}
