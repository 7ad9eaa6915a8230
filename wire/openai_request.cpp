#include "wire/openai_request.hpp"

#include <boost/json.hpp>

#include <algorithm>
#include <array>
#include <fmt/format.h>
#include <iterator>

namespace llmgw::wire {

namespace json = boost::json;

namespace {

error bad(errc code, std::string message) {
  return error{code, std::move(message)};
}

/// A token id, or an error naming where it was (`where`[`index`]). The
/// name is formatted only for the error: this runs once per prompt token.
result<std::uint32_t> token_of(const json::value& v, const std::string& where, std::size_t index) {
  if (v.is_uint64() && v.as_uint64() <= UINT32_MAX)
    return static_cast<std::uint32_t>(v.as_uint64());
  if (v.is_int64() && v.as_int64() >= 0 && v.as_int64() <= UINT32_MAX)
    return static_cast<std::uint32_t>(v.as_int64());
  return bad(errc::bad_value, fmt::format("{}[{}] must be a token id (0..4294967295), not {}",
                                          where, index, json::serialize(v)));
}

result<std::vector<std::uint32_t>> tokens_of(const json::array& a, const std::string& where,
                                             const request_limits& limits) {
  if (a.size() > limits.max_prompt_tokens)
    return bad(errc::bad_length, fmt::format("{} has {} tokens, more than the {} allowed", where,
                                             a.size(), limits.max_prompt_tokens));
  std::vector<std::uint32_t> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    // The common case inline; token_of says what is wrong otherwise.
    const auto& v = a[i];
    if (v.is_int64() && v.get_int64() >= 0 && v.get_int64() <= UINT32_MAX) {
      out[i] = static_cast<std::uint32_t>(v.get_int64());
      continue;
    }
    auto t = token_of(v, where, i);
    if (!t)
      return t.err();
    out[i] = *t;
  }
  return out;
}

/// The text of a chat message's content: a string, or the text parts of an
/// array (other parts as their JSON, so different images differ).
result<std::string> content_text(const json::value& content, std::size_t index) {
  if (content.is_string())
    return std::string(content.as_string());
  if (content.is_null())
    return std::string{};
  if (!content.is_array())
    return bad(errc::bad_type,
               fmt::format("messages[{}].content must be a string or an array of parts", index));
  std::string out;
  for (const auto& part : content.as_array()) {
    const auto* obj = part.if_object();
    const json::value* text = obj ? obj->if_contains("text") : nullptr;
    if (text && text->is_string())
      out += std::string(text->as_string());
    else
      out += json::serialize(part);
    out += '\x1e';
  }
  return out;
}

result<std::string> optional_string(const json::object& o, const char* key) {
  const auto* v = o.if_contains(key);
  if (!v || v->is_null())
    return std::string{};
  if (!v->is_string())
    return bad(errc::bad_type, fmt::format("'{}' must be a string", key));
  return std::string(v->as_string());
}

} // namespace

