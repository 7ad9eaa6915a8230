#include "routing/block_index.hpp"

#include <algorithm>
#include <cassert>
#include <cstdlib>

namespace llmgw::routing {

namespace {

constexpr std::size_t initial_slots = 64;
constexpr double max_load = 0.85;

std::uint16_t make_entry(holder_id h, kv::medium m) {
  return static_cast<std::uint16_t>((h << 2) | static_cast<std::uint16_t>(m));
}

holder_id holder_of(std::uint16_t e) {
  return static_cast<holder_id>(e >> 2);
}

kv::medium medium_of_entry(std::uint16_t e) {
  return static_cast<kv::medium>(e & 3);
}

} // namespace

block_index::block_index() : slots_(initial_slots) {
  for (auto& s : slots_)
    s.count = 0;
}

std::size_t block_index::home(wire::block_key key) const noexcept {
  // The keys are digests already; mixing guards against crafted ones, and the
  // multiply-shift maps onto any table size (growth by 1.5).
  auto mixed = (key ^ (key >> 29)) * 0xbf58476d1ce4e5b9ull;
  __extension__ using u128 = unsigned __int128; // g++ and clang, without -Wpedantic noise
  return static_cast<std::size_t>((static_cast<u128>(mixed) * slots_.size()) >> 64);
}

std::size_t block_index::distance(std::size_t pos, wire::block_key key) const noexcept {
  auto h = home(key);
  return pos >= h ? pos - h : pos + slots_.size() - h;
}

block_index::slot* block_index::find(wire::block_key key) {
  return const_cast<slot*>(static_cast<const block_index*>(this)->find(key));
}

const block_index::slot* block_index::find(wire::block_key key) const {
  auto n = slots_.size();
  auto pos = home(key);
  for (std::size_t dist = 0;; ++dist) {
    const auto& s = slots_[pos];
    if (s.count == 0)
      return nullptr;
    if (s.key == key)
      return &s;
    // Robin Hood: a resident closer to its home than we are to ours means
    // our key would have displaced it; it is not here.
    if (distance(pos, s.key) < dist)
      return nullptr;
    if (++pos == n)
      pos = 0;
  }
}

block_index::slot& block_index::insert_key(wire::block_key key) {
  if (static_cast<double>(used_ + 1) > max_load * static_cast<double>(slots_.size()))
    grow();
  auto n = slots_.size();
  auto pos = home(key);
  slot carry{key, 0, {0, 0, 0}};
  std::size_t dist = 0;
  slot* placed = nullptr;
  for (;;) {
    auto& s = slots_[pos];
    if (s.count == 0) {
      s = carry;
      ++used_;
      return placed ? *placed : s;
    }
    auto resident = distance(pos, s.key);
    if (resident < dist) {
      std::swap(s, carry);
      if (!placed)
        placed = &s;
      dist = resident;
    }
    if (++pos == n)
      pos = 0;
    ++dist;
  }
}

void block_index::erase_at(std::size_t pos) {
  // Backward shift: pull followers one step back until an empty slot or one
  // at its home, so no tombstones are needed.
  auto n = slots_.size();
  for (;;) {
    auto next = pos + 1 == n ? 0 : pos + 1;
    auto& s = slots_[next];
    if (s.count == 0 || distance(next, s.key) == 0) {
      slots_[pos].count = 0;
      break;
    }
    slots_[pos] = s;
    pos = next;
  }
  --used_;
}

void block_index::grow() {
  std::vector<slot> old(slots_.size() + slots_.size() / 2);
  for (auto& s : old)
    s.count = 0;
  old.swap(slots_);
  used_ = 0;
  for (const auto& s : old) {
    if (s.count == 0)
      continue;
    auto& placed = insert_key(s.key);
    placed.count = s.count;
    std::copy(std::begin(s.inline_entries), std::end(s.inline_entries),
              std::begin(placed.inline_entries));
  }
}

std::uint32_t block_index::pool_index(const slot& s) const noexcept {
  return static_cast<std::uint32_t>(s.inline_entries[0])
         | (static_cast<std::uint32_t>(s.inline_entries[1]) << 16);
}

void block_index::set_pool_index(slot& s, std::uint32_t index) noexcept {
  s.inline_entries[0] = static_cast<std::uint16_t>(index & 0xffff);
  s.inline_entries[1] = static_cast<std::uint16_t>(index >> 16);
}

const block_index::entry* block_index::entries_of(const slot& s) const noexcept {
  return s.count <= 3 ? s.inline_entries : pool_[pool_index(s)].data();
}

bool block_index::add_entry(slot& s, entry e) {
  const entry* begin = entries_of(s);
  if (std::find(begin, begin + s.count, e) != begin + s.count)
    return false;
  if (s.count < 3) {
    s.inline_entries[s.count++] = e;
    return true;
  }
  if (s.count == 3) {
    // Move the three inline entries and the new one to the pool.
    std::uint32_t index;
    if (!free_pool_.empty()) {
      index = free_pool_.back();
      free_pool_.pop_back();
    } else {
      index = static_cast<std::uint32_t>(pool_.size());
      pool_.emplace_back();
    }
    auto& list = pool_[index];
    list.assign(std::begin(s.inline_entries), std::end(s.inline_entries));
    list.push_back(e);
    set_pool_index(s, index);
    s.count = 4;
    return true;
  }
  pool_[pool_index(s)].push_back(e);
  ++s.count;
  return true;
}

bool block_index::remove_entry(slot& s, entry e) {
  if (s.count <= 3) {
    auto* end = s.inline_entries + s.count;
    auto* it = std::find(s.inline_entries, end, e);
    if (it == end)
      return false;
    *it = *(end - 1);
    --s.count;
    return true;
  }
  auto index = pool_index(s);
  auto& list = pool_[index];
  auto it = std::find(list.begin(), list.end(), e);
  if (it == list.end())
    return false;
  *it = list.back();
  list.pop_back();
  --s.count;
  if (s.count == 3) {
    // Back inline: the invariant is count <= 3 exactly when inline.
    std::copy(list.begin(), list.end(), std::begin(s.inline_entries));
    list.clear();
    list.shrink_to_fit();
    free_pool_.push_back(index);
  }
  return true;
}

void block_index::count_change(holder_id h, int delta) {
  if (h >= counts_.size())
    counts_.resize(static_cast<std::size_t>(h) + 1, 0);
  counts_[h] = static_cast<std::uint64_t>(static_cast<std::int64_t>(counts_[h]) + delta);
  entries_ = static_cast<std::size_t>(static_cast<std::int64_t>(entries_) + delta);
}

bool block_index::add(wire::block_key key, holder_id h, kv::medium m) {
  assert(h < max_holders);
  auto e = make_entry(h, m);
  auto* s = find(key);
  if (!s)
    s = &insert_key(key);
  if (!add_entry(*s, e))
    return false;
  count_change(h, +1);
  return true;
}

bool block_index::remove(wire::block_key key, holder_id h, kv::medium m) {
  auto* s = find(key);
  if (!s || !remove_entry(*s, make_entry(h, m)))
    return false;
  count_change(h, -1);
  if (s->count == 0)
    erase_at(static_cast<std::size_t>(s - slots_.data()));
  return true;
}

bool block_index::holds(wire::block_key key, holder_id h, kv::medium m) const {
  const auto* s = find(key);
  if (!s)
    return false;
  const entry* begin = entries_of(*s);
  return std::find(begin, begin + s->count, make_entry(h, m)) != begin + s->count;
}

void block_index::drop(holder_id h) {
  if (count(h) == 0)
    return;
  std::size_t pos = 0;
  while (pos < slots_.size()) {
    auto& s = slots_[pos];
    if (s.count == 0) {
      ++pos;
      continue;
    }
    bool removed = false;
    for (int m = 0; m < 3; ++m)
      if (remove_entry(s, make_entry(h, static_cast<kv::medium>(m)))) {
        count_change(h, -1);
        removed = true;
      }
    if (removed && s.count == 0) {
      erase_at(pos); // a follower may have moved into pos: look at it again
      continue;
    }
    ++pos;
  }
  // A backward shift can wrap a slot from the table's start to its end,
  // past the scan; look again if anything is left (rare).
  if (count(h) != 0)
    drop(h);
}

void block_index::walk(const wire::block_key* keys, std::size_t n,
                       const std::vector<holder_id>& candidates,
                       const std::array<double, 3>& weights, std::vector<walk_score>& out) {
  out.assign(candidates.size(), walk_score{});
  alive_.clear();
  std::size_t need = 0;
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    out[c].holder = candidates[c];
    need = std::max<std::size_t>(need, candidates[c] + 1u);
    alive_.push_back(static_cast<std::uint32_t>(c));
  }
  if (seen_stamp_.size() < need) {
    seen_stamp_.resize(need, 0);
    seen_weight_.resize(need, 0);
  }
  for (std::size_t i = 0; i < n && !alive_.empty(); ++i) {
    const auto* s = find(keys[i]);
    if (!s)
      break;
    if (++stamp_ == 0) { // wrapped: old stamps could look current
      std::fill(seen_stamp_.begin(), seen_stamp_.end(), 0);
      stamp_ = 1;
    }
    const entry* begin = entries_of(*s);
    for (const entry* e = begin; e != begin + s->count; ++e) {
      auto h = holder_of(*e);
      if (h >= need)
        continue;
      auto w = weights[static_cast<std::size_t>(medium_of_entry(*e))];
      if (seen_stamp_[h] != stamp_) {
        seen_stamp_[h] = stamp_;
        seen_weight_[h] = w;
      } else if (w > seen_weight_[h]) {
        seen_weight_[h] = w;
      }
    }
    std::size_t kept = 0;
    for (auto c : alive_) {
      auto h = candidates[c];
      if (seen_stamp_[h] != stamp_)
        continue;
      ++out[c].blocks;
      out[c].weighted += seen_weight_[h];
      alive_[kept++] = c;
    }
    alive_.resize(kept);
  }
}

