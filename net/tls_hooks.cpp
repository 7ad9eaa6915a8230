// llmgw's hooks between CAF 0.17.6 (libcaf_openssl) and libssl: what CAF's
// TLS layer gets wrong or leaves unbounded, fixed where its calls pass.
//
// These definitions, linked into the executable, take precedence over
// libssl's for libcaf_openssl's calls (the executable comes first in the
// dynamic linker's lookup order); each does its part and calls OpenSSL's own
// function. Nothing else in llmgw uses these functions directly. This file is
// linked as an object into every executable that runs CAF with TLS (a static
// library would drop it: nothing refers to it by name).
//
// 1. The error queue. OpenSSL keeps one error queue per thread, and
//    SSL_get_error() looks at it: the queue must be empty before
//    SSL_read/SSL_write/SSL_connect/SSL_accept, or an error left there by
//    another connection is reported for this one. CAF never clears it, and
//    drains it only inside CAF_LOG_INFO(...), which Debian's build compiles
//    out. So when one peer failed on the middleman's thread (a killed agent:
//    "unexpected EOF"), the next read on a healthy connection failed too and
//    CAF dropped that connection (seen in the cluster tests: killing one
//    agent cut another agent's session about one run in four).
//
// 2. Certificates. CAF accepts any certificate the cluster CA signed. As a
//    TLS handshake ends (SSL_accept or SSL_connect returns 1), the peer's
//    certificate must name a node of the topology by its CN and, if that
//    node lists fingerprints, be one of them: a revoked key, or a
//    certificate the CA issued for something else, does not reach CAF.
//
// 3. Handshakes (net/node_port_guard.hpp). CAF keeps an accepted connection
//    that never starts or finishes TLS forever (13.5k of them cost 90% of a
//    core and 530 MB). The first SSL_accept of a connection (CAF calls it as
//    it accepts) registers it; more than max_pending_handshakes at once are
//    refused there (CAF then closes the socket), and a thread closes the
//    socket of one still pending after handshake_timeout: CAF sees the end
//    of the stream, fails the handshake and frees the connection.
//
// 4. BASP messages. CAF sizes its read buffer from the payload length a
//    header announces, and believes the node a routed, monitor or down
//    message says it speaks for. SSL_read follows each connection's BASP
//    framing (basp_frame_guard) and fails the read of a header that
//    announces more than llmgw ever sends, of a routed message, and of a
//    monitor or down message for another node than the connection's: CAF
//    closes the connection before it allocates or believes it.
//
// Per-connection state hangs off the SSL object (ex_data), freed with it.
#include "base/burst_log.hpp"
#include "base/log.hpp"
#include "net/node_port_guard.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

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

using clock_type = std::chrono::steady_clock;

/// A connection whose TLS handshake this process accepts and that has not
/// finished it.
struct pending_handshake {
  int fd = -1;
  ino_t inode = 0; ///< the socket's, to never touch a reused descriptor
  clock_type::time_point since;
};

/// Accepted connections with a handshake in progress. Never destroyed: the
/// reaper thread and CAF's threads may use it until the process ends.
struct handshakes {
  std::mutex mtx;
  std::unordered_map<const SSL*, pending_handshake> pending;
  std::once_flag reaper_started;

  void forget(const SSL* ssl) {
    std::lock_guard<std::mutex> g(mtx);
    pending.erase(ssl);
    counted();
  }

  /// Publishes the number pending (mtx held).
  void counted() { llmgw::node_port_counters().pending_handshakes = pending.size(); }
};

handshakes& accepted() {
  static auto* h = new handshakes;
  return *h;
}

ino_t inode_of(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/// The peer's address of a socket, for the log.
std::string peer_of(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  char host[INET6_ADDRSTRLEN] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    if (addr.ss_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, host, sizeof host);
    else if (addr.ss_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, host, sizeof host);
  }
  return host;
}

/// Logs what was refused, once per burst of its reason.
void note(const char* reason, int fd, const std::string& detail) {
  static auto* log = new llmgw::burst_log;
  if (auto n = log->admit(reason))
    LLMGW_LOG(warning, "node port", "closed a connection from {} ({}): {}{}", peer_of(fd), reason,
              detail, llmgw::burst_note(n));
}

/// Closes, every quarter second, the sockets of handshakes pending too long.
void reap() {
  auto& h = accepted();
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    auto limit = llmgw::node_port_settings().handshake_timeout;
    auto now = clock_type::now();
    std::lock_guard<std::mutex> g(h.mtx);
    std::vector<pending_handshake> expired;
    for (auto it = h.pending.begin(); it != h.pending.end();) {
      if (now - it->second.since < limit) {
        ++it;
        continue;
      }
      ++llmgw::node_port_counters().handshakes_timed_out;
      expired.push_back(it->second);
      it = h.pending.erase(it);
    }
    h.counted(); // counted before the peer can see its connection end
    for (const auto& p : expired) {
      // The entry went when CAF freed the SSL object (under this lock), so
      // the descriptor is still this connection's unless CAF closed it just
      // now; the inode tells.
      if (inode_of(p.fd) == p.inode) {
        note("handshake_timeout", p.fd, "no TLS handshake in time");
        ::shutdown(p.fd, SHUT_RDWR);
      }
    }
  }
}

