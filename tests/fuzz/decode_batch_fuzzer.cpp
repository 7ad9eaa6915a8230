// libFuzzer target: any bytes as a KV event payload (and as a ZMQ seq
// frame). Decoding must never crash, leak or exceed memory in proportion to
// the input; a decoded batch must render to JSON.
//   scripts/fuzz.sh [seconds]   builds with clang and runs it on the captures
#include "wire/event_json.hpp"
#include "wire/kv_events.hpp"
#include "wire/zmq_message.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  auto batch = llmgw::wire::decode_batch(input);
  if (batch) {
    for (const auto& ev : batch->events)
      if (llmgw::wire::event_to_json(0, *batch, ev).empty())
        std::abort(); // a decoded event always renders
  } else if (batch.err().message.empty()) {
    std::abort(); // every error says what went wrong
  }
  if (size >= 8) {
    auto reply = llmgw::wire::split_replay_reply({"", input.substr(0, 8), input.substr(8)});
    if (!reply)
      std::abort(); // an 8-byte seq frame is always accepted
  }
  return 0;
}
