// llmgw-sim's stand-in for a model's tokenizer, chat template and output:
// deterministic and cheap, so equal text gives equal tokens and equal
// prefixes give equal leading tokens (what prefix caching and routing need).
//
// - tokenize(): an optional BOS token (1), then one token per 4 bytes of
//   UTF-8 text, the last one shorter: id = 256 + XXH32(chunk) % 32000.
// - chat_prompt(): "<s>" then "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per
//   message, and "<|im_start|>assistant\n" with add_generation_prompt;
//   array contents contribute their text parts.
// - next_token() and token_text(): generated tokens from the context, and
//   the word each one stands for.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace llmgw::sim {

/// The token ids of `text`.
std::vector<std::uint32_t> tokenize(std::string_view text, bool add_special_tokens);

/// The chat template applied to `messages` (an array of {role, content}).
/// Returns false (with `error`) when a message is malformed.
bool chat_prompt(const boost::json::value& messages, bool add_generation_prompt,
                 bool continue_final_message, std::string& out, std::string& error);

/// The next generated token after `context` (deterministic).
std::uint32_t next_token(const std::vector<std::uint32_t>& context);

/// The text one generated token stands for (a word with a leading space).
std::string token_text(std::uint32_t token);

} // namespace llmgw::sim
