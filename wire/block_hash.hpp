// vLLM's block hashes with --prefix-caching-hash-algo sha256_cbor.
//
// Only full blocks are hashed. For block i of a request with tokens t and
// block size B:
//
//   h_i    = sha256(canonical_cbor([h_{i-1}, [t_iB .. t_iB+B-1], extra_i]))
//   h_{-1} = NONE_HASH = sha256(canonical_cbor(PYTHONHASHSEED as text))
//
// where h_{i-1} is the previous digest as a 32-byte CBOR byte string, the
// tokens a CBOR array of unsigned integers, and extra_i CBOR null when the
// block has no extra keys, else an array in this order: the LoRA name (every
// block), one [identifier, offset - block_start] pair per multimodal item that
// overlaps the block, the cache salt (block 0 only). The routing key of a
// block is the digest's last 8 bytes, big-endian.
//
// The CBOR is written here (it is three small shapes, always in canonical
// shortest form); SHA-256 is OpenSSL's.
#pragma once

#include "wire/kv_events.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llmgw::wire {

/// A full SHA-256 digest.
using digest = std::array<std::uint8_t, 32>;

/// The 64-bit routing key of a digest: its last 8 bytes, big-endian.
block_key key_of(const digest& d) noexcept;

/// Lowercase hex of a digest.
std::string to_hex(const digest& d);

/// Parses 64 hex characters; nullopt if that is not what `hex` is.
std::optional<digest> digest_from_hex(std::string_view hex);

/// A multimodal item of a prompt: its identifier (vLLM's mm hash) and the
/// token range it occupies.
struct mm_item {
  std::string identifier;
  std::int64_t offset = 0; ///< first token of the item in the prompt
  std::int64_t length = 0; ///< number of placeholder tokens
};

/// What besides the tokens goes into a request's block hashes.
struct extra_key_recipe {
  std::optional<std::string> lora_name;
  std::optional<std::string> cache_salt;
  std::vector<mm_item> mm_items; ///< sorted by offset

  /// The extra keys of the block covering tokens [start, end): CBOR null
  /// (nullopt) when there are none.
  block_extra for_block(std::size_t index, std::int64_t start, std::int64_t end) const;
};

/// Appends the canonical CBOR of [parent, tokens, extra] to `out`. Exposed so
/// benchmarks and tests can hash the very same bytes.
void append_block_cbor(std::string& out, const digest& parent, const std::uint32_t* tokens,
                       std::size_t count, const block_extra& extra);

/// The canonical CBOR of a text string (NONE_HASH's input).
std::string cbor_text(std::string_view text);

/// SHA-256 by OpenSSL, one context reused for many digests. Not thread-safe:
/// one per thread.
class sha256 {
public:
  sha256();
  ~sha256();
  sha256(sha256&&) noexcept;
  sha256& operator=(sha256&&) noexcept;
  sha256(const sha256&) = delete;
  sha256& operator=(const sha256&) = delete;

  /// The digest of `size` bytes at `data`.
  digest operator()(const void* data, std::size_t size);
  digest operator()(std::string_view bytes) { return (*this)(bytes.data(), bytes.size()); }

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// NONE_HASH: the parent of every request's first block, from the
/// PYTHONHASHSEED string of the engine.
digest none_hash(std::string_view python_hash_seed);

/// One hashed block.
struct hashed_block {
  digest full;
  block_key key = 0;
};

/// Hashes requests' full blocks, reusing its buffer and SHA-256 context.
/// Not thread-safe: one per thread.
class block_hasher {
public:
  /// `seed` is the engine's PYTHONHASHSEED, `block_size` its --block-size.
  block_hasher(std::string_view seed, std::size_t block_size);

  /// The chain of every full block of `tokens`, in order. Trailing tokens that
  /// do not fill a block are not hashed.
  std::vector<hashed_block> hash(const std::vector<std::uint32_t>& tokens,
                                 const extra_key_recipe& extras = {});

  /// The same into a caller's vector, which keeps its capacity between
  /// prompts (the router hashes every request).
  void hash_into(const std::vector<std::uint32_t>& tokens, const extra_key_recipe& extras,
                 std::vector<hashed_block>& out);

  /// The hash of one block given its parent digest, tokens and extra keys:
  /// what the agent uses to check an engine's published hashes.
  digest hash_one(const digest& parent, const std::uint32_t* tokens, std::size_t count,
                  const block_extra& extra);

  /// The chain root for this seed.
  const digest& root() const noexcept { return root_; }
  std::size_t block_size() const noexcept { return block_size_; }

private:
  digest root_;
  std::size_t block_size_;
  std::string buffer_;
  sha256 sha_;
};

} // namespace llmgw::wire
