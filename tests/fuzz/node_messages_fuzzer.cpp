// libFuzzer target: any bytes as one of the messages that cross nodes, read
// with CAF's binary deserializer and llmgw's inspect() overloads (the first
// byte picks the type). Reading must fail cleanly or give a message that
// writes, reads back and writes again to the same bytes (the input itself
// may differ: a bool byte of 2, a longer varint); an update's MAC can be
// computed whatever it holds, and so can a load report's, and its range check.
//   scripts/fuzz.sh [seconds]
#include "messages/kv_messages.hpp"

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace {

template <class T>
std::vector<char> write(T& x) {
  std::vector<char> out;
  caf::binary_serializer sink{static_cast<caf::execution_unit*>(nullptr), out};
  if (sink(x))
    std::abort(); // what was read can be written
  return out;
}

template <class T>
void round_trip(const char* data, std::size_t size) {
  T x;
  caf::binary_deserializer source{static_cast<caf::execution_unit*>(nullptr), data, size};
  if (source(x))
    return; // refused: fine
  auto once = write(x);
  T y;
  caf::binary_deserializer again{static_cast<caf::execution_unit*>(nullptr), once.data(),
                                 once.size()};
  if (again(y) || again.remaining() != 0)
    std::abort(); // what llmgw writes it reads, whole
  if (write(y) != once)
    std::abort(); // and the same
  if constexpr (std::is_same_v<T, llmgw::replica_update>)
    if (llmgw::update_mac(std::string(32, 'k'), x).size() != 32)
      std::abort();
  if constexpr (std::is_same_v<T, llmgw::load_report>) {
    if (llmgw::load_report_mac(std::string(32, 'k'), x).size() != 32)
      std::abort();
    (void)llmgw::out_of_range_fields(x); // any values: an answer, never a crash
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0)
    return 0;
  const auto* bytes = reinterpret_cast<const char*>(data) + 1;
  auto n = size - 1;
  switch (data[0] % 6) {
  case 0:
    round_trip<llmgw::replica_update>(bytes, n);
    break;
  case 1:
    round_trip<llmgw::agent_hello>(bytes, n);
    break;
  case 2:
    round_trip<llmgw::control_proof>(bytes, n);
    break;
  case 3:
    round_trip<llmgw::agent_proof>(bytes, n);
    break;
  case 4:
    round_trip<llmgw::load_report>(bytes, n);
    break;
  default:
    round_trip<llmgw::session_ack>(bytes, n);
    break;
  }
  return 0;
}
