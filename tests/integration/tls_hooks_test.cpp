// The TLS error-queue fix (net/tls_hooks.cpp): an error left on this
// thread's OpenSSL queue by another connection must not make a healthy
// connection's read fail, and libraries (CAF) must reach our SSL_read.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

TEST(tls_hooks, ssl_calls_resolve_to_the_fix) {
  for (const char* name : {"SSL_read", "SSL_write", "SSL_connect", "SSL_accept"}) {
    Dl_info info{};
    ASSERT_NE(dladdr(dlsym(RTLD_DEFAULT, name), &info), 0) << name;
    EXPECT_EQ(std::string(info.dli_fname).find("libssl"), std::string::npos)
      << name << " resolves to " << info.dli_fname << ", not to the executable's fix";
  }
}

TEST(tls_hooks, a_stale_error_does_not_fail_a_healthy_read) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL* ssl = SSL_new(ctx);
  BIO* ours = nullptr;
  BIO* theirs = nullptr;
  ASSERT_EQ(BIO_new_bio_pair(&ours, 0, &theirs, 0), 1);
  SSL_set_bio(ssl, ours, ours);
  SSL_set_connect_state(ssl);
  // What a failed peer on the same thread leaves behind.
  ERR_raise(ERR_LIB_SSL, SSL_R_UNEXPECTED_EOF_WHILE_READING);
  char buf[16];
  int r = SSL_read(ssl, buf, sizeof buf); // sends ClientHello, then waits for the server
  EXPECT_EQ(r, -1);
  EXPECT_EQ(SSL_get_error(ssl, r), SSL_ERROR_WANT_READ)
    << "the stale error was reported for this connection";
  SSL_free(ssl);
  BIO_free(theirs);
  SSL_CTX_free(ctx);
}
