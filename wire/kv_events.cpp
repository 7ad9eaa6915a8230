#include "wire/kv_events.hpp"

#include "base/log.hpp"

#include <fmt/format.h>
#include <msgpack.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

namespace llmgw::wire {

// -- small value types -------------------------------------------------------

bool block_hash::operator==(const block_hash& other) const noexcept {
  return key == other.key && digest_size == other.digest_size
         && std::memcmp(digest.data(), other.digest.data(), digest_size) == 0;
}

extra_item extra_item::of_text(std::string value) {
  extra_item item;
  item.type = kind::text;
  item.text = std::move(value);
  return item;
}

extra_item extra_item::of_integer(std::int64_t value) {
  extra_item item;
  item.type = kind::integer;
  item.integer = value;
  return item;
}

extra_item extra_item::of_bytes(std::string value) {
  extra_item item;
  item.type = kind::bytes;
  item.text = std::move(value);
  return item;
}

extra_item extra_item::of_list(std::vector<extra_item> value) {
  extra_item item;
  item.type = kind::list;
  item.items = std::move(value);
  return item;
}

bool extra_item::operator==(const extra_item& other) const {
  if (type != other.type)
    return false;
  switch (type) {
  case kind::text:
  case kind::bytes:
    return text == other.text;
  case kind::integer:
    return integer == other.integer;
  case kind::list:
    return items == other.items;
  }
  return false;
}

const char* to_string(event_kind kind) noexcept {
  switch (kind) {
  case event_kind::block_stored:
    return "BlockStored";
  case event_kind::block_removed:
    return "BlockRemoved";
  case event_kind::all_blocks_cleared:
    return "AllBlocksCleared";
  }
  return "unknown";
}

std::string_view kv_event::medium_or_gpu() const noexcept {
  if (medium)
    return *medium;
  return "GPU";
}

block_key key_of_digest(const std::uint8_t* digest, std::size_t size) noexcept {
  block_key key = 0;
  auto start = size >= 8 ? size - 8 : 0;
  for (auto i = start; i < size; ++i)
    key = (key << 8) | digest[i];
  return key;
}

namespace {

// -- msgpack parsing with bounds ---------------------------------------------

// msgpack-c's object builder allocates an array's elements as soon as it reads
// the header. A hostile header may claim four billion elements in five bytes,
// so this visitor refuses any claim beyond what the payload could hold (every
// element takes at least one byte) and bounds the nesting depth, before the
// builder allocates anything. It also records where parsing stopped instead
// of throwing.
class bounded_object_builder : public msgpack::v2::detail::create_object_visitor {
public:
  using base = msgpack::v2::detail::create_object_visitor;

  bounded_object_builder(std::size_t element_budget, std::size_t max_depth)
    : base(reference_payload, nullptr, msgpack::unpack_limit()), element_budget_(element_budget),
      max_depth_(max_depth) {}

  bool start_array(std::uint32_t count) {
    if (!claim(count))
      return false;
    return base::start_array(count);
  }

  bool end_array() {
    --depth_;
    return base::end_array();
  }

  bool start_map(std::uint32_t count) {
    if (!claim(std::uint64_t{count} * 2))
      return false;
    return base::start_map(count);
  }

  bool end_map() {
    --depth_;
    return base::end_map();
  }

  void parse_error(std::size_t, std::size_t error_offset) {
    failure_ = failure::malformed;
    failure_offset_ = error_offset;
  }

  void insufficient_bytes(std::size_t, std::size_t error_offset) {
    failure_ = failure::truncated;
    failure_offset_ = error_offset;
  }

  enum class failure { none, malformed, truncated, overclaim, too_deep };

  failure why() const noexcept { return failure_; }
  std::size_t failure_offset() const noexcept { return failure_offset_; }
  std::uint64_t claimed() const noexcept { return claimed_; }

private:
  static bool reference_payload(msgpack::type::object_type, std::size_t, void*) {
    return true; // strings and bins point into the payload: no copies
  }

  bool claim(std::uint64_t elements) {
    if (++depth_ > max_depth_) {
      failure_ = failure::too_deep;
      return false;
    }
    claimed_ += elements;
    if (claimed_ > element_budget_) {
      failure_ = failure::overclaim;
      return false;
    }
    return true;
  }