/// The per-connection BASP guard, and the ex_data slot that holds it.
int guard_index() {
  static int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr,
                                          [](void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
                                            delete static_cast<llmgw::basp_frame_guard*>(ptr);
                                          });
  return index;
}

/// The pending-handshake entry goes with its SSL object too.
int handshake_index() {
  static int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr,
                                          [](void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
                                            if (ptr)
                                              accepted().forget(static_cast<const SSL*>(ptr));
                                          });
  return index;
}

llmgw::basp_frame_guard& guard_of(SSL* ssl) {
  auto* g = static_cast<llmgw::basp_frame_guard*>(SSL_get_ex_data(ssl, guard_index()));
  if (!g) {
    const auto& limits = llmgw::node_port_settings();
    g = new llmgw::basp_frame_guard(limits.max_first_payload, limits.max_payload);
    SSL_set_ex_data(ssl, guard_index(), g);
  }
  return *g;
}

/// Ends the connection under CAF: its next read sees the end of the stream.
void cut(SSL* ssl) {
  int fd = SSL_get_fd(ssl);
  if (fd >= 0)
    ::shutdown(fd, SHUT_RDWR);
}

/// After a finished handshake: true if the peer's certificate is one of a
/// topology node's (llmgw::check_node_certificate); else the
/// connection is cut, counted and logged.
bool peer_allowed(SSL* ssl) {
  // Refused once, refused for good: CAF may call again (it can take the
  // -1 for "wants to read"), and the peer is counted once.
  static int refused_index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  if (SSL_get_ex_data(ssl, refused_index))
    return false;
  if (!llmgw::node_certificates_checked())
    return true;
  std::string der;
  if (X509* peer = SSL_get0_peer_certificate(ssl)) {
    unsigned char* buf = nullptr;
    int len = i2d_X509(peer, &buf);
    if (len > 0)
      der.assign(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(len));
    OPENSSL_free(buf);
  }
  auto why = der.empty() ? std::string("no certificate") : llmgw::check_node_certificate_now(der);
  if (why.empty())
    return true;
  ++llmgw::node_port_counters().certificates_refused;
  note("certificate", SSL_get_fd(ssl), why);
  SSL_set_ex_data(ssl, refused_index, ssl);
  cut(ssl);
  return false;
}

} // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static auto real = real_function<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  int n = real(ssl, buf, num);
  using verdict = llmgw::basp_frame_guard::verdict;
  auto& g = guard_of(ssl);
  if (g.why() != verdict::ok) // refused before (and counted then)
    return -1;
  if (n > 0 && !g.feed(static_cast<const unsigned char*>(buf), static_cast<std::size_t>(n))) {
    auto& counts = llmgw::node_port_counters();
    if (g.why() == verdict::too_large) {
      ++counts.payloads_refused;
      note("payload_too_large", SSL_get_fd(ssl),
           "a message header announced " + std::to_string(g.refused_length()) + " bytes");
    } else {
      ++counts.messages_refused;
      note("message", SSL_get_fd(ssl),
           g.why() == verdict::routed          ? "a routed message (llmgw's nodes talk directly)"
           : g.why() == verdict::not_handshake ? "the first message was no handshake"
                                               : "a monitor or down message for another node");
    }
    cut(ssl);
    return -1; // SSL_get_error: a syscall error; CAF closes the connection
  }
  return n;
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static auto real = real_function<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_connect(SSL* ssl) {
  static auto real = real_function<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  int r = real(ssl);
  if (r == 1 && !peer_allowed(ssl))
    return -1; // CAF fails the connection
  return r;
}

int SSL_accept(SSL* ssl) {
  static auto real = real_function<int (*)(SSL*)>("SSL_accept");
  auto& h = accepted();
  if (!SSL_get_ex_data(ssl, handshake_index())) { // this connection's first call
    const auto& limits = llmgw::node_port_settings();
    std::call_once(h.reaper_started, [] { std::thread(reap).detach(); });
    int fd = SSL_get_fd(ssl);
    std::lock_guard<std::mutex> g(h.mtx);
    if (h.pending.size() >= limits.max_pending_handshakes) {
      ++llmgw::node_port_counters().handshakes_refused;
      note("too_many_handshakes", fd,
           std::to_string(h.pending.size()) + " TLS handshakes are in progress");
      cut(ssl);
      ERR_clear_error();
      return -1; // CAF drops the connection before it has a scribe
    }
    h.pending[ssl] = {fd, inode_of(fd), clock_type::now()};
    h.counted();
    SSL_set_ex_data(ssl, handshake_index(), ssl);
  }
  ERR_clear_error();
  int r = real(ssl);
  if (r == 1) {
    h.forget(ssl);
    if (!peer_allowed(ssl))
      return -1; // CAF drops the connection
  }
  return r;
}

} // extern "C"
