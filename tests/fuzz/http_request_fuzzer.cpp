// libFuzzer target: any bytes as what a client sends the gateway's HTTP
// server, half-closed after them. The server frames requests (Beast and its
// own checks: limits, Expect, transfer codings, pipelining, half-close) and
// the handler parses OpenAI bodies the way the gateway does. Nothing may
// crash, leak or hang, and whatever comes back is HTTP/1.1 answers.
//   scripts/fuzz.sh [seconds]
#include "net/http_server.hpp"
#include "wire/openai_request.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace {

/// The gateway's parse of a completion, chat or route body.
void answer(llmgw::http_request&& req, llmgw::http_responder respond) {
  using llmgw::wire::request_kind;
  auto path = req.target.substr(0, req.target.find('?'));
  std::optional<request_kind> kind;
  if (path == "/v1/completions")
    kind = request_kind::completion;
  else if (path == "/v1/chat/completions")
    kind = request_kind::chat;
  auto parsed = llmgw::wire::parse_routing_request(req.body, kind);
  if (!parsed) {
    if (parsed.err().message.empty())
      std::abort(); // every refusal says why
    respond(llmgw::http_reply{
      400,
      "application/json",
      llmgw::wire::openai_error_json(parsed.err().message, "BadRequestError", 400),
      {}});
    return;
  }
  respond(llmgw::http_reply{200, "application/json", "{\"model\":\"ok\"}", {}});
}

llmgw::http_server& server() {
  static auto* s = [] {
    llmgw::http_server_limits limits;
    limits.max_body_bytes = 64 << 10;
    limits.max_header_bytes = 8 << 10;
    limits.max_buffered_body_bytes = 256 << 10;
    limits.read_timeout = std::chrono::milliseconds(1000);
    limits.idle_timeout = std::chrono::milliseconds(1000);
    return new llmgw::http_server("127.0.0.1", 0, 1, limits, answer);
  }();
  return *s;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  // Both sides of every connection end in TIME_WAIT for a minute: a run of
  // 100k inputs would use up one address's ports, and a new connection with
  // the four numbers of one still waiting gets its SYN dropped (seconds of
  // retries). Each connection comes from the next of 16M loopback
  // addresses, 127.1.0.0 onwards: no address is used twice in a run.
  static std::uint32_t next_source = 0;
  sockaddr_in source{};
  source.sin_family = AF_INET;
  source.sin_addr.s_addr = htonl((127u << 24) + (1u << 16) + (next_source++ % 0xfeffffu));
  ::bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof source);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server().port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // libFuzzer's timeout alarm interrupts blocking calls: each is retried.
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    pollfd p{fd, POLLOUT, 0};
    int err = errno;
    while (err == EINTR && ::poll(&p, 1, 3000) < 0 && errno == EINTR) {
    }
    socklen_t len = sizeof err;
    if (err == EINTR)
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      std::fprintf(stderr, "connect: %s\n", std::strerror(err));
      std::abort(); // the server must be there
    }
  }
  timeval tv{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::size_t sent = 0;
  while (sent < size) {
    auto n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break; // the server may refuse early and close
    sent += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string got;
  char buf[4096];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (;;) {
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR && std::chrono::steady_clock::now() < deadline)
      continue;
    if (n == 0 || (n < 0 && errno == ECONNRESET))
      break;
    if (n < 0) {
      const auto& c = server().counters();
      std::fprintf(stderr,
                   "no end after 3 s: sent %zu of %zu, got %zu bytes: %.200s\nopen %llu, "
                   "requests %llu, evicted %llu, refused %llu, buffered %zu\n",
                   sent, size, got.size(), got.c_str(),
                   static_cast<unsigned long long>(c.open.load()),
                   static_cast<unsigned long long>(c.requests.load()),
                   static_cast<unsigned long long>(c.evicted.load()),
                   static_cast<unsigned long long>(c.rejected_connections.load()),
                   c.buffered_body_bytes.load());
      std::abort(); // a half-closed client was left waiting
    }
    got.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (!got.empty() && got.compare(0, 9, "HTTP/1.1 ") != 0)
    std::abort(); // only answers come back
  return 0;
}
