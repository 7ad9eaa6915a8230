// Files, hex, JSON, and the vLLM captures (golden/vllm-captures/, as the build
// tree holds them), for every test folder.
#pragma once

#include "kv/block_table.hpp"

#include <boost/json/value.hpp>

#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmgw::test {

/// The whole content of a file; fails the test (and returns "") if unreadable.
std::string read_file(const std::string& path);

/// Bytes from hex, whitespace ignored; aborts the test on bad hex.
std::string from_hex(const std::string& hex);

/// Lowercase hex of bytes.
std::string to_hex(const std::string& bytes);

/// A parsed JSON document.
boost::json::value read_json(const std::string& path);

/// Absolute path of a capture (golden/vllm-captures/, as the build tree holds it).
std::string capture_path(const std::string& name);

/// Names of every capture file (the 24 *.json), sorted.
std::vector<std::string> capture_names();

/// The blocks a capture's engine holds at the end (its "expected.final_blocks").
std::set<kv::block_ref> capture_final_blocks(const boost::json::value& capture);

/// Engine key -> the cluster's key for every block of a capture's requests,
/// as the router hashes their prompts (tokens, LoRA name, cache salt) under
/// `seed`: with another seed than the capture's, what a translating mirror
/// must key the engine's blocks by.
std::unordered_map<wire::block_key, wire::block_key>
capture_router_keys(const boost::json::value& capture, const std::string& seed);

/// `blocks` under the keys `keys` maps them to (a block of none: a failure).
std::set<kv::block_ref>
translated_blocks(const std::set<kv::block_ref>& blocks,
                  const std::unordered_map<wire::block_key, wire::block_key>& keys);

/// Absolute path of a file in the source tree.
std::string source_path(const std::string& relative);

} // namespace llmgw::test
