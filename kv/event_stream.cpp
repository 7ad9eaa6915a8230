#include "kv/event_stream.hpp"

#include <algorithm>

namespace llmgw::kv {

event_stream::event_stream(config cfg) : cfg_(cfg) {}

namespace {

stream_action reset_for(reset_reason why, std::uint64_t expected, std::uint64_t seq) {
  stream_action r;
  r.what = stream_action::kind::reset;
  r.reason = why;
  r.expected = expected;
  r.seq = seq;
  return r;
}

} // namespace

void event_stream::apply_payload(std::uint64_t seq, std::string_view payload,
                                 std::vector<stream_action>& out) {
  auto batch = wire::decode_batch(payload, cfg_.limits, cfg_.dialect);
  stream_action action;
  action.seq = seq;
  if (!batch) {
    ++counts_.decode_errors;
    action.what = stream_action::kind::reset;
    action.reason = reset_reason::decode_error;
    action.decode_failure = batch.err();
    out.push_back(std::move(action));
    return;
  }
  ++counts_.applied;
  counts_.unknown_events += batch->skipped;
  action.what = stream_action::kind::apply;
  action.batch = std::move(*batch);
  out.push_back(std::move(action));
}

void event_stream::start_replay(std::uint64_t from, std::uint64_t seq, std::string_view payload,
                                clock::time_point now, bool late_start,
                                std::vector<stream_action>& out) {
  replay_state state;
  state.late_start = late_start;
  state.next = from;
  state.until = seq;
  state.deadline = now + cfg_.replay_timeout;
  state.held.push_back({seq, std::string(payload)});
  replay_ = std::move(state);
  stream_action request;
  request.what = stream_action::kind::request_replay;
  request.seq = from;
  out.push_back(std::move(request));
}

std::vector<stream_action> event_stream::on_live(std::uint64_t seq, std::string_view payload,
                                                 clock::time_point now) {
  std::vector<stream_action> out;
  ++counts_.messages;
  auto expected = tracker_.expected();
  auto verdict = tracker_.observe(seq);
  if (replay_) {
    // While replaying, hold what arrives (a step back restarts everything).
    if (verdict == wire::seq_verdict::restart) {
      counts_.lost_batches += replay_->until - replay_->next;
      replay_.reset();
      ++counts_.restarts;
      out.push_back(reset_for(reset_reason::restart, *expected, seq));
      apply_payload(seq, payload, out);
      return out;
    }
    if (replay_->held.size() >= cfg_.max_held) {
      replay_->held.push_back({seq, std::string(payload)});
      finish_replay(out); // too much to hold: give up on the hole
      return out;
    }
    replay_->held.push_back({seq, std::string(payload)});
    return out;
  }
  switch (verdict) {
  case wire::seq_verdict::first:
    if (seq > 0 && cfg_.replay_available) {
      start_replay(0, seq, payload, now, true, out); // learn what was stored before we came
      return out;
    }
    if (seq > 0) { // what was stored before we came is unknown: the mirror starts partial
      ++counts_.gaps;
      counts_.lost_batches += seq;
      out.push_back(reset_for(reset_reason::gap, 0, seq));
    }
    break;
  case wire::seq_verdict::next:
    break;
  case wire::seq_verdict::gap:
    ++counts_.gaps;
    if (cfg_.replay_available) {
      start_replay(*expected, seq, payload, now, false, out);
      return out;
    } else {
      counts_.lost_batches += seq - *expected;
      out.push_back(reset_for(reset_reason::gap, *expected, seq));
    }
    break;
  case wire::seq_verdict::restart: {
    ++counts_.restarts;
    out.push_back(reset_for(reset_reason::restart, *expected, seq));
    break;
  }
  }
  apply_payload(seq, payload, out);
  return out;
}

std::vector<stream_action> event_stream::on_replay(const wire::replay_reply& reply,
                                                   clock::time_point) {
  std::vector<stream_action> out;
  if (!replay_)
    return out; // a late reply after giving up: ignored
  if (reply.end) {
    finish_replay(out);
    return out;
  }
  // After a late start the engine's buffer may no longer reach back to 0:
  // its oldest batch is where history begins for us.
  // What was stored before it is unknown: the mirror starts partial.
  if (replay_->late_start && !replay_->any_reply && reply.seq > replay_->next) {
    ++counts_.gaps;
    counts_.lost_batches += reply.seq - replay_->next;
    out.push_back(reset_for(reset_reason::gap, replay_->next, reply.seq));
    replay_->next = std::min(reply.seq, replay_->until);
  }
  replay_->any_reply = true;
  if (reply.seq != replay_->next || reply.seq >= replay_->until)
    return out; // before what was asked, or already held from the live stream
  ++replay_->next;
  ++counts_.replayed;
  apply_payload(reply.seq, reply.payload, out);
  out.back().replayed = true;
  return out;
}

std::vector<stream_action> event_stream::on_tick(clock::time_point now) {
  std::vector<stream_action> out;
  if (replay_ && now >= replay_->deadline)
    finish_replay(out);
  return out;
}

void event_stream::finish_replay(std::vector<stream_action>& out) {
  auto state = std::move(*replay_);
  replay_.reset();
  if (state.next >= state.until) {
    if (!state.late_start)
      ++counts_.gaps_filled;
  } else {
    counts_.lost_batches += state.until - state.next;
    out.push_back(reset_for(reset_reason::gap, state.next, state.until));
  }
  // Apply the held live messages in order; a hole among them (messages lost
  // while replaying) is a gap of its own.
  std::optional<std::uint64_t> last;
  for (auto& m : state.held) {
    if (last && m.seq != *last + 1) {
      counts_.lost_batches += m.seq > *last ? m.seq - *last - 1 : 0;
      ++counts_.gaps;
      out.push_back(
        reset_for(m.seq > *last ? reset_reason::gap : reset_reason::restart, *last + 1, m.seq));
    }
    apply_payload(m.seq, m.payload, out);
    last = m.seq;
  }
}

} // namespace llmgw::kv
