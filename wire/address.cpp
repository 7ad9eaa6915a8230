#include "wire/address.hpp"

#include <algorithm>
#include <cctype>

namespace llmgw::wire {

std::optional<host_port> parse_host_port(std::string_view s) {
  auto colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == s.size())
    return std::nullopt;
  auto digits = s.substr(colon + 1);
  if (digits.size() > 5
      || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  unsigned long port = 0;
  for (char c : digits)
    port = port * 10 + static_cast<unsigned long>(c - '0');
  if (port == 0 || port > 65535)
    return std::nullopt;
  auto host = s.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host_port{std::string(host), static_cast<std::uint16_t>(port)};
}

std::optional<host_port> parse_http_url(std::string_view url) {
  constexpr std::string_view scheme = "http://";
  if (url.substr(0, scheme.size()) != scheme)
    return std::nullopt;
  auto rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/')
    rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos)
    return std::nullopt;
  return parse_host_port(rest);
}

std::optional<host_port> parse_tcp_endpoint(std::string_view endpoint) {
  constexpr std::string_view scheme = "tcp://";
  if (endpoint.substr(0, scheme.size()) != scheme)
    return std::nullopt;
  auto rest = endpoint.substr(scheme.size());
  auto at = parse_host_port(rest);
  if (!at)
    return std::nullopt;
  auto written = rest.substr(0, rest.rfind(':'));
  bool bracketed = written.size() > 2 && written.front() == '[' && written.back() == ']';
  // An IPv6 address only in brackets (else its last group reads as a port);
  // a name or IPv4 address of letters, digits, '.', '-' and '_' only.
  bool v6 = at->host.find(':') != std::string::npos;
  if (v6 != bracketed)
    return std::nullopt;
  for (char c : at->host) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_'
              || (v6 && (c == ':' || c == '%'));
    if (!ok)
      return std::nullopt;
  }
  return at;
}

bool is_wildcard(std::string_view host) {
  return host == "*" || host == "0.0.0.0" || host == "::" || host == "0:0:0:0:0:0:0:0";
}

std::string tcp_endpoint(const host_port& at, std::uint32_t offset) {
  auto port = std::to_string(static_cast<std::uint32_t>(at.port) + offset);
  if (at.host.find(':') != std::string::npos)
    return "tcp://[" + at.host + "]:" + port;
  return "tcp://" + at.host + ":" + port;
}

bool is_loopback(std::string_view host) {
  if (host == "localhost" || host == "::1")
    return true;
  // 127.0.0.0/8 as a dotted address: a host name that merely starts with
  // "127." (127.example.com) is no loopback.
  return host.substr(0, 4) == "127." && host.size() > 4
         && std::all_of(host.begin() + 4, host.end(),
                        [](char c) { return (c >= '0' && c <= '9') || c == '.'; });
}

} // namespace llmgw::wire
