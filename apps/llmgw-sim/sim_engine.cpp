#include "apps/llmgw-sim/sim_engine.hpp"

#include "apps/llmgw-sim/sim_cache.hpp"
#include "apps/llmgw-sim/sim_publisher.hpp"
#include "apps/llmgw-sim/sim_text.hpp"
#include "base/log.hpp"
#include "wire/metrics_text.hpp"
#include "wire/openai_request.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

namespace llmgw::sim {

namespace json = boost::json;
using clock = std::chrono::steady_clock;

namespace {

http_reply json_reply(int status, const json::value& v) {
  return llmgw::json_reply(status, json::serialize(v));
}

/// One request, from its arrival to its last token.
struct request {
  std::uint64_t id = 0;
  bool chat = false;
  std::string model;
  bool stream = false;
  bool include_usage = false;
  std::vector<std::uint32_t> prompt;
  wire::extra_key_recipe extras;
  std::optional<std::int64_t> lora_id;
  std::size_t max_tokens = 16;
  int rank_hint = -1;
  http_responder respond;
  std::atomic<bool> cancelled{false};
  std::int64_t created = 0;
  // Engine thread only:
  std::size_t rank = 0;
  std::optional<allocation> alloc;
  std::optional<http_stream> out;
  std::size_t generated = 0;
  std::string text;

  explicit request(http_responder r) : respond(std::move(r)) {}
  std::string rid() const { return (chat ? "chatcmpl-" : "cmpl-") + std::to_string(id); }
};

struct rank_state {
  explicit rank_state(cache_config cfg) : cache(std::move(cfg)) {}
  kv_cache cache;
  std::unique_ptr<publisher> pub;
  std::deque<std::shared_ptr<request>> waiting;
  std::size_t running = 0;
};

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

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

} // namespace

struct engine::impl {
  engine_options opts;
  std::vector<std::unique_ptr<rank_state>> ranks;
  std::mutex mtx;
  std::condition_variable cv;
  std::deque<std::function<void()>> inbox;                     ///< guarded by mtx
  std::multimap<clock::time_point, std::function<void()>> due; ///< engine thread only
  bool stop = false;
  std::thread thread;
  std::unique_ptr<http_server> server;
  std::atomic<std::uint64_t> next_id{1};
  std::atomic<std::uint64_t> succeeded{0};
  std::atomic<std::uint64_t> running_total{0};
  std::atomic<std::uint64_t> waiting_total{0};
  std::atomic<std::uint64_t> queried{0};
  std::atomic<std::uint64_t> hits{0};
  std::atomic<double> usage{0};

  /// Runs `f` on the engine thread (any thread).
  void post(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> g(mtx);
      inbox.push_back(std::move(f));
    }
    cv.notify_all();
  }

  /// Runs `f` on the engine thread at `t` (engine thread only).
  void at(clock::time_point t, std::function<void()> f) { due.emplace(t, std::move(f)); }

  void run() {
    for (;;) {
      std::deque<std::function<void()>> jobs;
      {
        std::unique_lock<std::mutex> g(mtx);
        auto ready = [this] {
          return stop || !inbox.empty() || (!due.empty() && due.begin()->first <= clock::now());
        };
        if (due.empty())
          cv.wait(g, ready);
        else
          cv.wait_until(g, due.begin()->first, ready);
        if (stop)
          return;
        jobs.swap(inbox);
      }
      for (auto& j : jobs)
        j();
      auto now = clock::now();
      while (!due.empty() && due.begin()->first <= now) {
        auto f = std::move(due.begin()->second);
        due.erase(due.begin());
        f();
      }
      refresh_gauges();
    }
  }

  void refresh_gauges() {
    std::size_t running = 0, waiting = 0, used = 0, total = 0;
    std::uint64_t q = 0, h = 0;
    for (const auto& r : ranks) {
      running += r->running;
      waiting += r->waiting.size();
      used += r->cache.used_blocks();
      total += r->cache.total_blocks();
      q += r->cache.queried_tokens();
      h += r->cache.hit_tokens();
    }
    running_total = running;
    waiting_total = waiting;
    queried = q;
    hits = h;
    usage = total ? static_cast<double>(used) / static_cast<double>(total) : 0;
  }

  // -- the engine thread ---------------------------------------------------

  void admit(const std::shared_ptr<request>& r) {
    std::size_t best = 0;
    if (r->rank_hint >= 0 && static_cast<std::size_t>(r->rank_hint) < ranks.size())
      best = static_cast<std::size_t>(r->rank_hint);
    else
      for (std::size_t i = 1; i < ranks.size(); ++i)
        if (ranks[i]->running + ranks[i]->waiting.size()
            < ranks[best]->running + ranks[best]->waiting.size())
          best = i;
    r->rank = best;
    ranks[best]->waiting.push_back(r);
    try_admit(best);
  }

