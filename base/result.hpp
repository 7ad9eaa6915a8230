// A small result type for pure code in wire/: either a value or an error that
// says what went wrong and where. wire/ has no CAF in sight (STYLE.md), so it
// cannot use caf::expected; actors convert at their boundary.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace llmgw {

/// What kind of bad input a decoder met; the label of the metric that counts it.
enum class errc : std::uint8_t {
  truncated,      ///< the input ended in the middle of a value
  bad_type,       ///< a value had the wrong msgpack/JSON type
  bad_length,     ///< a length or element count out of the allowed range
  too_deep,       ///< nesting deeper than the decoder allows
  too_large,      ///< the input itself exceeds the size limit
  bad_hash,       ///< a block hash of the wrong size or form
  bad_frame,      ///< a ZMQ message with the wrong frame count or seq width
  trailing_bytes, ///< bytes left over after a complete value
  bad_value,      ///< a value of the right type but out of range
};

/// A stable lower_snake_case name for an error kind (metric label, logs).
const char* to_string(errc code) noexcept;

/// An error with a message that names the field and position.
struct error {
  errc code;
  std::string message;
};

/// Either a T or an error. Deliberately tiny: has_value, value, error.
template <class T>
class result {
public:
  result(T value) : state_(std::in_place_index<0>, std::move(value)) {}
  result(error err) : state_(std::in_place_index<1>, std::move(err)) {}

  /// True when this holds a value.
  bool has_value() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  /// The value; only valid when has_value().
  T& value() & { return std::get<0>(state_); }
  const T& value() const& { return std::get<0>(state_); }
  T&& value() && { return std::get<0>(std::move(state_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  /// The error; only valid when !has_value().
  const error& err() const { return std::get<1>(state_); }

private:
  std::variant<T, error> state_;
};

} // namespace llmgw
