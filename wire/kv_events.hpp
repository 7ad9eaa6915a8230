// vLLM's KV cache events, decoded from the msgpack payload of one ZMQ message.
//
// A payload is one msgpack array: [ts (float), events (array),
// data_parallel_rank (int or nil)]; older publishers send two elements, and
// extra trailing elements are ignored. Each event comes in one of two shapes:
//
// - array shape (vLLM before 2026-06): [tag, field, ...], positional:
//     ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//      lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
//      kv_cache_spec_sliding_window, locality]
//     ["BlockRemoved", block_hashes, medium, group_idx, locality]
//     ["AllBlocksCleared"]
//   Older versions stop earlier; missing trailing fields take their default.
// - map shape (since 2026-06): {"type": tag, name: value, ...}, the same names;
//   fields at their default may be missing, unknown keys are skipped.
//
// A block hash is either an unsigned integer of any msgpack width (vLLM's
// default: the digest's last 8 bytes, big-endian) or the raw digest as bin (16
// bytes for xxhash, 32 for sha256), reduced here to the same 64-bit key.
//
// SGLang's publisher (the `sglang` dialect) sends the same batches with its
// own events (sglang/srt/disaggregation/kv_events.py):
//     ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//      lora_id, medium] and, for a request with a cache salt, an eighth
//      element {"cache_salt": salt}
//     ["BlockRemoved", block_hashes, medium]
//   or, since 2026-09, maps with a "type" key and the same names (the salt as
//   "cache_salt"). A hash is a signed integer (the digest's first 8 bytes as
//   an int64), kept as its two's complement. SGLang mixes nothing but the salt into its hashes
//   and publishes no extra_keys: the decoder gives each stored block the
//   extra keys vLLM would hash for it (the salt on a chain's first block,
//   none elsewhere). An EAGLE engine's pages are token pairs (bigram keys);
//   a pair's first token is the page's token.
//
// The decoder trusts nothing: sizes are checked against the bytes that remain,
// nesting is bounded, and every error names the event and field it concerns.
#pragma once

#include "base/result.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace llmgw::wire {

/// The 64-bit key by which llmgw knows a block: what vLLM publishes by default.
using block_key = std::uint64_t;

/// A block hash as it was on the wire.
struct block_hash {
  block_key key = 0;                     ///< the routing key (last 8 digest bytes, big-endian)
  std::uint8_t digest_size = 0;          ///< 0: an integer on the wire; 16 or 32: raw digest bytes
  std::array<std::uint8_t, 32> digest{}; ///< the raw digest, first digest_size bytes valid

  /// True when the wire carried the raw digest rather than the integer key.
  bool has_digest() const noexcept { return digest_size != 0; }
  bool operator==(const block_hash& other) const noexcept;
  bool operator!=(const block_hash& other) const noexcept { return !(*this == other); }
};

/// One element of an extra-keys tuple (LoRA name, cache salt, a multimodal
/// (identifier, offset) pair, an embedding digest). Also the input of block
/// hashing, so what is decoded can be hashed again unchanged.
struct extra_item {
  enum class kind : std::uint8_t { text, integer, bytes, list };
  kind type = kind::text;
  std::string text;              ///< text or bytes
  std::int64_t integer = 0;      ///< integer
  std::vector<extra_item> items; ///< list

  static extra_item of_text(std::string value);
  static extra_item of_integer(std::int64_t value);
  static extra_item of_bytes(std::string value);
  static extra_item of_list(std::vector<extra_item> value);
  bool operator==(const extra_item& other) const;
  bool operator!=(const extra_item& other) const { return !(*this == other); }
};

/// The extra keys of one block: nullopt is vLLM's None (CBOR null when hashed).
using block_extra = std::optional<std::vector<extra_item>>;

/// The three kinds of KV cache event vLLM publishes.
enum class event_kind : std::uint8_t { block_stored, block_removed, all_blocks_cleared };

/// vLLM's name of an event kind ("BlockStored", ...).
const char* to_string(event_kind kind) noexcept;