  std::uint64_t element_budget_;
  std::size_t max_depth_;
  std::size_t depth_ = 0;
  std::uint64_t claimed_ = 0;
  failure failure_ = failure::none;
  std::size_t failure_offset_ = 0;
};

// -- walking the object tree -------------------------------------------------

const char* type_name(const msgpack::object& obj) {
  switch (obj.type) {
  case msgpack::type::NIL:
    return "nil";
  case msgpack::type::BOOLEAN:
    return "boolean";
  case msgpack::type::POSITIVE_INTEGER:
    return "unsigned integer";
  case msgpack::type::NEGATIVE_INTEGER:
    return "negative integer";
  case msgpack::type::FLOAT32:
  case msgpack::type::FLOAT64:
    return "float";
  case msgpack::type::STR:
    return "str";
  case msgpack::type::BIN:
    return "bin";
  case msgpack::type::ARRAY:
    return "array";
  case msgpack::type::MAP:
    return "map";
  case msgpack::type::EXT:
    return "ext";
  }
  return "unknown";
}

/// Peer text for an error message, as log::printable makes it (and shorter).
std::string printable(std::string_view text) {
  return log::printable(text, 40);
}

std::string_view as_view(const msgpack::object& obj) {
  return {obj.via.str.ptr, obj.via.str.size};
}

/// Where the decoder is, for error messages: "event 3 (BlockStored), field
/// 'token_ids', element 17".
struct position {
  std::size_t event = std::numeric_limits<std::size_t>::max();
  const char* tag = nullptr;
  const char* field = nullptr;
  std::size_t element = std::numeric_limits<std::size_t>::max();

  std::string describe() const {
    std::string out;
    if (event == std::numeric_limits<std::size_t>::max()) {
      out = "batch";
    } else {
      out = fmt::format("event {}", event);
      if (tag)
        out += fmt::format(" ({})", tag);
    }
    if (field)
      out += fmt::format(", field '{}'", field);
    if (element != std::numeric_limits<std::size_t>::max())
      out += fmt::format(", element {}", element);
    return out;
  }
};

class batch_decoder {
public:
  explicit batch_decoder(event_dialect dialect) : dialect_(dialect) {}

  result<event_batch> decode(const msgpack::object& root) {
    if (!decode_root(root))
      return std::move(*error_);
    return std::move(batch_);
  }

private:
  bool fail(errc code, const std::string& what) {
    error_ = error{code, pos_.describe() + ": " + what};
    return false;
  }

  bool wrong_type(const msgpack::object& obj, const char* expected) {
    return fail(errc::bad_type, fmt::format("expected {}, got {}", expected, type_name(obj)));
  }

  bool decode_root(const msgpack::object& root) {
    if (root.type != msgpack::type::ARRAY)
      return wrong_type(root, "an array [ts, events, data_parallel_rank]");
    const auto& arr = root.via.array;
    if (arr.size < 2)
      return fail(errc::bad_length,
                  fmt::format("batch has {} elements, expected at least 2 (ts, events)", arr.size));
    const auto& ts = arr.ptr[0];
    pos_.field = "ts";
    switch (ts.type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64:
      batch_.ts = ts.via.f64;
      break;
    case msgpack::type::POSITIVE_INTEGER:
      batch_.ts = static_cast<double>(ts.via.u64);
      break;
    case msgpack::type::NEGATIVE_INTEGER:
      batch_.ts = static_cast<double>(ts.via.i64);
      break;
    default:
      return wrong_type(ts, "a number");
    }
    if (arr.size >= 3) {
      pos_.field = "data_parallel_rank";
      if (!optional_int(arr.ptr[2], batch_.data_parallel_rank))
        return false;
    }
    const auto& events = arr.ptr[1];
    pos_.field = "events";
    if (events.type != msgpack::type::ARRAY)
      return wrong_type(events, "an array of events");
    pos_.field = nullptr;
    // Bounded: a payload of unknown (skipped) events must not reserve room
    // for millions of known ones.
    batch_.events.reserve(std::min<std::uint32_t>(events.via.array.size, 4096));
    for (std::uint32_t i = 0; i < events.via.array.size; ++i) {
      pos_ = position{};
      pos_.event = i;
      kv_event ev;
      bool known = true;
      unpublished_ = false;
      if (!decode_event(events.via.array.ptr[i], ev, known))
        return false;
      ev.unpublished_extras = unpublished_;
      if (!known)
        continue;
      if (dialect_ == event_dialect::sglang && ev.kind == event_kind::block_stored)
        sglang_extra_keys(ev);
      if (dialect_ == event_dialect::trtllm && ev.kind == event_kind::block_stored) {
        if (ev.lora_id && !ev.lora_name)
          ev.unpublished_extras = true; // an adapter named only by TensorRT-LLM's id
        if (!ev.extra_keys)
          trtllm_extra_keys(ev);
      }
      batch_.events.push_back(std::move(ev));
    }
    return true;
  }