  void try_admit(std::size_t rank) {
    auto& rs = *ranks[rank];
    while (!rs.waiting.empty()) {
      auto r = rs.waiting.front();
      if (r->cancelled) {
        rs.waiting.pop_front();
        continue;
      }
      std::vector<wire::kv_event> events;
      auto a = rs.cache.admit(r->prompt, r->extras, r->lora_id, r->max_tokens, events);
      if (!a) {
        if (rs.running == 0) { // it does not fit even into an idle cache
          rs.waiting.pop_front();
          r->respond(error_reply(400, "BadRequestError",
                                 "the request needs more KV cache blocks than the engine has"));
          continue;
        }
        return; // waits for blocks to come free
      }
      rs.waiting.pop_front();
      if (rs.pub)
        rs.pub->publish(std::move(events));
      ++rs.running;
      auto uncached = a->prompt_tokens - a->cached_tokens;
      r->alloc = std::move(a);
      auto first = clock::now()
                   + std::chrono::microseconds(static_cast<std::int64_t>(
                     opts.base_ms * 1000 + opts.prefill_us_per_token * uncached));
      at(first, [this, r] { step(r); });
    }
  }

  json::object usage_of(const request& r) const {
    json::object u{{"prompt_tokens", r.alloc->prompt_tokens},
                   {"total_tokens", r.alloc->prompt_tokens + r.generated},
                   {"completion_tokens", r.generated}};
    if (opts.prompt_tokens_details)
      u["prompt_tokens_details"] = json::object{{"cached_tokens", r.alloc->cached_tokens}};
    return u;
  }

