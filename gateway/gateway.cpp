#include "gateway/gateway.hpp"

#include "actors/control.hpp"
#include "actors/router.hpp"
#include "actors/tokenizer.hpp"

#include "base/log.hpp"
#include "gateway/proxy.hpp"
#include "net/http_client.hpp"
#include "net/io_loop.hpp"
#include "net/node_port_guard.hpp"
#include "routing/locked_router.hpp"
#include "routing/router_report.hpp"
#include "routing/token_cache.hpp"
#include "wire/block_hash.hpp"

#include <boost/json.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

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

/// Decides and records on this thread against the shared router state (in
/// one hold of its lock), then hands the decision on.
void decide_here(const gateway_peers& peers, const wire::route_query& q,
                 const std::function<void(const wire::route_decision&)>& done) {
  done(peers.shared_router->decide_and_record(q));
}

} // namespace

gateway_peers spawn_control_plane(caf::actor_system& sys, const control_options& opts) {
  const auto& topo = *opts.topo;
  gateway_peers p;
  p.shared_router = std::make_shared<wire::locked_router>(topo);
  p.token_cache = std::make_shared<wire::token_cache>(topo.router.tokenize_cache_entries,
                                                      topo.router.tokenize_cache_mib << 20);
  p.router = sys.spawn(router, p.shared_router);
  p.control = sys.spawn(control, opts, p.router);
  p.tokenizer = sys.spawn(tokenizer, topo, p.token_cache);
  return p;
}

void stop_control_plane(const gateway_peers& peers) {
  for (const auto& a :
       {caf::actor_cast<caf::actor>(peers.router), caf::actor_cast<caf::actor>(peers.control),
        caf::actor_cast<caf::actor>(peers.tokenizer)})
    if (a)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

void route_flow(caf::actor_system& sys, const gateway_peers& peers,
                const std::shared_ptr<const wire::topology>& topo, const wire::routing_request& req,
                bool dry_run, std::function<void(const wire::route_decision&)> done,
                const std::vector<std::string>& exclude) {
  if (req.token_ids) {
    decide_here(peers, make_query(*topo, req, dry_run, &*req.token_ids, -1, exclude), done);
    return;
  }
  // A prompt tokenized before: no hop to the tokenizer either.
  thread_local std::vector<std::uint32_t> tokens;
  if (peers.token_cache->lookup(req.model, req.tokenize_body, tokens)) {
    decide_here(peers, make_query(*topo, req, dry_run, &tokens, 0, exclude), done);
    return;
  }
  sys.spawn(
    [peers, topo, req, dry_run, done = std::move(done), exclude](caf::event_based_actor* self) {
      auto timeout = topo->router.tokenize_timeout + std::chrono::milliseconds(200);
      self->request(peers.tokenizer, timeout, tokenize_atom::value, req.model, req.tokenize_body)
        .then(
          [peers, topo, req, dry_run, done, exclude](const tokenize_reply& r) {
            // Failed tokenization is not fatal: tier 1 routes the request.
            decide_here(peers,
                        make_query(*topo, req, dry_run, r.ok ? &r.tokens : nullptr,
                                   r.cached ? 0.0 : r.seconds, exclude),
                        done);
          },
          [peers, topo, req, dry_run, done, exclude](const caf::error&) {
            decide_here(
              peers,
              make_query(*topo, req, dry_run, nullptr,
                         std::chrono::duration<double>(topo->router.tokenize_timeout).count(),
                         exclude),
              done);
          });
    });
}

gateway::gateway(caf::actor_system& sys, std::shared_ptr<const wire::topology> topo,
                 const std::string& host, std::uint16_t port, gateway_peers peers,
                 const std::string& admin_host, std::uint16_t admin_port)
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
  // A loop per thread, each with its connections and its own upstream
  // client: a request, its upstream call and the answer's relay never cross
  // threads.
  std::vector<std::shared_ptr<io_loop>> loops;
  for (std::size_t i = 0; i < std::max<std::size_t>(g.threads, 1); ++i) {
    loops.push_back(std::make_shared<io_loop>(1, "llmgw-gateway"));
    upstreams_.emplace_back(loops.back().get(), std::make_shared<http_client>(loops.back()));
  }
  http_server_limits limits;
  limits.max_body_bytes = g.max_body_bytes;
  limits.max_header_bytes = g.max_header_bytes;
  limits.read_timeout = g.read_timeout;
  limits.idle_timeout = g.idle_timeout;
  limits.max_connections = g.max_connections;
  limits.max_connections_per_client = g.max_connections_per_client;
  limits.max_buffered_body_bytes = g.max_buffered_body_mib << 20;
  server_ = std::make_unique<http_server>(host, port, std::move(loops), limits,
                                          [this](http_request&& req, http_responder respond) {
                                            handle(std::move(req), std::move(respond));
                                          });
  error_ = server_->error();
  if (!error_.empty() || admin_host.empty())
    return;
  // Probes and scrapes: few connections, small requests, no per-client cap
  // (a monitoring system may hold several), one thread.
  http_server_limits admin_limits;
  admin_limits.max_body_bytes = 4096;
  admin_limits.max_header_bytes = 16384;
  admin_limits.max_connections = 64;
  admin_ = std::make_unique<http_server>(
    admin_host, admin_port, 1, admin_limits, [this](http_request&& req, http_responder respond) {
      auto path = req.target.substr(0, req.target.find('?'));
      if (!handle_admin(path, req, respond))
        respond(error_reply(404, "NotFoundError",
                            "the admin listener serves /healthz, /metrics and /v1/kv/replicas"));
    });
  if (!admin_->error().empty())
    error_ = "admin listener: " + admin_->error();
}

