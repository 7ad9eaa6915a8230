#include "wire/block_hash.hpp"

// OpenSSL 3 deprecates the one-shot SHA256_* functions in favour of EVP, but
// for a 100-byte block input EVP's per-call dispatch costs as much as the
// compression itself (measured: 212 ns vs 135 ns a block, chained). They
// remain part of OpenSSL 3's API; this file alone opts into them.
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace llmgw::wire {

namespace {

// CBOR major types (RFC 8949, section 3.1).
constexpr std::uint8_t major_unsigned = 0;
constexpr std::uint8_t major_negative = 1;
constexpr std::uint8_t major_bytes = 2;
constexpr std::uint8_t major_text = 3;
constexpr std::uint8_t major_array = 4;
constexpr char cbor_null = static_cast<char>(0xf6);

// The head of a data item in its shortest form, as canonical CBOR requires.
inline void append_head(std::string& out, std::uint8_t major, std::uint64_t value) {
  auto m = static_cast<char>(major << 5);
  if (value < 24) {
    out.push_back(static_cast<char>(m | static_cast<char>(value)));
  } else if (value <= 0xff) {
    out.push_back(static_cast<char>(m | 24));
    out.push_back(static_cast<char>(value));
  } else if (value <= 0xffff) {
    char b[3] = {static_cast<char>(m | 25), static_cast<char>(value >> 8),
                 static_cast<char>(value)};
    out.append(b, 3);
  } else if (value <= 0xffffffffu) {
    char b[5] = {static_cast<char>(m | 26), static_cast<char>(value >> 24),
                 static_cast<char>(value >> 16), static_cast<char>(value >> 8),
                 static_cast<char>(value)};
    out.append(b, 5);
  } else {
    char b[9];
    b[0] = static_cast<char>(m | 27);
    for (int i = 0; i < 8; ++i)
      b[8 - i] = static_cast<char>(value >> (8 * i));
    out.append(b, 9);
  }
}

void append_item(std::string& out, const extra_item& item) {
  switch (item.type) {
  case extra_item::kind::text:
    append_head(out, major_text, item.text.size());
    out += item.text;
    break;
  case extra_item::kind::bytes:
    append_head(out, major_bytes, item.text.size());
    out += item.text;
    break;
  case extra_item::kind::integer:
    if (item.integer >= 0)
      append_head(out, major_unsigned, static_cast<std::uint64_t>(item.integer));
    else // -1 - n, computed without overflow for INT64_MIN
      append_head(out, major_negative, ~static_cast<std::uint64_t>(item.integer));
    break;
  case extra_item::kind::list:
    append_head(out, major_array, item.items.size());
    for (const auto& sub : item.items)
      append_item(out, sub);
    break;
  }
}

} // namespace

block_key key_of(const digest& d) noexcept {
  return key_of_digest(d.data(), d.size());
}

std::string to_hex(const digest& d) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(64, '0');
  for (std::size_t i = 0; i < d.size(); ++i) {
    out[2 * i] = digits[d[i] >> 4];
    out[2 * i + 1] = digits[d[i] & 0xf];
  }
  return out;
}

