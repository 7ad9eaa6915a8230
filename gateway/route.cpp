#include "gateway/route.hpp"

#include "actors/tokenizer.hpp"
#include "config/topology.hpp"
#include "routing/shared_router.hpp"
#include "routing/token_cache.hpp"
#include "wire/block_hash.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>

#include <chrono>

namespace llmgw {

namespace {

/// A block hasher for this thread and the cluster's seed and block size:
/// constructing one hashes the seed, which is not worth doing per request.
wire::block_hasher& hasher_for(const config::topology& topo) {
  thread_local std::unique_ptr<wire::block_hasher> h;
  thread_local std::string seed;
  thread_local std::size_t block_size = 0;
  if (!h || seed != topo.seed || block_size != topo.block_size) {
    h = std::make_unique<wire::block_hasher>(topo.seed, topo.block_size);
    seed = topo.seed;
    block_size = topo.block_size;
  }
  return *h;
}

/// The router's query for a request: block keys hashed here (on the
/// caller's thread, not the router's), tier-1 chunk hashes, timings.
routing::route_query make_query(const config::topology& topo, const wire::routing_request& req,
                                bool dry_run, const std::vector<std::uint32_t>* tokens,
                                double tokenize_seconds, const std::vector<std::string>& exclude,
                                const char* tokens_from) {
  routing::route_query q;
  q.model = req.model;
  if (tokens)
    q.tokens_from = tokens_from;
  q.dry_run = dry_run;
  q.exclude = exclude;
  q.tokenize_seconds = tokenize_seconds;
  auto start = std::chrono::steady_clock::now();
  if (tokens) {
    q.tokenized = true;
    q.prompt_tokens = tokens->size();
    wire::extra_key_recipe extras;
    if (topo.is_adapter(req.model))
      extras.lora_name = req.model;
    extras.cache_salt = req.cache_salt;
    thread_local std::vector<wire::hashed_block> blocks;
    hasher_for(topo).hash_into(*tokens, extras, blocks);
    q.keys.reserve(blocks.size());
    for (const auto& b : blocks)
      q.keys.push_back(b.key);
  }
  q.chunks = routing::chunk_hashes(req.text, topo.router.tier1_chunk_bytes);
  q.hash_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return q;
}

/// Decides and records on this thread against the shared router state (in
/// one hold of its lock), then hands the decision on.
void decide_here(const control_plane& plane, const routing::route_query& q,
                 const std::function<void(const routing::route_decision&)>& done) {
  done(plane.shared_router->decide_and_record(q));
}

} // namespace

void route_request(caf::actor_system& sys, const control_plane& plane,
                   const std::shared_ptr<const config::topology>& topo,
                   const wire::routing_request& req, bool dry_run,
                   std::function<void(const routing::route_decision&)> done,
                   const std::vector<std::string>& exclude) {
  if (req.token_ids) {
    decide_here(plane, make_query(*topo, req, dry_run, &*req.token_ids, -1, exclude, "request"),
                done);
    return;
  }
  // A prompt tokenized before: no hop to the tokenizer either.
  thread_local std::vector<std::uint32_t> tokens;
  if (plane.token_cache->lookup(req.model, req.render_body, tokens)) {
    decide_here(plane, make_query(*topo, req, dry_run, &tokens, 0, exclude, "cache"), done);
    return;
  }
  sys.spawn(
    [plane, topo, req, dry_run, done = std::move(done), exclude](caf::event_based_actor* self) {
      auto timeout = topo->router.tokenize_timeout + std::chrono::milliseconds(200);
      tokenize_request ask{req.model, req.tokenize_body, wire::render_path(req.kind),
                           req.render_body};
      self->request(plane.tokenizer, timeout, tokenize_atom::value, std::move(ask))
        .then(
          [plane, topo, req, dry_run, done, exclude](const tokenize_reply& r) {
            // Failed tokenization is not fatal: tier 1 routes the request.
            decide_here(plane,
                        make_query(*topo, req, dry_run, r.ok ? &r.tokens : nullptr,
                                   r.cached ? 0.0 : r.seconds, exclude,
                                   r.cached ? "cache" : r.method.c_str()),
                        done);
          },
          [plane, topo, req, dry_run, done, exclude](const caf::error&) {
            decide_here(
              plane,
              make_query(*topo, req, dry_run, nullptr,
                         std::chrono::duration<double>(topo->router.tokenize_timeout).count(),
                         exclude, ""),
              done);
          });
    });
}

} // namespace llmgw
