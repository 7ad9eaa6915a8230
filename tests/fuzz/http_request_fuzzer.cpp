// libFuzzer target: any bytes as what a client sends the gateway's HTTP
// server, half-closed after them. The server frames requests (Beast and its
// own checks: limits, Expect, transfer codings, pipelining, half-close) and
// the handler parses OpenAI bodies the way the gateway does. Nothing may
// crash, leak or hang, and whatever comes back is HTTP/1.1 answers.
//   scripts/fuzz.sh [seconds]
#include "actors/http_server.hpp"
#include "wire/openai_request.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
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
      400, "application/json",
      llmgw::wire::openai_error_json(parsed.err().message, "BadRequestError", 400), {}});
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
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server().port());
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    std::abort(); // the server must be there
  timeval tv{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  linger abort_on_close{1, 0}; // no TIME_WAIT: a run makes many connections
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close);
  std::size_t sent = 0;
  while (sent < size) {
    auto n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0)
      break; // the server may refuse early and close
    sent += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string got;
  char buf[4096];
  for (;;) {
    auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno == ECONNRESET))
      break;
    if (n < 0)
      std::abort(); // a half-closed client was left waiting
    got.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (!got.empty() && got.compare(0, 9, "HTTP/1.1 ") != 0)
    std::abort(); // only answers come back
  return 0;
}
