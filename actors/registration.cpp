#include "actors/registration.hpp"

#include "actors/interfaces.hpp"
#include "messages/kv_messages.hpp"

#include <caf/actor_system_config.hpp>

namespace llmgw {

void register_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<kv::block_ref>("llmgw::block_ref");
  cfg.add_message_type<agent_hello>("llmgw::agent_hello");
  cfg.add_message_type<control_proof>("llmgw::control_proof");
  cfg.add_message_type<agent_proof>("llmgw::agent_proof");
  cfg.add_message_type<kv::mirror_totals>("llmgw::mirror_totals");
  cfg.add_message_type<replica_update>("llmgw::replica_update");
  cfg.add_message_type<session_ack>("llmgw::session_ack");
  cfg.add_message_type<engine_load>("llmgw::engine_load");
  cfg.add_message_type<load_report>("llmgw::load_report");
  // Handles that travel inside messages (agent_hello carries the forwarder).
  cfg.add_message_type<forwarder_actor>("llmgw::forwarder_actor");
  cfg.add_message_type<control_actor>("llmgw::control_actor");
}

} // namespace llmgw
