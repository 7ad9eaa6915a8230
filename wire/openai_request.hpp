// OpenAI-style requests as the router needs them, and vLLM's /tokenize.
//
// From a /v1/completions or /v1/chat/completions body the router needs the
// model, what to tokenize (and how, so the tokens equal what the engine will
// hash), the text for tier 1, and the request's cache salt. A completion
// prompt may already be token ids; then no tokenization is needed.
//
// /tokenize bodies (docs/vllm.md):
//   completion: {"model", "prompt", "add_special_tokens": true}
//   chat:       {"model", "messages", "add_generation_prompt",
//                "add_special_tokens": false, and the template options the
//                request carries: tools, chat_template, chat_template_kwargs,
//                continue_final_message, documents}
// Answer: {"count", "max_model_len", "tokens": [...], "token_strs"}.
//
// Render (vLLM's POST /v1/completions/render and /v1/chat/completions/render,
// PR #32473; on `vllm serve` only with --enable-scale-out, else 404): the
// whole request in, the engine's own token ids out, as it will see them
// (every field that shapes the prompt, which /tokenize partly ignores).
//   chat:       {"request_id", "token_ids": [...], "features", ...}
//   completion: [{"request_id", "token_ids": [...], ...}, one per prompt]
#pragma once

#include "base/result.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llmgw::wire {

/// Which endpoint a request is for.
enum class request_kind : std::uint8_t { completion, chat };

/// What routing needs of one request.
struct routing_request {
  request_kind kind = request_kind::completion;
  std::string model;
  bool stream = false;
  std::optional<std::string> cache_salt;
  /// Token ids given in the request itself (a completion prompt of ids).
  std::optional<std::vector<std::uint32_t>> token_ids;
  /// The /tokenize body that yields the engine's tokens (empty with token_ids).
  std::string tokenize_body;
  /// The render body: the request without the fields that cannot change its
  /// tokens (sampling, streaming, output), so that requests differing only
  /// in those share one tokenization. Also the token cache's key. Empty
  /// with token_ids.
  std::string render_body;
  /// The prompt as text, for tier 1 (chat: roles and contents, delimited).
  std::string text;
};

/// Bounds on what a request may contain.
struct request_limits {
  std::size_t max_messages = 4096;
  std::size_t max_prompt_tokens = 1u << 20;
};

/// Reads a request body for `kind` (nullopt: a chat if it has "messages",
/// else a completion, as /v1/route takes either). Errors say which field is
/// wrong.
result<routing_request> parse_routing_request(std::string_view body,
                                              std::optional<request_kind> kind,
                                              const request_limits& limits = {});

/// Reads a /tokenize answer's token ids.
result<std::vector<std::uint32_t>> parse_tokenize_response(std::string_view body);

/// Where a request of `kind` is rendered.
const char* render_path(request_kind kind) noexcept;

/// Reads a render answer's token ids (a completion's: its first prompt's).
result<std::vector<std::uint32_t>> parse_render_response(std::string_view body);

/// The prompt tokens an engine says it found cached, from the first
/// `"cached_tokens": N` in an answer (vLLM's usage.prompt_tokens_details,
/// in a whole body or a streamed usage event); nullopt when absent, or when
/// the number reaches the end of `text` (it may go on in the next piece). A
/// search, not a parse: the proxy reads it from bytes it relays anyway.
std::optional<std::uint64_t> find_cached_tokens(std::string_view text);

/// What a client reads from a streamed chat or completion answer (a body of
/// server-sent events): the text of every delta or choice, and the usage of
/// the final event when the stream carried one (stream_options.include_usage).
struct streamed_answer {
  std::string content;
  bool has_usage = false;
  std::uint64_t prompt_tokens = 0;
  std::uint64_t cached_tokens = 0; ///< usage.prompt_tokens_details.cached_tokens
};

/// Reads every complete `data:` event of `sse`; events that are not JSON
/// objects ([DONE]) are skipped.
streamed_answer read_streamed_answer(std::string_view sse);

/// An OpenAI-style error body: {"error": {"message", "type", "code"}}.
std::string openai_error_json(const std::string& message, const std::string& type, int code);

} // namespace llmgw::wire