  /// The event's type; `known` false (and its name kept in the batch's
  /// skipped list) for a type llmgw does not know.
  bool decode_tag(const msgpack::object& obj, event_kind& kind, bool& known) {
    if (obj.type != msgpack::type::STR)
      return wrong_type(obj, "the event type as str");
    auto tag = as_view(obj);
    known = true;
    if (tag == "BlockStored") {
      kind = event_kind::block_stored;
    } else if (tag == "BlockRemoved") {
      kind = event_kind::block_removed;
    } else if (tag == "AllBlocksCleared") {
      kind = event_kind::all_blocks_cleared;
    } else {
      known = false;
      ++batch_.skipped;
      auto name = printable(tag);
      auto& types = batch_.skipped_types;
      if (types.size() < event_batch::max_skipped_types
          && std::find(types.begin(), types.end(), name) == types.end())
        types.push_back(std::move(name));
      return true;
    }
    pos_.tag = to_string(kind);
    return true;
  }

  bool decode_event(const msgpack::object& obj, kv_event& ev, bool& known) {
    if (obj.type == msgpack::type::ARRAY)
      return decode_array_event(obj.via.array, ev, known);
    if (obj.type == msgpack::type::MAP)
      return decode_map_event(obj.via.map, ev, known);
    return wrong_type(obj, "an event (array or map)");
  }

  // Every field an event has had, in BlockStored's positional order.
  enum class field : std::uint8_t {
    block_hashes,
    parent_block_hash,
    token_ids,
    block_size,
    lora_id,
    medium,
    lora_name,
    extra_keys,
    group_idx,
    kv_cache_spec_kind,
    kv_cache_spec_sliding_window,
    locality,
    metadata,   ///< SGLang only: {"cache_salt": salt}
    cache_salt, ///< SGLang only, its maps since 2026-09
    mm_keys,    ///< TensorRT-LLM only: its multimodal keys
    unknown,
  };

  static constexpr const char* field_names[] = {"block_hashes",
                                                "parent_block_hash",
                                                "token_ids",
                                                "block_size",
                                                "lora_id",
                                                "medium",
                                                "lora_name",
                                                "extra_keys",
                                                "group_idx",
                                                "kv_cache_spec_kind",
                                                "kv_cache_spec_sliding_window",
                                                "locality",
                                                "metadata",
                                                "cache_salt",
                                                "mm_keys"};
  static_assert(std::size(field_names) == static_cast<std::size_t>(field::unknown),
                "a name for every field");

  // Positional order of the array shape, after the tag.
  static constexpr field stored_fields[] = {field::block_hashes,
                                            field::parent_block_hash,
                                            field::token_ids,
                                            field::block_size,
                                            field::lora_id,
                                            field::medium,
                                            field::lora_name,
                                            field::extra_keys,
                                            field::group_idx,
                                            field::kv_cache_spec_kind,
                                            field::kv_cache_spec_sliding_window,
                                            field::locality};
  static constexpr field removed_fields[] = {field::block_hashes, field::medium, field::group_idx,
                                             field::locality};
  static constexpr field sglang_stored_fields[] = {field::block_hashes, field::parent_block_hash,
                                                   field::token_ids,    field::block_size,
                                                   field::lora_id,      field::medium,
                                                   field::metadata};
  static constexpr field sglang_removed_fields[] = {field::block_hashes, field::medium};

  static const char* name_of(field f) { return field_names[static_cast<std::size_t>(f)]; }

