// How a forwarder reaches its control node over CAF's network layer: an
// asynchronous connect through the middleman with a timeout (a blocking
// remote_actor() waits forever on a hung peer), checked against
// control_actor's interface, reported back to the forwarder on success.
// Failures are logged; the forwarder's backoff timer tries again. When the
// actor system has CAF's OpenSSL module, the connection is mutual TLS.
#pragma once

#include "actors/forwarder.hpp"

#include <chrono>
#include <cstdint>
#include <string>

namespace llmgw {

/// A connect_function for a forwarder that connects to host:port.
connect_function middleman_connector(const std::string& host, std::uint16_t port,
                                     std::chrono::milliseconds timeout);

} // namespace llmgw
