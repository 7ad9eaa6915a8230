#include "config/node_identity.hpp"

#include "base/openssl.hpp"

#include <fmt/format.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

namespace llmgw::config {

namespace {

std::string hex(const unsigned char* p, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

std::string sha256(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr) != 1) {
    // SHA-256 over memory we own cannot fail unless OpenSSL is broken.
    std::fprintf(stderr, "llmgw: OpenSSL SHA-256 failed: %s\n", ssl::last_error().c_str());
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(md), len);
}

/// Appends `s` with its length first (8 bytes, big-endian): no two field
/// lists share an encoding.
void add_field(std::string& out, std::string_view s) {
  for (int shift = 56; shift >= 0; shift -= 8)
    out += static_cast<char>((s.size() >> shift) & 0xff);
  out.append(s.data(), s.size());
}

std::string der_of(X509* x) {
  unsigned char* buf = nullptr;
  int len = i2d_X509(x, &buf);
  if (len <= 0)
    return {};
  std::string out(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(len));
  OPENSSL_free(buf);
  return out;
}

ssl::x509_ptr x509_of(std::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  ssl::x509_ptr x(d2i_X509(nullptr, &p, static_cast<long>(der.size())));
  if (x && p != reinterpret_cast<const unsigned char*>(der.data() + der.size()))
    return nullptr; // bytes after the certificate
  return x;
}

/// True if `x` names node `name`: its subject CN, exactly. Not a subject
/// alternative name: those list the hosts a node is reached at, and `llmgw
/// certs` gives every node all of them (nodes named after their hosts
/// would each name them all).
std::optional<std::string> cn_of(X509* x) {
  auto* subject = X509_get_subject_name(x);
  int at = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (at < 0 || X509_NAME_get_index_by_NID(subject, NID_commonName, at) >= 0)
    return std::nullopt; // no CN, or more than one: ambiguous
  const auto* cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, at));
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(cn)),
                     static_cast<std::size_t>(ASN1_STRING_length(cn)));
}

bool names(X509* x, const std::string& name) {
  auto cn = cn_of(x);
  return cn && *cn == name;
}

const EVP_MD* digest_for(EVP_PKEY* key) {
  // Ed25519 and Ed448 sign the message itself; every other key type signs
  // its SHA-256.
  auto id = EVP_PKEY_get_id(key);
  return id == EVP_PKEY_ED25519 || id == EVP_PKEY_ED448 ? nullptr : EVP_sha256();
}

} // namespace

std::string random_bytes(std::size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    std::fprintf(stderr, "llmgw: OpenSSL has no randomness: %s\n", ssl::last_error().c_str());
    std::abort();
  }
  return out;
}

std::string fingerprint_of(std::string_view der) {
  auto md = sha256(der);
  return "sha256:" + hex(reinterpret_cast<const unsigned char*>(md.data()), md.size());
}

std::string normalize_fingerprint(std::string_view text) {
  if (text.size() > 7 && std::equal(text.begin(), text.begin() + 7, "sha256:", [](char a, char b) {
        return std::tolower(a) == b;
      }))
    text.remove_prefix(7);
  std::string digits;
  for (char c : text) {
    if (c == ':')
      continue;
    if (!std::isxdigit(static_cast<unsigned char>(c)))
      return {};
    digits += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return digits.size() == 64 ? "sha256:" + digits : std::string{};
}

std::string session_transcript::digest() const {
  std::string all;
  all.reserve(256 + agent.size() + control.size());
  add_field(all, "llmgw session v1");
  add_field(all, agent);
  add_field(all, control);
  std::string id;
  for (int shift = 56; shift >= 0; shift -= 8)
    id += static_cast<char>((session >> shift) & 0xff);
  add_field(all, id);
  add_field(all, agent_nonce);
  add_field(all, agent_share);
  add_field(all, control_nonce);
  add_field(all, control_share);
  return sha256(all);
}

std::string proof_input(proof_role role, const session_transcript& t) {
  std::string out = role == proof_role::agent ? "llmgw agent proof" : "llmgw control proof";
  out += '\0';
  out += t.digest();
  return out;
}

// -- key_share ----------------------------------------------------------------

struct key_share::impl {
  ssl::pkey_ptr key;
};

key_share::key_share(key_share&&) noexcept = default;
key_share& key_share::operator=(key_share&&) noexcept = default;
key_share::~key_share() = default;

result<key_share> key_share::make() {
  ssl::pkey_ctx_ptr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  EVP_PKEY* raw = nullptr;
  if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &raw) != 1)
    return error{errc::bad_value, "cannot make an X25519 key: " + ssl::last_error()};
  key_share s;
  s.impl_ = std::make_unique<impl>();
  s.impl_->key.reset(raw);
  unsigned char pub[32];
  std::size_t len = sizeof pub;
  if (EVP_PKEY_get_raw_public_key(raw, pub, &len) != 1 || len != sizeof pub)
    return error{errc::bad_value, "cannot read an X25519 public key: " + ssl::last_error()};
  s.public_.assign(reinterpret_cast<const char*>(pub), len);
  s.nonce_ = random_bytes(32);
  return s;
}

