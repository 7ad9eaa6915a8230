#include "apps/llmgw-sim/sim_api.hpp"

#include "apps/llmgw-sim/sim_text.hpp"
#include "wire/metrics_text.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <unistd.h>

namespace llmgw::sim {

namespace json = boost::json;

namespace {

http_reply json_reply(int status, const json::value& v) {
  return llmgw::json_reply(status, json::serialize(v));
}

std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

/// The LoRA id of `model` (1-based, as vLLM numbers adapters), if any.
std::optional<std::int64_t> lora_id_of(const engine_options& opts, const std::string& model) {
  for (std::size_t i = 0; i < opts.lora_modules.size(); ++i)
    if (opts.lora_modules[i].first == model)
      return static_cast<std::int64_t>(i + 1);
  return std::nullopt;
}

/// Tokens of a completion prompt or chat messages, as /tokenize and the
/// completion endpoints both see them.
bool prompt_tokens(const json::object& body, bool chat, std::vector<std::uint32_t>& out,
                   std::string& error) {
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

/// One answer as it goes out: what the client asked for and what was sent.
struct answer {
  std::string id; ///< cmpl-N or chatcmpl-N
  bool chat = false;
  std::string model;
  std::int64_t created = 0;
  bool stream = false;
  bool include_usage = false;
  bool prompt_details = false; ///< --enable-prompt-tokens-details
  http_responder respond;
  std::optional<http_stream> out; ///< once streaming started
  std::string text;               ///< a whole answer's text so far

  explicit answer(http_responder r) : respond(std::move(r)) {}

  json::object usage(const token_out& t) const {
    json::object u{{"prompt_tokens", t.prompt_tokens},
                   {"total_tokens", t.prompt_tokens + t.generated},
                   {"completion_tokens", t.generated}};
    if (prompt_details)
      u["prompt_tokens_details"] = json::object{{"cached_tokens", t.cached_tokens}};
    return u;
  }

  json::object chunk(const token_out& t) const {
    json::object choice{{"index", 0}, {"logprobs", nullptr}};
    if (chat) {
      json::object delta;
      if (t.first)
        delta["role"] = "assistant";
      delta["content"] = t.piece;
      choice["delta"] = std::move(delta);
    } else {
      choice["text"] = t.piece;
    }
    choice["finish_reason"] = t.last ? json::value("length") : json::value(nullptr);
    choice["stop_reason"] = nullptr;
    return json::object{{"id", id},
                        {"object", chat ? "chat.completion.chunk" : "text_completion"},
                        {"created", created},
                        {"model", model},
                        {"choices", json::array{choice}}};
  }

  /// Sends `t` on (a streamed event, or the whole answer with the last
  /// token); false when the client no longer reads.
  bool emit(const token_out& t) {
    text += t.piece;
    if (stream) {
      bool ok = out->write("data: " + json::serialize(chunk(t)) + "\n\n");
      if (ok && t.last) {
        if (include_usage) {
          json::object u{{"id", id},
                         {"object", chat ? "chat.completion.chunk" : "text_completion"},
                         {"created", created},
                         {"model", model},
                         {"choices", json::array{}},
                         {"usage", usage(t)}};
          out->write("data: " + json::serialize(u) + "\n\n");
        }
        out->write("data: [DONE]\n\n");
        out->end();
      }
      return ok;
    }
    if (t.last) {
      json::object choice{
        {"index", 0}, {"logprobs", nullptr}, {"finish_reason", "length"}, {"stop_reason", nullptr}};
      if (chat)
        choice["message"] = json::object{{"role", "assistant"}, {"content", text}};
      else
        choice["text"] = text;
      json::object body{{"id", id},
                        {"object", chat ? "chat.completion" : "text_completion"},
                        {"created", created},
                        {"model", model},
                        {"choices", json::array{choice}},
                        {"usage", usage(t)}};
      respond(json_reply(200, body));
    }
    return true;
  }
};

} // namespace

api::api(const engine_options& opts, scheduler& sched) : opts_(opts), sched_(sched) {}

void api::completion(http_request&& req, const http_responder& respond, bool chat) {
  boost::system::error_code ec;
  auto doc = json::parse(req.body, ec);
  if (ec || !doc.is_object())
    return respond(error_reply(400, "BadRequestError", "the body is not a JSON object"));
  const auto& body = doc.as_object();
  const auto* model = body.if_contains("model");
  std::string name = model && model->is_string() ? std::string(model->as_string()) : opts_.model;
  auto lora_id = lora_id_of(opts_, name);
  if (name != opts_.model && !lora_id)
    return respond(error_reply(404, "NotFoundError", "The model `" + name + "` does not exist."));
  auto r = std::make_shared<sim_request>();
  auto a = std::make_shared<answer>(respond);
  a->id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  a->chat = chat;
  a->model = name;
  a->created = unix_now();
  a->prompt_details = opts_.prompt_tokens_details;
  std::string error;
  if (!prompt_tokens(body, chat, r->prompt, error))
    return respond(error_reply(400, "BadRequestError", error));
  for (const char* k : {"max_tokens", "max_completion_tokens"})
    if (const auto* v = body.if_contains(k); v && (v->is_int64() || v->is_uint64()))
      r->max_tokens =
        static_cast<std::size_t>(std::max<std::int64_t>(1, v->to_number<std::int64_t>()));
  if (r->prompt.size() + r->max_tokens > opts_.max_model_len)
    return respond(error_reply(
      400, "BadRequestError",
      fmt::format("This model's maximum context length is {} tokens. However, you requested {} "
                  "tokens ({} in the messages, {} in the completion).",
                  opts_.max_model_len, r->prompt.size() + r->max_tokens, r->prompt.size(),
                  r->max_tokens)));
  if (const auto* st = body.if_contains("stream"); st && st->is_bool())
    a->stream = st->as_bool();
  if (const auto* so = body.if_contains("stream_options"); so && so->is_object())
    if (const auto* iu = so->as_object().if_contains("include_usage"); iu && iu->is_bool())
      a->include_usage = iu->as_bool();
  r->lora_id = lora_id;
  if (lora_id)
    r->extras.lora_name = name;
  if (const auto* salt = body.if_contains("cache_salt"); salt && salt->is_string())
    r->extras.cache_salt = std::string(salt->as_string());
  auto hint = req.header("x-data-parallel-rank");
  if (!hint.empty() && hint.size() < 6 && std::all_of(hint.begin(), hint.end(), ::isdigit))
    r->rank_hint = std::stoi(hint);
  r->emit = [a](const token_out& t) { return a->emit(t); };
  r->reject = [a](const std::string& message) {
    if (!a->out)
      return a->respond(error_reply(400, "BadRequestError", message));
    // The stream began: vLLM's shape for an error then is an event.
    json::object e{
      {"message", message}, {"type", "BadRequestError"}, {"param", nullptr}, {"code", 400}};
    a->out->write("data: " + json::serialize(json::object{{"error", std::move(e)}}) + "\n\n");
    a->out->write("data: [DONE]\n\n");
    a->out->end();
  };
  // vLLM's api_server begins a stream (its head goes out) before the engine
  // schedules the request; the events follow from the first token on.
  if (a->stream)
    a->out = respond.stream(200, "text/event-stream; charset=utf-8");
  std::weak_ptr<sim_request> weak = r;
  respond.on_disconnect([weak] {
    if (auto rr = weak.lock())
      rr->cancelled = true;
  });
  sched_.submit(std::move(r));
}

namespace {

/// The body of `req` and its prompt's tokens (chat: when it has messages,
/// if `chat` is unset); nullopt after answering 400 with why.
std::optional<json::object> prompt_of(const http_request& req, std::optional<bool> chat,
                                      std::vector<std::uint32_t>& tokens,
                                      const http_responder& respond) {
  boost::system::error_code ec;
  auto doc = json::parse(req.body, ec);
  if (ec || !doc.is_object()) {
    respond(error_reply(400, "BadRequestError", "the body is not a JSON object"));
    return std::nullopt;
  }
  std::string error;
  if (!prompt_tokens(doc.as_object(), chat.value_or(doc.as_object().contains("messages")), tokens,
                     error)) {
    respond(error_reply(400, "BadRequestError", error));
    return std::nullopt;
  }
  return std::move(doc.as_object());
}

} // namespace

void api::tokenize_endpoint(http_request&& req, const http_responder& respond) {
  std::vector<std::uint32_t> tokens;
  if (!prompt_of(req, std::nullopt, tokens, respond))
    return;
  json::array ts;
  for (auto t : tokens)
    ts.push_back(t);
  respond(json_reply(200, json::object{{"count", tokens.size()},
                                       {"max_model_len", opts_.max_model_len},
                                       {"tokens", std::move(ts)},
                                       {"token_strs", nullptr}}));
}

void api::render_endpoint(http_request&& req, const http_responder& respond, bool chat) {
  std::vector<std::uint32_t> tokens;
  auto body = prompt_of(req, chat, tokens, respond);
  if (!body)
    return;
  json::array ids;
  for (auto t : tokens)
    ids.push_back(t);
  const auto* model = body->if_contains("model");
  json::object out{{"request_id", fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id_++)},
                   {"token_ids", std::move(ids)},
                   {"model", model ? *model : json::value(opts_.model)},
                   {"features", nullptr}};
  if (chat)
    return respond(json_reply(200, std::move(out)));
  respond(json_reply(200, json::array{std::move(out)})); // one per prompt; the first here
}

void api::handle(http_request&& req, const http_responder& respond) {
  auto path = req.target.substr(0, req.target.find('?'));
  if (!opts_.fail_file.empty() && ::access(opts_.fail_file.c_str(), F_OK) == 0) {
    // vLLM once its engine core is gone: /health says 503
    // (EngineDeadError), and each generation request fails with a 500.
    if (req.method == "GET" && path == "/health")
      return respond(http_reply{503, "application/json", "", {}});
    if (req.method == "POST"
        && (path == "/v1/completions" || path == "/v1/chat/completions" || path == "/tokenize"
            || path == "/v1/completions/render" || path == "/v1/chat/completions/render"))
      return respond(error_reply(500, "EngineDeadError",
                                 "EngineCore encountered an issue. See stack trace (above) for "
                                 "the root cause."));
  }
  if (req.method == "POST" && path == "/v1/completions")
    return completion(std::move(req), respond, false);
  if (req.method == "POST" && path == "/v1/chat/completions")
    return completion(std::move(req), respond, true);
  if (req.method == "POST" && path == "/tokenize")
    return tokenize_endpoint(std::move(req), respond);
  if (opts_.enable_scale_out && req.method == "POST" && path == "/v1/completions/render")
    return render_endpoint(std::move(req), respond, false);
  if (opts_.enable_scale_out && req.method == "POST" && path == "/v1/chat/completions/render")
    return render_endpoint(std::move(req), respond, true);
  if (req.method == "GET" && path == "/health")
    return respond(http_reply{200, "application/json", "", {}});
  if (req.method == "GET" && path == "/v1/models")
    return models(respond);
  if (req.method == "GET" && path == "/metrics")
    return metrics(respond);
  if (req.method == "POST" && path == "/reset_prefix_cache")
    return sched_.reset_prefix_cache([respond](bool all) {
      respond(all ? http_reply{200, "application/json", "", {}}
                  : error_reply(409, "ConflictError",
                                "requests are running: the prefix cache was not reset"));
    });
  // As vLLM's FastAPI answers a route it does not have.
  respond(http_reply{404, "application/json", R"({"detail":"Not Found"})", {}});
}

void api::models(const http_responder& respond) const {
  json::array data;
  data.push_back(json::object{{"id", opts_.model},
                              {"object", "model"},
                              {"created", unix_now()},
                              {"owned_by", "vllm"},
                              {"root", opts_.model},
                              {"parent", nullptr},
                              {"max_model_len", opts_.max_model_len}});
  for (const auto& [name, path] : opts_.lora_modules)
    data.push_back(json::object{{"id", name},
                                {"object", "model"},
                                {"created", unix_now()},
                                {"owned_by", "vllm"},
                                {"root", path},
                                {"parent", opts_.model}});
  respond(json_reply(200, json::object{{"object", "list"}, {"data", std::move(data)}}));
}

void api::metrics(const http_responder& respond) const {
  // As vLLM: every sample labelled with the served model and the engine
  // (data-parallel rank) it describes.
  auto ranks = sched_.read();
  wire::metrics_text m;
  for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
    const auto& g = ranks[rank];
    wire::metric_labels l{{"model_name", opts_.model}, {"engine", std::to_string(rank)}};
    m.gauge("vllm:num_requests_running", "Requests running.", static_cast<double>(g.running), l);
    m.gauge("vllm:num_requests_waiting", "Requests waiting for KV cache.",
            static_cast<double>(g.waiting), l);
    m.gauge("vllm:kv_cache_usage_perc", "KV cache blocks in use (0..1).", g.usage, l);
    m.counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
              static_cast<double>(g.queried), l);
    m.counter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
              static_cast<double>(g.hits), l);
    m.counter("vllm:request_success_total", "Requests finished.", static_cast<double>(g.succeeded),
              l);
    m.counter("vllm:num_preemptions_total", "Requests preempted (blocks freed, work redone).",
              static_cast<double>(g.preemptions), l);
    m.histogram("vllm:time_to_first_token_seconds", "Time from arrival to the first token.", g.ttft,
                l);
  }
  respond(http_reply{200, "text/plain; version=0.0.4", m.str(), {}});
}

} // namespace llmgw::sim
