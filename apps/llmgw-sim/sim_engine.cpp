#include "apps/llmgw-sim/sim_engine.hpp"

#include "apps/llmgw-sim/sim_api.hpp"
#include "apps/llmgw-sim/sim_scheduler.hpp"
#include "base/log.hpp"

#include <boost/json.hpp>

namespace llmgw::sim {

namespace json = boost::json;

namespace {

/// "tcp://HOST:PORT" with PORT moved by `delta` (data-parallel ranks).
std::string shift_port(const std::string& endpoint, std::size_t delta) {
  auto colon = endpoint.rfind(':');
  if (delta == 0 || endpoint.rfind("tcp://", 0) != 0 || colon == std::string::npos)
    return endpoint;
  auto port = endpoint.substr(colon + 1);
  if (port == "*" || port.empty())
    return endpoint;
  return endpoint.substr(0, colon + 1) + std::to_string(std::stoul(port) + delta);
}

} // namespace

struct engine::impl {
  engine_options opts;
  std::unique_ptr<scheduler> sched;
  std::unique_ptr<api> http_api;
  std::unique_ptr<http_server> server; ///< last: stopped first
};

engine::engine(engine_options opts) : impl_(std::make_unique<impl>()) {
  auto& im = *impl_;
  im.opts = std::move(opts);
  publisher_config pc;
  bool events = false;
  if (!im.opts.kv_events_config.empty()) {
    boost::system::error_code ec;
    auto cfg = json::parse(im.opts.kv_events_config, ec);
    if (ec || !cfg.is_object()) {
      error_ = "--kv-events-config is not a JSON object";
      return;
    }
    const auto& o = cfg.as_object();
    auto str = [&](const char* k, const std::string& def) {
      const auto* v = o.if_contains(k);
      return v && v->is_string() ? std::string(v->as_string()) : def;
    };
    const auto* enable = o.if_contains("enable_kv_cache_events");
    events = enable && enable->is_bool() && enable->as_bool();
    if (events && str("publisher", "zmq") != "zmq") {
      error_ = "--kv-events-config: only the zmq publisher is simulated";
      return;
    }
    pc.endpoint = str("endpoint", "tcp://*:5557");
    pc.replay_endpoint = str("replay_endpoint", "");
    pc.topic = str("topic", "");
    if (const auto* b = o.if_contains("buffer_steps"); b && b->is_int64())
      pc.buffer_steps = static_cast<std::size_t>(b->as_int64());
    pc.shape = im.opts.event_shape;
  }
  bool matchable = im.opts.hash_algo == "sha256_cbor" && !im.opts.seed.empty();
  if (!matchable)
    LLMGW_LOG(warning, "llmgw-sim",
              "block hashes cannot be reproduced outside this engine ({}): start it with "
              "PYTHONHASHSEED set and --prefix-caching-hash-algo sha256_cbor",
              im.opts.seed.empty() ? "PYTHONHASHSEED is not set"
                                   : "hash algo " + im.opts.hash_algo);
  std::vector<std::unique_ptr<sim_rank>> ranks;
  for (std::size_t r = 0; r < std::max<std::size_t>(im.opts.dp_size, 1); ++r) {
    cache_config cc;
    cc.blocks = im.opts.num_gpu_blocks;
    cc.block_size = im.opts.block_size;
    cc.seed = matchable ? im.opts.seed : std::string{};
    cc.int_hashes = im.opts.int_hashes;
    auto rs = std::make_unique<sim_rank>(cc, im.opts.batch);
    if (events) {
      auto rpc = pc;
      rpc.endpoint = shift_port(pc.endpoint, r);
      rpc.replay_endpoint = shift_port(pc.replay_endpoint, r);
      rpc.dp_rank = static_cast<std::int64_t>(r);
      rs->pub = std::make_unique<publisher>(rpc);
      if (!rs->pub->error().empty()) {
        error_ = rs->pub->error();
        return;
      }
    }
    ranks.push_back(std::move(rs));
  }
  im.sched = std::make_unique<scheduler>(std::move(ranks));
  im.http_api = std::make_unique<api>(im.opts, *im.sched);
  http_server_limits limits;
  limits.idle_timeout = std::chrono::minutes(5);
  im.server =
    std::make_unique<http_server>(im.opts.host, im.opts.port, 2, limits,
                                  [&im](http_request&& req, const http_responder& respond) {
                                    im.http_api->handle(std::move(req), respond);
                                  });
  if (im.server->port() == 0)
    error_ = im.server->error();
}

engine::~engine() {
  auto& im = *impl_;
  if (im.server)
    im.server->stop();
  im.sched.reset(); // its thread ends; requests still running get no answer
}

std::uint16_t engine::port() const noexcept {
  return impl_->server ? impl_->server->port() : 0;
}

} // namespace llmgw::sim