  /// The field a map key names, if the event kind (in this dialect) has it.
  field field_of(std::string_view key, event_kind kind) const {
    field f = field::unknown;
    for (std::size_t i = 0; i < std::size(field_names); ++i) {
      std::string_view name = field_names[i];
      if (key.size() == name.size() && key[0] == name[0] && key == name) {
        f = static_cast<field>(i);
        break;
      }
    }
    bool sglang_only = f == field::metadata || f == field::cache_salt;
    if ((sglang_only && dialect_ != event_dialect::sglang)
        || (f == field::mm_keys && dialect_ != event_dialect::trtllm))
      return field::unknown; // another engine's name: skipped like any unknown key
    if (kind == event_kind::block_removed && f != field::block_hashes && f != field::medium
        && f != field::group_idx && f != field::locality)
      return field::unknown; // a stored-only name on a removal is skipped like any unknown key
    return f;
  }

  bool decode_array_event(const msgpack::object_array& arr, kv_event& ev, bool& known_kind) {
    if (arr.size == 0)
      return fail(errc::bad_length, "empty event array, expected [type, fields...]");
    if (!decode_tag(arr.ptr[0], ev.kind, known_kind))
      return false;
    if (!known_kind)
      return true; // its fields are not read
    // The oldest vLLM that published events (2025-04) sent the first five
    // BlockStored fields and BlockRemoved's block_hashes.
    std::size_t minimum = 1;
    std::size_t known = 0;
    const field* order = nullptr;
    bool sglang = dialect_ == event_dialect::sglang;
    switch (ev.kind) {
    case event_kind::block_stored:
      minimum = 6;
      known = sglang ? std::size(sglang_stored_fields) : std::size(stored_fields);
      order = sglang ? sglang_stored_fields : stored_fields;
      break;
    case event_kind::block_removed:
      minimum = 2;
      known = sglang ? std::size(sglang_removed_fields) : std::size(removed_fields);
      order = sglang ? sglang_removed_fields : removed_fields;
      break;
    case event_kind::all_blocks_cleared:
      return true;
    }
    if (arr.size < minimum)
      return fail(errc::bad_length,
                  fmt::format("{} elements, expected at least {}", arr.size, minimum));
    auto present = std::min<std::size_t>(arr.size - 1, known);
    for (std::size_t i = 0; i < present; ++i)
      if (!decode_field(order[i], arr.ptr[i + 1], ev))
        return false;
    return true;
  }

  bool decode_map_event(const msgpack::object_map& map, kv_event& ev, bool& known) {
    const msgpack::object* type = nullptr;
    for (std::uint32_t i = 0; i < map.size; ++i) {
      const auto& key = map.ptr[i].key;
      if (key.type == msgpack::type::STR && as_view(key) == "type") {
        type = &map.ptr[i].val;
        break;
      }
    }
    if (!type)
      return fail(errc::bad_value, "map event without a 'type' key");
    if (!decode_tag(*type, ev.kind, known))
      return false;
    if (!known || ev.kind == event_kind::all_blocks_cleared)
      return true;          // nothing else to read; other keys are skipped
    std::uint32_t seen = 0; // one bit per field, to refuse duplicates
    for (std::uint32_t i = 0; i < map.size; ++i) {
      const auto& key = map.ptr[i].key;
      if (key.type != msgpack::type::STR) {
        pos_.field = nullptr;
        return wrong_type(key, "a str map key");
      }
      auto f = field_of(as_view(key), ev.kind);
      if (f == field::unknown)
        continue; // "type", and keys a newer vLLM may add
      // The salt has two names (SGLang's arrays' metadata map, its maps'
      // field): both in one event is a salt given twice.
      auto bit = 1u << static_cast<unsigned>(f == field::cache_salt ? field::metadata : f);
      if (seen & bit) {
        pos_.field = name_of(f);
        return fail(errc::bad_value, "key appears twice");
      }
      seen |= bit;
      if (!decode_field(f, map.ptr[i].val, ev))
        return false;
    }
    if (!(seen & 1u)) {
      pos_.field = name_of(field::block_hashes);
      return fail(errc::bad_value, "missing");
    }
    return true;
  }