  json::object chunk(const request& r, const std::string& piece, bool last, bool first) const {
    json::object choice{{"index", 0}, {"logprobs", nullptr}};
    if (r.chat) {
      json::object delta;
      if (first)
        delta["role"] = "assistant";
      delta["content"] = piece;
      choice["delta"] = std::move(delta);
    } else {
      choice["text"] = piece;
    }
    choice["finish_reason"] = last ? json::value("length") : json::value(nullptr);
    choice["stop_reason"] = nullptr;
    return json::object{{"id", r.rid()},
                        {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
                        {"created", r.created},
                        {"model", r.model},
                        {"choices", json::array{choice}}};
  }

  void finish(const std::shared_ptr<request>& r) {
    auto& rs = *ranks[r->rank];
    rs.cache.release(*r->alloc);
    --rs.running;
    try_admit(r->rank);
  }

  void step(const std::shared_ptr<request>& r) {
    auto& rs = *ranks[r->rank];
    if (r->cancelled) {
      finish(r);
      return;
    }
    auto token = next_token(r->alloc->tokens);
    std::vector<wire::kv_event> events;
    rs.cache.append(*r->alloc, token, events);
    if (rs.pub)
      rs.pub->publish(std::move(events));
    auto piece = token_text(token);
    bool first = r->generated == 0;
    ++r->generated;
    r->text += piece;
    bool last = r->generated >= r->max_tokens;
    if (r->stream) {
      if (first)
        r->out = r->respond.stream(200, "text/event-stream; charset=utf-8");
      bool ok = r->out->write("data: " + json::serialize(chunk(*r, piece, last, first)) + "\n\n");
      if (ok && last) {
        if (r->include_usage) {
          json::object u{{"id", r->rid()},
                         {"object", r->chat ? "chat.completion.chunk" : "text_completion"},
                         {"created", r->created},
                         {"model", r->model},
                         {"choices", json::array{}},
                         {"usage", usage_of(*r)}};
          r->out->write("data: " + json::serialize(u) + "\n\n");
        }
        r->out->write("data: [DONE]\n\n");
        r->out->end();
      }
      if (!ok)
        r->cancelled = true;
    } else if (last) {
      json::object choice{
        {"index", 0}, {"logprobs", nullptr}, {"finish_reason", "length"}, {"stop_reason", nullptr}};
      if (r->chat)
        choice["message"] = json::object{{"role", "assistant"}, {"content", r->text}};
      else
        choice["text"] = r->text;
      json::object body{{"id", r->rid()},
                        {"object", r->chat ? "chat.completion" : "text_completion"},
                        {"created", r->created},
                        {"model", r->model},
                        {"choices", json::array{choice}},
                        {"usage", usage_of(*r)}};
      r->respond(json_reply(200, body));
    }
    if (last) {
      ++succeeded;
      finish(r);
      return;
    }
    at(clock::now()
         + std::chrono::microseconds(static_cast<std::int64_t>(opts.decode_ms_per_token * 1000)),
       [this, r] { step(r); });
  }

  // -- HTTP threads ----------------------------------------------------------

  /// The LoRA id of `model` (1-based, as vLLM numbers adapters), if any.
  std::optional<std::int64_t> lora_id_of(const std::string& model) const {
    for (std::size_t i = 0; i < opts.lora_modules.size(); ++i)
      if (opts.lora_modules[i].first == model)
        return static_cast<std::int64_t>(i + 1);
    return std::nullopt;
  }

  bool serves(const std::string& model) const { return model == opts.model || lora_id_of(model); }

  /// Tokens of a completion prompt or chat messages, as /tokenize and the
  /// completion endpoints both see them.
  bool prompt_tokens(const json::object& body, bool chat, std::vector<std::uint32_t>& out,
                     std::string& error) const {
    if (chat) {
      const auto* messages = body.if_contains("messages");
      auto flag = [&](const char* k, bool def) {
        const auto* v = body.if_contains(k);
        return v && v->is_bool() ? v->as_bool() : def;
      };
      std::string text;
      if (!messages
          || !chat_prompt(*messages, flag("add_generation_prompt", true),
                          flag("continue_final_message", false), text, error)) {
        if (error.empty())
          error = "'messages' is missing";
        return false;
      }
      out = tokenize(text, flag("add_special_tokens", false));
      return true;
    }
    const auto* prompt = body.if_contains("prompt");
    if (!prompt) {
      error = "'prompt' is missing";
      return false;
    }
    const json::value* p = prompt;
    if (p->is_array() && !p->as_array().empty()
        && (p->as_array()[0].is_string() || p->as_array()[0].is_array()))
      p = &p->as_array()[0]; // a batch: the first prompt
    if (p->is_string()) {
      const auto* add = body.if_contains("add_special_tokens");
      out = tokenize(p->as_string(), !(add && add->is_bool()) || add->as_bool());
      return true;
    }
    if (p->is_array()) {
      for (const auto& t : p->as_array()) {
        if (!t.is_int64() && !t.is_uint64()) {
          error = "'prompt' must be text or token ids";
          return false;
        }
        out.push_back(static_cast<std::uint32_t>(t.to_number<std::int64_t>()));
      }
      return !out.empty();
    }
    error = "'prompt' must be text or token ids";
    return false;
  }

  void completion(http_request&& req, const http_responder& respond, bool chat) {
    boost::system::error_code ec;
    auto doc = json::parse(req.body, ec);
    if (ec || !doc.is_object())
      return respond(error_reply(400, "BadRequestError", "the body is not a JSON object"));
    const auto& body = doc.as_object();
    const auto* model = body.if_contains("model");
    std::string name = model && model->is_string() ? std::string(model->as_string()) : opts.model;
    if (!serves(name))
      return respond(error_reply(404, "NotFoundError", "The model `" + name + "` does not exist."));
    auto r = std::make_shared<request>(respond);
    r->id = next_id++;
    r->chat = chat;
    r->model = name;
    r->created = unix_now();
    std::string error;
    if (!prompt_tokens(body, chat, r->prompt, error))
      return respond(error_reply(400, "BadRequestError", error));
    for (const char* k : {"max_tokens", "max_completion_tokens"})
      if (const auto* v = body.if_contains(k); v && (v->is_int64() || v->is_uint64()))
        r->max_tokens =
          static_cast<std::size_t>(std::max<std::int64_t>(1, v->to_number<std::int64_t>()));
    if (r->prompt.size() + r->max_tokens > opts.max_model_len)
      return respond(error_reply(
        400, "BadRequestError",
        fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                    "tokens ({} in the messages, {} in the completion).",
                    opts.max_model_len, r->prompt.size() + r->max_tokens, r->prompt.size(),
                    r->max_tokens)));
    if (const auto* s = body.if_contains("stream"); s && s->is_bool())
      r->stream = s->as_bool();
    if (const auto* so = body.if_contains("stream_options"); so && so->is_object())
      if (const auto* iu = so->as_object().if_contains("include_usage"); iu && iu->is_bool())
        r->include_usage = iu->as_bool();
    r->lora_id = lora_id_of(name);
    if (r->lora_id)
      r->extras.lora_name = name;
    if (const auto* salt = body.if_contains("cache_salt"); salt && salt->is_string())
      r->extras.cache_salt = std::string(salt->as_string());
    auto hint = req.header("x-data-parallel-rank");
    if (!hint.empty() && std::all_of(hint.begin(), hint.end(), ::isdigit))
      r->rank_hint = std::stoi(hint);
    std::weak_ptr<request> weak = r;
    respond.on_disconnect([weak] {
      if (auto rr = weak.lock())
        rr->cancelled = true;
    });
    post([this, r] { admit(r); });
  }