std::optional<digest> digest_from_hex(std::string_view hex) {
  if (hex.size() != 64)
    return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
    return -1;
  };
  digest d{};
  for (std::size_t i = 0; i < 32; ++i) {
    int hi = nibble(hex[2 * i]);
    int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return std::nullopt;
    d[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return d;
}

block_extra extra_key_recipe::for_block(std::size_t index, std::int64_t start,
                                        std::int64_t end) const {
  std::vector<extra_item> items;
  if (lora_name)
    items.push_back(extra_item::of_text(*lora_name));
  for (const auto& mm : mm_items) {
    if (mm.offset >= end)
      break;
    if (mm.offset + mm.length <= start)
      continue;
    items.push_back(extra_item::of_list(
      {extra_item::of_text(mm.identifier), extra_item::of_integer(mm.offset - start)}));
  }
  if (index == 0 && cache_salt)
    items.push_back(extra_item::of_text(*cache_salt));
  if (items.empty())
    return std::nullopt;
  return items;
}

namespace {

// The head of an unsigned integer below 2^32 in its shortest form, written
// without branches: token ids are random in width, and a mispredicted branch
// per token cost more than the rest of the encoding. Always stores 5 bytes
// (the caller leaves room) and returns the position after the ones that count.
inline char* write_unsigned(char* p, std::uint32_t value) {
  unsigned cls = (value >= 24) + (value >= 0x100) + (value >= 0x10000); // 0..3
  static constexpr unsigned char length[] = {1, 2, 3, 5};
  static constexpr unsigned char shift[] = {0, 24, 16, 0};
  p[0] = static_cast<char>(cls == 0 ? value : 23 + cls);
  std::uint32_t aligned = value << shift[cls];
  p[1] = static_cast<char>(aligned >> 24);
  p[2] = static_cast<char>(aligned >> 16);
  p[3] = static_cast<char>(aligned >> 8);
  p[4] = static_cast<char>(aligned);
  return p + length[cls];
}

// Writes [parent, tokens, null] into `p`, which has room for
// max_plain_block_size(count) bytes; returns the end.
char* write_plain_block(char* p, const digest& parent, const std::uint32_t* tokens,
                        std::size_t count) {
  *p++ = static_cast<char>(0x83); // array of 3
  *p++ = static_cast<char>(0x58); // byte string, 1-byte length
  *p++ = static_cast<char>(0x20); // 32
  std::memcpy(p, parent.data(), parent.size());
  p += parent.size();
  if (count < 24) {
    *p++ = static_cast<char>(major_array << 5 | count);
  } else {
    std::string head; // rare: block sizes of 24 tokens or more
    append_head(head, major_array, count);
    p = std::copy(head.begin(), head.end(), p);
  }
  for (std::size_t i = 0; i < count; ++i)
    p = write_unsigned(p, tokens[i]);
  return p;
}

constexpr std::size_t max_plain_block_size(std::size_t count) {
  return 3 + 32 + 9 + 5 * count + 1;
}

} // namespace

void append_block_cbor(std::string& out, const digest& parent, const std::uint32_t* tokens,
                       std::size_t count, const block_extra& extra) {
  auto old_size = out.size();
  out.resize(old_size + max_plain_block_size(count));
  char* end = write_plain_block(out.data() + old_size, parent, tokens, count);
  out.resize(static_cast<std::size_t>(end - out.data()));
  if (!extra) {
    out.push_back(cbor_null);
    return;
  }
  append_head(out, major_array, extra->size());
  for (const auto& item : *extra)
    append_item(out, item);
}

std::string cbor_text(std::string_view text) {
  std::string out;
  append_head(out, major_text, text.size());
  out += text;
  return out;
}

struct sha256::impl {
  SHA256_CTX ctx;
};

sha256::sha256() : impl_(std::make_unique<impl>()) {}

sha256::~sha256() = default;
sha256::sha256(sha256&&) noexcept = default;
sha256& sha256::operator=(sha256&&) noexcept = default;

digest sha256::operator()(const void* data, std::size_t size) {
  digest out{};
  if (SHA256_Init(&impl_->ctx) != 1 || SHA256_Update(&impl_->ctx, data, size) != 1
      || SHA256_Final(out.data(), &impl_->ctx) != 1) {
    // OpenSSL's SHA-256 cannot fail on valid memory: this can never happen.
    std::fprintf(stderr, "llmgw: OpenSSL SHA-256 failed\n");
    std::abort();
  }
  return out;
}

digest none_hash(std::string_view python_hash_seed) {
  sha256 sha;
  return sha(cbor_text(python_hash_seed));
}

block_hasher::block_hasher(std::string_view seed, std::size_t block_size)
  : root_(none_hash(seed)), block_size_(block_size) {
  buffer_.reserve(64 + 5 * block_size);
}

digest block_hasher::hash_one(const digest& parent, const std::uint32_t* tokens, std::size_t count,
                              const block_extra& extra) {
  if (extra) {
    buffer_.clear();
    append_block_cbor(buffer_, parent, tokens, count, extra);
    return sha_(buffer_);
  }
  // The common case: no extra keys. The buffer keeps its size between calls,
  // so nothing is zero-filled or reallocated per block.
  if (buffer_.size() < max_plain_block_size(count))
    buffer_.resize(max_plain_block_size(count));
  char* end = write_plain_block(buffer_.data(), parent, tokens, count);
  *end++ = cbor_null;
  return sha_(buffer_.data(), static_cast<std::size_t>(end - buffer_.data()));
}

std::vector<hashed_block> block_hasher::hash(const std::vector<std::uint32_t>& tokens,
                                             const extra_key_recipe& extras) {
  std::vector<hashed_block> out;
  hash_into(tokens, extras, out);
  return out;
}

void block_hasher::hash_into(const std::vector<std::uint32_t>& tokens,
                             const extra_key_recipe& extras, std::vector<hashed_block>& out) {
  out.clear();
  if (block_size_ == 0)
    return;
  auto blocks = tokens.size() / block_size_;
  out.resize(blocks);
  const digest* parent = &root_;
  bool plain = !extras.lora_name && !extras.cache_salt && extras.mm_items.empty();
  for (std::size_t i = 0; i < blocks; ++i) {
    auto start = static_cast<std::int64_t>(i * block_size_);
    auto end = start + static_cast<std::int64_t>(block_size_);
    auto& block = out[i];
    if (plain)
      block.full = hash_one(*parent, tokens.data() + i * block_size_, block_size_, std::nullopt);
    else
      block.full = hash_one(*parent, tokens.data() + i * block_size_, block_size_,
                            extras.for_block(i, start, end));
    block.key = key_of(block.full);
    parent = &block.full;
  }
}

} // namespace llmgw::wire
