#include "actors/control_plane.hpp"

#include "actors/canary.hpp"
#include "actors/control.hpp"
#include "actors/router.hpp"
#include "actors/tokenizer.hpp"
#include "base/log.hpp"
#include "config/topology.hpp"
#include "routing/shared_router.hpp"
#include "routing/token_cache.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <netdb.h>
#include <sys/socket.h>

namespace llmgw {

std::set<std::string> addresses_of(const std::string& host) {
  std::set<std::string> out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0)
    return out;
  for (auto* ai = res; ai; ai = ai->ai_next) {
    char buf[NI_MAXHOST];
    if (getnameinfo(ai->ai_addr, ai->ai_addrlen, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0)
      continue;
    out.insert(buf);
    if (ai->ai_family == AF_INET)
      out.insert(std::string("::ffff:") + buf);
  }
  freeaddrinfo(res);
  return out;
}

std::map<std::string, std::set<std::string>> agent_addresses_of(const config::topology& topo,
                                                                const std::string& name) {
  std::map<std::string, std::set<std::string>> out;
  if (!topo.check_agent_address)
    return out;
  for (const auto& n : topo.nodes)
    if (n.roles.agent) {
      auto addrs = addresses_of(n.host);
      if (addrs.empty())
        LLMGW_LOG(warning, "node " + name,
                  "cannot resolve agent node '{}''s host '{}': its sessions "
                  "will be refused until it resolves",
                  n.name, n.host);
      addrs.insert("unresolved:" + n.host); // never matches, keeps the check on
      out[n.name] = std::move(addrs);
    }
  return out;
}

control_options control_options_of(std::shared_ptr<const config::topology> topo,
                                   const std::string& name,
                                   std::shared_ptr<const config::node_identity> identity) {
  control_options opts;
  opts.node = name;
  opts.identity = std::move(identity);
  opts.agent_addresses = agent_addresses_of(*topo, name);
  opts.topo = std::move(topo);
  return opts;
}

std::shared_ptr<routing::token_cache> token_cache_of(const config::topology& topo) {
  return std::make_shared<routing::token_cache>(topo.router.tokenize_cache_entries,
                                                topo.router.tokenize_cache_mib << 20);
}

control_plane spawn_control_plane(caf::actor_system& sys, const control_options& opts) {
  const auto& topo = *opts.topo;
  control_plane p;
  p.shared_router = std::make_shared<routing::shared_router>(topo);
  p.token_cache = token_cache_of(topo);
  p.router = sys.spawn(router, p.shared_router);
  p.control = sys.spawn(control, opts, p.router);
  p.tokenizer = sys.spawn(tokenizer, topo, p.token_cache);
  p.canary = sys.spawn(canary, p.shared_router, topo.router.canary_timeout);
  return p;
}

caf::expected<std::uint16_t> publish_control(caf::actor_system& sys, const control_plane& plane,
                                             const config::topology& topo,
                                             const config::node_spec& node) {
  if (topo.plaintext)
    return sys.middleman().publish(plane.control, node.port, node.host.c_str(), true);
  return caf::openssl::publish(plane.control, node.port, node.host.c_str(), true);
}

void reload_control_plane(caf::actor_system& sys, const control_plane& plane,
                          const std::shared_ptr<const config::topology>& fresh,
                          const std::string& name) {
  // The actors take a reload only from an actor of this node; the control
  // actor passes it on to the router.
  caf::scoped_actor self{sys};
  self->send(plane.control, topology_reload{fresh, agent_addresses_of(*fresh, name)});
  self->send(plane.tokenizer, topology_reload{fresh, {}});
}

void stop_control_plane(const control_plane& plane) {
  for (const auto& a :
       {caf::actor_cast<caf::actor>(plane.router), caf::actor_cast<caf::actor>(plane.control),
        caf::actor_cast<caf::actor>(plane.tokenizer), caf::actor_cast<caf::actor>(plane.canary)})
    if (a)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

} // namespace llmgw
