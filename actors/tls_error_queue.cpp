// Clears OpenSSL's error queue before every TLS I/O call CAF makes.
//
// OpenSSL keeps one error queue per thread, and SSL_get_error() looks at it:
// the queue must be empty before SSL_read/SSL_write/SSL_connect/SSL_accept,
// or an error left there by another connection is reported for this one.
// CAF 0.17.6 (libcaf_openssl) never clears it, and drains it only inside
// CAF_LOG_INFO(...), which Debian's build compiles out. So when one peer
// fails on the middleman's thread (a killed agent: "unexpected EOF"; any
// client with a bad handshake), the next read on a healthy connection fails
// too and CAF drops that connection. Seen in the cluster tests: killing one
// agent node cut another agent's session about one run in four.
//
// These definitions, linked into the executable, take precedence over
// libssl's for libcaf_openssl's calls (the executable comes first in the
// dynamic linker's lookup order); each clears the queue and calls OpenSSL's
// own function. Nothing else in llmgw uses these functions directly.
// This file is linked as an object into every executable that runs CAF with
// TLS (a static library would drop it: nothing refers to it by name).
#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cstdio>
#include <cstdlib>

namespace {

template <class F>
F real_function(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) {
    // Without libssl's own function there is nothing sensible to do.
    std::fprintf(stderr, "llmgw: cannot find OpenSSL's %s: %s\n", name, dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

} // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static auto real = real_function<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static auto real = real_function<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_connect(SSL* ssl) {
  static auto real = real_function<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

int SSL_accept(SSL* ssl) {
  static auto real = real_function<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(ssl);
}

} // extern "C"
