#include "tests/support/captures.hpp"

#include "wire/block_hash.hpp"

#include <boost/json.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <dirent.h>
#include <fstream>
#include <sstream>

namespace llmgw::test {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::string from_hex(const std::string& hex) {
  std::string out;
  int high = -1;
  for (char c : hex) {
    if (std::isspace(static_cast<unsigned char>(c)))
      continue;
    int v = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : (c >= 'a' && c <= 'f')                    ? c - 'a' + 10
            : (c >= 'A' && c <= 'F')                    ? c - 'A' + 10
                                                        : -1;
    if (v < 0) {
      ADD_FAILURE() << "bad hex character '" << c << "'";
      return out;
    }
    if (high < 0) {
      high = v;
    } else {
      out.push_back(static_cast<char>(high << 4 | v));
      high = -1;
    }
  }
  EXPECT_LT(high, 0) << "odd number of hex digits";
  return out;
}

std::string to_hex(const std::string& bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 0xf]);
  }
  return out;
}

boost::json::value read_json(const std::string& path) {
  boost::system::error_code ec;
  auto value = boost::json::parse(read_file(path), ec);
  EXPECT_FALSE(ec) << path << ": " << ec.message();
  return value;
}

std::string capture_path(const std::string& name) {
  return std::string(LLMGW_CAPTURES_DIR) + "/" + name;
}

std::vector<std::string> capture_names() {
  std::vector<std::string> names;
  auto dir_path = std::string(LLMGW_CAPTURES_DIR);
  if (auto* dir = opendir(dir_path.c_str())) {
    while (auto* entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0)
        names.push_back(name);
    }
    closedir(dir);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string source_path(const std::string& relative) {
  return std::string(LLMGW_SOURCE_DIR) + "/" + relative;
}

std::unordered_map<wire::block_key, wire::block_key>
capture_router_keys(const boost::json::value& capture, const std::string& seed) {
  namespace json = boost::json;
  std::unordered_map<wire::block_key, wire::block_key> out;
  bool ints = json::value_to<std::string>(capture.at("hash_encoding")) == "int";
  wire::block_hasher hasher(seed, json::value_to<std::size_t>(capture.at("block_size")));
  for (const auto& r : capture.at("requests").as_array()) {
    auto tokens = json::value_to<std::vector<std::uint32_t>>(r.at("tokens"));
    wire::extra_key_recipe extras;
    if (!r.at("lora_name").is_null())
      extras.lora_name = json::value_to<std::string>(r.at("lora_name"));
    if (!r.at("cache_salt").is_null())
      extras.cache_salt = json::value_to<std::string>(r.at("cache_salt"));
    auto mine = hasher.hash(tokens, extras);
    const auto& theirs = r.at(ints ? "block_hashes_u64" : "block_hashes_hex").as_array();
    EXPECT_EQ(mine.size(), theirs.size()) << r.at("id");
    for (std::size_t i = 0; i < std::min(mine.size(), theirs.size()); ++i) {
      auto engine =
        ints ? theirs[i].to_number<wire::block_key>()
             : wire::key_of(*wire::digest_from_hex(json::value_to<std::string>(theirs[i])));
      out[engine] = mine[i].key;
    }
  }
  return out;
}

std::set<kv::block_ref>
translated_blocks(const std::set<kv::block_ref>& blocks,
                  const std::unordered_map<wire::block_key, wire::block_key>& keys) {
  std::set<kv::block_ref> out;
  for (const auto& b : blocks) {
    auto it = keys.find(b.key);
    EXPECT_NE(it, keys.end()) << "a held block of no captured request: " << b.key;
    if (it != keys.end())
      out.insert({it->second, b.where});
  }
  return out;
}

} // namespace llmgw::test

namespace llmgw::test {

std::set<kv::block_ref> capture_final_blocks(const boost::json::value& capture) {
  std::set<kv::block_ref> out;
  for (const auto& b : capture.at("expected").at("final_blocks").as_array()) {
    auto hash = boost::json::value_to<std::string>(b.at("hash"));
    auto key = boost::json::value_to<std::string>(b.at("hash_kind")) == "int"
                 ? std::stoull(hash)
                 : wire::key_of(*wire::digest_from_hex(hash));
    out.insert({key, kv::medium_of(boost::json::value_to<std::string>(b.at("medium")))});
  }
  return out;
}

} // namespace llmgw::test