result<routing_request> parse_routing_request(std::string_view body,
                                              std::optional<request_kind> wanted,
                                              const request_limits& limits) {
  boost::system::error_code ec;
  // The document lives only in this call: a monotonic resource over a
  // per-thread buffer allocates it without malloc (a 512-token prompt is
  // 512 values) and frees it at once (no per-value destructors). The parser
  // is kept per thread too: its stack of values in the making grows once,
  // not for every request.
  thread_local std::array<unsigned char, std::size_t{64} * 1024> scratch;
  thread_local json::parser parser({}, [] {
    json::parse_options po;
    po.max_depth = 64;
    return po;
  }());
  json::monotonic_resource arena(scratch.data(), scratch.size());
  parser.reset(&arena);
  parser.write(body.data(), body.size(), ec);
  if (ec) {
    parser.reset();
    return bad(errc::bad_type, "the body is not JSON: " + ec.message());
  }
  auto doc = parser.release();
  if (!doc.is_object())
    return bad(errc::bad_type, "the body must be a JSON object");
  const auto& o = doc.as_object();
  auto kind = wanted                   ? *wanted
              : o.contains("messages") ? request_kind::chat
                                       : request_kind::completion;
  routing_request r;
  r.kind = kind;
  const auto* model = o.if_contains("model");
  if (!model || !model->is_string() || model->as_string().empty())
    return bad(errc::bad_value, "'model' must be a non-empty string");
  r.model = std::string(model->as_string());
  if (const auto* s = o.if_contains("stream")) {
    if (!s->is_bool() && !s->is_null())
      return bad(errc::bad_type, "'stream' must be true or false");
    r.stream = s->is_bool() && s->as_bool();
  }
  auto salt = optional_string(o, "cache_salt");
  if (!salt)
    return salt.err();
  if (!salt->empty())
    r.cache_salt = *salt;
  json::object tok(&arena); // the /tokenize body, serialized before the arena goes
  tok["model"] = r.model;
  if (kind == request_kind::completion) {
    const auto* prompt = o.if_contains("prompt");
    if (!prompt)
      return bad(errc::bad_value, "'prompt' is missing");
    const json::value* first = prompt;
    std::string where = "prompt";
    // A list of prompts is a batch: the first one decides where it goes.
    if (prompt->is_array() && !prompt->as_array().empty()
        && (prompt->as_array()[0].is_string() || prompt->as_array()[0].is_array())) {
      first = &prompt->as_array()[0];
      where = "prompt[0]";
    }
    if (first->is_string()) {
      r.text = std::string(first->as_string());
      tok["prompt"] = r.text;
      tok["add_special_tokens"] = true;
      if (const auto* add = o.if_contains("add_special_tokens"); add && add->is_bool())
        tok["add_special_tokens"] = add->as_bool();
    } else if (first->is_array()) {
      auto ids = tokens_of(first->as_array(), where, limits);
      if (!ids)
        return ids.err();
      if (ids->empty())
        return bad(errc::bad_value, where + " is empty");
      // Tier 1 still needs text: the ids as bytes keep equal prefixes equal.
      r.text.assign(reinterpret_cast<const char*>(ids->data()), ids->size() * 4);
      r.token_ids = std::move(*ids);
    } else {
      return bad(errc::bad_type,
                 where + " must be a string, an array of token ids, or a list of those");
    }
  } else {
    const auto* messages = o.if_contains("messages");
    if (!messages || !messages->is_array() || messages->as_array().empty())
      return bad(errc::bad_value, "'messages' must be a non-empty array");
    const auto& ms = messages->as_array();
    if (ms.size() > limits.max_messages)
      return bad(errc::bad_length, fmt::format("'messages' has {} entries, more than the {} "
                                               "allowed",
                                               ms.size(), limits.max_messages));
    for (std::size_t i = 0; i < ms.size(); ++i) {
      const auto* m = ms[i].if_object();
      if (!m)
        return bad(errc::bad_type, fmt::format("messages[{}] must be an object", i));
      const auto* role = m->if_contains("role");
      if (!role || !role->is_string())
        return bad(errc::bad_value, fmt::format("messages[{}].role must be a string", i));
      const auto* content = m->if_contains("content");
      auto text = content ? content_text(*content, i) : result<std::string>(std::string{});
      if (!text)
        return text.err();
      r.text += std::string(role->as_string());
      r.text += '\x1f';
      r.text += *text;
      r.text += '\x1d';
    }
    tok["messages"] = *messages;
    tok["add_generation_prompt"] = true;
    tok["add_special_tokens"] = false;
    // The template options change the tokens: pass them as the request has them.
    for (const char* key : {"add_generation_prompt", "add_special_tokens", "continue_final_message",
                            "tools", "chat_template", "chat_template_kwargs", "documents"})
      if (const auto* v = o.if_contains(key); v && !v->is_null())
        tok[key] = *v;
  }
  if (!r.token_ids) {
    r.tokenize_body = json::serialize(tok);
    // What cannot change the prompt's tokens: sampling, streaming, output.
    static constexpr std::string_view not_prompt[] = {"max_tokens",
                                                      "max_completion_tokens",
                                                      "temperature",
                                                      "top_p",
                                                      "top_k",
                                                      "min_p",
                                                      "n",
                                                      "best_of",
                                                      "stream",
                                                      "stream_options",
                                                      "stop",
                                                      "stop_token_ids",
                                                      "seed",
                                                      "presence_penalty",
                                                      "frequency_penalty",
                                                      "repetition_penalty",
                                                      "logprobs",
                                                      "top_logprobs",
                                                      "logit_bias",
                                                      "user",
                                                      "ignore_eos",
                                                      "min_tokens",
                                                      "echo",
                                                      "skip_special_tokens",
                                                      "spaces_between_special_tokens",
                                                      "include_stop_str_in_output",
                                                      "priority",
                                                      "request_id"};
    // Except that vLLM truncates a prompt to max_model_len - max_tokens
    // when truncate_prompt_tokens is -1: then the output's length shapes it.
    bool truncates = o.contains("truncate_prompt_tokens");
    json::object render(&arena);
    for (const auto& [k, v] : o) {
      std::string_view key(k);
      bool output_length = key == "max_tokens" || key == "max_completion_tokens";
      if ((truncates && output_length)
          || std::find(std::begin(not_prompt), std::end(not_prompt), key) == std::end(not_prompt))
        render[k] = v;
    }
    r.render_body = json::serialize(render);
  }
  return r;
}

