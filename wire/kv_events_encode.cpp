// The encoder half of wire/kv_events.hpp: what llmgw-sim publishes, written
// exactly as vLLM's msgspec-based publisher writes it (tested byte for byte
// against every payload of golden/vllm-captures/).
#include "wire/kv_events.hpp"

#include <msgpack.hpp>

namespace llmgw::wire {

namespace {

using packer = msgpack::packer<msgpack::sbuffer>;

void pack_hash(packer& p, const block_hash& h) {
  if (h.has_digest()) {
    p.pack_bin(h.digest_size);
    p.pack_bin_body(reinterpret_cast<const char*>(h.digest.data()), h.digest_size);
  } else {
    p.pack_uint64(h.key);
  }
}

void pack_str(packer& p, const std::string& s) {
  p.pack_str(static_cast<std::uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
}

void pack_int(packer& p, std::int64_t v) {
  if (v >= 0)
    p.pack_uint64(static_cast<std::uint64_t>(v));
  else
    p.pack_int64(v);
}

template <class T, class F>
void pack_optional(packer& p, const std::optional<T>& v, F f) {
  if (v)
    f(*v);
  else
    p.pack_nil();
}

void pack_item(packer& p, const extra_item& item) {
  switch (item.type) {
  case extra_item::kind::text:
    pack_str(p, item.text);
    break;
  case extra_item::kind::integer:
    pack_int(p, item.integer);
    break;
  case extra_item::kind::bytes:
    p.pack_bin(static_cast<std::uint32_t>(item.text.size()));
    p.pack_bin_body(item.text.data(), static_cast<std::uint32_t>(item.text.size()));
    break;
  case extra_item::kind::list:
    p.pack_array(static_cast<std::uint32_t>(item.items.size()));
    for (const auto& x : item.items)
      pack_item(p, x);
    break;
  }
}

void pack_extra_keys(packer& p, const std::vector<block_extra>& keys) {
  p.pack_array(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) {
    if (!k) {
      p.pack_nil();
      continue;
    }
    p.pack_array(static_cast<std::uint32_t>(k->size()));
    for (const auto& item : *k)
      pack_item(p, item);
  }
}

void pack_hashes(packer& p, const std::vector<block_hash>& hs) {
  p.pack_array(static_cast<std::uint32_t>(hs.size()));
  for (const auto& h : hs)
    pack_hash(p, h);
}

void pack_tokens(packer& p, const std::vector<std::uint32_t>& ts) {
  p.pack_array(static_cast<std::uint32_t>(ts.size()));
  for (auto t : ts)
    p.pack_uint32(t);
}

void pack_array_event(packer& p, const kv_event& ev) {
  switch (ev.kind) {
  case event_kind::block_stored:
    p.pack_array(ev.locality ? 13 : 12);
    pack_str(p, "BlockStored");
    pack_hashes(p, ev.block_hashes);
    pack_optional(p, ev.parent_block_hash, [&](const block_hash& h) { pack_hash(p, h); });
    pack_tokens(p, ev.token_ids);
    p.pack_uint32(ev.block_size);
    pack_optional(p, ev.lora_id, [&](std::int64_t v) { pack_int(p, v); });
    pack_optional(p, ev.medium, [&](const std::string& v) { pack_str(p, v); });
    pack_optional(p, ev.lora_name, [&](const std::string& v) { pack_str(p, v); });
    pack_optional(p, ev.extra_keys,
                  [&](const std::vector<block_extra>& v) { pack_extra_keys(p, v); });
    pack_optional(p, ev.group_idx, [&](std::int64_t v) { pack_int(p, v); });
    pack_optional(p, ev.kv_cache_spec_kind, [&](const std::string& v) { pack_str(p, v); });
    pack_optional(p, ev.kv_cache_spec_sliding_window, [&](std::int64_t v) { pack_int(p, v); });
    if (ev.locality)
      pack_str(p, *ev.locality);
    break;
  case event_kind::block_removed:
    p.pack_array(ev.locality ? 5 : 4);
    pack_str(p, "BlockRemoved");
    pack_hashes(p, ev.block_hashes);
    pack_optional(p, ev.medium, [&](const std::string& v) { pack_str(p, v); });
    pack_optional(p, ev.group_idx, [&](std::int64_t v) { pack_int(p, v); });
    if (ev.locality)
      pack_str(p, *ev.locality);
    break;
  case event_kind::all_blocks_cleared:
    p.pack_array(1);
    pack_str(p, "AllBlocksCleared");
    break;
  }
}

/// SGLang's events (its publisher's msgspec structs are array_like, so every
/// field is written; the salt's metadata struct is a map).
void pack_sglang_event(packer& p, const kv_event& ev) {
  auto pack_signed = [&](const block_hash& h) { pack_int(p, static_cast<std::int64_t>(h.key)); };
  switch (ev.kind) {
  case event_kind::block_stored:
    p.pack_array(ev.cache_salt ? 8 : 7);
    pack_str(p, "BlockStored");
    p.pack_array(static_cast<std::uint32_t>(ev.block_hashes.size()));
    for (const auto& h : ev.block_hashes)
      pack_signed(h);
    pack_optional(p, ev.parent_block_hash, pack_signed);
    pack_tokens(p, ev.token_ids);
    p.pack_uint32(ev.block_size);
    pack_optional(p, ev.lora_id, [&](std::int64_t v) { pack_int(p, v); });
    pack_optional(p, ev.medium, [&](const std::string& v) { pack_str(p, v); });
    if (ev.cache_salt) {
      p.pack_map(1);
      pack_str(p, "cache_salt");
      pack_str(p, *ev.cache_salt);
    }
    break;
  case event_kind::block_removed:
    p.pack_array(3);
    pack_str(p, "BlockRemoved");
    p.pack_array(static_cast<std::uint32_t>(ev.block_hashes.size()));
    for (const auto& h : ev.block_hashes)
      pack_signed(h);
    pack_optional(p, ev.medium, [&](const std::string& v) { pack_str(p, v); });
    break;
  case event_kind::all_blocks_cleared:
    p.pack_array(1);
    pack_str(p, "AllBlocksCleared");
    break;
  }
}

void pack_map_event(packer& p, const kv_event& ev) {
  switch (ev.kind) {
  case event_kind::block_stored: {
    std::uint32_t n = 8 + !!ev.extra_keys + !!ev.group_idx + !!ev.kv_cache_spec_kind
                      + !!ev.kv_cache_spec_sliding_window + !!ev.locality;
    p.pack_map(n);
    pack_str(p, "type");
    pack_str(p, "BlockStored");
    pack_str(p, "block_hashes");
    pack_hashes(p, ev.block_hashes);
    pack_str(p, "parent_block_hash");
    pack_optional(p, ev.parent_block_hash, [&](const block_hash& h) { pack_hash(p, h); });
    pack_str(p, "token_ids");
    pack_tokens(p, ev.token_ids);
    pack_str(p, "block_size");
    p.pack_uint32(ev.block_size);
    pack_str(p, "lora_id");
    pack_optional(p, ev.lora_id, [&](std::int64_t v) { pack_int(p, v); });
    pack_str(p, "medium");
    pack_optional(p, ev.medium, [&](const std::string& v) { pack_str(p, v); });
    pack_str(p, "lora_name");
    pack_optional(p, ev.lora_name, [&](const std::string& v) { pack_str(p, v); });
    if (ev.extra_keys) {
      pack_str(p, "extra_keys");
      pack_extra_keys(p, *ev.extra_keys);
    }
    if (ev.group_idx) {
      pack_str(p, "group_idx");
      pack_int(p, *ev.group_idx);
    }
    if (ev.kv_cache_spec_kind) {
      pack_str(p, "kv_cache_spec_kind");
      pack_str(p, *ev.kv_cache_spec_kind);
    }
    if (ev.kv_cache_spec_sliding_window) {
      pack_str(p, "kv_cache_spec_sliding_window");
      pack_int(p, *ev.kv_cache_spec_sliding_window);
    }
    if (ev.locality) {
      pack_str(p, "locality");
      pack_str(p, *ev.locality);
    }
    break;
  }
  case event_kind::block_removed: {
    std::uint32_t n = 3 + !!ev.group_idx + !!ev.locality;
    p.pack_map(n);
    pack_str(p, "type");
    pack_str(p, "BlockRemoved");
    pack_str(p, "block_hashes");
    pack_hashes(p, ev.block_hashes);
    pack_str(p, "medium");
    pack_optional(p, ev.medium, [&](const std::string& v) { pack_str(p, v); });
    if (ev.group_idx) {
      pack_str(p, "group_idx");
      pack_int(p, *ev.group_idx);
    }
    if (ev.locality) {
      pack_str(p, "locality");
      pack_str(p, *ev.locality);
    }
    break;
  }
  case event_kind::all_blocks_cleared:
    p.pack_map(1);
    pack_str(p, "type");
    pack_str(p, "AllBlocksCleared");
    break;
  }
}

} // namespace

std::string encode_batch(const event_batch& batch, event_shape shape) {
  msgpack::sbuffer buf;
  packer p(buf);
  p.pack_array(3);
  p.pack_double(batch.ts);
  p.pack_array(static_cast<std::uint32_t>(batch.events.size()));
  for (const auto& ev : batch.events) {
    switch (shape) {
    case event_shape::array:
      pack_array_event(p, ev);
      break;
    case event_shape::map:
      pack_map_event(p, ev);
      break;
    case event_shape::sglang:
      pack_sglang_event(p, ev);
      break;
    }
  }
  pack_optional(p, batch.data_parallel_rank, [&](std::int64_t v) { pack_int(p, v); });
  return std::string(buf.data(), buf.size());
}

} // namespace llmgw::wire
