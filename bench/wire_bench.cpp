// Decoding vLLM's event stream and hashing prompts into block keys.
//
// decode: every payload of the S2 churn captures (2,000 batches, ~12k block
//   events each), decoded in a loop; block events are hashes stored or
//   removed plus clears.
// hash: 8,192 blocks of 16 tokens through block_hasher, next to OpenSSL
//   SHA-256 alone over the very same CBOR bytes, next to the Python
//   reference (cbor2 + hashlib) on the same tokens.
#include "bench/bench.hpp"
#include "wire/block_hash.hpp"
#include "wire/kv_events.hpp"

#include <boost/json.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <unistd.h>

namespace llmgw::bench {

namespace {

int decode_bench(int rounds) {
  for (const char* name : {"S2_churn.array.int.json", "S2_churn.map.int.json",
                           "S2_churn.array.bytes.json", "S2_churn.map.bytes.json"}) {
    capture_payloads cap;
    if (!load_capture(name, cap))
      return 1;
    std::vector<double> times;
    std::size_t sink = 0;
    for (int r = 0; r < rounds; ++r)
      times.push_back(time_once([&] {
        for (const auto& p : cap.payloads)
          sink += wire::decode_batch(p)->events.size();
      }));
    if (sink != cap.events * static_cast<std::size_t>(rounds))
      return 1;
    auto t = median(times);
    std::string label = std::string("decode ") + name;
    report(label + ": block events/s", static_cast<double>(cap.block_events) / t / 1e6, "M/s",
           fmt::format("({} block events, {} batches)", cap.block_events, cap.payloads.size()));
    report(label + ": payload bytes/s", static_cast<double>(cap.bytes) / t / 1e6, "MB/s",
           fmt::format("({:.2f} MB)", static_cast<double>(cap.bytes) / 1e6));
  }
  return 0;
}

std::vector<std::uint32_t> bench_tokens(std::size_t n) {
  std::vector<std::uint32_t> out(n);
  std::uint64_t x = 0x9E3779B97F4A7C15u;
  for (auto& t : out) {
    x = x * 6364136223846793005u + 1442695040888963407u;
    t = static_cast<std::uint32_t>((x >> 33) % 151643);
  }
  return out;
}

double python_blocks_per_second(const std::vector<std::uint32_t>& tokens) {
  char path[] = "/tmp/llmgw-bench-tokens-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0)
    return 0;
  boost::json::array arr(tokens.begin(), tokens.end());
  auto text = boost::json::serialize(arr);
  auto written = write(fd, text.data(), text.size());
  close(fd);
  if (written != static_cast<ssize_t>(text.size()))
    return 0;
  auto cmd = fmt::format("/usr/bin/python3 {}/golden/make_block_hash_vectors.py --bench {}",
                         LLMGW_SOURCE_DIR, path);
  std::string out;
  if (auto* pipe = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (auto n = fread(buf, 1, sizeof buf, pipe))
      out.append(buf, n);
    pclose(pipe);
  }
  unlink(path);
  boost::system::error_code ec;
  auto doc = boost::json::parse(out, ec);
  if (ec || !doc.is_object() || !doc.as_object().contains("blocks_per_second"))
    return 0;
  return doc.at("blocks_per_second").to_number<double>();
}

int hash_bench(int rounds) {
  // 64 prompts of 8,192 tokens (512 blocks of 16): the size of a long chat.
  constexpr std::size_t block_size = 16;
  constexpr std::size_t prompt_blocks = 512;
  constexpr std::size_t prompts = 64;
  constexpr std::size_t blocks = prompt_blocks * prompts;
  auto all_tokens = bench_tokens(block_size * blocks);
  std::vector<std::vector<std::uint32_t>> prompt_tokens;
  for (std::size_t p = 0; p < prompts; ++p)
    prompt_tokens.emplace_back(all_tokens.begin() + p * prompt_blocks * block_size,
                               all_tokens.begin() + (p + 1) * prompt_blocks * block_size);
  wire::block_hasher hasher("0", block_size);

  // The exact CBOR bytes block_hasher hashes, for SHA-256 alone.
  std::vector<std::string> inputs;
  std::size_t cbor_bytes = 0;
  for (const auto& tokens : prompt_tokens) {
    auto chain = hasher.hash(tokens);
    wire::digest parent = hasher.root();
    for (std::size_t i = 0; i < prompt_blocks; ++i) {
      std::string bytes;
      wire::append_block_cbor(bytes, parent, tokens.data() + i * block_size, block_size,
                              std::nullopt);
      cbor_bytes += bytes.size();
      inputs.push_back(std::move(bytes));
      parent = chain[i].full;
    }
  }
  wire::sha256 sha;
  std::vector<double> ours;
  std::vector<double> raw;
  std::vector<double> raw_chained;
  std::vector<double> ratio_chained;
  std::vector<double> ratio_raw;
  std::uint64_t sink = 0;
  std::vector<wire::hashed_block> chain;
  for (int r = 0; r < rounds; ++r) { // interleaved, so all see the same machine
    ours.push_back(time_once([&] {
      for (const auto& tokens : prompt_tokens) {
        hasher.hash_into(tokens, {}, chain);
        sink += chain.back().key;
      }
    }));
    raw.push_back(time_once([&] {
      for (const auto& in : inputs)
        sink += sha(in)[31];
    }));
    // The same bytes, but each input waits for the digest before it, as a
    // chain must: the previous digest is copied into the parent field.
    raw_chained.push_back(time_once([&] {
      for (std::size_t p = 0; p < prompts; ++p) {
        wire::digest prev = hasher.root();
        for (std::size_t i = 0; i < prompt_blocks; ++i) {
          auto& in = inputs[p * prompt_blocks + i];
          std::memcpy(in.data() + 3, prev.data(), prev.size());
          prev = sha(in);
        }
        sink += prev[31];
      }
    }));
    ratio_chained.push_back(ours.back() / raw_chained.back());
    ratio_raw.push_back(ours.back() / raw.back());
  }
  auto t_ours = median(ours);
  report("hash: block_hasher (CBOR + SHA-256 + chain)", blocks / t_ours / 1e6, "M blocks/s",
         fmt::format("({} prompts x {} blocks of {} tokens, {:.0f} CBOR bytes/block)", prompts,
                     prompt_blocks, block_size, static_cast<double>(cbor_bytes) / blocks));
  report("hash: SHA-256 alone, same bytes, chained", blocks / median(raw_chained) / 1e6,
         "M blocks/s");
  report("hash: SHA-256 alone, same bytes, independent", blocks / median(raw) / 1e6, "M blocks/s",
         "(no chain: the CPU overlaps consecutive digests)");
  report("hash: ratio block_hasher / SHA-256 chained", median(ratio_chained), "x",
         "(median of per-round ratios; target <= 1.3)");
  report("hash: ratio block_hasher / SHA-256 independent", median(ratio_raw), "x");
  report("hash: one 8k-token prompt (512 blocks)", t_ours / prompts * 1e6, "us");
  auto py = python_blocks_per_second(all_tokens);
  if (py <= 0) {
    fmt::print(stderr, "llmgw-bench: the Python reference did not run (needs python3-cbor2)\n");
    return 1;
  }
  report("hash: Python cbor2 + hashlib, same tokens", py / 1e6, "M blocks/s");
  report("hash: speedup over Python", (blocks / t_ours) / py, "x", "(target >= 20)");
  return sink == 0 ? 1 : 0; // sink keeps the work from being optimized away
}

} // namespace

int run_wire_bench(int rounds) {
  fmt::print("# llmgw-bench wire --rounds {} (medians of {} rounds)\n", rounds, rounds);
  if (int rc = decode_bench(rounds))
    return rc;
  return hash_bench(rounds);
}

} // namespace llmgw::bench
