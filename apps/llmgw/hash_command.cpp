// `llmgw hash --seed S --block-size B [--lora NAME] [--salt SALT]`
//
// Reads a JSON array of token ids on stdin and prints one line per full
// block: index, 64-bit key (decimal), full digest (hex). Compare with the
// engine's published hashes to check that its PYTHONHASHSEED and
// --prefix-caching-hash-algo match what llmgw computes.
#include "apps/llmgw/commands.hpp"
#include "wire/block_hash.hpp"

#include <CLI/CLI.hpp>
#include <boost/json.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <limits>
#include <string>

namespace llmgw::apps {

namespace {

struct hash_options {
  std::string seed;
  std::size_t block_size = 16;
  std::string lora;
  std::string salt;
};

/// Parses the token list; on failure prints what and where and returns false.
bool read_tokens(const std::string& text, std::vector<std::uint32_t>& tokens) {
  boost::system::error_code ec;
  auto value = boost::json::parse(text, ec);
  if (ec) {
    fmt::print(stderr, "llmgw hash: stdin is not JSON: {}\n", ec.message());
    return false;
  }
  if (!value.is_array()) {
    fmt::print(stderr, "llmgw hash: stdin must be a JSON array of token ids\n");
    return false;
  }
  const auto& arr = value.as_array();
  tokens.reserve(arr.size());
  for (std::size_t i = 0; i < arr.size(); ++i) {
    const auto& v = arr[i];
    std::uint64_t id = 0;
    if (v.is_uint64())
      id = v.as_uint64();
    else if (v.is_int64() && v.as_int64() >= 0)
      id = static_cast<std::uint64_t>(v.as_int64());
    else
      id = std::numeric_limits<std::uint64_t>::max();
    if (id > std::numeric_limits<std::uint32_t>::max()) {
      fmt::print(stderr, "llmgw hash: element {} is {}, expected a token id (0..4294967295)\n", i,
                 boost::json::serialize(v));
      return false;
    }
    tokens.push_back(static_cast<std::uint32_t>(id));
  }
  return true;
}

int run_hash(const hash_options& opts) {
  std::string input{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  std::vector<std::uint32_t> tokens;
  if (!read_tokens(input, tokens))
    return 2;
  wire::extra_key_recipe extras;
  if (!opts.lora.empty())
    extras.lora_name = opts.lora;
  if (!opts.salt.empty())
    extras.cache_salt = opts.salt;
  wire::block_hasher hasher(opts.seed, opts.block_size);
  std::string out;
  std::size_t index = 0;
  for (const auto& block : hasher.hash(tokens, extras))
    out += fmt::format("{} {} {}\n", index++, block.key, wire::to_hex(block.full));
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

} // namespace

void add_hash_command(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<hash_options>();
  auto* cmd =
    app.add_subcommand("hash", "Print vLLM sha256_cbor block keys of token ids read from stdin");
  cmd->add_option("--seed", opts->seed, "the engine's PYTHONHASHSEED")->required();
  cmd->add_option("--block-size", opts->block_size, "the engine's --block-size")
    ->check(CLI::Range(std::size_t{1}, std::size_t{1} << 20))
    ->capture_default_str();
  cmd->add_option("--lora", opts->lora, "LoRA adapter name the request uses");
  cmd->add_option("--salt", opts->salt, "the request's cache_salt");
  cmd->callback([opts, &exit_code] { exit_code = run_hash(*opts); });
}

} // namespace llmgw::apps