double block_index::weigh(const wire::block_key* keys, std::size_t count, holder_id h,
                          const std::array<double, 3>& weights) const {
  double sum = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const auto* s = find(keys[i]);
    if (!s)
      continue;
    double best = 0;
    const entry* begin = entries_of(*s);
    for (const entry* e = begin; e != begin + s->count; ++e)
      if (holder_of(*e) == h)
        best = std::max(best, weights[static_cast<std::size_t>(medium_of_entry(*e))]);
    sum += best;
  }
  return sum;
}

std::vector<kv::block_ref> block_index::blocks_of(holder_id h) const {
  std::vector<kv::block_ref> out;
  for (const auto& s : slots_) {
    if (s.count == 0)
      continue;
    const entry* begin = entries_of(s);
    for (const entry* e = begin; e != begin + s.count; ++e)
      if (holder_of(*e) == h)
        out.push_back({s.key, medium_of_entry(*e)});
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::size_t block_index::memory_bytes() const noexcept {
  std::size_t bytes = slots_.capacity() * sizeof(slot);
  bytes += pool_.capacity() * sizeof(std::vector<entry>);
  for (const auto& list : pool_)
    bytes += list.capacity() * sizeof(entry) + (list.capacity() ? 16 : 0); // + malloc header
  bytes += free_pool_.capacity() * sizeof(std::uint32_t);
  bytes += counts_.capacity() * sizeof(std::uint64_t);
  return bytes;
}

} // namespace llmgw::routing