  void tokenize_endpoint(http_request&& req, const http_responder& respond) {
    boost::system::error_code ec;
    auto doc = json::parse(req.body, ec);
    if (ec || !doc.is_object())
      return respond(error_reply(400, "BadRequestError", "the body is not a JSON object"));
    std::vector<std::uint32_t> tokens;
    std::string error;
    if (!prompt_tokens(doc.as_object(), doc.as_object().contains("messages"), tokens, error))
      return respond(error_reply(400, "BadRequestError", error));
    json::array ts;
    for (auto t : tokens)
      ts.push_back(t);
    respond(json_reply(200, json::object{{"count", tokens.size()},
                                         {"max_model_len", opts.max_model_len},
                                         {"tokens", std::move(ts)},
                                         {"token_strs", nullptr}}));
  }

  void handle(http_request&& req, const http_responder& respond) {
    auto path = req.target.substr(0, req.target.find('?'));
    if (req.method == "POST" && path == "/v1/completions")
      return completion(std::move(req), respond, false);
    if (req.method == "POST" && path == "/v1/chat/completions")
      return completion(std::move(req), respond, true);
    if (req.method == "POST" && path == "/tokenize")
      return tokenize_endpoint(std::move(req), respond);
    if (req.method == "GET" && path == "/health")
      return respond(http_reply{200, "application/json", "", {}});
    if (req.method == "GET" && path == "/v1/models") {
      json::array data;
      data.push_back(json::object{{"id", opts.model},
                                  {"object", "model"},
                                  {"created", unix_now()},
                                  {"owned_by", "vllm"},
                                  {"root", opts.model},
                                  {"parent", nullptr},
                                  {"max_model_len", opts.max_model_len}});
      for (const auto& [name, path_] : opts.lora_modules)
        data.push_back(json::object{{"id", name},
                                    {"object", "model"},
                                    {"created", unix_now()},
                                    {"owned_by", "vllm"},
                                    {"root", path_},
                                    {"parent", opts.model}});
      return respond(json_reply(200, json::object{{"object", "list"}, {"data", std::move(data)}}));
    }
    if (req.method == "GET" && path == "/metrics") {
      wire::metrics_text m;
      wire::metric_labels l{{"model_name", opts.model}};
      m.gauge("vllm:num_requests_running", "Requests running.",
              static_cast<double>(running_total.load()), l);
      m.gauge("vllm:num_requests_waiting", "Requests waiting for KV cache.",
              static_cast<double>(waiting_total.load()), l);
      m.gauge("vllm:kv_cache_usage_perc", "KV cache blocks in use (0..1).", usage.load(), l);
      m.counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
                static_cast<double>(queried.load()), l);
      m.counter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
                static_cast<double>(hits.load()), l);
      m.counter("vllm:request_success_total", "Requests finished.",
                static_cast<double>(succeeded.load()), l);
      return respond(http_reply{200, "text/plain; version=0.0.4", m.str(), {}});
    }
    if (req.method == "POST" && path == "/reset_prefix_cache") {
      post([this, respond] {
        bool all = true;
        for (auto& rs : ranks) {
          std::vector<wire::kv_event> events;
          bool ok = rs->cache.reset(events);
          all = all && ok;
          if (ok && rs->pub)
            rs->pub->publish(std::move(events));
        }
        respond(all ? http_reply{200, "application/json", "", {}}
                    : error_reply(409, "ConflictError",
                                  "requests are running: the prefix cache was not reset"));
      });
      return;
    }
    respond(error_reply(404, "NotFoundError", "no such endpoint: " + req.method + " " + path));
  }
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
  for (std::size_t r = 0; r < std::max<std::size_t>(im.opts.dp_size, 1); ++r) {
    cache_config cc;
    cc.blocks = im.opts.num_gpu_blocks;
    cc.block_size = im.opts.block_size;
    cc.seed = matchable ? im.opts.seed : std::string{};
    cc.int_hashes = im.opts.int_hashes;
    auto rs = std::make_unique<rank_state>(cc);
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
    im.ranks.push_back(std::move(rs));
  }
  im.thread = std::thread([&im] { im.run(); });
  http_server_limits limits;
  limits.idle_timeout = std::chrono::minutes(5);
  im.server =
    std::make_unique<http_server>(im.opts.host, im.opts.port, 2, limits,
                                  [&im](http_request&& req, const http_responder& respond) {
                                    im.handle(std::move(req), respond);
                                  });
  if (im.server->port() == 0)
    error_ = im.server->error();
}

engine::~engine() {
  auto& im = *impl_;
  if (im.server)
    im.server->stop();
  {
    std::lock_guard<std::mutex> g(im.mtx);
    im.stop = true;
  }
  im.cv.notify_all();
  if (im.thread.joinable())
    im.thread.join();
}

std::uint16_t engine::port() const noexcept {
  return impl_->server ? impl_->server->port() : 0;
}

} // namespace llmgw::sim