gateway::~gateway() {
  stop();
}

void gateway::add_metrics(std::function<void(wire::metrics_text&)> f) {
  std::lock_guard<std::mutex> g(extra_mtx_);
  extra_metrics_ = std::move(f);
}

void gateway::stop() {
  server_->stop();
  if (admin_)
    admin_->stop();
}

std::shared_ptr<http_client> gateway::upstream_here() const {
  auto* loop = io_loop::current();
  for (const auto& [l, client] : upstreams_)
    if (l == loop)
      return client;
  return upstreams_.front().second; // not on a loop thread: any client will do
}

namespace {

/// Answers 405 unless the request's method is `m`.
bool method_is(const http_request& req, const std::string& path, const char* m,
               http_responder& respond) {
  if (req.method == m)
    return true;
  respond(error_reply(405, "MethodNotAllowed", req.method + " is not allowed on " + path));
  return false;
}

void append_http_counters(wire::metrics_text& m, const http_server_counters& counters,
                          const wire::metric_labels& listener) {
  auto with = [&](wire::metric_labels more) {
    more.insert(more.begin(), listener.begin(), listener.end());
    return more;
  };
  m.counter("llmgw_http_requests_total", "HTTP requests read, by listener.",
            static_cast<double>(counters.requests.load()), listener);
  m.counter("llmgw_http_connections_total", "HTTP connections accepted, by listener.",
            static_cast<double>(counters.connections.load()), listener);
  m.gauge("llmgw_http_open_connections", "HTTP connections open now, by listener.",
          static_cast<double>(counters.open.load()), listener);
  m.counter("llmgw_http_idle_evicted_total",
            "Idle HTTP connections closed to make room for new ones, by listener.",
            static_cast<double>(counters.evicted.load()), listener);
  auto bad = [&](const char* why, std::uint64_t n) {
    m.counter("llmgw_http_refused_total",
              "HTTP requests or connections refused, by listener and reason.",
              static_cast<double>(n), with({{"reason", why}}));
  };
  bad("malformed", counters.bad_requests.load());
  bad("too_large", counters.too_large.load());
  bad("unsupported", counters.unsupported.load());
  bad("timeout", counters.timeouts.load());
  bad("too_many_connections", counters.rejected_connections.load());
  bad("too_many_from_client", counters.rejected_per_client.load());
  bad("over_body_budget", counters.over_body_budget.load());
  m.gauge("llmgw_http_buffered_body_bytes",
          "Request bodies held now (from their head until their answer is out), by listener.",
          static_cast<double>(counters.buffered_body_bytes.load()), listener);
}

} // namespace

