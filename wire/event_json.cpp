#include "wire/event_json.hpp"

#include <boost/json.hpp>

namespace llmgw::wire {

namespace {

boost::json::value hash_value(const block_hash& hash) {
  return boost::json::value(static_cast<std::uint64_t>(hash.key));
}

template <class T>
boost::json::value optional_value(const std::optional<T>& value) {
  if (!value)
    return nullptr;
  return boost::json::value(*value);
}

boost::json::value extra_value(const extra_item& item) {
  switch (item.type) {
  case extra_item::kind::text:
    return boost::json::value(item.text);
  case extra_item::kind::bytes: {
    static constexpr char digits[] = "0123456789abcdef";
    std::string hex;
    for (unsigned char c : item.text) {
      hex.push_back(digits[c >> 4]);
      hex.push_back(digits[c & 0xf]);
    }
    return boost::json::value(hex);
  }
  case extra_item::kind::integer:
    return boost::json::value(item.integer);
  case extra_item::kind::list: {
    boost::json::array arr;
    for (const auto& sub : item.items)
      arr.push_back(extra_value(sub));
    return arr;
  }
  }
  return nullptr;
}

} // namespace

std::string event_to_json(std::uint64_t seq, const event_batch& batch, const kv_event& event) {
  boost::json::object obj;
  obj["seq"] = seq;
  obj["dp_rank"] = optional_value(batch.data_parallel_rank);
  obj["type"] = to_string(event.kind);
  if (event.kind == event_kind::all_blocks_cleared)
    return boost::json::serialize(obj);
  boost::json::array hashes;
  for (const auto& h : event.block_hashes)
    hashes.push_back(hash_value(h));
  obj["block_hashes"] = std::move(hashes);
  if (event.kind == event_kind::block_stored) {
    obj["parent_block_hash"] =
      event.parent_block_hash ? hash_value(*event.parent_block_hash) : boost::json::value(nullptr);
    boost::json::array tokens;
    tokens.reserve(event.token_ids.size());
    for (auto t : event.token_ids)
      tokens.push_back(t);
    obj["token_ids"] = std::move(tokens);
    obj["block_size"] = event.block_size;
    obj["lora_id"] = optional_value(event.lora_id);
  }
  obj["medium"] = optional_value(event.medium);
  if (event.kind == event_kind::block_stored) {
    obj["lora_name"] = optional_value(event.lora_name);
    if (event.extra_keys) {
      boost::json::array extras;
      for (const auto& block : *event.extra_keys) {
        if (!block) {
          extras.push_back(nullptr);
          continue;
        }
        boost::json::array items;
        for (const auto& item : *block)
          items.push_back(extra_value(item));
        extras.push_back(std::move(items));
      }
      obj["extra_keys"] = std::move(extras);
    } else {
      obj["extra_keys"] = nullptr;
    }
  }
  obj["group_idx"] = optional_value(event.group_idx);
  if (event.kind == event_kind::block_stored) {
    obj["kv_cache_spec_kind"] = optional_value(event.kv_cache_spec_kind);
    obj["kv_cache_spec_sliding_window"] = optional_value(event.kv_cache_spec_sliding_window);
  }
  obj["locality"] = optional_value(event.locality);
  return boost::json::serialize(obj);
}

} // namespace llmgw::wire
