#include "actors/load_scraper.hpp"

#include "base/log.hpp"
#include "net/http_client.hpp"

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include <algorithm>
#include <cmath>

namespace llmgw {

const char* to_string(scrape_outcome o) noexcept {
  switch (o) {
  case scrape_outcome::ok:
    return "ok";
  case scrape_outcome::connect:
    return "connect";
  case scrape_outcome::status:
    return "status";
  case scrape_outcome::parse:
    return "parse";
  case scrape_outcome::too_large:
    return "too_large";
  }
  return "?";
}

engine_loads::engine_loads(std::vector<std::string> replicas) {
  for (auto& r : replicas) {
    entry e;
    e.replica = std::move(r);
    entries_.push_back(std::move(e));
  }
}

void engine_loads::set_replicas(const std::vector<std::string>& replicas) {
  std::lock_guard<std::mutex> lock(mtx_);
  std::vector<entry> fresh;
  for (const auto& r : replicas) {
    if (auto* e = find(r)) {
      fresh.push_back(*e);
      // The scraper is new too: the old one's call in flight may never end.
      fresh.back().in_flight = false;
      continue;
    }
    entry e;
    e.replica = r;
    fresh.push_back(std::move(e));
  }
  entries_ = std::move(fresh);
}

engine_loads::entry* engine_loads::find(const std::string& replica) {
  for (auto& e : entries_)
    if (e.replica == replica)
      return &e;
  return nullptr;
}

void engine_loads::read(const std::string& replica, const wire::engine_gauges& g,
                        clock::time_point at) {
  std::lock_guard<std::mutex> lock(mtx_);
  if (auto* e = find(replica)) {
    e->known = true;
    e->gauges = g;
    e->at = at;
  }
}

bool engine_loads::count(const std::string& replica, scrape_outcome o) {
  std::lock_guard<std::mutex> lock(mtx_);
  auto* e = find(replica);
  if (!e)
    return false;
  ++e->by_outcome[static_cast<std::size_t>(o)];
  auto changed = e->last != o;
  e->last = o;
  auto now = clock::now();
  if (!changed || (e->ever_logged && now - e->logged < std::chrono::seconds(10)))
    return false;
  e->logged = now;
  e->ever_logged = true;
  return true;
}

bool engine_loads::begin(const std::string& replica) {
  std::lock_guard<std::mutex> lock(mtx_);
  auto* e = find(replica);
  if (!e || e->in_flight)
    return false;
  e->in_flight = true;
  return true;
}

void engine_loads::end(const std::string& replica) {
  std::lock_guard<std::mutex> lock(mtx_);
  if (auto* e = find(replica))
    e->in_flight = false;
}

std::vector<engine_load> engine_loads::fresh(clock::time_point now,
                                             std::chrono::milliseconds max_age) const {
  std::vector<engine_load> out;
  std::lock_guard<std::mutex> lock(mtx_);
  for (const auto& e : entries_) {
    if (!e.known || now - e.at > max_age)
      continue;
    engine_load l;
    l.replica = e.replica;
    l.running = e.gauges.running;
    l.waiting = e.gauges.waiting;
    l.kv_usage_permille =
      e.gauges.kv_usage < 0 ? -1 : static_cast<std::int32_t>(std::lround(e.gauges.kv_usage * 1000));
    l.age_ms = static_cast<std::uint32_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::max(now - e.at, clock::duration{}))
        .count());
    out.push_back(std::move(l));
  }
  return out;
}

std::vector<engine_loads::counts> engine_loads::totals() const {
  std::vector<counts> out;
  std::lock_guard<std::mutex> lock(mtx_);
  for (const auto& e : entries_) {
    counts c;
    c.replica = e.replica;
    std::copy(std::begin(e.by_outcome), std::end(e.by_outcome), std::begin(c.by_outcome));
    out.push_back(std::move(c));
  }
  return out;
}

namespace {

using self_ptr = load_scraper_actor::stateful_pointer<load_scraper_state>;

/// One engine's /metrics, read into the table; runs on the client's thread.
void scrape(self_ptr self, const load_scraper_options::engine& e) {
  auto& st = self->state;
  if (!st.loads->begin(e.replica))
    return; // the last one has not finished
  struct call_state {
    std::string body;
    int status = 0;
    bool too_large = false;
  };
  auto cs = std::make_shared<call_state>();
  auto loads = st.loads;
  auto limit = st.opts.max_body_bytes;
  auto replica = e.replica;
  http_call_handlers h;
  h.on_head = [cs](int status, const auto&) { cs->status = status; };
  h.on_data = [cs, limit](const std::string& data) {
    // Past the limit the rest is read and dropped: the timeout ends a body
    // that never does.
    if (cs->too_large || cs->body.size() + data.size() > limit) {
      cs->too_large = true;
      cs->body.clear();
      return;
    }
    cs->body += data;
  };
  auto limit_mib = limit >> 20;
  h.on_done = [cs, loads, replica, limit_mib](const http_error& err) {
    auto now = engine_loads::clock::now();
    loads->end(replica);
    // Logged when the outcome changes, not every interval.
    auto failed = [&](scrape_outcome o, const std::string& why) {
      if (loads->count(replica, o))
        LLMGW_LOG(warning, "agent engine " + replica,
                  "its /metrics gives no load ({}), so routers see only their own traffic "
                  "there: {}",
                  to_string(o), why);
    };
    if (cs->too_large)
      return failed(scrape_outcome::too_large,
                    "the body exceeds " + std::to_string(limit_mib) + " MiB");
    if (!err.ok())
      return failed(cs->status == 0 ? scrape_outcome::connect : scrape_outcome::status,
                    err.message);
    if (cs->status != 200)
      return failed(scrape_outcome::status, "HTTP status " + std::to_string(cs->status));
    auto g = wire::read_engine_gauges(cs->body);
    if (!g)
      return failed(scrape_outcome::parse, g.err().message);
    loads->read(replica, *g, now);
    if (loads->count(replica, scrape_outcome::ok))
      LLMGW_LOG(info, "agent engine " + replica, "its /metrics gives its load again");
  };
  st.client->call("GET", e.url, "/metrics", {}, {}, st.opts.timeout, st.opts.timeout, std::move(h));
}

} // namespace

load_scraper_actor::behavior_type
load_scraper(load_scraper_actor::stateful_pointer<load_scraper_state> self,
             load_scraper_options opts, std::shared_ptr<engine_loads> loads) {
  auto& st = self->state;
  st.opts = std::move(opts);
  st.loads = std::move(loads);
  st.client = std::make_shared<http_client>();
  self->send(self, poll_atom::value);
  return {
    [self](poll_atom) {
      if (self->current_sender().get() != self->ctrl())
        return; // its own timer only
      auto& st = self->state;
      self->delayed_send(self, st.opts.interval, poll_atom::value);
      for (const auto& e : st.opts.engines)
        scrape(self, e);
    },
  };
}

} // namespace llmgw
