#include "apps/llmgw-sim/sim_scheduler.hpp"

#include "apps/llmgw-sim/sim_text.hpp"

namespace llmgw::sim {

using clock = std::chrono::steady_clock;

scheduler::scheduler(std::vector<std::unique_ptr<sim_rank>> ranks)
  : ranks_(std::move(ranks)), thread_([this] { run(); }) {}

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

std::vector<scheduler::gauges> scheduler::read() const {
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
  std::vector<gauges> now(ranks_.size());
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    const auto& r = *ranks_[i];
    auto& n = now[i];
    n.running = r.batch.running();
    n.waiting = r.batch.waiting();
    auto total = r.cache.total_blocks();
    n.usage = total ? static_cast<double>(r.cache.used_blocks()) / static_cast<double>(total) : 0;
    n.queried = r.cache.queried_tokens();
    n.hits = r.cache.hit_tokens();
    n.succeeded = r.batch.succeeded();
    n.preemptions = r.batch.preemptions();
    n.ttft.merge(r.batch.ttft());
  }
  std::lock_guard<std::mutex> g(mtx_);
  gauges_ = std::move(now);
}

void scheduler::admit(const std::shared_ptr<sim_request>& r) {
  auto load = [](const sim_rank& rs) { return rs.batch.running() + rs.batch.waiting(); };
  std::size_t best = 0;
  if (r->rank_hint >= 0 && static_cast<std::size_t>(r->rank_hint) < ranks_.size())
    best = static_cast<std::size_t>(r->rank_hint);
  else
    for (std::size_t i = 1; i < ranks_.size(); ++i)
      if (load(*ranks_[i]) < load(*ranks_[best]))
        best = i;
  r->rank = best;
  ranks_[best]->batch.enqueue(r, clock::now());
  step(best);
}

void scheduler::step(std::size_t rank) {
  auto& rs = *ranks_[rank];
  if (rs.stepping)
    return;
  auto p = std::make_shared<step_plan>(rs.batch.plan());
  if (p->empty()) {
    if (rs.pub && !p->events.empty())
      rs.pub->publish(std::move(p->events));
    return;
  }
  rs.stepping = true;
  auto end = clock::now() + std::chrono::microseconds(static_cast<std::int64_t>(p->ms * 1000));
  at(end, [this, rank, p] {
    auto& r = *ranks_[rank];
    if (r.pub)
      r.pub->publish(std::move(p->events));
    r.batch.complete(*p, clock::now());
    r.stepping = false;
    step(rank);
  });
}

} // namespace llmgw::sim