  bool decode_field(field f, const msgpack::object& obj, kv_event& ev) {
    pos_.field = name_of(f);
    pos_.element = std::numeric_limits<std::size_t>::max();
    switch (f) {
    case field::block_hashes:
      return hash_list(obj, ev.block_hashes);
    case field::parent_block_hash: {
      if (obj.type == msgpack::type::NIL) {
        ev.parent_block_hash.reset();
        return true;
      }
      block_hash parent;
      if (!hash(obj, parent))
        return false;
      ev.parent_block_hash = parent;
      return true;
    }
    case field::token_ids:
      return token_list(obj, ev.token_ids);
    case field::block_size:
      return uint32_value(obj, ev.block_size);
    case field::lora_id:
      return optional_int(obj, ev.lora_id);
    case field::medium:
      return optional_str(obj, ev.medium);
    case field::lora_name:
      return optional_str(obj, ev.lora_name);
    case field::extra_keys:
      return extra_keys(obj, ev.extra_keys);
    case field::group_idx:
      return optional_int(obj, ev.group_idx);
    case field::kv_cache_spec_kind:
      return optional_str(obj, ev.kv_cache_spec_kind);
    case field::kv_cache_spec_sliding_window:
      return optional_int(obj, ev.kv_cache_spec_sliding_window);
    case field::locality:
      return optional_str(obj, ev.locality);
    case field::metadata:
      return metadata(obj, ev.cache_salt);
    case field::cache_salt:
      return optional_str(obj, ev.cache_salt);
    case field::mm_keys:
      if (obj.type != msgpack::type::NIL
          && !(obj.type == msgpack::type::ARRAY && obj.via.array.size == 0))
        unpublished_ = true; // keys the cluster's hash has no recipe for
      return true;
    case field::unknown:
      break;
    }
    return true;
  }

  bool hash(const msgpack::object& obj, block_hash& out) {
    if (obj.type == msgpack::type::POSITIVE_INTEGER) {
      out.key = obj.via.u64;
      out.digest_size = 0;
      return true;
    }
    if (obj.type == msgpack::type::NEGATIVE_INTEGER && dialect_ != event_dialect::vllm) {
      out.key = static_cast<block_key>(obj.via.i64);
      out.digest_size = 0;
      return true;
    }
    if (obj.type == msgpack::type::BIN) {
      auto size = obj.via.bin.size;
      if (size != 16 && size != 32)
        return fail(errc::bad_hash,
                    fmt::format("hash is {} bytes, expected 16 (xxhash) or 32 (sha256)", size));
      out.digest_size = static_cast<std::uint8_t>(size);
      std::memcpy(out.digest.data(), obj.via.bin.ptr, size);
      out.key = key_of_digest(out.digest.data(), size);
      return true;
    }
    return fail(errc::bad_hash,
                fmt::format("expected {} or a 16/32-byte bin, got {}",
                            dialect_ != event_dialect::vllm ? "an integer" : "an unsigned integer",
                            type_name(obj)));
  }

  bool hash_list(const msgpack::object& obj, std::vector<block_hash>& out) {
    if (obj.type != msgpack::type::ARRAY)
      return wrong_type(obj, "an array of block hashes");
    const auto& arr = obj.via.array;
    out.resize(arr.size);
    for (std::uint32_t i = 0; i < arr.size; ++i) {
      pos_.element = i;
      if (!hash(arr.ptr[i], out[i]))
        return false;
    }
    pos_.element = std::numeric_limits<std::size_t>::max();
    return true;
  }

  bool token_list(const msgpack::object& obj, std::vector<std::uint32_t>& out) {
    if (obj.type != msgpack::type::ARRAY)
      return wrong_type(obj, "an array of token ids");
    const auto& arr = obj.via.array;
    // An EAGLE engine's SGLang pages are bigram keys: pairs (t_i, t_i+1),
    // each pair's second token the next pair's first.
    const bool pairs =
      dialect_ == event_dialect::sglang && arr.size > 0 && arr.ptr[0].type == msgpack::type::ARRAY;
    out.resize(arr.size);
    for (std::uint32_t i = 0; i < arr.size; ++i) {
      const auto* tp = &arr.ptr[i];
      if (dialect_ == event_dialect::trtllm && tp->type == msgpack::type::STR) {
        // A multimodal placeholder: the block's hash covers what no token says.
        unpublished_ = true;
        out.clear();
        return true;
      }
      if (pairs) {
        pos_.element = i;
        if (tp->type != msgpack::type::ARRAY || tp->via.array.size != 2)
          return wrong_type(*tp, "a token pair [t, next] like the page's first");
        const auto& second = tp->via.array.ptr[1];
        if (second.type != msgpack::type::POSITIVE_INTEGER)
          return wrong_type(second, "an unsigned integer token id as a pair's second");
        if (i + 1 < arr.size && arr.ptr[i + 1].type == msgpack::type::ARRAY
            && arr.ptr[i + 1].via.array.size == 2
            && (arr.ptr[i + 1].via.array.ptr[0].type != msgpack::type::POSITIVE_INTEGER
                || second.via.u64 != arr.ptr[i + 1].via.array.ptr[0].via.u64))
          return fail(errc::bad_value, "a token pair whose second token is not the next pair's "
                                       "first");
        tp = &tp->via.array.ptr[0];
      }
      const auto& t = *tp;
      if (t.type != msgpack::type::POSITIVE_INTEGER || t.via.u64 > 0xffffffffu) {
        pos_.element = i;
        if (t.type == msgpack::type::POSITIVE_INTEGER)
          return fail(errc::bad_value, fmt::format("token id {} does not fit 32 bits", t.via.u64));
        return wrong_type(t, "an unsigned integer token id");
      }
      out[i] = static_cast<std::uint32_t>(t.via.u64);
    }
    return true;
  }

