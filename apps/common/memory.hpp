// How a long-running llmgw process gives memory back.
#pragma once

#include <malloc.h>

namespace llmgw::apps {

/// Allocations of 1 MiB and more (request bodies, tokenizations of long
/// prompts) are mapped on their own and unmapped when freed. glibc's
/// default raises that threshold to the largest block freed so far (up to
/// 32 MiB), after which such blocks come from the heap and freeing them
/// returns nothing to the system: 20 half-sent 31 MiB bodies left 493 MB
/// behind after their clients were gone.
inline void return_large_blocks_when_freed() {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
}

} // namespace llmgw::apps
