#include "gateway/gateway.hpp"

#include "base/log.hpp"
#include "gateway/health_probe.hpp"
#include "gateway/proxy.hpp"
#include "gateway/route.hpp"
#include "net/http_client.hpp"
#include "net/io_loop.hpp"
#include "net/node_port_guard.hpp"
#include "routing/router_report.hpp"
#include "routing/shared_router.hpp"
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

/// How long cut requests get to write their last words once the drain
/// deadline passed: their upstream calls end on the loops at once.
constexpr std::chrono::milliseconds cut_allowance{2000};

/// /v1/models: every model and LoRA adapter of the topology's engines.
std::string models_json_of(const config::topology& topo) {
  json::array data;
  std::set<std::string> seen;
  for (const auto& n : topo.nodes)
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
  return json::serialize(models);
}

} // namespace

gateway::gateway(caf::actor_system& sys, const std::shared_ptr<const config::topology>& topo,
                 const std::string& host, std::uint16_t port, control_plane plane,
                 const std::string& admin_host, std::uint16_t admin_port)
  : sys_(sys), topo_(topo), plane_(std::move(plane)) {
  models_json_ = models_json_of(*topo);
  const auto& g = topo->gateway;
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
  if (!error_.empty())
    return;
  prober_ = std::make_unique<health_prober>(
    topo, upstreams_.front().second, plane_.shared_router,
    [stats = stats_](const std::string& replica) { abandon_attempts(*stats, replica); });
  if (admin_host.empty())
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
      if (!handle_admin(path, req, respond)) {
        std::string served = "/healthz, /readyz, /metrics, /v1/kv/replicas";
        {
          std::lock_guard<std::mutex> g(extra_mtx_);
          for (const auto& [p, f] : extra_json_)
            served += ", " + p;
        }
        respond(error_reply(404, "NotFoundError", "the admin listener serves " + served));
      }
    });
  if (!admin_->error().empty())
    error_ = "admin listener: " + admin_->error();
}

gateway::~gateway() {
  stop();
}

void gateway::reload(std::shared_ptr<const config::topology> fresh) {
  {
    std::lock_guard<std::mutex> g(models_mtx_);
    models_json_ = models_json_of(*fresh);
  }
  if (prober_)
    prober_->set_targets(*fresh);
  topo_.set(std::move(fresh));
}

std::string gateway::models_json() const {
  std::lock_guard<std::mutex> g(models_mtx_);
  return models_json_;
}

void gateway::add_metrics(std::function<void(wire::metrics_text&)> f) {
  std::lock_guard<std::mutex> g(extra_mtx_);
  extra_metrics_ = std::move(f);
}

void gateway::add_json(std::string path, std::function<std::string()> f) {
  std::lock_guard<std::mutex> g(extra_mtx_);
  extra_json_[std::move(path)] = std::move(f);
}

void gateway::stop() {
  if (prober_)
    prober_->stop();
  server_->stop();
  if (admin_)
    admin_->stop();
}

bool gateway::drain(std::chrono::milliseconds timeout) {
  draining_ = true;
  auto idle = [this] { return stats_->in_flight == 0; };
  {
    std::unique_lock<std::mutex> g(stats_->mtx);
    if (stats_->idle.wait_for(g, timeout, idle))
      return true;
  }
  // The deadline passed: what is still in flight ends now, each stream with
  // an error event its client notices, before stop() closes connections.
  cut_in_flight(*stats_);
  std::unique_lock<std::mutex> g(stats_->mtx);
  stats_->idle.wait_for(g, cut_allowance, idle);
  return false;
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
      respond(draining_ ? json_reply(503, R"({"status":"draining"})")
                        : json_reply(200, R"({"status":"ok"})"));
    return true;
  }
  if (path == "/readyz") {
    if (!method_is(req, path, "GET", respond))
      return true;
    auto why = draining_ ? std::string("draining") : plane_.shared_router->unready_reason();
    json::object o;
    o["status"] = why.empty() ? "ready" : "not ready";
    if (!why.empty())
      o["reason"] = why;
    respond(json_reply(why.empty() ? 200 : 503, json::serialize(o)));
    return true;
  }
  if (path == "/metrics") {
    if (!method_is(req, path, "GET", respond))
      return true;
    serve_metrics(respond);
    return true;
  }
  if (path == "/v1/kv/replicas") {
    if (method_is(req, path, "GET", respond))
      respond(json_reply(200, plane_.shared_router->kv_replicas_json()));
    return true;
  }
  std::function<std::string()> extra;
  {
    std::lock_guard<std::mutex> g(extra_mtx_);
    auto it = extra_json_.find(path);
    if (it == extra_json_.end())
      return false;
    extra = it->second;
  }
  if (method_is(req, path, "GET", respond))
    respond(json_reply(200, extra()));
  return true;
}

std::string gateway::local_metrics() {
  wire::metrics_text m;
  plane_.shared_router->append_metrics(m);
  stats_->append(m);
  if (prober_)
    prober_->append_metrics(m);
  append_http_counters(m, server_->counters(), {{"listener", "gateway"}});
  if (admin_)
    append_http_counters(m, admin_->counters(), {{"listener", "admin"}});
  append_node_port_metrics(m);
  {
    std::lock_guard<std::mutex> g(extra_mtx_);
    if (extra_metrics_)
      extra_metrics_(m);
  }
  auto cache = plane_.token_cache->stats();
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
  return m.str();
}

void gateway::serve_metrics(const http_responder& respond) {
  auto control = plane_.control;
  sys_.spawn([control, respond, text = local_metrics()](caf::event_based_actor* self) {
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
}

void gateway::handle(http_request&& req, http_responder respond) {
  auto path = req.target.substr(0, req.target.find('?'));
  auto method_is = [&](const char* m) { return llmgw::method_is(req, path, m, respond); };
  // With an admin listener, what the node knows of its replicas and its
  // counters stays off the clients' port; health answers on both.
  if ((!admin_ || path == "/healthz" || path == "/readyz") && handle_admin(path, req, respond))
    return;
  if (path == "/v1/models") {
    if (method_is("GET"))
      respond(json_reply(200, models_json()));
    return;
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (!method_is("POST"))
      return;
    if (draining_) {
      respond(error_reply(503, "ServiceUnavailableError",
                          "this gateway is draining (stopping): send the request to another"));
      return;
    }
    proxy_request(proxy_context{sys_, plane_, topo_.get(), upstream_here(), stats_}, std::move(req),
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
    route_request(sys_, plane_, topo_.get(), *parsed, true,
                  [respond](const routing::route_decision& d) {
                    int status = d.replica.empty() ? 404 : 200;
                    respond(json_reply(status, routing::decision_json(d)));
                  });
    return;
  }
  respond(error_reply(404, "NotFoundError", "no such endpoint: " + req.method + " " + path));
}

} // namespace llmgw
