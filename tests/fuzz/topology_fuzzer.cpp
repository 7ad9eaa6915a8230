// libFuzzer target: any bytes as a topology file. The loader must report
// problems (each with a message), never crash, overflow its stack or take
// seconds; a topology it accepts has what every node needs.
//   scripts/fuzz.sh [seconds]
#include "config/topology.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  llmgw::config::topology_options opts;
  opts.check_tls_files = false; // no files here: the text is the input
  auto r = llmgw::config::parse_topology(text, "/fuzz/cluster.toml", opts);
  if (r.value.has_value() == !r.problems.empty())
    std::abort(); // either a topology or problems
  for (const auto& p : r.problems)
    if (p.message.empty())
      std::abort(); // every problem says what
  if (r.value)
    for (const auto& n : r.value->nodes)
      if (n.name.empty() || (!n.roles.agent && !n.roles.control))
        std::abort(); // an accepted node has a name and a role
  return 0;
}
