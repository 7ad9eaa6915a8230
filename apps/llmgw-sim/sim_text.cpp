#include "apps/llmgw-sim/sim_text.hpp"

#include <boost/json.hpp>
#include <xxhash.h>

#include <array>

namespace llmgw::sim {

namespace json = boost::json;

std::vector<std::uint32_t> tokenize(std::string_view text, bool add_special_tokens) {
  std::vector<std::uint32_t> out;
  out.reserve(text.size() / 4 + 2);
  if (add_special_tokens)
    out.push_back(1);
  for (std::size_t at = 0; at < text.size(); at += 4) {
    auto n = std::min<std::size_t>(4, text.size() - at);
    out.push_back(256 + XXH32(text.data() + at, n, 0) % 32000);
  }
  return out;
}

bool chat_prompt(const json::value& messages, bool add_generation_prompt,
                 bool continue_final_message, std::string& out, std::string& error) {
  const auto* ms = messages.if_array();
  if (!ms || ms->empty()) {
    error = "'messages' must be a non-empty array";
    return false;
  }
  out = "<s>";
  for (std::size_t i = 0; i < ms->size(); ++i) {
    const auto* m = (*ms)[i].if_object();
    const json::value* role = m ? m->if_contains("role") : nullptr;
    if (!role || !role->is_string()) {
      error = "messages[" + std::to_string(i) + "].role must be a string";
      return false;
    }
    std::string content;
    if (const auto* c = m->if_contains("content")) {
      if (c->is_string()) {
        content = std::string(c->as_string());
      } else if (c->is_array()) {
        for (const auto& part : c->as_array())
          if (const auto* t = part.is_object() ? part.as_object().if_contains("text") : nullptr;
              t && t->is_string())
            content += std::string(t->as_string());
      } else if (!c->is_null()) {
        error = "messages[" + std::to_string(i) + "].content must be a string or an array";
        return false;
      }
    }
    out += "<|im_start|>" + std::string(role->as_string()) + "\n" + content;
    bool last = i + 1 == ms->size();
    if (!(last && continue_final_message))
      out += "<|im_end|>\n";
  }
  if (add_generation_prompt && !continue_final_message)
    out += "<|im_start|>assistant\n";
  return true;
}

std::uint32_t next_token(const std::vector<std::uint32_t>& context) {
  std::uint64_t h = context.size();
  auto from = context.size() > 8 ? context.size() - 8 : 0;
  for (auto i = from; i < context.size(); ++i)
    h = h * 0x100000001b3ull ^ context[i];
  return 256 + static_cast<std::uint32_t>(XXH64(&h, sizeof h, 7) % 32000);
}

std::string token_text(std::uint32_t token) {
  static const std::array<const char*, 32> words = {
    "the",   "cache", "block",  "prefix",  "token", "router", "engine",  "replica",
    "fast",  "warm",  "hit",    "layer",   "query", "key",    "value",   "attention",
    "model", "batch", "decode", "prefill", "gpu",   "memory", "page",    "hash",
    "chain", "seed",  "event",  "stream",  "node",  "agent",  "control", "route"};
  return " " + std::string(words[token % words.size()]);
}

} // namespace llmgw::sim
