// Reading OpenAI-style requests for routing: the /tokenize body that gives
// the engine's own tokens, the tier-1 text, and every kind of bad body.
#include "wire/openai_request.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

using namespace llmgw;
using namespace llmgw::wire;
namespace json = boost::json;

namespace {

routing_request parse_ok(const std::string& body, request_kind kind) {
  auto r = parse_routing_request(body, kind);
  EXPECT_TRUE(r) << (r ? "" : r.err().message);
  return r ? *r : routing_request{};
}

std::string parse_error(const std::string& body, request_kind kind) {
  auto r = parse_routing_request(body, kind);
  EXPECT_FALSE(r) << "expected an error for " << body;
  return r ? std::string{} : r.err().message;
}

} // namespace

TEST(openai_request, a_completion_is_tokenized_with_special_tokens) {
  auto r = parse_ok(R"({"model": "llama", "prompt": "Hello there", "max_tokens": 5,
                       "cache_salt": "tenant-7", "stream": true})",
                    request_kind::completion);
  EXPECT_EQ(r.model, "llama");
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.cache_salt, std::optional<std::string>("tenant-7"));
  EXPECT_EQ(r.text, "Hello there");
  EXPECT_FALSE(r.token_ids);
  EXPECT_EQ(json::parse(r.tokenize_body),
            json::parse(R"({"model":"llama","prompt":"Hello there","add_special_tokens":true})"));
}

TEST(openai_request, a_prompt_of_token_ids_needs_no_tokenizer) {
  auto r = parse_ok(R"({"model": "llama", "prompt": [1, 2, 3]})", request_kind::completion);
  ASSERT_TRUE(r.token_ids);
  EXPECT_EQ(*r.token_ids, (std::vector<std::uint32_t>{1, 2, 3}));
  EXPECT_TRUE(r.tokenize_body.empty());
  EXPECT_EQ(r.text.size(), 12u) << "the ids' bytes stand in for text in tier 1";
  auto batch = parse_ok(R"({"model": "m", "prompt": [[7, 8], [9]]})", request_kind::completion);
  EXPECT_EQ(*batch.token_ids, (std::vector<std::uint32_t>{7, 8})) << "a batch goes by its first";
  auto texts =
    parse_ok(R"({"model": "m", "prompt": ["first", "second"]})", request_kind::completion);
  EXPECT_EQ(texts.text, "first");
}

TEST(openai_request, a_chat_passes_its_template_options_to_tokenize) {
  auto r = parse_ok(R"({"model": "llama", "messages": [
                         {"role": "system", "content": "You are terse."},
                         {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                      {"type": "image_url", "image_url": {"url": "x"}}]}],
                       "tools": [{"type": "function", "function": {"name": "f"}}],
                       "chat_template_kwargs": {"enable_thinking": false},
                       "temperature": 0.2})",
                    request_kind::chat);
  auto tok = json::parse(r.tokenize_body).as_object();
  EXPECT_EQ(tok.at("add_generation_prompt"), true);
  EXPECT_EQ(tok.at("add_special_tokens"), false);
  EXPECT_EQ(tok.at("messages").as_array().size(), 2u);
  EXPECT_TRUE(tok.contains("tools"));
  EXPECT_EQ(tok.at("chat_template_kwargs").at("enable_thinking"), false);
  EXPECT_FALSE(tok.contains("temperature")) << "sampling options do not change the tokens";
  EXPECT_EQ(r.text.rfind("system\x1fYou are terse.\x1duser\x1fHi\x1e", 0), 0u) << r.text;
  auto cont = parse_ok(R"({"model": "m", "messages": [{"role": "assistant", "content": "x"}],
                          "add_generation_prompt": false, "continue_final_message": true})",
                       request_kind::chat);
  auto tok2 = json::parse(cont.tokenize_body).as_object();
  EXPECT_EQ(tok2.at("add_generation_prompt"), false);
  EXPECT_EQ(tok2.at("continue_final_message"), true);
}

TEST(openai_request, equal_conversations_give_equal_prefixes) {
  auto a = parse_ok(R"({"model": "m", "messages": [{"role": "user", "content": "one"}]})",
                    request_kind::chat);
  auto b = parse_ok(R"({"model": "m", "messages": [{"role": "user", "content": "one"},
                          {"role": "assistant", "content": "two"}]})",
                    request_kind::chat);
  EXPECT_EQ(b.text.rfind(a.text, 0), 0u) << "a later turn extends the earlier text";
}

