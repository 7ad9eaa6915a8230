#include "actors/canary.hpp"

#include "base/log.hpp"
#include "routing/shared_router.hpp"

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <fmt/format.h>

namespace llmgw {

namespace {

using self_ptr = canary_actor::stateful_pointer<canary_state>;

/// Sends `job` and has its answer come back as a canary_atom message.
void send(self_ptr self, routing::canary_job job) {
  // A weak address: the callback lives in the HTTP client, which the
  // actor's own state owns.
  auto me = self->address();
  auto replica = job.replica;
  auto id = job.id;
  self->state.http->post_json(job.url, "/v1/completions", std::move(job.body), self->state.timeout,
                              [me, replica, id](const http_response& resp) {
                                std::string error;
                                if (resp.status == 0)
                                  error = resp.error;
                                else if (resp.status != 200)
                                  error = fmt::format("/v1/completions answered {}: {}",
                                                      resp.status, log::printable(resp.body, 200));
                                if (auto handle = caf::actor_cast<canary_actor>(me))
                                  caf::anon_send(handle, canary_atom::value, replica, id,
                                                 resp.status, std::move(error));
                              });
}

} // namespace

canary_actor::behavior_type canary(canary_actor::stateful_pointer<canary_state> self,
                                   std::shared_ptr<routing::shared_router> shared,
                                   std::chrono::milliseconds timeout) {
  auto& st = self->state;
  st.shared = std::move(shared);
  st.timeout = timeout;
  st.http = std::make_unique<http_client>();
  self->send(self, poll_atom::value);
  return {
    [self](poll_atom) {
      auto now = std::chrono::steady_clock::now();
      std::vector<std::string> news;
      auto jobs = self->state.shared->with([&](routing::router_core& core, routing::router_stats&) {
        return core.canary_tick(now, &news);
      });
      for (const auto& line : news)
        LLMGW_LOG(info, "canary", "{}", line);
      for (auto& job : jobs) {
        if (job.follow_up)
          LLMGW_LOG(debug, "canary", "replica {}: canary {} follows, to {}", job.replica, job.id,
                    job.url);
        else
          LLMGW_LOG(info, "canary", "replica {}: sending canary {} to {}", job.replica, job.id,
                    job.url);
        send(self, std::move(job));
      }
      self->delayed_send(self, canary_interval, poll_atom::value);
    },
    [self](canary_atom, const std::string& replica, std::uint64_t id, int status,
           const std::string& error) {
      auto now = std::chrono::steady_clock::now();
      self->state.shared->with([&](routing::router_core& core, routing::router_stats&) {
        core.canary_answered(replica, id, status, error, now);
      });
      if (status != 200 && status != 0 && status < 500 && status != 408 && status != 429)
        LLMGW_LOG(warning, "canary",
                  "replica {}: canary {} refused ({}): routed by the prefix tree until one "
                  "passes (set canary = false on an engine that cannot take it)",
                  replica, id, error);
    },
  };
}

} // namespace llmgw
