// Loading golden/vllm-captures/ for the benchmarks.
#include "bench/bench.hpp"
#include "wire/kv_events.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace llmgw::bench {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

std::string from_hex(std::string_view hex) {
  std::string out(hex.size() / 2, '\0');
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<char>(nib(hex[2 * i]) << 4 | nib(hex[2 * i + 1]));
  return out;
}

} // namespace

bool load_capture(const std::string& name, capture_payloads& out) {
  auto text = read_file(std::string(LLMGW_CAPTURES_DIR) + "/" + name);
  boost::system::error_code ec;
  auto doc = boost::json::parse(text, ec);
  if (ec) {
    fmt::print(stderr, "llmgw-bench: cannot read capture {}: {}\n", name, ec.message());
    return false;
  }
  out.topic = std::string(doc.at("topic").as_string());
  for (const auto& f : doc.at("frames").as_array()) {
    out.payloads.push_back(from_hex(f.at("payload_hex").as_string()));
    out.bytes += out.payloads.back().size();
  }
  for (const auto& p : out.payloads) {
    auto batch = wire::decode_batch(p);
    if (!batch) {
      fmt::print(stderr, "llmgw-bench: {} does not decode: {}\n", name, batch.err().message);
      return false;
    }
    for (const auto& ev : batch->events) {
      ++out.events;
      out.block_events +=
        ev.kind == wire::event_kind::all_blocks_cleared ? 1 : ev.block_hashes.size();
    }
  }
  return true;
}

} // namespace llmgw::bench
