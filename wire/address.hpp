// Addresses as the topology and the HTTP client write them: "HOST:PORT"
// and an engine's base URL "http://HOST:PORT". One parser for both, so the
// topology never accepts a URL the client then refuses.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace llmgw::wire {

struct host_port {
  std::string host;       ///< a name, an IPv4 address, or an IPv6 address (no brackets)
  std::uint16_t port = 0; ///< 1..65535
};

/// "HOST:PORT": HOST not empty (an IPv6 address in brackets), PORT 1..65535
/// in at most five digits; nullopt otherwise.
std::optional<host_port> parse_host_port(std::string_view s);

/// An engine's base URL: "http://HOST:PORT" with at most one trailing '/'
/// and no path; nullopt otherwise.
std::optional<host_port> parse_http_url(std::string_view url);

/// A ZeroMQ tcp endpoint: "tcp://HOST:PORT", HOST a name or an IPv4 address,
/// or an IPv6 address in brackets; nullopt otherwise (an unbracketed IPv6
/// address, "*", spaces, brackets inside).
std::optional<host_port> parse_tcp_endpoint(std::string_view endpoint);

/// True for the hosts a socket binds on every interface with ("*",
/// "0.0.0.0", "::"): where an engine listens, not an address to reach it at.
bool is_wildcard(std::string_view host);

/// "tcp://HOST:PORT" for `at` with `offset` added to its port (vLLM's
/// data-parallel rank r is at the port + r); the caller checks the range.
std::string tcp_endpoint(const host_port& at, std::uint32_t offset = 0);

/// True for "localhost", "::1" and 127.0.0.0/8 as a dotted address.
bool is_loopback(std::string_view host);

} // namespace llmgw::wire