result<std::string> key_share::session_key(std::string_view peer_share,
                                           const session_transcript& t) const {
  if (peer_share.size() != 32)
    return error{errc::bad_length,
                 fmt::format("the peer's key share has {} bytes, not 32", peer_share.size())};
  ssl::pkey_ptr peer(EVP_PKEY_new_raw_public_key(
    EVP_PKEY_X25519, nullptr, reinterpret_cast<const unsigned char*>(peer_share.data()), 32));
  ssl::pkey_ctx_ptr ctx(EVP_PKEY_CTX_new(impl_->key.get(), nullptr));
  unsigned char shared[32];
  std::size_t shared_len = sizeof shared;
  // OpenSSL refuses a low-order peer point (an all-zero shared secret) here.
  if (!peer || !ctx || EVP_PKEY_derive_init(ctx.get()) != 1
      || EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1
      || EVP_PKEY_derive(ctx.get(), shared, &shared_len) != 1 || shared_len != sizeof shared)
    return error{errc::bad_value, "the peer's key share is not usable: " + ssl::last_error()};
  auto salt = t.digest();
  static constexpr char info[] = "llmgw session key";
  ssl::pkey_ctx_ptr kdf(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  unsigned char key[32];
  std::size_t key_len = sizeof key;
  bool ok =
    kdf && EVP_PKEY_derive_init(kdf.get()) == 1
    && EVP_PKEY_CTX_set_hkdf_md(kdf.get(), EVP_sha256()) == 1
    && EVP_PKEY_CTX_set1_hkdf_salt(kdf.get(), reinterpret_cast<const unsigned char*>(salt.data()),
                                   static_cast<int>(salt.size()))
         == 1
    && EVP_PKEY_CTX_set1_hkdf_key(kdf.get(), shared, sizeof shared) == 1
    && EVP_PKEY_CTX_add1_hkdf_info(kdf.get(), reinterpret_cast<const unsigned char*>(info),
                                   sizeof info - 1)
         == 1
    && EVP_PKEY_derive(kdf.get(), key, &key_len) == 1;
  OPENSSL_cleanse(shared, sizeof shared);
  if (!ok)
    return error{errc::bad_value, "cannot derive the session key: " + ssl::last_error()};
  std::string out(reinterpret_cast<const char*>(key), key_len);
  OPENSSL_cleanse(key, sizeof key);
  return out;
}

// -- node_identity --------------------------------------------------------------

struct node_identity::impl {
  ssl::pkey_ptr key;
  ssl::store_ptr store;
};

node_identity::~node_identity() = default;

result<std::shared_ptr<const node_identity>> node_identity::load(const std::string& name,
                                                                 const std::string& cert_path,
                                                                 const std::string& key_path,
                                                                 const std::string& ca_path) {
  auto fail = [](std::string message) { return error{errc::bad_value, std::move(message)}; };
  ssl::bio_ptr cert_bio(BIO_new_file(cert_path.c_str(), "r"));
  if (!cert_bio)
    return fail(fmt::format("cannot read certificate '{}'", cert_path));
  ssl::x509_ptr cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (!cert)
    return fail(fmt::format("'{}' is not a PEM certificate ({})", cert_path, ssl::last_error()));
  ssl::bio_ptr key_bio(BIO_new_file(key_path.c_str(), "r"));
  if (!key_bio)
    return fail(fmt::format("cannot read key '{}'", key_path));
  // No passphrase is supplied: an encrypted key fails here, not later.
  auto no_passphrase = [](char*, int, int, void*) -> int { return 0; };
  ssl::pkey_ptr key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_passphrase, nullptr));
  if (!key)
    return fail(
      fmt::format("'{}' is not an unencrypted PEM private key ({})", key_path, ssl::last_error()));
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return fail(fmt::format("key '{}' does not belong to certificate '{}'", key_path, cert_path));
  }
  ssl::store_ptr store(X509_STORE_new());
  if (!store || X509_STORE_load_locations(store.get(), ca_path.c_str(), nullptr) != 1)
    return fail(fmt::format("cannot load CA '{}' ({})", ca_path, ssl::last_error()));
  std::shared_ptr<node_identity> id(new node_identity);
  id->impl_ = std::make_unique<impl>();
  id->name_ = name;
  id->der_ = der_of(cert.get());
  id->fingerprint_ = fingerprint_of(id->der_);
  id->impl_->store = std::move(store);
  ssl::store_ctx_ptr ctx(X509_STORE_CTX_new());
  if (!ctx || X509_STORE_CTX_init(ctx.get(), id->impl_->store.get(), cert.get(), nullptr) != 1)
    return fail("cannot check a certificate: " + ssl::last_error());
  if (X509_verify_cert(ctx.get()) != 1) {
    auto why = X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
    ERR_clear_error();
    return fail(
      fmt::format("certificate '{}' is not valid under CA '{}': {}", cert_path, ca_path, why));
  }
  if (!names(cert.get(), name))
    return fail(fmt::format("certificate '{}' does not name node '{}' (its subject CN must be the "
                            "node's name): other nodes would refuse it",
                            cert_path, name));
  id->impl_->key = std::move(key);
  return std::shared_ptr<const node_identity>(std::move(id));
}

