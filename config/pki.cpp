#include "config/pki.hpp"

#include "base/openssl.hpp"

#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <memory>
#include <sys/stat.h>
#include <unistd.h>

namespace llmgw::config {

namespace {

using ssl::pkey_ptr;
using ssl::x509_ptr;

std::string ssl_error(const std::string& what) {
  return fmt::format("{}: {}", what, ssl::last_error());
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

/// Writes `path` with `mode` bits (0600 for keys) through a new file beside
/// it, created with O_EXCL | O_NOFOLLOW (never an existing file, never
/// through a symlink someone placed there), then renamed over `path`: a
/// reader sees the old file or the new one whole, and a symlink at `path`
/// is replaced, not followed.
template <class Write>
std::string write_pem(const std::string& path, mode_t mode, Write write) {
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    unsigned char r[6];
    RAND_bytes(r, sizeof r);
    tmp = fmt::format("{}.tmp-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}", path, r[0], r[1], r[2], r[3],
                      r[4], r[5]);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0 && errno != EEXIST)
      break;
  }
  if (fd < 0)
    return fmt::format("cannot write '{}': {}", path, std::strerror(errno));
  ::fchmod(fd, mode); // whatever the umask
  FILE* f = ::fdopen(fd, "w");
  if (!f) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return fmt::format("cannot write '{}'", path);
  }
  bool ok = write(f) == 1;
  ok = std::fflush(f) == 0 && ::fsync(fd) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    return ssl_error(fmt::format("writing '{}'", path));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    auto err = errno;
    ::unlink(tmp.c_str());
    return fmt::format("cannot write '{}': {}", path, std::strerror(err));
  }
  return {};
}

std::string write_key(const std::string& path, EVP_PKEY* key) {
  return write_pem(path, 0600, [key](FILE* f) {
    return PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  });
}

std::string write_cert(const std::string& path, X509* cert) {
  return write_pem(path, 0644, [cert](FILE* f) { return PEM_write_X509(f, cert); });
}

bool add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (!ext)
    return false;
  bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

/// A certificate for `key` named `cn`, valid now for `days` (and never
/// beyond `until`, its issuer's end, when given).
x509_ptr new_cert(EVP_PKEY* key, const std::string& cn, int days,
                  const ASN1_TIME* until = nullptr) {
  x509_ptr cert(X509_new());
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  RAND_bytes(serial, sizeof serial);
  serial[0] &= 0x7f; // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  if (until && ASN1_TIME_compare(until, X509_get0_notAfter(cert.get())) < 0)
    X509_set1_notAfter(cert.get(), until);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("llmgw"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  return cert;
}

pkey_ptr read_key(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f)
    return nullptr;
  pkey_ptr key(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  return key;
}

x509_ptr read_cert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f)
    return nullptr;
  x509_ptr cert(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  return cert;
}

bool is_ip(const std::string& host) {
  unsigned char buf[16];
  return host.find(':') != std::string::npos
         || (std::sscanf(host.c_str(), "%hhu.%hhu.%hhu.%hhu", &buf[0], &buf[1], &buf[2], &buf[3])
               == 4
             && host.find_first_not_of("0123456789.") == std::string::npos);
}

} // namespace

node_credentials credentials_in(const std::string& dir, const std::string& name) {
  return {dir + "/" + name + ".pem", dir + "/" + name + ".key"};
}

std::string ca_key_path(const std::string& dir) {
  return dir + "/private/ca.key";
}

std::string ensure_ca(const std::string& dir, int days) {
  auto cert_path = dir + "/ca.pem";
  auto key_path = ca_key_path(dir);
  // An earlier llmgw wrote the key beside the certificates: still used.
  if (exists(cert_path) && (exists(key_path) || exists(dir + "/ca.key")))
    return {};
  if (exists(cert_path)) // its key is offline, as it should be: never a new CA
    return fmt::format("'{}' is there but its key '{}' is not: bring the CA's key back to issue "
                       "certificates (a new CA would make every node's certificate invalid)",
                       cert_path, key_path);
  std::error_code ec;
  std::filesystem::create_directories(dir + "/private", ec);
  if (ec)
    return fmt::format("cannot create '{}/private': {}", dir, ec.message());
  ::chmod((dir + "/private").c_str(), 0700); // only its owner may even list it
  pkey_ptr key(EVP_EC_gen("P-256"));
  if (!key)
    return ssl_error("generating the CA key");
  // Each CA its own name: two CAs in one file (while rotating) must never be
  // taken for each other.
  unsigned char id[6];
  RAND_bytes(id, sizeof id);
  auto cert = new_cert(key.get(),
                       fmt::format("llmgw cluster CA {:02x}{:02x}{:02x}{:02x}{:02x}{:02x}", id[0],
                                   id[1], id[2], id[3], id[4], id[5]),
                       days);
  X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get()));
  if (!add_ext(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE")
      || !add_ext(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign")
      || !add_ext(cert.get(), cert.get(), NID_subject_key_identifier, "hash"))
    return ssl_error("CA certificate extensions");
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0)
    return ssl_error("signing the CA certificate");
  if (auto err = write_key(key_path, key.get()); !err.empty())
    return err;
  return write_cert(cert_path, cert.get());
}

std::string issue_node_certificate(const std::string& dir, const std::string& name,
                                   const std::vector<std::string>& hosts, int days) {
  auto ca_key = read_key(exists(ca_key_path(dir)) ? ca_key_path(dir) : dir + "/ca.key");
  auto ca_cert = read_cert(dir + "/ca.pem");
  if (!ca_key || !ca_cert)
    return fmt::format("no CA in '{}' (ca.pem and private/ca.key)", dir);
  pkey_ptr key(EVP_EC_gen("P-256"));
  if (!key)
    return ssl_error("generating a node key");
  auto cert = new_cert(key.get(), name, days, X509_get0_notAfter(ca_cert.get()));
  X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get()));
  std::string san = "DNS:" + name;
  for (const auto& h : hosts)
    san += (is_ip(h) ? ",IP:" : ",DNS:") + h;
  if (!add_ext(cert.get(), ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE")
      || !add_ext(cert.get(), ca_cert.get(), NID_key_usage,
                  "critical,digitalSignature,keyEncipherment,keyAgreement")
      || !add_ext(cert.get(), ca_cert.get(), NID_ext_key_usage, "serverAuth,clientAuth")
      || !add_ext(cert.get(), ca_cert.get(), NID_authority_key_identifier, "keyid:always")
      || !add_ext(cert.get(), ca_cert.get(), NID_subject_alt_name, san))
    return ssl_error("node certificate extensions");
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) == 0)
    return ssl_error("signing a node certificate");
  auto files = credentials_in(dir, name);
  if (auto err = write_key(files.key, key.get()); !err.empty())
    return err;
  return write_cert(files.cert, cert.get());
}

} // namespace llmgw::config
