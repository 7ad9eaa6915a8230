// The one place message types are registered. Every app and test calls it
// on its actor_system_config before starting the actor system.
#pragma once

namespace caf {
class actor_system_config;
} // namespace caf

namespace llmgw {

/// Registers every type that crosses actors or nodes.
void register_message_types(caf::actor_system_config& cfg);

} // namespace llmgw
