#include "apps/llmgw-sim/sim_batch.hpp"

#include "apps/llmgw-sim/sim_text.hpp"

#include <algorithm>

namespace llmgw::sim {

std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

batch_scheduler::batch_scheduler(batch_options opts, kv_cache& cache)
  : opts_(opts), cache_(cache), ttft_(ttft_buckets()) {}

void batch_scheduler::enqueue(std::shared_ptr<sim_request> r,
                              std::chrono::steady_clock::time_point now) {
  auto bs = cache_.block_size();
  if ((r->prompt.size() + r->max_tokens + bs - 1) / bs > cache_.total_blocks()) {
    r->reject("the request needs more KV cache blocks than the engine has");
    return;
  }
  r->arrived = now;
  r->alloc = kv_cache::start(r->prompt, r->extras, r->lora_id);
  waiting_.push_back(std::move(r));
}

void batch_scheduler::drop_cancelled() {
  for (auto it = running_.begin(); it != running_.end();)
    if ((*it)->cancelled) {
      cache_.release((*it)->alloc);
      it = running_.erase(it);
    } else {
      ++it;
    }
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(),
                                [this](const std::shared_ptr<sim_request>& r) {
                                  if (r->cancelled)
                                    cache_.release(r->alloc);
                                  return r->cancelled.load();
                                }),
                 waiting_.end());
}

void batch_scheduler::preempt(const std::shared_ptr<sim_request>& r, step_plan& p) {
  cache_.release(r->alloc); // its blocks stay cached until reused
  r->computed = 0;
  ++r->preemptions;
  ++preemptions_;
  waiting_.push_front(r);
  p.preempted.push_back(r);
}

step_plan batch_scheduler::plan() {
  drop_cancelled();
  step_plan p;
  auto budget = opts_.max_num_batched_tokens;
  auto add = [&](const std::shared_ptr<sim_request>& r, std::size_t n) {
    cache_.commit(r->alloc, r->computed + n, p.events);
    p.items.push_back({r, n});
    p.tokens += n;
    p.context += r->computed + n;
    budget -= n;
  };
  for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
    auto r = running_[i];
    auto n = std::min(r->alloc.tokens.size() - r->computed, budget);
    bool got = true;
    while (!cache_.allocate(r->alloc, {}, r->computed + n, p.events)) {
      auto victim = running_.back();
      running_.pop_back();
      preempt(victim, p);
      if (victim == r) {
        got = false;
        break;
      }
    }
    if (!got)
      break;
    add(r, n);
  }
  while (p.preempted.empty() && !waiting_.empty() && budget > 0
         && running_.size() < opts_.max_num_seqs) {
    auto r = waiting_.front();
    auto hit = cache_.lookup(r->alloc);
    auto computed = hit.blocks.size() * cache_.block_size();
    auto n = std::min(r->alloc.tokens.size() - computed, budget);
    if (!cache_.allocate(r->alloc, hit, computed + n, p.events))
      break; // the head waits for blocks, and everyone behind it
    r->computed = computed;
    if (!r->scheduled_once) {
      r->scheduled_once = true;
      r->cached_tokens = computed;
    }
    waiting_.pop_front();
    running_.push_back(r);
    p.admitted.push_back(r);
    add(r, n);
  }
  if (!p.empty())
    p.ms = opts_.step_ms + opts_.us_per_token * static_cast<double>(p.tokens) / 1e3
           + opts_.ns_per_context_token * static_cast<double>(p.context) / 1e6;
  return p;
}

void batch_scheduler::finish(const std::shared_ptr<sim_request>& r) {
  cache_.release(r->alloc);
  running_.erase(std::find(running_.begin(), running_.end(), r));
}

void batch_scheduler::complete(const step_plan& p, std::chrono::steady_clock::time_point now) {
  for (const auto& [r, n] : p.items) {
    r->computed += n;
    if (r->computed < r->alloc.tokens.size())
      continue; // a prefill chunk: no token yet
    auto token = next_token(r->alloc.tokens);
    r->alloc.tokens.push_back(token);
    token_out out;
    out.piece = token_text(token);
    out.first = r->generated == 0;
    out.generated = ++r->generated;
    out.last = r->generated >= r->max_tokens;
    out.prompt_tokens = r->alloc.prompt_tokens;
    out.cached_tokens = r->cached_tokens;
    if (out.first)
      ttft_.observe(std::chrono::duration<double>(now - r->arrived).count());
    if (!r->emit(out))
      r->cancelled = true;
    if (out.last) {
      ++succeeded_;
      finish(r);
    }
  }
}

} // namespace llmgw::sim