  bool uint32_value(const msgpack::object& obj, std::uint32_t& out) {
    if (obj.type != msgpack::type::POSITIVE_INTEGER)
      return wrong_type(obj, "an unsigned integer");
    if (obj.via.u64 > 0xffffffffu)
      return fail(errc::bad_value, fmt::format("{} does not fit 32 bits", obj.via.u64));
    out = static_cast<std::uint32_t>(obj.via.u64);
    return true;
  }

  bool int64_value(const msgpack::object& obj, std::int64_t& out) {
    if (obj.type == msgpack::type::NEGATIVE_INTEGER) {
      out = obj.via.i64;
      return true;
    }
    if (obj.type == msgpack::type::POSITIVE_INTEGER) {
      if (obj.via.u64 > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        return fail(errc::bad_value,
                    fmt::format("{} does not fit a signed 64-bit integer", obj.via.u64));
      out = static_cast<std::int64_t>(obj.via.u64);
      return true;
    }
    return wrong_type(obj, "an integer");
  }

  bool optional_int(const msgpack::object& obj, std::optional<std::int64_t>& out) {
    if (obj.type == msgpack::type::NIL) {
      out.reset();
      return true;
    }
    std::int64_t value = 0;
    if (!int64_value(obj, value))
      return false;
    out = value;
    return true;
  }

  bool optional_str(const msgpack::object& obj, std::optional<std::string>& out) {
    if (obj.type == msgpack::type::NIL) {
      out.reset();
      return true;
    }
    if (obj.type != msgpack::type::STR)
      return wrong_type(obj, "str or nil");
    out.emplace(obj.via.str.ptr, obj.via.str.size);
    return true;
  }

  /// SGLang's BlockStoredMetadata: a map; only cache_salt is known.
  bool metadata(const msgpack::object& obj, std::optional<std::string>& salt) {
    if (obj.type == msgpack::type::NIL)
      return true;
    if (obj.type != msgpack::type::MAP)
      return wrong_type(obj, "a map {\"cache_salt\": str} or nil");
    const auto& map = obj.via.map;
    for (std::uint32_t i = 0; i < map.size; ++i) {
      const auto& key = map.ptr[i].key;
      if (key.type != msgpack::type::STR)
        return wrong_type(key, "a str map key");
      if (as_view(key) != "cache_salt")
        continue; // what a newer SGLang may add
      if (map.ptr[i].val.type != msgpack::type::STR)
        return wrong_type(map.ptr[i].val, "the cache salt as str");
      salt.emplace(as_view(map.ptr[i].val));
    }
    return true;
  }

  /// SGLang hashes a block from its tokens, its parent and, on a chain's
  /// first block, the cache salt: the extra keys vLLM hashes for the same
  /// request, which the cluster's keys are made of.
  static void sglang_extra_keys(kv_event& ev) {
    std::vector<block_extra> extra(ev.block_hashes.size());
    if (ev.cache_salt && !ev.parent_block_hash && !extra.empty())
      extra[0] = std::vector<extra_item>{extra_item::of_text(*ev.cache_salt)};
    ev.extra_keys = std::move(extra);
  }

  /// TensorRT-LLM's blocks: the LoRA name on each, if any (as vLLM hashes
  /// an adapter's blocks), nothing else.
  static void trtllm_extra_keys(kv_event& ev) {
    std::vector<block_extra> extra(ev.block_hashes.size());
    if (ev.lora_name)
      for (auto& e : extra)
        e = std::vector<extra_item>{extra_item::of_text(*ev.lora_name)};
    ev.extra_keys = std::move(extra);
  }

  bool extra_value(const msgpack::object& obj, extra_item& out) {
    switch (obj.type) {
    case msgpack::type::STR:
      out = extra_item::of_text(std::string(as_view(obj)));
      return true;
    case msgpack::type::BIN:
      out = extra_item::of_bytes(std::string(obj.via.bin.ptr, obj.via.bin.size));
      return true;
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER: {
      std::int64_t value = 0;
      if (!int64_value(obj, value))
        return false;
      out = extra_item::of_integer(value);
      return true;
    }
    case msgpack::type::ARRAY: {
      std::vector<extra_item> items(obj.via.array.size);
      for (std::uint32_t i = 0; i < obj.via.array.size; ++i)
        if (!extra_value(obj.via.array.ptr[i], items[i]))
          return false;
      out = extra_item::of_list(std::move(items));
      return true;
    }
    default:
      return wrong_type(obj, "str, bin, integer or array inside extra keys");
    }
  }

  bool extra_keys(const msgpack::object& obj, std::optional<std::vector<block_extra>>& out) {
    if (obj.type == msgpack::type::NIL) {
      out.reset();
      return true;
    }
    if (obj.type != msgpack::type::ARRAY)
      return wrong_type(obj, "an array (one entry per block) or nil");
    const auto& arr = obj.via.array;
    out.emplace(arr.size);
    for (std::uint32_t i = 0; i < arr.size; ++i) {
      pos_.element = i;
      const auto& entry = arr.ptr[i];
      if (entry.type == msgpack::type::NIL)
        continue;
      if (entry.type != msgpack::type::ARRAY)
        return wrong_type(entry, "an array of extra keys or nil");
      std::vector<extra_item> items(entry.via.array.size);
      for (std::uint32_t k = 0; k < entry.via.array.size; ++k)
        if (!extra_value(entry.via.array.ptr[k], items[k]))
          return false;
      (*out)[i] = std::move(items);
    }
    return true;
  }

  event_dialect dialect_;
  bool unpublished_ = false; ///< the event being decoded: see kv_event::unpublished_extras
  event_batch batch_;
  position pos_;
  std::optional<error> error_;
};

} // namespace

result<event_batch> decode_batch(std::string_view payload, const decode_limits& limits,
                                 event_dialect dialect) {
  if (payload.size() > limits.max_payload_bytes)
    return error{errc::too_large, fmt::format("payload of {} bytes exceeds the limit of {} bytes",
                                              payload.size(), limits.max_payload_bytes)};
  if (payload.empty())
    return error{errc::truncated, "empty payload, expected a msgpack array"};
  msgpack::zone zone;
  bounded_object_builder builder(payload.size(), limits.max_depth);
  builder.set_zone(zone);
  std::size_t offset = 0;
  bool parsed = false;
  try {
    parsed = msgpack::parse(payload.data(), payload.size(), offset, builder);
  } catch (const std::bad_alloc&) {
    return error{errc::too_large, "payload needs more memory than is available"};
  } catch (const std::exception& e) {
    return error{errc::bad_type, fmt::format("msgpack: {}", e.what())};
  }
  using failure = bounded_object_builder::failure;
  if (!parsed) {
    switch (builder.why()) {
    case failure::truncated:
      return error{errc::truncated, fmt::format("payload ends inside a value at byte {} of {}",
                                                builder.failure_offset(), payload.size())};
    case failure::overclaim:
      return error{
        errc::bad_length,
        fmt::format("array/map headers claim {} elements but the payload has only {} bytes",
                    builder.claimed(), payload.size())};
    case failure::too_deep:
      return error{errc::too_deep, fmt::format("nesting deeper than {} levels", limits.max_depth)};
    case failure::malformed:
    case failure::none:
      break;
    }
    return error{errc::bad_type,
                 fmt::format("invalid msgpack byte at offset {}", builder.failure_offset())};
  }
  if (offset != payload.size())
    return error{errc::trailing_bytes, fmt::format("{} bytes after the batch (it ends at byte {})",
                                                   payload.size() - offset, offset)};
  return batch_decoder{dialect}.decode(builder.data());
}

} // namespace llmgw::wire
