#include "actors/tokenizer.hpp"

#include "base/log.hpp"
#include "wire/openai_request.hpp"

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace llmgw {

namespace {

using self_ptr = tokenizer_actor::stateful_pointer<tokenizer_state>;

/// The replica to ask next for `model`: the next one in turn that is not
/// marked bad; any one of the model's if all are.
const tokenizer_state::replica* pick(tokenizer_state& st, const std::string& model) {
  auto now = std::chrono::steady_clock::now();
  const tokenizer_state::replica* fallback = nullptr;
  auto n = st.replicas.size();
  for (std::size_t i = 0; i < n; ++i) {
    auto& r = st.replicas[(st.turn + i) % n];
    if (!config::serves(r.model, r.lora, model))
      continue;
    if (r.bad_until <= now) {
      st.turn = (st.turn + i + 1) % n;
      return &r;
    }
    if (!fallback)
      fallback = &r;
  }
  return fallback;
}

/// Tokenizes with the replicas of `topo` from now on; one still there
/// keeps its time out (bad_until). Calls in flight answer as they will.
void use_replicas_of(tokenizer_state& st, const config::topology& topo) {
  std::vector<tokenizer_state::replica> fresh;
  for (const auto& n : topo.nodes)
    for (const auto& e : n.engines) {
      tokenizer_state::replica r{e.replica, e.model, e.lora, e.url, {}, false};
      for (const auto& old : st.replicas)
        if (old.name == e.replica && old.url == e.url) {
          r.bad_until = old.bad_until;
          r.no_render = old.no_render;
        }
      fresh.push_back(std::move(r));
    }
  st.replicas = std::move(fresh);
}

/// Whether a render call's answer says the engine has no such route: a
/// web framework's 404 or 405 ({"detail": "Not Found"}, as vLLM's FastAPI
/// answers a route it lacks), not vLLM's own error for this request
/// ({"error": {...}}: an unknown model, say), nor any other failure.
bool no_such_route(const http_response& resp) {
  if (resp.status != 404 && resp.status != 405)
    return false;
  return resp.body.find("\"error\"") == std::string::npos;
}

/// Asks `replica` for the tokens of pending request `id`: its render
/// endpoint unless it has none (or `tokenize`), else /tokenize.
void ask(self_ptr self, std::uint64_t id, const tokenizer_state::replica& replica,
         bool tokenize = false) {
  auto& st = self->state;
  const auto& req = st.pending.at(id).request;
  bool render = !tokenize && !replica.no_render && !req.render_path.empty();
  auto start = st.pending.at(id).start;
  // A weak address: the callbacks live in the HTTP client, which the
  // actor's own state owns; a strong handle there would keep the actor
  // alive from inside itself.
  auto me = self->address();
  auto name = replica.name;
  st.http->post_json(
    replica.url, render ? req.render_path : "/tokenize",
    render ? req.render_body : req.tokenize_body, st.timeout,
    [me, id, start, name, render](const http_response& resp) {
      tokenize_reply r;
      r.replica = name;
      r.method = render ? "render" : "tokenize";
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (resp.status == 200) {
        auto tokens = render ? wire::parse_render_response(resp.body)
                             : wire::parse_tokenize_response(resp.body);
        if (tokens) {
          r.ok = true;
          r.tokens = std::move(*tokens);
        } else {
          r.error = tokens.err().message;
          if (render) // whatever answers there, it is no render endpoint
            r.method = "no render";
        }
      } else if (resp.status != 0) {
        r.error = fmt::format("{} answered {}: {}", render ? "render" : "/tokenize", resp.status,
                              resp.body.substr(0, 200));
        // No such route: this engine is asked /tokenize from now on. Any
        // other failure of render (a request it refuses, say beam search):
        // this request is asked /tokenize.
        if (render)
          r.method = no_such_route(resp) ? "no render" : "render failed";
      } else {
        r.error = resp.error;
        if (render)
          r.method = "render failed";
      }
      if (auto handle = caf::actor_cast<tokenizer_actor>(me))
        caf::anon_send(handle, tokenized_atom::value, id, std::move(r));
    });
}

} // namespace

tokenizer_actor::behavior_type tokenizer(tokenizer_actor::stateful_pointer<tokenizer_state> self,
                                         const config::topology& topo,
                                         std::shared_ptr<routing::token_cache> cache) {
  auto& st = self->state;
  st.cache = std::move(cache);
  use_replicas_of(st, topo);
  st.timeout = topo.router.tokenize_timeout;
  st.http = std::make_unique<http_client>();
  return {
    [self](tokenize_atom, tokenize_request& req) -> caf::result<tokenize_reply> {
      auto& st = self->state;
      tokenize_reply cached;
      // Not counted: the gateway counted its own look-up before asking.
      if (st.cache->peek(req.model, req.render_body, cached.tokens)) {
        cached.ok = true;
        cached.cached = true;
        return cached;
      }
      const auto* replica = pick(st, req.model);
      if (!replica) {
        tokenize_reply r;
        r.error = "no replica serves model '" + req.model + "'";
        return r;
      }
      auto id = ++st.next_id;
      auto rp = self->make_response_promise<tokenize_reply>();
      st.pending.emplace(
        id, tokenizer_state::waiting{rp, std::move(req), std::chrono::steady_clock::now()});
      ask(self, id, *replica);
      return rp;
    },
    [self](tokenized_atom, std::uint64_t id, tokenize_reply& r) {
      auto& st = self->state;
      auto it = st.pending.find(id);
      if (it == st.pending.end())
        return;
      if (r.method == "no render" || r.method == "render failed") {
        for (auto& rep : st.replicas)
          if (rep.name == r.replica && !rep.no_render && r.method == "no render") {
            rep.no_render = true;
            LLMGW_LOG(info, "tokenizer",
                      "replica {} has no render endpoint ({}): asking its /tokenize, which "
                      "ignores some request fields (start vLLM with --enable-scale-out)",
                      r.replica, r.error);
          }
        for (const auto& rep : st.replicas)
          if (rep.name == r.replica)
            return ask(self, id, rep, true); // the same request, by /tokenize
      }
      auto w = std::move(it->second);
      st.pending.erase(it);
      if (r.ok) {
        st.cache->insert(w.request.model, w.request.render_body, r.tokens);
      } else {
        for (auto& rep : st.replicas)
          if (rep.name == r.replica)
            rep.bad_until = std::chrono::steady_clock::now() + st.bad_for;
        LLMGW_LOG(warning, "tokenizer",
                  "replica {}: {} (routing by prefix tree; replica skipped "
                  "for tokenizing for {} ms)",
                  r.replica, r.error, st.bad_for.count());
      }
      w.promise.deliver(std::move(r));
    },
    [self](const topology_reload& r) {
      auto sender = self->current_sender();
      if (!sender || sender->node() != self->node() || !r.topo)
        return; // only this node's reload
      use_replicas_of(self->state, *r.topo);
    },
  };
}

} // namespace llmgw
