#include "kv/block_table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <unordered_set>

namespace llmgw::kv {

medium medium_of(std::string_view name) noexcept {
  if (name == "GPU")
    return medium::gpu;
  if (name == "CPU" || name == "CPU_PINNED") // vLLM's, SGLang's host memory
    return medium::cpu;
  return medium::storage;
}

const char* to_string(medium m) noexcept {
  switch (m) {
  case medium::gpu:
    return "gpu";
  case medium::cpu:
    return "cpu";
  case medium::storage:
    return "storage";
  }
  return "unknown";
}

std::uint64_t fingerprint_of(const block_ref& b) noexcept {
  // splitmix64 of the key and medium.
  auto x = b.key ^ (static_cast<std::uint64_t>(b.where) + 1) * 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

const char* to_string(reset_reason r) noexcept {
  switch (r) {
  case reset_reason::gap:
    return "gap";
  case reset_reason::restart:
    return "restart";
  case reset_reason::clear:
    return "clear";
  case reset_reason::engine_exit:
    return "engine_exit";
  case reset_reason::decode_error:
    return "decode_error";
  }
  return "unknown";
}

const char* to_string(parity_state p) noexcept {
  switch (p) {
  case parity_state::unknown:
    return "unknown";
  case parity_state::verified:
    return "verified";
  case parity_state::mismatch:
    return "mismatch";
  case parity_state::translated:
    return "translated";
  case parity_state::untranslatable:
    return "untranslatable";
  }
  return "unknown";
}

block_table::block_table(std::optional<parity_config> parity) : parity_config_(std::move(parity)) {
  if (parity_config_)
    hasher_.emplace(parity_config_->seed, parity_config_->block_size);
}

group_kind group_kind_of(const std::optional<std::string>& kind) noexcept {
  if (!kind || *kind == "full_attention" || *kind == "mla_attention"
      || *kind == "sink_full_attention")
    return group_kind::full;
  if (*kind == "sliding_window" || *kind == "sliding_window_mla")
    return group_kind::window;
  if (*kind == "mamba")
    return group_kind::mamba;
  return group_kind::unsupported;
}

wire::block_key end_marker_of(wire::block_key key) noexcept {
  // splitmix64 of the key under another constant than fingerprint_of's.
  auto x = key ^ 0xd6e8feb86659fd93ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

apply_counts block_table::apply(const wire::event_batch& batch) {
  apply_counts counts;
  note_groups(batch, counts);
  // The groups that are not full attention apply after the batch's
  // full-attention events: their blocks are keyed, and chained, by those.
  // Each group's own events keep their order; groups do not share
  // references, so the table ends the same.
  deferred_.clear();
  for (const auto& ev : batch.events) {
    if (ev.kind == wire::event_kind::all_blocks_cleared) {
      for (const auto* d : deferred_)
        apply_event(*d, counts);
      deferred_.clear();
    } else if (!full_group(ev.group_idx.value_or(0))) {
      deferred_.push_back(&ev);
      continue;
    }
    apply_event(ev, counts);
  }
  for (const auto* d : deferred_)
    apply_event(*d, counts);
  deferred_.clear();
  return counts;
}

void block_table::apply_event(const wire::kv_event& ev, apply_counts& counts) {
  auto where = medium_of(ev.medium_or_gpu());
  auto group = ev.group_idx.value_or(0);
  switch (ev.kind) {
  case wire::event_kind::block_stored: {
    bool chain = hybrid() && where == medium::gpu && full_group(group);
    std::optional<wire::block_key> parent;
    bool parent_known = true;
    if (chain && ev.parent_block_hash) {
      // The parent's cluster key: its translation, or its own key where the
      // engine's keys are the cluster's.
      auto pk = ev.parent_block_hash->key;
      auto it = translating() ? keyed_.find(pk) : keyed_.end();
      if (it != keyed_.end())
        parent = wire::key_of(it->second.cluster);
      else if (!translating() || parity_ == parity_state::verified)
        parent = pk;
      else
        parent_known = false;
    }
    if (translating()) {
      translate_stored(ev, where, counts);
      for (const auto& [key, kept] : keys_)
        if (kept)
          store({key, where}, group);
    } else {
      check_parity(ev, counts);
      keys_.clear();
      for (const auto& h : ev.block_hashes) {
        store({h.key, where}, group);
        if (chain)
          keys_.emplace_back(h.key, true);
      }
    }
    if (chain)
      link_chain(keys_, parent, parent_known);
    counts.stored += ev.block_hashes.size();
    break;
  }
  case wire::event_kind::block_removed:
    for (const auto& h : ev.block_hashes) {
      auto key = translating() ? cluster_key_of(h.key) : h.key;
      if (!remove({key, where}, group))
        ++counts.ignored_removes;
      else if (translating())
        release(h.key);
    }
    counts.removed += ev.block_hashes.size();
    break;
  case wire::event_kind::all_blocks_cleared:
    reset(reset_reason::clear);
    ++counts.clears;
    break;
  }
}

void block_table::store(const block_ref& ref, std::int64_t group) {
  auto& n = refs_[{ref.key, ref.where, group}];
  bool first = n++ == 0;
  if (first && ref.where == medium::gpu && hybrid())
    gpu_holding(ref.key, group, +1);
  if (!full_group(group))
    return; // seen through end markers only
  if (!first)
    return renewed(ref);
  auto& groups = presence_[ref];
  if (groups++ == 0)
    presence_changed(ref, false);
  else
    renewed(ref);
}

void block_table::renewed(const block_ref& ref) {
  for (auto& [id, peer] : peers_)
    peer.changed.emplace(ref, change::renewed); // an "added" pending stays one
}

bool block_table::remove(const block_ref& ref, std::int64_t group) {
  auto it = refs_.find({ref.key, ref.where, group});
  if (it == refs_.end())
    return false;
  if (--it->second > 0)
    return true;
  auto g = it->first;
  refs_.erase(it);
  released(g);
  return true;
}

bool block_table::released(const group_key& g) {
  block_ref ref{g.key, g.where};
  bool left = false;
  if (full_group(g.group)) {
    auto p = presence_.find(ref);
    if (p != presence_.end() && --p->second == 0) {
      presence_.erase(p);
      if (ref.where == medium::gpu)
        digests_.erase(ref.key);
      presence_changed(ref, true);
      left = true;
    }
  }
  if (g.where == medium::gpu && hybrid())
    gpu_holding(g.key, g.group, -1);
  return left;
}

void block_table::presence_changed(const block_ref& ref, bool was) {
  if (was)
    fingerprint_ -= fingerprint_of(ref);
  else
    fingerprint_ += fingerprint_of(ref);
  for (auto& [id, peer] : peers_) {
    auto it = peer.changed.find(ref);
    if (it == peer.changed.end())
      peer.changed.emplace(ref, was ? change::removed : change::added);
    else if (was && it->second == change::added)
      peer.changed.erase(it); // back to what the peer last saw: nothing to send
    else
      it->second = was ? change::removed : change::renewed; // held, then gone; or back again
  }
}

void block_table::reset(reset_reason why) {
  // Blocks the engine stored before a gap stay unknown until its cache is
  // emptied (a clear, a restart, an exit); a store after the gap says
  // nothing of them.
  partial_ = why == reset_reason::gap || why == reset_reason::decode_error;
  if (why == reset_reason::restart || why == reset_reason::engine_exit) {
    groups_.clear(); // the engine may come back with another model
    full_groups_ = other_groups_ = 0;
    group_problem_.clear();
  }
  refs_.clear();
  presence_.clear();
  links_.clear();
  runs_.clear();
  markers_.clear();
  digests_.clear();
  keyed_.clear();
  fingerprint_ = 0;
  ++epoch_;
  parity_ = parity_state::unknown;
  parity_message_.clear();
  if (auto problem = groups_problem(); !problem.empty()) {
    parity_ = parity_state::untranslatable; // the engine's groups have not changed
    parity_message_ = std::move(problem);
  }
  for (auto& [id, peer] : peers_) {
    peer.reset_pending = true;
    peer.changed.clear(); // after the reset a peer's copy is empty
  }
}

table_delta block_table::subscribe(peer_id peer) {
  auto& state = peers_[peer];
  state.changed.clear();
  state.reset_pending = false;
  table_delta delta;
  delta.epoch = epoch_;
  delta.reset = true;
  delta.added = held();
  return delta;
}

table_delta block_table::drain(peer_id peer) {
  table_delta delta;
  delta.epoch = epoch_;
  auto it = peers_.find(peer);
  if (it == peers_.end())
    return delta;
  auto& state = it->second;
  delta.reset = state.reset_pending;
  state.reset_pending = false;
  for (const auto& [ref, what] : state.changed) {
    if (what == change::removed)
      delta.removed.push_back(ref);
    else
      delta.added.push_back(ref); // added, or renewed
  }
  state.changed.clear();
  std::sort(delta.added.begin(), delta.added.end());
  std::sort(delta.removed.begin(), delta.removed.end());
  return delta;
}

void block_table::unsubscribe(peer_id peer) {
  peers_.erase(peer);
}

std::vector<block_ref> block_table::held() const {
  std::vector<block_ref> out;
  out.reserve(size());
  for (const auto& [ref, groups] : presence_)
    out.push_back(ref);
  for (auto marker : markers_)
    out.push_back({marker, medium::gpu});
  std::sort(out.begin(), out.end());
  return out;
}

std::size_t block_table::pending_size(peer_id peer) const {
  auto it = peers_.find(peer);
  return it == peers_.end() ? 0 : it->second.changed.size();
}

namespace {

/// Whether `published` (a whole digest, or its routing key) is `d`.
bool matches(const wire::digest& d, const wire::block_hash& published) {
  return published.digest_size == 32 ? std::equal(d.begin(), d.end(), published.digest.begin())
                                     : wire::key_of(d) == published.key;
}

} // namespace

void block_table::flag(parity_state state, std::string message, apply_counts& counts) {
  if (!routable(parity_))
    return; // the first problem says it; later ones add nothing
  parity_ = state;
  parity_message_ = std::move(message);
  counts.mismatch_found = true;
}

wire::block_key block_table::cluster_key_of(wire::block_key engine_key) const {
  auto it = keyed_.find(engine_key);
  return it == keyed_.end() ? engine_key : wire::key_of(it->second.cluster);
}

void block_table::release(wire::block_key engine_key) {
  auto it = keyed_.find(engine_key);
  if (it != keyed_.end() && --it->second.copies == 0)
    keyed_.erase(it);
}

void block_table::fallback(wire::block_key engine_key, apply_counts& counts) {
  if (parity_ == parity_state::verified) {
    keys_.emplace_back(engine_key, true); // the engine hashes the cluster's way
    return;
  }
  keys_.emplace_back(0, false);
  ++counts.untranslated;
}

void block_table::translate_stored(const wire::kv_event& ev, medium where, apply_counts& counts) {
  keys_.clear();
  const auto n = ev.block_hashes.size();
  // A block seen before (a copy on another medium or in another group, or
  // stored twice) keeps the cluster key it got then.
  auto known = [&](std::size_t i) -> const keyed_block* {
    auto it = keyed_.find(ev.block_hashes[i].key);
    if (it == keyed_.end())
      return nullptr;
    ++it->second.copies;
    keys_.emplace_back(wire::key_of(it->second.cluster), true);
    return &it->second;
  };
  // Blocks that cannot be hashed here: keys seen before, or fallback().
  auto resolve_unhashed = [&] {
    for (std::size_t i = 0; i < n; ++i)
      if (!known(i))
        fallback(ev.block_hashes[i].key, counts);
  };
  if (!full_group(ev.group_idx.value_or(0))) {
    // A group that is not full attention (a window, a Mamba state) stores
    // only some of a prompt's blocks, null blocks left out of block_hashes
    // but not of token_ids: never a chain to hash. Its hashes are the
    // full-attention group's, keyed there (apply() defers it for that).
    resolve_unhashed();
    return;
  }
  if (ev.unpublished_extras) {
    // Only these blocks cannot be keyed (and their children, whose parent
    // is then unknown): the engine's other blocks still can.
    resolve_unhashed();
    return;
  }
  if (where != medium::gpu || ev.token_ids.empty()) {
    // Offloading tiers publish placeholders without tokens: only blocks
    // seen on the GPU can be keyed. A GPU store without tokens is an engine
    // that cannot be translated at all, unless it proved to hash the
    // cluster's way (then its keys are used as they are, as with
    // block_keys = "engine").
    if (where == medium::gpu && parity_ != parity_state::verified)
      flag(parity_state::untranslatable,
           "the engine publishes stored GPU blocks without token ids: its blocks cannot be keyed "
           "by the cluster's hash",
           counts);
    resolve_unhashed();
    return;
  }
  const auto bs = hasher_->block_size();
  // Another full-attention group (an engine without spec kinds, whose
  // groups may be anything) whose tokens do not line up with its blocks:
  // its hashes are group 0's, keyed there.
  bool other_group = ev.group_idx.value_or(0) != 0;
  if (ev.block_size == bs && other_group && ev.token_ids.size() != n * bs) {
    resolve_unhashed();
    return;
  }
  if (ev.block_size != bs || ev.token_ids.size() != n * bs
      || (ev.extra_keys && ev.extra_keys->size() != n)) {
    if (ev.block_size != bs)
      flag(parity_state::untranslatable,
           fmt::format("the engine publishes block size {}, the cluster's is {}: start it with "
                       "{} {} (a prefix hit in the engine is whole blocks of its own "
                       "size, which the cluster's keys cannot say)",
                       ev.block_size, bs, parity_config_->block_size_flag, bs),
           counts);
    else
      flag(parity_state::untranslatable,
           fmt::format("a stored event of {} blocks carries {} token ids and {} extra keys", n,
                       ev.token_ids.size(), ev.extra_keys ? ev.extra_keys->size() : 0),
           counts);
    resolve_unhashed();
    return;
  }
  // The parent's cluster digest: the chain's root, a block held here, or
  // the engine's own digest once the engine proved to hash the cluster's
  // way. Only a block chained from one of these proves anything: a match
  // chained from an engine's digest says its algorithm is sha256_cbor, not
  // that its seed is the cluster's.
  wire::digest parent = hasher_->root();
  bool parent_known = true;
  if (ev.parent_block_hash) {
    const auto& p = *ev.parent_block_hash;
    if (auto it = keyed_.find(p.key); it != keyed_.end())
      parent = it->second.cluster;
    else if (p.digest_size == 32 && parity_ == parity_state::verified)
      std::copy(p.digest.begin(), p.digest.end(), parent.begin());
    else
      parent_known = false;
  }
  // Without extra keys (vLLM before 2026-02) a block is keyed only if its
  // hash with none (or the LoRA name alone) proves equal to the engine's.
  wire::block_extra lora_only;
  if (!ev.extra_keys && ev.lora_name)
    lora_only = std::vector<wire::extra_item>{wire::extra_item::of_text(*ev.lora_name)};
  for (std::size_t i = 0; i < n; ++i) {
    const auto& published = ev.block_hashes[i];
    if (const auto* k = known(i)) {
      parent = k->cluster;
      parent_known = true;
      continue;
    }
    if (!parent_known) {
      fallback(published.key, counts);
      continue; // its children's parent is unknown too
    }
    const auto& extra = ev.extra_keys ? (*ev.extra_keys)[i] : lora_only;
    auto d = hasher_->hash_one(parent, ev.token_ids.data() + i * bs, bs, extra);
    bool same = matches(d, published);
    if (same) {
      ++counts.verified;
      if (parity_ == parity_state::unknown)
        parity_ = parity_state::verified;
    } else if (!ev.extra_keys) {
      // Without extra keys, a block unequal to the engine's is one with
      // extra keys nobody published (multimodal, salt) if the engine has
      // proved to hash the cluster's way; else the engine hashes another way.
      if (parity_ != parity_state::verified)
        flag(parity_state::untranslatable,
             "the engine hashes another way and publishes no extra_keys (vLLM before 2026-02): "
             "upgrade it, or start it with --prefix-caching-hash-algo sha256_cbor and "
             "PYTHONHASHSEED="
               + parity_config_->seed,
             counts);
      fallback(published.key, counts);
      parent_known = false;
      continue;
    } else {
      ++counts.translated;
      if (parity_ == parity_state::verified)
        drop_own_keys(counts); // what was kept on the belief the engine hashes our way
      if (routable(parity_))
        parity_ = parity_state::translated;
    }
    keyed_.emplace(published.key, keyed_block{d, 1});
    keys_.emplace_back(wire::key_of(d), true);
    parent = d;
  }
}

void block_table::drop_own_keys(apply_counts& counts) {
  std::unordered_set<wire::block_key> cluster;
  cluster.reserve(keyed_.size());
  for (const auto& [engine, k] : keyed_)
    cluster.insert(wire::key_of(k.cluster));
  for (auto& [key, kept] : keys_) // this event's blocks not stored yet
    if (kept && cluster.count(key) == 0) {
      kept = false;
      ++counts.untranslated;
    }
  std::vector<group_key> gone;
  for (const auto& [g, n] : refs_)
    if (cluster.count(g.key) == 0)
      gone.push_back(g);
  for (const auto& g : gone) {
    refs_.erase(g);
    if (released(g))
      ++counts.untranslated;
  }
  if (!gone.empty())
    partial_ = true; // the engine holds them; their cluster keys are unknown
}

void block_table::flag_mismatch(std::string message) {
  if (parity_ == parity_state::mismatch)
    return; // the first mismatch says it; later ones add nothing
  parity_ = parity_state::mismatch;
  parity_message_ = std::move(message);
}

void block_table::check_parity(const wire::kv_event& ev, apply_counts& counts) {
  if (!hasher_ || parity_ == parity_state::mismatch || !full_group(ev.group_idx.value_or(0)))
    return; // other groups' blocks are not a chain (see translate_stored)
  if (medium_of(ev.medium_or_gpu()) != medium::gpu || ev.token_ids.empty())
    return; // offloading tiers publish placeholders without tokens
  const auto n = ev.block_hashes.size();
  const auto bs = hasher_->block_size();
  if (ev.block_size != bs) {
    flag_mismatch(fmt::format("engine publishes block size {}, the topology says {}: start it with "
                              "{} {}",
                              ev.block_size, bs, parity_config_->block_size_flag, bs));
    counts.mismatch_found = true;
    return;
  }
  // Extra keys (LoRA name, salt, multimodal) are needed to recompute a hash;
  // vLLM publishes them since 2026-02. Without them a block cannot be checked.
  if (!ev.extra_keys || ev.extra_keys->size() != n || ev.token_ids.size() != n * bs)
    return;
  wire::digest parent = hasher_->root();
  if (ev.parent_block_hash) {
    const auto& p = *ev.parent_block_hash;
    if (p.digest_size == 32) {
      std::copy(p.digest.begin(), p.digest.end(), parent.begin());
    } else {
      auto known = digests_.find(p.key);
      if (known == digests_.end())
        return; // the parent was never checked here: nothing to chain from
      parent = known->second;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    auto d = hasher_->hash_one(parent, ev.token_ids.data() + i * bs, bs, (*ev.extra_keys)[i]);
    const auto& published = ev.block_hashes[i];
    bool same = matches(d, published);
    if (!same) {
      flag_mismatch(fmt::format(
        "block {} of a stored run hashes to {} here but the engine published {}: start the "
        "engine with --prefix-caching-hash-algo sha256_cbor and PYTHONHASHSEED={}",
        i, wire::key_of(d), published.key, parity_config_->seed));
      counts.mismatch_found = true;
      return;
    }
    digests_[published.key] = d;
    parent = d;
    ++counts.verified;
  }
  if (counts.verified > 0 && parity_ == parity_state::unknown)
    parity_ = parity_state::verified;
}

// --- Hybrid models ---------------------------------------------------------

namespace {

const std::string no_full_group_message =
  "every KV cache group the engine publishes is sliding-window or Mamba: a prefix hit there "
  "needs no leading blocks, which the router's walk cannot say";

} // namespace

bool block_table::full_group(std::int64_t group) const {
  if (other_groups_ == 0)
    return true; // the common case: no map lookup
  auto it = groups_.find(group);
  return it == groups_.end() || it->second.kind == group_kind::full;
}

std::string block_table::groups_problem() const {
  if (!group_problem_.empty())
    return group_problem_;
  if (other_groups_ > 0 && full_groups_ == 0)
    return no_full_group_message;
  return {};
}

void block_table::note_groups(const wire::event_batch& batch, apply_counts& counts) {
  // The most groups a table follows, and the longest window: vLLM's models
  // have a handful of groups and windows of a few thousand tokens; more is
  // a hostile or broken publisher, refused rather than followed.
  constexpr std::int64_t most_groups = 256;
  constexpr std::int64_t most_window_blocks = 1 << 16;
  for (const auto& ev : batch.events) {
    // Only a GPU store naming its kind says what a group is: offloading
    // tiers' placeholders name none.
    if (ev.kind != wire::event_kind::block_stored || !ev.kv_cache_spec_kind
        || medium_of(ev.medium_or_gpu()) != medium::gpu)
      continue;
    auto group = ev.group_idx.value_or(0);
    group_spec spec{group_kind_of(ev.kv_cache_spec_kind), 0};
    bool no_window = false;
    if (spec.kind == group_kind::window) {
      auto window = ev.kv_cache_spec_sliding_window.value_or(0);
      auto bs = static_cast<std::int64_t>(ev.block_size);
      if (window <= 0 || bs <= 0) {
        spec.kind = group_kind::unsupported;
        no_window = true;
      } else {
        // vLLM's SlidingWindowManager: cdiv(sliding_window - 1, block_size)
        // blocks end a hit; at least one.
        auto need = (window - 1) / bs + ((window - 1) % bs != 0);
        spec.window_blocks =
          static_cast<std::uint32_t>(std::clamp<std::int64_t>(need, 1, most_window_blocks));
        if (need > most_window_blocks)
          spec.kind = group_kind::unsupported;
      }
    }
    auto it = groups_.find(group);
    if (it != groups_.end() && it->second.kind == spec.kind
        && it->second.window_blocks == spec.window_blocks)
      continue;
    if (group_problem_.empty()) {
      if (group < 0 || group >= most_groups)
        group_problem_ = fmt::format("KV cache group {} is outside 0..{}", group, most_groups - 1);
      else if (it != groups_.end())
        group_problem_ =
          fmt::format("KV cache group {} changed its kind or window without a restart", group);
      else if (spec.kind == group_kind::unsupported)
        group_problem_ = fmt::format(
          "KV cache group {} is {}{}: llmgw cannot say which prefixes the engine reuses there",
          group, *ev.kv_cache_spec_kind, no_window ? " without a window" : "");
      else if (spec.kind != group_kind::full && hasher_ && ev.block_size != hasher_->block_size())
        group_problem_ = fmt::format(
          "KV cache group {} ({}) has block size {}, the cluster's is {}: start the engine with "
          "{} {}",
          group, *ev.kv_cache_spec_kind, ev.block_size, hasher_->block_size(),
          parity_config_ ? parity_config_->block_size_flag : "--block-size", hasher_->block_size());
    }
    if (!group_problem_.empty() && (it != groups_.end() || group < 0 || group >= most_groups))
      continue; // the table is untranslatable now: nothing more is learned
    groups_[group] = spec;
    ++(spec.kind == group_kind::full ? full_groups_ : other_groups_);
    if (spec.kind != group_kind::full) {
      // Every marker must now satisfy this group too.
      std::vector<wire::block_key> keys;
      for (const auto& [key, link] : links_)
        keys.push_back(key);
      for (auto key : keys)
        eval_marker(key);
    }
  }
  if (parity_ == parity_state::untranslatable && parity_message_ == no_full_group_message
      && full_groups_ > 0) {
    // That a batch named no full-attention group said too little: one has
    // come. The blocks to come establish parity again.
    parity_ = parity_state::unknown;
    parity_message_.clear();
  }
  if (auto problem = groups_problem(); !problem.empty())
    flag(parity_state::untranslatable, std::move(problem), counts);
}

std::uint32_t block_table::run_of(wire::block_key key, std::int64_t group) const {
  auto it = runs_.find({key, group});
  return it == runs_.end() ? 0 : it->second;
}

void block_table::link_chain(const std::vector<std::pair<wire::block_key, bool>>& keys,
                             std::optional<wire::block_key> parent, bool parent_known) {
  bool known = parent_known;
  bool root = !parent && parent_known;
  wire::block_key prev = parent.value_or(0);
  for (const auto& [key, kept] : keys) {
    if (!kept) {
      known = false; // the next block's parent has no cluster key
      root = false;
      continue;
    }
    auto& link = links_[key];
    if (!link.linked && known && !root && !acyclic(key, prev))
      known = false; // a publisher's loop: its blocks stay unchained
    if (!link.linked && known) {
      link.linked = true;
      link.root = root;
      std::int32_t depth = -1;
      if (root) {
        depth = 0;
      } else {
        link.parent = prev;
        auto& p = links_[prev]; // a placeholder while the parent is not held
        p.children.push_back(key);
        if (p.depth >= 0)
          depth = p.depth + 1;
      }
      for (const auto& [group, spec] : groups_)
        if (spec.kind == group_kind::window)
          update_runs(key, group);
      if (depth >= 0)
        set_depth(key, depth);
      else
        eval_marker(key);
    }
    known = true;
    root = false;
    prev = key;
  }
}

bool block_table::acyclic(wire::block_key key, wire::block_key parent) const {
  // A parent whose chain reaches a root cannot have `key` above it: `key`
  // is not linked yet. Otherwise walk up a while.
  for (int steps = 0; steps < 4096; ++steps) {
    if (parent == key)
      return false;
    auto it = links_.find(parent);
    if (it == links_.end() || it->second.depth >= 0 || it->second.root || !it->second.linked)
      return true;
    parent = it->second.parent;
  }
  return false; // a chain longer than any prompt's without a root: not followed
}

void block_table::set_depth(wire::block_key key, std::int32_t depth) {
  std::vector<std::pair<wire::block_key, std::int32_t>> todo{{key, depth}};
  while (!todo.empty()) {
    auto [k, d] = todo.back();
    todo.pop_back();
    auto it = links_.find(k);
    if (it == links_.end() || it->second.depth >= 0)
      continue;
    it->second.depth = d;
    eval_marker(k);
    for (auto child : it->second.children)
      todo.emplace_back(child, d + 1);
  }
}

void block_table::gpu_holding(wire::block_key key, std::int64_t group, int delta) {
  auto it = links_.find(key);
  if (it == links_.end()) {
    if (delta < 0)
      return;
    it = links_.emplace(key, chain_link{}).first;
  }
  if (delta > 0)
    ++it->second.holders;
  else if (it->second.holders > 0) // blocks stored before the table knew it was hybrid count none
    --it->second.holders;
  auto spec = groups_.find(group);
  if (spec != groups_.end()) {
    if (spec->second.kind == group_kind::window)
      update_runs(key, group);
    else if (spec->second.kind == group_kind::mamba)
      eval_marker(key);
  }
  if (delta < 0)
    maybe_unlink(key);
}

void block_table::maybe_unlink(wire::block_key key) {
  auto it = links_.find(key);
  while (it != links_.end() && it->second.holders == 0 && it->second.children.empty()) {
    bool has_parent = it->second.linked && !it->second.root;
    auto parent = it->second.parent;
    auto child = it->first;
    links_.erase(it);
    if (!has_parent)
      return;
    it = links_.find(parent);
    if (it == links_.end())
      return;
    auto& children = it->second.children;
    auto c = std::find(children.begin(), children.end(), child);
    if (c != children.end()) {
      *c = children.back();
      children.pop_back();
    }
  }
}

void block_table::update_runs(wire::block_key key, std::int64_t group) {
  const auto cap = groups_.at(group).window_blocks;
  std::vector<wire::block_key> todo{key};
  while (!todo.empty()) {
    auto k = todo.back();
    todo.pop_back();
    std::uint32_t run = 0;
    auto link = links_.find(k);
    if (refs_.count({k, medium::gpu, group}) != 0) {
      run = 1;
      if (link != links_.end() && link->second.linked && !link->second.root)
        run += run_of(link->second.parent, group);
      run = std::min(run, cap);
    }
    auto old = run_of(k, group);
    if (run != old) {
      if (run == 0)
        runs_.erase({k, group});
      else
        runs_[{k, group}] = run;
      if (link != links_.end())
        for (auto child : link->second.children)
          todo.push_back(child);
    }
    if (run != old || k == key)
      eval_marker(k);
  }
}

void block_table::eval_marker(wire::block_key key) {
  bool on = other_groups_ > 0;
  auto link = links_.find(key);
  auto depth = link == links_.end() ? -1 : link->second.depth;
  if (link == links_.end())
    on = false;
  for (const auto& [group, spec] : groups_) {
    if (!on)
      break;
    switch (spec.kind) {
    case group_kind::full:
      break;
    case group_kind::window: {
      // The window's last blocks, or every block of a shorter prefix.
      auto need = depth >= 0 ? std::min<std::uint32_t>(spec.window_blocks,
                                                       static_cast<std::uint32_t>(depth) + 1)
                             : spec.window_blocks;
      on = run_of(key, group) >= need;
      break;
    }
    case group_kind::mamba:
      on = refs_.count({key, medium::gpu, group}) != 0;
      break;
    case group_kind::unsupported:
      on = false;
      break;
    }
  }
  auto marker = end_marker_of(key);
  bool was = markers_.count(marker) != 0;
  if (on == was)
    return;
  if (on)
    markers_.insert(marker);
  else
    markers_.erase(marker);
  presence_changed({marker, medium::gpu}, was);
}

} // namespace llmgw::kv