bool gateway::handle_admin(const std::string& path, const http_request& req,
                           http_responder& respond) {
  if (path == "/healthz") {
    if (method_is(req, path, "GET", respond))
      respond(json_reply(200, R"({"status":"ok"})"));
    return true;
  }
  if (path == "/metrics") {
    if (!method_is(req, path, "GET", respond))
      return true;
    // The router's and the gateway's own parts are read here; the control
    // actor's come by message.
    wire::metrics_text m;
    peers_.shared_router->append_metrics(m);
    stats_->append(m);
    append_http_counters(m, server_->counters(), {{"listener", "gateway"}});
    if (admin_)
      append_http_counters(m, admin_->counters(), {{"listener", "admin"}});
    wire::append_node_port_metrics(m);
    {
      std::lock_guard<std::mutex> g(extra_mtx_);
      if (extra_metrics_)
        extra_metrics_(m);
    }
    auto cache = peers_.token_cache->stats();
    m.counter("llmgw_tokenize_cache_hits_total",
              "Text prompts whose tokens the gateway found in the tokenizer's cache.",
              static_cast<double>(cache.hits));
    m.counter("llmgw_tokenize_cache_misses_total",
              "Text prompts the gateway had tokenized (not in the cache).",
              static_cast<double>(cache.misses));
    m.gauge("llmgw_tokenize_cache_entries", "Tokenizations held in the cache.",
            static_cast<double>(cache.entries));
    m.gauge("llmgw_tokenize_cache_bytes",
            "Bytes the cache's tokenizations hold (model, body, tokens, overhead).",
            static_cast<double>(cache.bytes));
    auto control = peers_.control;
    sys_.spawn([control, respond, text = m.str()](caf::event_based_actor* self) {
      self->request(control, std::chrono::seconds(5), metrics_atom::value)
        .then(
          [respond, text](const std::string& control_text) {
            respond(http_reply{200, "text/plain; version=0.0.4", text + control_text, {}});
          },
          [respond](const caf::error& e) {
            respond(
              error_reply(503, "ServiceUnavailableError", "control actor: " + caf::to_string(e)));
          });
    });
    return true;
  }
  if (path == "/v1/kv/replicas") {
    if (method_is(req, path, "GET", respond))
      respond(json_reply(200, peers_.shared_router->kv_replicas_json()));
    return true;
  }
  return false;
}

void gateway::handle(http_request&& req, http_responder respond) {
  auto path = req.target.substr(0, req.target.find('?'));
  auto method_is = [&](const char* m) { return llmgw::method_is(req, path, m, respond); };
  // With an admin listener, what the node knows of its replicas and its
  // counters stays off the clients' port; health answers on both.
  if ((!admin_ || path == "/healthz") && handle_admin(path, req, respond))
    return;
  if (path == "/v1/models") {
    if (method_is("GET"))
      respond(json_reply(200, models_json_));
    return;
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!method_is("POST"))
      return;
    proxy_request(proxy_context{sys_, peers_, topo_, upstream_here(), stats_}, std::move(req),
                  std::move(respond), path,
                  path == "/v1/completions" ? wire::request_kind::completion
                                            : wire::request_kind::chat);
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
    route_flow(sys_, peers_, topo_, *parsed, true, [respond](const wire::route_decision& d) {
      int status = d.replica.empty() ? 404 : 200;
      respond(json_reply(status, wire::decision_json(d)));
    });
    return;
  }
  respond(error_reply(404, "NotFoundError", "no such endpoint: " + req.method + " " + path));
}

} // namespace llmgw