std::string node_identity::sign(std::string_view data) const {
  ssl::md_ctx_ptr ctx(EVP_MD_CTX_new());
  std::size_t len = 0;
  if (!ctx
      || EVP_DigestSignInit(ctx.get(), nullptr, digest_for(impl_->key.get()), nullptr,
                            impl_->key.get())
           != 1
      || EVP_DigestSign(ctx.get(), nullptr, &len,
                        reinterpret_cast<const unsigned char*>(data.data()), data.size())
           != 1) {
    // Our own key was checked at load: signing with it can never fail.
    std::fprintf(stderr, "llmgw: cannot sign with the node's key: %s\n", ssl::last_error().c_str());
    std::abort();
  }
  std::string sig(len, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                     reinterpret_cast<const unsigned char*>(data.data()), data.size())
      != 1) {
    std::fprintf(stderr, "llmgw: cannot sign with the node's key: %s\n", ssl::last_error().c_str());
    std::abort();
  }
  sig.resize(len);
  return sig;
}

peer_check node_identity::check_peer(std::string_view der, const std::string& expected,
                                     const std::vector<std::string>& fingerprints,
                                     std::string_view data, std::string_view signature) const {
  auto cert = x509_of(der);
  if (!cert) {
    ERR_clear_error();
    return {"certificate", "the certificate is not DER X.509"};
  }
  ssl::store_ctx_ptr ctx(X509_STORE_CTX_new());
  if (!ctx || X509_STORE_CTX_init(ctx.get(), impl_->store.get(), cert.get(), nullptr) != 1)
    return {"certificate", "cannot check a certificate: " + ssl::last_error()};
  if (X509_verify_cert(ctx.get()) != 1) {
    auto why = X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get()));
    ERR_clear_error();
    return {"certificate",
            std::string("the certificate is not valid under the cluster's CA: ") + why};
  }
  if (!names(cert.get(), expected))
    return {"name", "the certificate does not name node '" + expected + "'"};
  auto fingerprint = fingerprint_of(der);
  if (!fingerprints.empty()
      && std::find(fingerprints.begin(), fingerprints.end(), fingerprint) == fingerprints.end())
    return {"fingerprint", "certificate " + fingerprint + " is not among node '" + expected
                             + "''s fingerprints in the topology (revoked or not yet listed)"};
  auto* key = X509_get0_pubkey(cert.get());
  ssl::md_ctx_ptr md(EVP_MD_CTX_new());
  if (!key || !md || EVP_DigestVerifyInit(md.get(), nullptr, digest_for(key), nullptr, key) != 1
      || EVP_DigestVerify(md.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(), reinterpret_cast<const unsigned char*>(data.data()),
                          data.size())
           != 1) {
    ERR_clear_error();
    return {"signature", "the signature does not verify with the certificate's key"};
  }
  return {};
}

std::optional<std::string> certificate_cn(std::string_view der) {
  auto cert = x509_of(der);
  if (!cert) {
    ERR_clear_error();
    return std::nullopt;
  }
  return cn_of(cert.get());
}

std::string certificate_names(const std::string& cert_path, const std::string& name) {
  ssl::bio_ptr bio(BIO_new_file(cert_path.c_str(), "r"));
  ssl::x509_ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert) {
    ERR_clear_error();
    return fmt::format("cannot read certificate '{}'", cert_path);
  }
  if (names(cert.get(), name))
    return {};
  return fmt::format("certificate '{}' does not name node '{}' (its subject CN must be the node's "
                     "name): other nodes would refuse it",
                     cert_path, name);
}

std::string session_mac(std::string_view key, std::string_view data) {
  // OpenSSL 3's one-shot HMAC() looks the algorithm up on every call, which
  // cost more than the MAC of a small update: each thread keeps its own
  // context and re-keys it.
  struct mac_context {
    EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    EVP_MAC_CTX* ctx = mac ? EVP_MAC_CTX_new(mac) : nullptr;
    ~mac_context() {
      EVP_MAC_CTX_free(ctx);
      EVP_MAC_free(mac);
    }
  };
  thread_local mac_context m;
  char digest_name[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest_name, 0),
                         OSSL_PARAM_construct_end()};
  unsigned char md[EVP_MAX_MD_SIZE];
  std::size_t len = 0;
  if (!m.ctx
      || EVP_MAC_init(m.ctx, reinterpret_cast<const unsigned char*>(key.data()), key.size(), params)
           != 1
      || EVP_MAC_update(m.ctx, reinterpret_cast<const unsigned char*>(data.data()), data.size())
           != 1
      || EVP_MAC_final(m.ctx, md, &len, sizeof md) != 1) {
    // HMAC-SHA256 over memory we own cannot fail unless OpenSSL is broken.
    std::fprintf(stderr, "llmgw: OpenSSL HMAC-SHA256 failed: %s\n", ssl::last_error().c_str());
    std::abort();
  }
  return std::string(reinterpret_cast<const char*>(md), len);
}

bool same_mac(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

} // namespace llmgw::config
