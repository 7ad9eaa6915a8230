#include "wire/block_hash.hpp"

#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>

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

void append_block_cbor(std::string& out, const digest& parent, const std::uint32_t* tokens,
                       std::size_t count, const block_extra& extra) {
  out.push_back(static_cast<char>(0x83)); // array of 3
  out.push_back(static_cast<char>(0x58)); // byte string, 1-byte length
  out.push_back(static_cast<char>(0x20)); // 32
  out.append(reinterpret_cast<const char*>(parent.data()), parent.size());
  append_head(out, major_array, count);
  for (std::size_t i = 0; i < count; ++i)
    append_head(out, major_unsigned, tokens[i]);
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
  EVP_MD* md = nullptr;
  EVP_MD_CTX* ctx = nullptr;
};

sha256::sha256() : impl_(std::make_unique<impl>()) {
  impl_->md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  impl_->ctx = EVP_MD_CTX_new();
  if (!impl_->md || !impl_->ctx) {
    // Without SHA-256 nothing in llmgw can work: this can never happen on a
    // sane OpenSSL installation.
    std::fprintf(stderr, "llmgw: OpenSSL has no SHA-256\n");
    std::abort();
  }
}

sha256::~sha256() {
  EVP_MD_CTX_free(impl_->ctx);
  EVP_MD_free(impl_->md);
}

digest sha256::operator()(const void* data, std::size_t size) {
  digest out{};
  unsigned int len = 0;
  if (EVP_DigestInit_ex2(impl_->ctx, impl_->md, nullptr) != 1
      || EVP_DigestUpdate(impl_->ctx, data, size) != 1
      || EVP_DigestFinal_ex(impl_->ctx, out.data(), &len) != 1 || len != out.size()) {
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
  buffer_.clear();
  append_block_cbor(buffer_, parent, tokens, count, extra);
  return sha_(buffer_);
}

std::vector<hashed_block> block_hasher::hash(const std::vector<std::uint32_t>& tokens,
                                             const extra_key_recipe& extras) {
  std::vector<hashed_block> out;
  if (block_size_ == 0)
    return out;
  auto blocks = tokens.size() / block_size_;
  out.reserve(blocks);
  const digest* parent = &root_;
  bool plain = !extras.lora_name && !extras.cache_salt && extras.mm_items.empty();
  for (std::size_t i = 0; i < blocks; ++i) {
    auto start = static_cast<std::int64_t>(i * block_size_);
    auto end = start + static_cast<std::int64_t>(block_size_);
    auto extra = plain ? block_extra{} : extras.for_block(i, start, end);
    hashed_block block;
    block.full = hash_one(*parent, tokens.data() + i * block_size_, block_size_, extra);
    block.key = key_of(block.full);
    out.push_back(block);
    parent = &out.back().full;
  }
  return out;
}

} // namespace llmgw::wire
