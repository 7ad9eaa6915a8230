// Owning handles for OpenSSL's objects and one way to read its error queue:
// what the PKI (config/pki), the topology's TLS checks and node identity
// (config/node_identity) share. Only files that use OpenSSL include this.
#pragma once

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>

#include <memory>
#include <string>

namespace llmgw::ssl {

template <class T, void (*Free)(T*)>
struct deleter {
  void operator()(T* p) const { Free(p); }
};

using bio_ptr = std::unique_ptr<BIO, deleter<BIO, BIO_free_all>>;
using pkey_ptr = std::unique_ptr<EVP_PKEY, deleter<EVP_PKEY, EVP_PKEY_free>>;
using pkey_ctx_ptr = std::unique_ptr<EVP_PKEY_CTX, deleter<EVP_PKEY_CTX, EVP_PKEY_CTX_free>>;
using md_ctx_ptr = std::unique_ptr<EVP_MD_CTX, deleter<EVP_MD_CTX, EVP_MD_CTX_free>>;
using x509_ptr = std::unique_ptr<X509, deleter<X509, X509_free>>;
using store_ptr = std::unique_ptr<X509_STORE, deleter<X509_STORE, X509_STORE_free>>;
using store_ctx_ptr = std::unique_ptr<X509_STORE_CTX, deleter<X509_STORE_CTX, X509_STORE_CTX_free>>;

/// The oldest error on this thread's OpenSSL queue, as text ("no detail"
/// when the queue is empty); the queue is cleared, so the next call starts
/// clean.
inline std::string last_error() {
  auto code = ERR_get_error();
  ERR_clear_error();
  if (code == 0)
    return "no detail";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof buf);
  return buf;
}

} // namespace llmgw::ssl
