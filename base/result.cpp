#include "base/result.hpp"

namespace llmgw {

const char* to_string(errc code) noexcept {
  switch (code) {
  case errc::truncated:
    return "truncated";
  case errc::bad_type:
    return "bad_type";
  case errc::bad_length:
    return "bad_length";
  case errc::too_deep:
    return "too_deep";
  case errc::too_large:
    return "too_large";
  case errc::bad_hash:
    return "bad_hash";
  case errc::bad_frame:
    return "bad_frame";
  case errc::trailing_bytes:
    return "trailing_bytes";
  case errc::bad_value:
    return "bad_value";
  }
  return "unknown";
}

} // namespace llmgw
