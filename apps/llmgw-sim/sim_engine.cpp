#include "apps/llmgw-sim/sim_engine.hpp"

#include "apps/llmgw-sim/sim_api.hpp"
#include "apps/llmgw-sim/sim_scheduler.hpp"
#include "base/log.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <random>
#include <thread>

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

/// Publishes `per_second` block events a second into each of `pubs` until
/// `stop`: stores of random blocks (GPU, no tokens: nothing to check or to
/// match a prompt), then, once churn_cap are held, as many removes of the
/// oldest (churn_removes). Each 10 ms tick sends one batch per rank.
void churn(const std::vector<publisher*>& pubs, std::size_t per_second,
           const std::atomic<bool>& stop) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<std::deque<wire::block_key>> held(pubs.size());
  auto last = std::chrono::steady_clock::now();
  double owed = 0;
  while (!stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto now = std::chrono::steady_clock::now();
    // At most a second owed: a stalled process does not burst afterwards.
    owed = std::min(
      owed + std::chrono::duration<double>(now - last).count() * static_cast<double>(per_second),
      static_cast<double>(per_second));
    last = now;
    // At most half the cap a tick, so removes can always keep the cap.
    auto n = std::min(static_cast<std::size_t>(owed), churn_cap / 2);
    owed -= static_cast<double>(n);
    if (n == 0)
      continue;
    for (std::size_t r = 0; r < pubs.size(); ++r) {
      auto& h = held[r];
      auto removes = churn_removes(h.size(), n);
      std::vector<wire::kv_event> events; // no empty event: vLLM sends none
      if (removes < n) {
        auto& stored = events.emplace_back();
        stored.kind = wire::event_kind::block_stored;
        stored.block_size = 16;
        for (std::size_t i = 0; i < n - removes; ++i) {
          wire::block_hash b;
          b.key = rng();
          stored.block_hashes.push_back(b);
          h.push_back(b.key);
        }
      }
      if (removes > 0) {
        auto& removed = events.emplace_back();
        removed.kind = wire::event_kind::block_removed;
        for (std::size_t i = 0; i < removes; ++i) {
          wire::block_hash b;
          b.key = h.front();
          h.pop_front();
          removed.block_hashes.push_back(b);
        }
      }
      pubs[r]->publish(std::move(events));
    }
  }
}

} // namespace

std::size_t churn_removes(std::size_t held, std::size_t events, std::size_t cap) {
  if (held + events <= cap)
    return 0; // room for every store
  // Half the events remove, and more if the stores would pass the cap (an
  // odd count's extra store would otherwise add one block every tick):
  // held - r + (events - r) <= cap.
  auto needed = (held + events - cap + 1) / 2;
  return std::min({held, events, std::max(events / 2, needed)});
}

struct engine::impl {
  engine_options opts;
  std::atomic<bool> churn_stop{false};
  std::thread churn;
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
    // SGLang publishes when its config names the zmq publisher (its
    // default is "null"); vLLM when enabled, its publisher then zmq.
    if (im.opts.sglang)
      events = str("publisher", "null") == "zmq";
    else
      events = enable && enable->is_bool() && enable->as_bool();
    if (!im.opts.sglang && events && str("publisher", "zmq") != "zmq") {
      error_ = "--kv-events-config: only the zmq publisher is simulated";
      return;
    }
    pc.endpoint = str("endpoint", "tcp://*:5557");
    pc.replay_endpoint = str("replay_endpoint", "");
    pc.topic = str("topic", "");
    if (const auto* b = o.if_contains("buffer_steps"); b && b->is_int64())
      pc.buffer_steps = static_cast<std::size_t>(b->as_int64());
    pc.shape = im.opts.sglang ? wire::event_shape::sglang : im.opts.event_shape;
  }
  bool matchable = im.opts.hash_algo == "sha256_cbor" && !im.opts.seed.empty();
  if (!matchable && !im.opts.sglang) // SGLang's page ids are its own whatever the flags
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
  std::vector<publisher*> pubs;
  for (const auto& rs : ranks)
    if (rs->pub)
      pubs.push_back(rs->pub.get());
  im.sched = std::make_unique<scheduler>(std::move(ranks));
  if (im.opts.event_churn > 0 && !pubs.empty())
    im.churn = std::thread([&im, pubs] { churn(pubs, im.opts.event_churn, im.churn_stop); });
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
  im.churn_stop = true;
  if (im.churn.joinable())
    im.churn.join();
  im.sched.reset(); // its thread ends; requests still running get no answer
}

std::uint16_t engine::port() const noexcept {
  return impl_->server ? impl_->server->port() : 0;
}

} // namespace llmgw::sim
