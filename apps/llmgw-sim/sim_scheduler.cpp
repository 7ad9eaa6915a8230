#include "apps/llmgw-sim/sim_scheduler.hpp"

#include "apps/llmgw-sim/sim_text.hpp"

namespace llmgw::sim {

using clock = std::chrono::steady_clock;

scheduler::scheduler(scheduler_options opts, std::vector<std::unique_ptr<sim_rank>> ranks)
  : opts_(opts), ranks_(std::move(ranks)), thread_([this] { run(); }) {}

scheduler::~scheduler() {
  {
    std::lock_guard<std::mutex> g(mtx_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable())
    thread_.join();
}

void scheduler::submit(std::shared_ptr<sim_request> r) {
  post([this, r = std::move(r)] { admit(r); });
}

void scheduler::reset_prefix_cache(std::function<void(bool)> done) {
  post([this, done = std::move(done)] {
    bool all = true;
    for (auto& rs : ranks_) {
      std::vector<wire::kv_event> events;
      bool ok = rs->cache.reset(events);
      all = all && ok;
      if (ok && rs->pub)
        rs->pub->publish(std::move(events));
    }
    done(all);
  });
}

scheduler::gauges scheduler::read() const {
  std::lock_guard<std::mutex> g(mtx_);
  return gauges_;
}

void scheduler::post(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> g(mtx_);
    inbox_.push_back(std::move(f));
  }
  cv_.notify_all();
}

void scheduler::at(clock::time_point t, std::function<void()> f) {
  due_.emplace(t, std::move(f));
}

void scheduler::run() {
  for (;;) {
    std::deque<std::function<void()>> jobs;
    {
      std::unique_lock<std::mutex> g(mtx_);
      auto ready = [this] {
        return stop_ || !inbox_.empty() || (!due_.empty() && due_.begin()->first <= clock::now());
      };
      if (due_.empty())
        cv_.wait(g, ready);
      else
        cv_.wait_until(g, due_.begin()->first, ready);
      if (stop_)
        return;
      jobs.swap(inbox_);
    }
    for (auto& j : jobs)
      j();
    auto now = clock::now();
    while (!due_.empty() && due_.begin()->first <= now) {
      auto f = std::move(due_.begin()->second);
      due_.erase(due_.begin());
      f();
    }
    refresh_gauges();
  }
}

void scheduler::refresh_gauges() {
  gauges now;
  std::size_t used = 0, total = 0;
  for (const auto& r : ranks_) {
    now.running += r->running;
    now.waiting += r->waiting.size();
    used += r->cache.used_blocks();
    total += r->cache.total_blocks();
    now.queried += r->cache.queried_tokens();
    now.hits += r->cache.hit_tokens();
  }
  now.usage = total ? static_cast<double>(used) / static_cast<double>(total) : 0;
  now.succeeded = succeeded_;
  std::lock_guard<std::mutex> g(mtx_);
  gauges_ = now;
}

void scheduler::admit(const std::shared_ptr<sim_request>& r) {
  std::size_t best = 0;
  if (r->rank_hint >= 0 && static_cast<std::size_t>(r->rank_hint) < ranks_.size())
    best = static_cast<std::size_t>(r->rank_hint);
  else
    for (std::size_t i = 1; i < ranks_.size(); ++i)
      if (ranks_[i]->running + ranks_[i]->waiting.size()
          < ranks_[best]->running + ranks_[best]->waiting.size())
        best = i;
  r->rank = best;
  ranks_[best]->waiting.push_back(r);
  try_admit(best);
}

void scheduler::try_admit(std::size_t rank) {
  auto& rs = *ranks_[rank];
  while (!rs.waiting.empty()) {
    auto r = rs.waiting.front();
    if (r->cancelled) {
      rs.waiting.pop_front();
      continue;
    }
    std::vector<wire::kv_event> events;
    auto a = rs.cache.admit(r->prompt, r->extras, r->lora_id, r->max_tokens, events);
    if (!a) {
      if (rs.running == 0) { // it does not fit even into an idle cache
        rs.waiting.pop_front();
        r->reject("the request needs more KV cache blocks than the engine has");
        continue;
      }
      return; // waits for blocks to come free
    }
    rs.waiting.pop_front();
    if (rs.pub)
      rs.pub->publish(std::move(events));
    ++rs.running;
    auto uncached = a->prompt_tokens - a->cached_tokens;
    r->alloc = std::move(a);
    auto first = clock::now()
                 + std::chrono::microseconds(static_cast<std::int64_t>(
                   opts_.base_ms * 1000 + opts_.prefill_us_per_token * uncached));
    at(first, [this, r] { step(r); });
  }
}

void scheduler::finish(const std::shared_ptr<sim_request>& r) {
  auto& rs = *ranks_[r->rank];
  rs.cache.release(*r->alloc);
  --rs.running;
  try_admit(r->rank);
}

void scheduler::step(const std::shared_ptr<sim_request>& r) {
  auto& rs = *ranks_[r->rank];
  if (r->cancelled) {
    finish(r);
    return;
  }
  auto token = next_token(r->alloc->tokens);
  std::vector<wire::kv_event> events;
  rs.cache.append(*r->alloc, token, events);
  if (rs.pub)
    rs.pub->publish(std::move(events));
  token_out out;
  out.piece = token_text(token);
  out.first = r->generated == 0;
  out.generated = ++r->generated;
  out.last = r->generated >= r->max_tokens;
  out.prompt_tokens = r->alloc->prompt_tokens;
  out.cached_tokens = r->alloc->cached_tokens;
  if (!r->emit(out))
    r->cancelled = true;
  if (out.last) {
    ++succeeded_;
    finish(r);
    return;
  }
  at(clock::now()
       + std::chrono::microseconds(static_cast<std::int64_t>(opts_.decode_ms_per_token * 1000)),
     [this, r] { step(r); });
}

} // namespace llmgw::sim