/// One event. Fields that do not apply to the kind stay empty.
struct kv_event {
  event_kind kind = event_kind::all_blocks_cleared;
  std::vector<block_hash> block_hashes;                     ///< stored, removed
  std::optional<block_hash> parent_block_hash;              ///< stored; nullopt for a first block
  std::vector<std::uint32_t> token_ids;                     ///< stored
  std::uint32_t block_size = 0;                             ///< stored
  std::optional<std::int64_t> lora_id;                      ///< stored
  std::optional<std::string> medium;                        ///< stored, removed; nullopt means GPU
  std::optional<std::string> lora_name;                     ///< stored
  std::optional<std::vector<block_extra>> extra_keys;       ///< stored: one entry per block
  std::optional<std::int64_t> group_idx;                    ///< stored, removed
  std::optional<std::string> kv_cache_spec_kind;            ///< stored
  std::optional<std::int64_t> kv_cache_spec_sliding_window; ///< stored
  std::optional<std::string> locality;                      ///< stored, removed
  std::optional<std::string> cache_salt;                    ///< stored (SGLang's metadata)
  /// Stored: the engine mixed into these blocks' hashes what it does not
  /// publish (TensorRT-LLM: an adapter named only by its id, multimodal keys,
  /// placeholder tokens as text); the cluster's keys for them are unknown.
  bool unpublished_extras = false;

  /// The medium with vLLM's default applied: nil is "GPU".
  std::string_view medium_or_gpu() const noexcept;
};

/// One published batch.
struct event_batch {
  double ts = 0; ///< publisher wall-clock time, seconds
  std::vector<kv_event> events;
  std::optional<std::int64_t> data_parallel_rank; ///< nullopt: nil or absent
  /// Events of a type llmgw does not know (engines add them: ROCm ATOM's
  /// BlockTransferred): skipped, not an error; the batch's known events
  /// still apply. How many, and the first few distinct type names (escaped
  /// as log::printable does).
  std::uint32_t skipped = 0;
  std::vector<std::string> skipped_types; ///< at most max_skipped_types
  static constexpr std::size_t max_skipped_types = 8;
};

/// Bounds applied while decoding untrusted payloads.
struct decode_limits {
  std::size_t max_payload_bytes = 8u << 20; ///< larger payloads are refused unread
  std::size_t max_depth = 16;               ///< msgpack nesting (a batch needs 5)
};

/// Whose publisher wrote a payload: the batch is the same, the events differ.
/// TensorRT-LLM writes vLLM's map shape, and its hashes may be signed (as
/// Dynamo's publisher for it writes them); it publishes no extra keys: the
/// decoder gives each stored block none, or the LoRA name when one is
/// named, as vLLM would hash them. What it mixes in without publishing (a
/// LoRA id without a name, `mm_keys`, text placeholder tokens) marks the
/// event's blocks `unpublished_extras`. Its cache salt is not published at
/// all: a salted request's blocks look unsalted.
enum class event_dialect : std::uint8_t { vllm, sglang, trtllm };

/// Decodes one payload. On error, nothing of the batch is returned and the
/// message says what was wrong and at which event and field.
result<event_batch> decode_batch(std::string_view payload, const decode_limits& limits = {},
                                 event_dialect dialect = event_dialect::vllm);

/// The two event encodings vLLM has used.
enum class event_shape : std::uint8_t {
  array,  ///< positional arrays (vLLM before 2026-06)
  map,    ///< maps with a "type" key, None-valued optional fields left out
  sglang, ///< SGLang's positional arrays (llmgw-sim's SGLang stream)
};

/// Encodes a batch as vLLM's publisher does, byte for byte: the array shape
/// writes BlockStored with 12 elements and BlockRemoved with 4 (13 and 5 when
/// a locality is set); the map shape always writes type, block_hashes,
/// parent_block_hash, token_ids, block_size, lora_id, medium and lora_name,
/// and extra_keys, group_idx, the spec fields and locality only when set. A
/// hash is written as it was read: an integer, or the raw digest as bin. The
/// sglang shape writes SGLang's events as its publisher does: BlockStored
/// with 7 elements (8, the salt's map, when cache_salt is set), BlockRemoved
/// with 3, each hash a signed integer (the key's two's complement).
std::string encode_batch(const event_batch& batch, event_shape shape);

/// Reduces a raw digest (16 or 32 bytes) to its 64-bit key, as vLLM does.
block_key key_of_digest(const std::uint8_t* digest, std::size_t size) noexcept;

} // namespace llmgw::wire