const char* render_path(request_kind kind) noexcept {
  return kind == request_kind::chat ? "/v1/chat/completions/render" : "/v1/completions/render";
}

result<std::vector<std::uint32_t>> parse_render_response(std::string_view body) {
  boost::system::error_code ec;
  auto doc = json::parse(body, ec);
  if (ec)
    return bad(errc::bad_type, "the render answer is not JSON: " + ec.message());
  const json::value* first = &doc;
  if (doc.is_array()) { // a completion's: one per prompt
    if (doc.as_array().empty())
      return bad(errc::bad_value, "the render answer is an empty list");
    first = &doc.as_array()[0];
  }
  const auto* o = first->if_object();
  const auto* ids = o ? o->if_contains("token_ids") : nullptr;
  if (!ids || !ids->is_array())
    return bad(errc::bad_value, "the render answer has no 'token_ids' array");
  return tokens_of(ids->as_array(), "token_ids", request_limits{});
}

result<std::vector<std::uint32_t>> parse_tokenize_response(std::string_view body) {
  boost::system::error_code ec;
  auto doc = json::parse(body, ec);
  if (ec)
    return bad(errc::bad_type, "the /tokenize answer is not JSON: " + ec.message());
  const auto* o = doc.if_object();
  const auto* tokens = o ? o->if_contains("tokens") : nullptr;
  if (!tokens || !tokens->is_array())
    return bad(errc::bad_value, "the /tokenize answer has no 'tokens' array");
  return tokens_of(tokens->as_array(), "tokens", request_limits{});
}

std::optional<std::uint64_t> find_cached_tokens(std::string_view text) {
  constexpr std::string_view key = "\"cached_tokens\"";
  auto at = text.find(key);
  if (at == std::string_view::npos)
    return std::nullopt;
  auto i = at + key.size();
  while (i < text.size()
         && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
    ++i;
  if (i >= text.size() || text[i] != ':')
    return std::nullopt;
  ++i;
  while (i < text.size()
         && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
    ++i;
  std::uint64_t n = 0;
  std::size_t digits = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9' && digits < 19; ++i, ++digits)
    n = n * 10 + static_cast<std::uint64_t>(text[i] - '0');
  // A number at the very end may go on in the next piece of a stream.
  if (digits == 0 || i >= text.size() || (text[i] >= '0' && text[i] <= '9'))
    return std::nullopt;
  return n;
}

std::string openai_error_json(const std::string& message, const std::string& type, int code) {
  json::object err;
  err["message"] = message;
  err["type"] = type;
  err["code"] = code;
  json::object o;
  o["error"] = std::move(err);
  return json::serialize(o);
}

streamed_answer read_streamed_answer(std::string_view sse) {
  streamed_answer a;
  std::size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string_view::npos) {
    auto end = sse.find("\n\n", pos);
    if (end == std::string_view::npos)
      break;
    auto payload = sse.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    boost::system::error_code ec;
    auto v = json::parse(payload, ec);
    if (ec || !v.is_object())
      continue;
    const auto& o = v.as_object();
    if (const auto* ch = o.if_contains("choices"); ch && ch->is_array())
      for (const auto& c : ch->as_array()) {
        if (!c.is_object())
          continue;
        const auto& co = c.as_object();
        if (const auto* d = co.if_contains("delta"); d && d->is_object()) {
          if (const auto* t = d->as_object().if_contains("content"); t && t->is_string())
            a.content += std::string(t->as_string());
        } else if (const auto* t = co.if_contains("text"); t && t->is_string()) {
          a.content += std::string(t->as_string());
        }
      }
    const auto* u = o.if_contains("usage");
    if (!u || !u->is_object())
      continue;
    const auto& uo = u->as_object();
    auto count = [](const json::value* x) {
      return x && x->is_int64() && x->as_int64() >= 0 ? static_cast<std::uint64_t>(x->as_int64())
                                                      : std::uint64_t{0};
    };
    a.has_usage = true;
    a.prompt_tokens = count(uo.if_contains("prompt_tokens"));
    if (const auto* d = uo.if_contains("prompt_tokens_details"); d && d->is_object())
      a.cached_tokens = count(d->as_object().if_contains("cached_tokens"));
  }
  return a;
}

} // namespace llmgw::wire
