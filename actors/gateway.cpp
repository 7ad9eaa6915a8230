#include "actors/gateway.hpp"

#include "actors/http_client.hpp"
#include "actors/io_loop.hpp"
#include "actors/proxy.hpp"
#include "wire/block_hash.hpp"
#include "wire/log.hpp"
#include "wire/router_report.hpp"

#include <boost/json.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <set>

namespace llmgw {

namespace {

namespace json = boost::json;

http_reply json_reply(int status, std::string body) {
  return http_reply{status, "application/json", std::move(body), {}};
}

http_reply error_reply(int status, const std::string& type, const std::string& message) {
  return json_reply(status, wire::openai_error_json(message, type, status));
}

/// A block hasher for this thread and the cluster's seed and block size:
/// constructing one hashes the seed, which is not worth doing per request.
wire::block_hasher& hasher_for(const wire::topology& topo) {
  thread_local std::unique_ptr<wire::block_hasher> h;
  thread_local std::string seed;
  thread_local std::size_t block_size = 0;
  if (!h || seed != topo.seed || block_size != topo.block_size) {
    h = std::make_unique<wire::block_hasher>(topo.seed, topo.block_size);
    seed = topo.seed;
    block_size = topo.block_size;
  }
  return *h;
}

bool is_lora(const wire::topology& topo, const std::string& model) {
  for (const auto& n : topo.nodes)
    for (const auto& e : n.engines)
      for (const auto& l : e.lora)
        if (l == model)
          return true;
  return false;
}

/// The router's query for a request: block keys hashed here (on the
/// caller's thread, not the router's), tier-1 chunk hashes, timings.
wire::route_query make_query(const wire::topology& topo, const wire::routing_request& req,
                             bool dry_run, const std::vector<std::uint32_t>* tokens,
                             double tokenize_seconds, const std::vector<std::string>& exclude) {
  wire::route_query q;
  q.model = req.model;
  q.dry_run = dry_run;
  q.exclude = exclude;
  q.tokenize_seconds = tokenize_seconds;
  auto start = std::chrono::steady_clock::now();
  if (tokens) {
    q.tokenized = true;
    wire::extra_key_recipe extras;
    if (is_lora(topo, req.model))
      extras.lora_name = req.model;
    extras.cache_salt = req.cache_salt;
    thread_local std::vector<wire::hashed_block> blocks;
    hasher_for(topo).hash_into(*tokens, extras, blocks);
    q.keys.reserve(blocks.size());
    for (const auto& b : blocks)
      q.keys.push_back(b.key);
  }
  q.chunks = wire::chunk_hashes(req.text, topo.router.tier1_chunk_bytes);
  q.hash_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return q;
}

/// Asks the router from within an actor, with a deadline.
void decide(caf::event_based_actor* self, const gateway_peers& peers,
            const std::shared_ptr<const wire::topology>& topo, const wire::routing_request& req,
            bool dry_run, const std::vector<std::uint32_t>* tokens, double tokenize_seconds,
            const std::function<void(wire::route_decision)>& done,
            const std::vector<std::string>& exclude) {
  auto q = make_query(*topo, req, dry_run, tokens, tokenize_seconds, exclude);
  self->request(peers.router, std::chrono::seconds(5), route_atom::value, std::move(q))
    .then([done](wire::route_decision& d) { done(std::move(d)); },
          [done](const caf::error& err) {
            wire::route_decision d;
            d.error = "the router did not answer: " + caf::to_string(err);
            done(std::move(d));
          });
}

} // namespace

void route_flow(caf::actor_system& sys, const gateway_peers& peers,
                const std::shared_ptr<const wire::topology>& topo, wire::routing_request req,
                bool dry_run, std::function<void(wire::route_decision)> done,
                std::vector<std::string> exclude) {
  if (req.token_ids) {
    // Nothing to tokenize: hash here and let the router call back, without
    // an actor in between (a spawn and a hop per request).
    auto q = make_query(*topo, req, dry_run, &*req.token_ids, -1, exclude);
    auto cb = std::make_shared<std::function<void(const wire::route_decision&)>>(
      [done = std::move(done)](const wire::route_decision& d) { done(d); });
    caf::anon_send(peers.router, route_atom::value, std::move(q), std::move(cb));
    return;
  }
  sys.spawn([peers, topo, req = std::move(req), dry_run, done = std::move(done),
             exclude = std::move(exclude)](caf::event_based_actor* self) {
    auto timeout = topo->router.tokenize_timeout + std::chrono::milliseconds(200);
    self->request(peers.tokenizer, timeout, tokenize_atom::value, req.model, req.tokenize_body)
      .then(
        [self, peers, topo, req, dry_run, done, exclude](const tokenize_reply& r) {
          // Failed tokenization is not fatal: tier 1 routes the request.
          decide(self, peers, topo, req, dry_run, r.ok ? &r.tokens : nullptr,
                 r.cached ? 0.0 : r.seconds, done, exclude);
        },
        [self, peers, topo, req, dry_run, done, exclude](const caf::error&) {
          decide(self, peers, topo, req, dry_run, nullptr,
                 std::chrono::duration<double>(topo->router.tokenize_timeout).count(), done,
                 exclude);
        });
  });
}

gateway::gateway(caf::actor_system& sys, std::shared_ptr<const wire::topology> topo,
                 const std::string& host, std::uint16_t port, gateway_peers peers)
  : sys_(sys), topo_(std::move(topo)), peers_(std::move(peers)) {
  json::array data;
  std::set<std::string> seen;
  for (const auto& n : topo_->nodes)
    for (const auto& e : n.engines) {
      auto add = [&](const std::string& id, const std::string& parent) {
        if (!seen.insert(id).second)
          return;
        json::object m;
        m["id"] = id;
        m["object"] = "model";
        m["owned_by"] = "llmgw";
        if (!parent.empty())
          m["parent"] = parent;
        data.push_back(std::move(m));
      };
      add(e.model, "");
      for (const auto& l : e.lora)
        add(l, e.model);
    }
  json::object models;
  models["object"] = "list";
  models["data"] = std::move(data);
  models_json_ = json::serialize(models);
  const auto& g = topo_->gateway;
  stats_ = std::make_shared<proxy_stats>();
  // One thread: the server and the upstream client share it, so a request,
  // its upstream call and the answer's relay never cross threads. More
  // threads: the server gets them, the client keeps its own.
  std::shared_ptr<io_loop> loop = std::make_shared<io_loop>(std::max<std::size_t>(g.threads, 1));
  upstream_ =
    g.threads <= 1 ? std::make_shared<http_client>(loop) : std::make_shared<http_client>();
  http_server_limits limits;
  limits.max_body_bytes = g.max_body_bytes;
  limits.max_header_bytes = g.max_header_bytes;
  limits.read_timeout = g.read_timeout;
  limits.idle_timeout = g.idle_timeout;
  limits.max_connections = g.max_connections;
  server_ = std::make_unique<http_server>(host, port, loop, limits,
                                          [this](http_request&& req, http_responder respond) {
                                            handle(std::move(req), std::move(respond));
                                          });
}

gateway::~gateway() {
  server_->stop();
}

void gateway::handle(http_request&& req, http_responder respond) {
  auto path = req.target.substr(0, req.target.find('?'));
  auto method_is = [&](const char* m) {
    if (req.method == m)
      return true;
    respond(error_reply(405, "MethodNotAllowed", req.method + " is not allowed on " + path));
    return false;
  };
  if (path == "/healthz") {
    if (method_is("GET"))
      respond(json_reply(200, R"({"status":"ok"})"));
    return;
  }
  if (path == "/v1/models") {
    if (method_is("GET"))
      respond(json_reply(200, models_json_));
    return;
  }
  if (path == "/metrics") {
    if (!method_is("GET"))
      return;
    auto peers = peers_;
    const auto* counters = &server_->counters();
    auto stats = stats_;
    sys_.spawn([peers, respond, counters, stats](caf::event_based_actor* self) {
      self->request(peers.router, std::chrono::seconds(5), metrics_atom::value)
        .then(
          [self, peers, respond, counters, stats](const std::string& router_text) {
            self->request(peers.control, std::chrono::seconds(5), metrics_atom::value)
              .then(
                [respond, router_text, counters, stats](const std::string& control_text) {
                  wire::metrics_text m;
                  stats->append(m);
                  m.counter("llmgw_http_requests_total", "HTTP requests read by the gateway.",
                            static_cast<double>(counters->requests.load()));
                  m.counter("llmgw_http_connections_total", "HTTP connections accepted.",
                            static_cast<double>(counters->connections.load()));
                  m.gauge("llmgw_http_open_connections", "HTTP connections open now.",
                          static_cast<double>(counters->open.load()));
                  auto bad = [&](const char* why, std::uint64_t n) {
                    m.counter("llmgw_http_refused_total",
                              "HTTP requests or connections refused, by reason.",
                              static_cast<double>(n), {{"reason", why}});
                  };
                  bad("malformed", counters->bad_requests.load());
                  bad("too_large", counters->too_large.load());
                  bad("timeout", counters->timeouts.load());
                  bad("too_many_connections", counters->rejected_connections.load());
                  respond(http_reply{
                    200, "text/plain; version=0.0.4", router_text + control_text + m.str(), {}});
                },
                [respond](const caf::error& e) {
                  respond(error_reply(503, "ServiceUnavailableError",
                                      "control actor: " + caf::to_string(e)));
                });
          },
          [respond](const caf::error& e) {
            respond(error_reply(503, "ServiceUnavailableError", "router: " + caf::to_string(e)));
          });
    });
    return;
  }
  if (path == "/v1/kv/replicas") {
    if (!method_is("GET"))
      return;
    auto router = peers_.router;
    sys_.spawn([router, respond](caf::event_based_actor* self) {
      self->request(router, std::chrono::seconds(5), kv_atom::value)
        .then([respond](const std::string& body) { respond(json_reply(200, body)); },
              [respond](const caf::error& e) {
                respond(
                  error_reply(503, "ServiceUnavailableError", "router: " + caf::to_string(e)));
              });
    });
    return;
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!method_is("POST"))
      return;
    proxy_request(
      proxy_context{sys_, peers_, topo_, upstream_, stats_}, std::move(req), std::move(respond),
      path, path == "/v1/completions" ? wire::request_kind::completion : wire::request_kind::chat);
    return;
  }
  if (path == "/v1/route") {
    if (!method_is("POST"))
      return;
    auto parsed = wire::parse_routing_request(req.body, std::nullopt);
    if (!parsed) {
      respond(error_reply(400, "BadRequestError", parsed.err().message));
      return;
    }
    route_flow(sys_, peers_, topo_, std::move(*parsed), true,
               [respond](const wire::route_decision& d) {
                 int status = d.replica.empty() ? 404 : 200;
                 respond(json_reply(status, wire::decision_json(d)));
               });
    return;
  }
  respond(error_reply(404, "NotFoundError", "no such endpoint: " + req.method + " " + path));
}

} // namespace llmgw