TEST(openai_request, bad_bodies_say_what_is_wrong) {
  EXPECT_EQ(parse_error("{", request_kind::completion).rfind("the body is not JSON", 0), 0u);
  EXPECT_EQ(parse_error("[]", request_kind::completion), "the body must be a JSON object");
  EXPECT_EQ(parse_error(R"({"prompt": "x"})", request_kind::completion),
            "'model' must be a non-empty string");
  EXPECT_EQ(parse_error(R"({"model": "m"})", request_kind::completion), "'prompt' is missing");
  EXPECT_EQ(parse_error(R"({"model": "m", "prompt": 5})", request_kind::completion),
            "prompt must be a string, an array of token ids, or a list of those");
  EXPECT_EQ(parse_error(R"({"model": "m", "prompt": [1, -2]})", request_kind::completion),
            "prompt[1] must be a token id (0..4294967295), not -2");
  EXPECT_EQ(
    parse_error(R"({"model": "m", "prompt": [[1, 99999999999]]})", request_kind::completion),
    "prompt[0][1] must be a token id (0..4294967295), not 99999999999");
  EXPECT_EQ(
    parse_error(R"({"model": "m", "prompt": "x", "stream": "yes"})", request_kind::completion),
    "'stream' must be true or false");
  EXPECT_EQ(
    parse_error(R"({"model": "m", "prompt": "x", "cache_salt": 3})", request_kind::completion),
    "'cache_salt' must be a string");
  EXPECT_EQ(parse_error(R"({"model": "m", "messages": []})", request_kind::chat),
            "'messages' must be a non-empty array");
  EXPECT_EQ(parse_error(R"({"model": "m", "messages": [{"content": "x"}]})", request_kind::chat),
            "messages[0].role must be a string");
  EXPECT_EQ(parse_error(R"({"model": "m", "messages": [{"role": "user", "content": 4}]})",
                        request_kind::chat),
            "messages[0].content must be a string or an array of parts");
  std::string deep(200, '[');
  EXPECT_EQ(parse_error(R"({"model": "m", "prompt": )" + deep, request_kind::completion)
              .rfind("the body is not JSON", 0),
            0u);
}

TEST(openai_request, the_kind_can_be_told_from_the_body) {
  auto chat =
    parse_routing_request(R"({"model": "m", "messages": [{"role": "user"}]})", std::nullopt);
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->kind, request_kind::chat);
  auto completion =
    parse_routing_request(R"({"model": "m", "prompt": "\"messages\""})", std::nullopt);
  ASSERT_TRUE(completion);
  EXPECT_EQ(completion->kind, request_kind::completion) << "by the key, not by the text";
}

TEST(openai_request, tokenize_answers) {
  auto t = parse_tokenize_response(R"({"count": 3, "max_model_len": 8192, "tokens": [1, 15, 7],
                                       "token_strs": null})");
  ASSERT_TRUE(t);
  EXPECT_EQ(*t, (std::vector<std::uint32_t>{1, 15, 7}));
  EXPECT_FALSE(parse_tokenize_response(R"({"count": 3})"));
  EXPECT_FALSE(parse_tokenize_response(R"({"tokens": [1, "a"]})"));
  EXPECT_FALSE(parse_tokenize_response("<html>"));
}

TEST(openai_request, the_render_body_keeps_what_shapes_the_prompt_and_only_that) {
  auto a = parse_routing_request(
    R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true,)"
    R"("stream_options":{"include_usage":true},"temperature":0.3,"cache_salt":"s",)"
    R"("chat_template_kwargs":{"enable_thinking":false},"mm_processor_kwargs":{"x":1}})",
    request_kind::chat);
  ASSERT_TRUE(a) << a.err().message;
  auto body = json::parse(a->render_body).as_object();
  for (const char* kept :
       {"model", "messages", "cache_salt", "chat_template_kwargs", "mm_processor_kwargs"})
    EXPECT_TRUE(body.contains(kept)) << kept;
  for (const char* dropped : {"max_tokens", "stream", "stream_options", "temperature"})
    EXPECT_FALSE(body.contains(dropped)) << dropped;
  auto b = parse_routing_request(
    R"({"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":99,)"
    R"("cache_salt":"s","chat_template_kwargs":{"enable_thinking":false},"mm_processor_kwargs":{"x":1}})",
    request_kind::chat);
  ASSERT_TRUE(b);
  EXPECT_EQ(a->render_body, b->render_body) << "one tokenization for both: the token cache's key";
  // vLLM truncates to max_model_len - max_tokens with truncate_prompt_tokens
  // = -1: then the output's length shapes the prompt and stays.
  auto t = parse_routing_request(
    R"({"model":"m","prompt":"hi","max_tokens":7,"truncate_prompt_tokens":-1})",
    request_kind::completion);
  ASSERT_TRUE(t);
  EXPECT_TRUE(json::parse(t->render_body).as_object().contains("max_tokens"));
  EXPECT_STREQ(render_path(request_kind::chat), "/v1/chat/completions/render");
  EXPECT_STREQ(render_path(request_kind::completion), "/v1/completions/render");
}

TEST(openai_request, render_answers) {
  auto chat =
    parse_render_response(R"({"request_id":"chatcmpl-1","token_ids":[1,2,3],"features":null})");
  ASSERT_TRUE(chat);
  EXPECT_EQ(*chat, (std::vector<std::uint32_t>{1, 2, 3}));
  auto completion = parse_render_response(R"([{"token_ids":[4,5]},{"token_ids":[6]}])");
  ASSERT_TRUE(completion);
  EXPECT_EQ(*completion, (std::vector<std::uint32_t>{4, 5})) << "the first prompt's";
  EXPECT_FALSE(parse_render_response("[]"));
  EXPECT_FALSE(parse_render_response(R"({"tokens":[1]})"));
  EXPECT_FALSE(parse_render_response(R"({"token_ids":[-1]})"));
  EXPECT_FALSE(parse_render_response("not json"));
}

TEST(openai_request, errors_are_openai_shaped) {
  auto e = json::parse(openai_error_json("no replica serves model 'x'", "NotFoundError", 404));
  EXPECT_EQ(e.at("error").at("message"), "no replica serves model 'x'");
  EXPECT_EQ(e.at("error").at("type"), "NotFoundError");
  EXPECT_EQ(e.at("error").at("code"), 404);
}

TEST(openai_answer, cached_tokens_are_found_in_a_body_or_a_usage_event) {
  EXPECT_EQ(find_cached_tokens(R"({"usage":{"prompt_tokens":9,"prompt_tokens_details":)"
                               R"({"cached_tokens": 8}}})"),
            std::optional<std::uint64_t>(8));
  EXPECT_EQ(find_cached_tokens("data: {\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":"
                               "0}}}\n\n"),
            std::optional<std::uint64_t>(0));
  EXPECT_EQ(find_cached_tokens(R"({"usage":{"prompt_tokens":9}})"), std::nullopt);
  EXPECT_EQ(find_cached_tokens(R"({"cached_tokens": null})"), std::nullopt);
  EXPECT_EQ(find_cached_tokens(R"(data: {"usage":{"prompt_tokens_details":{"cached_tokens": 12)"),
            std::nullopt)
    << "a stream's piece may end inside the number";
  EXPECT_EQ(find_cached_tokens(R"({"cached_tokens": 12345678901234567890123})"), std::nullopt);
  // Text the model wrote is escaped inside its string: never taken for the key.
  EXPECT_EQ(find_cached_tokens(R"({"text":"\"cached_tokens\": 5"})"), std::nullopt);
}

TEST(openai_request, a_streamed_answer_gives_its_text_and_usage) {
  auto chat = read_streamed_answer(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" Hello\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"}}]}\n\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,"
    "\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n"
    "data: [DONE]\n\n");
  EXPECT_EQ(chat.content, " Hello there");
  EXPECT_TRUE(chat.has_usage);
  EXPECT_EQ(chat.prompt_tokens, 40u);
  EXPECT_EQ(chat.cached_tokens, 32u);
  auto completion = read_streamed_answer("data: {\"choices\":[{\"text\":\"a\"}]}\n\n"
                                         "data: {\"choices\":[{\"text\":\"b\"}]}\n\n"
                                         "data: {\"choices\":[{\"text\":\"c\"");
  EXPECT_EQ(completion.content, "ab") << "an unfinished event is not read";
  EXPECT_FALSE(completion.has_usage) << "no include_usage: no usage event";
  auto hostile = read_streamed_answer(
    "data: {\"choices\":[1,{\"delta\":7}],\"usage\":{\"prompt_tokens\":-5}}\n\n");
  EXPECT_EQ(hostile.content, "");
  EXPECT_EQ(hostile.prompt_tokens, 0u) << "a negative count reads as none";
}
