#include "gateway/proxy.hpp"

#include "gateway/route.hpp"

#include "base/log.hpp"
#include "routing/shared_router.hpp"
#include "wire/openai_request.hpp"

#include <algorithm>
#include <optional>
#include <string_view>

namespace llmgw {

namespace {

std::vector<double> seconds_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
}

/// ASCII case folding: header names are ASCII, and std::tolower asks the
/// locale for every character.
char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i]))
      return false;
  return true;
}

/// Headers a proxy must not pass on (hop-by-hop, or framing it redoes).
/// Expect is answered by the gateway's own server (100 Continue) before the
/// body is read; passed on, it would make the engine send an interim answer.
bool hop_by_hop(std::string_view name) {
  using namespace std::string_view_literals;
  static constexpr std::string_view names[] = {"connection"sv,
                                               "proxy-connection"sv,
                                               "expect"sv,
                                               "keep-alive"sv,
                                               "proxy-authenticate"sv,
                                               "proxy-authorization"sv,
                                               "te"sv,
                                               "trailer"sv,
                                               "transfer-encoding"sv,
                                               "upgrade"sv,
                                               "content-length"sv,
                                               "host"sv,
                                               "server"sv,
                                               "date"sv};
  for (auto h : names)
    if (iequals(name, h))
      return true;
  return false;
}

using header_list = std::vector<std::pair<std::string, std::string>>;

/// The header names a message's Connection headers list: they are meant for
/// this hop alone (RFC 9110, section 7.6.1), and a proxy drops them too.
std::vector<std::string_view> connection_options(const header_list& headers) {
  std::vector<std::string_view> names;
  for (const auto& [k, v] : headers) {
    if (!iequals(k, "connection"))
      continue;
    std::string_view rest = v;
    while (!rest.empty()) {
      auto comma = rest.find(',');
      auto token = rest.substr(0, comma);
      while (!token.empty() && (token.front() == ' ' || token.front() == '\t'))
        token.remove_prefix(1);
      while (!token.empty() && (token.back() == ' ' || token.back() == '\t'))
        token.remove_suffix(1);
      if (!token.empty())
        names.push_back(token);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    }
  }
  return names;
}

/// True unless `name` is hop-by-hop or listed in `named` (connection_options).
bool end_to_end(std::string_view name, const std::vector<std::string_view>& named) {
  if (hop_by_hop(name))
    return false;
  return std::none_of(named.begin(), named.end(),
                      [name](std::string_view n) { return iequals(n, name); });
}

/// A replica's answer that another replica may do better: a server error,
/// not one that says the request itself cannot be served (501, 505).
bool retryable_status(int status) {
  return status >= 500 && status <= 599 && status != 501 && status != 505;
}

/// Server errors in a row after which a replica is marked down: one could
/// be the request's fault (every replica would fail it), three are the
/// replica's.
constexpr std::uint32_t server_errors_to_mark_down = 3;

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// One client request, through its attempts.
class proxied : public std::enable_shared_from_this<proxied> {
public:
  proxied(const proxy_context& ctx, http_request&& req, http_responder respond, std::string path,
          wire::routing_request routing)
    : ctx_(ctx), req_(std::move(req)), respond_(std::move(respond)), path_(std::move(path)),
      routing_(std::move(routing)), started_(std::chrono::steady_clock::now()) {
    std::lock_guard<std::mutex> s(ctx_.stats->mtx);
    ++ctx_.stats->in_flight;
  }
  ~proxied() {
    std::lock_guard<std::mutex> s(ctx_.stats->mtx);
    if (--ctx_.stats->in_flight == 0)
      ctx_.stats->idle.notify_all();
  }
  proxied(const proxied&) = delete;
  proxied& operator=(const proxied&) = delete;

  void start() {
    std::weak_ptr<proxied> weak = shared_from_this(); // the responder must not own us
    respond_.on_disconnect([weak] {
      if (auto self = weak.lock())
        self->client_left();
    });
    route();
  }

private:
  void route() {
    auto self = shared_from_this();
    route_request(
      ctx_.sys, ctx_.plane, ctx_.topo, routing_, false,
      [self](const routing::route_decision& d) { self->on_decision(d); }, tried_);
  }

  void on_decision(const routing::route_decision& d) {
    if (stopping()) { // decided while the gateway was being stopped: never sent
      if (!d.replica.empty())
        ctx_.plane.shared_router->finished(routing::progress_of(d), false);
      std::unique_lock<std::mutex> g(mtx_);
      return end_at_stop(g);
    }
    if (d.replica.empty() && relay_held()) // every replica was tried: the last server error
      return;
    if (d.replica.empty()) {
      if (!last_error_.empty())
        return finish_error(502, "BadGatewayError",
                            "no replica could answer; the last one failed: " + last_error_);
      bool unknown = d.failure == routing::route_failure::unknown_model;
      return finish_error(unknown ? 404 : 503,
                          unknown ? "NotFoundError" : "ServiceUnavailableError", d.error);
    }
    std::unique_lock<std::mutex> g(mtx_);
    if (gone_) {
      ctx_.plane.shared_router->finished(routing::progress_of(d), false); // never sent
      return;
    }
    // What the relay needs; the candidates' scores stay behind.
    decision_.replica = d.replica;
    decision_.incarnation = d.incarnation; // which entry its end and failures are reported to
    decision_.url = d.url;
    decision_.tier = d.tier;
    decision_.dp_rank = d.dp_rank;
    decision_.predicted_cached_tokens = d.predicted_cached_tokens;
    decision_.watch = d.watch;
    decision_.uncached_tokens = d.uncached_tokens;
    decision_.model_ms = d.model_ms;
    // Each attempt starts afresh (an earlier one may have received a head).
    first_token_ = false;
    abandoned_ = false;
    server_error_ = false;
    status_ = 0;
    body_.clear();
    scan_.clear();
    relay_headers_.clear();
    content_type_.clear();
    reported_cached_.reset();
    tried_.push_back(d.replica);
    std::vector<std::pair<std::string, std::string>> headers;
    auto named = connection_options(req_.headers);
    for (const auto& [k, v] : req_.headers)
      if (end_to_end(k, named) && !iequals(k, "x-data-parallel-rank"))
        headers.emplace_back(k, v);
    if (d.dp_rank >= 0) {
      const auto* e = ctx_.topo->find_engine(d.replica);
      if (e && e->dp_size > 1)
        headers.emplace_back("X-data-parallel-rank", std::to_string(d.dp_rank));
    }
    auto self = shared_from_this();
    http_call_handlers h;
    h.on_head = [self](int status, const std::vector<std::pair<std::string, std::string>>& hs) {
      self->on_head(status, hs);
    };
    h.on_data = [self](const std::string& data) { self->on_data(data); };
    h.on_done = [self](const http_error& err) { self->on_done(err); };
    auto upstream = ctx_.upstream.lock();
    if (!upstream) { // the gateway is shutting down
      ctx_.plane.shared_router->finished(routing::progress_of(d), false);
      respond_(error_reply(503, "ServiceUnavailableError", "the gateway is stopping"));
      return;
    }
    // Held by the gateway until it ends: if the replica's health probes
    // fail meanwhile, or the gateway stops, the attempt is abandoned
    // (abandon_attempts, cut_in_flight). Registered before it is sent, in
    // one step with the stop check: a cut either finds this attempt or is
    // found here. (Abandoning it waits for mtx_, held until it is sent.)
    std::weak_ptr<proxied> weak = self;
    bool stopping = false;
    {
      std::lock_guard<std::mutex> s(ctx_.stats->mtx);
      stopping = ctx_.stats->stopping;
      if (!stopping) {
        attempt_ = ctx_.stats->next_attempt++;
        ctx_.stats->attempts.emplace(attempt_,
                                     std::make_pair(d.replica, [weak, attempt = attempt_] {
                                       if (auto p = weak.lock())
                                         p->abandon(attempt);
                                     }));
      }
    }
    if (stopping) {
      ctx_.plane.shared_router->finished(routing::progress_of(d), false); // never sent
      return end_at_stop(g);
    }
    sent_ = std::chrono::steady_clock::now();
    // A stream's head comes before the engine schedules it (vLLM's): one
    // that does not come in first_byte_timeout is a stuck engine, tried
    // elsewhere as nothing was relayed. A whole answer's head is its end.
    call_ = upstream->call(
      "POST", d.url, path_, req_.body, headers, ctx_.topo->gateway.connect_timeout,
      ctx_.topo->gateway.request_timeout, std::move(h),
      routing_.stream ? ctx_.topo->gateway.first_byte_timeout : std::chrono::milliseconds{0});
  }

  /// The replica was declared down while `attempt` waited on it: end the
  /// call; on_done tries another replica (or ends a relayed stream as failed).
  /// Nothing if that attempt is over (a later one may be on a good replica).
  void abandon(std::uint64_t attempt) {
    std::shared_ptr<http_call> call;
    {
      std::lock_guard<std::mutex> g(mtx_);
      if (attempt != attempt_)
        return;
      abandoned_ = true;
      call = call_.lock();
    }
    if (call)
      call->cancel();
  }

  void on_head(int status, const std::vector<std::pair<std::string, std::string>>& headers) {
    std::lock_guard<std::mutex> g(mtx_);
    status_ = status;
    // A server error is held back (its body is small) until it is known
    // whether another replica can answer instead: nothing is relayed yet.
    server_error_ = retryable_status(status);
    std::string content_type = "application/json";
    bool chunked = false;
    auto named = connection_options(headers);
    for (const auto& [k, v] : headers) {
      if (iequals(k, "content-type"))
        content_type = v;
      else if (iequals(k, "transfer-encoding"))
        chunked = true;
      else if (end_to_end(k, named))
        relay_headers_.emplace_back(k, v);
    }
    relay_headers_.emplace_back("x-llmgw-replica", decision_.replica);
    relay_headers_.emplace_back("x-llmgw-tier", routing::to_string(decision_.tier));
    content_type_ = content_type;
    streaming_ = !server_error_ && (chunked || content_type.rfind("text/event-stream", 0) == 0);
    // A whole answer is relayed when done, but it is the engine's: a
    // failure from here on is not retried. A stream's head waits for its
    // first byte (open_stream): vLLM sends the head before it schedules
    // the request, and until a token comes another replica may still take it.
    head_ = !server_error_ && !streaming_;
  }

  /// The client's stream begins, with the engine's head (mtx_ held).
  void open_stream() {
    stream_ = respond_.stream(status_, content_type_, std::move(relay_headers_));
    head_ = true;
    std::lock_guard<std::mutex> s(ctx_.stats->mtx);
    ctx_.stats->first_byte_seconds.observe(since(started_));
  }

  void on_data(const std::string& data) {
    std::lock_guard<std::mutex> g(mtx_);
    if (streaming_ && !first_token_ && !data.empty()) {
      // The first event of a stream comes with the first token (vLLM sends
      // its headers before): the prefill is done, and its time teaches the
      // router this replica's rate.
      first_token_ = true;
      ctx_.plane.shared_router->first_token(routing::progress_of(decision_), 1e3 * since(sent_));
    }
    if (streaming_ && decision_.predicted_cached_tokens > 0 && !reported_cached_) {
      // The usage event may be split across pieces: keep a short tail.
      scan_ += data;
      reported_cached_ = wire::find_cached_tokens(scan_);
      if (scan_.size() > 64)
        scan_.erase(0, scan_.size() - 64);
    }
    if (streaming_) {
      if (data.empty())
        return;
      if (!head_)
        open_stream();
      if (!stream_->write(data)) {
        if (auto call = call_.lock())
          call->cancel(); // the client is gone or not reading
      }
      return;
    }
    body_ += data;
  }

  void on_done(const http_error& err) {
    std::unique_lock<std::mutex> g(mtx_);
    if (err.ok() && !streaming_ && decision_.predicted_cached_tokens > 0)
      reported_cached_ = wire::find_cached_tokens(body_);
    // What the engine found cached checks the index's prediction (and
    // corrects the index) only when the answer is whole.
    ctx_.plane.shared_router->finished(routing::progress_of(decision_), first_token_,
                                       err.ok() ? reported_cached_ : std::nullopt);
    call_.reset();
    {
      std::lock_guard<std::mutex> s(ctx_.stats->mtx);
      ctx_.stats->attempts.erase(attempt_);
    }
    attempt_ = 0;
    bool abandoned = std::exchange(abandoned_, false);
    if (gone_)
      return;
    if (err.ok() && server_error_ && retry_server_error(g))
      return;
    if (err.ok()) {
      if (!server_error_)
        blame_server_errors();
      note_cache_accuracy();
      if (streaming_) {
        if (!head_) // an empty stream
          open_stream();
        stream_->end();
      } else {
        std::lock_guard<std::mutex> s(ctx_.stats->mtx);
        ctx_.stats->first_byte_seconds.observe(since(started_));
      }
      auto status = status_;
      g.unlock();
      if (!streaming_)
        respond_(http_reply{status, content_type_, std::move(body_), std::move(relay_headers_)});
      count(status);
      return;
    }
    if (stopping()) // cut_in_flight: the gateway stops; no replica is to blame
      return end_at_stop(g);
    // The replica failed.
    const char* reason = abandoned                           ? "replica_down"
                         : err.kind == http_failure::connect ? "connect"
                         : err.kind == http_failure::timeout ? "timeout"
                                                             : "broken";
    {
      std::lock_guard<std::mutex> s(ctx_.stats->mtx);
      ++ctx_.stats->failures[{decision_.replica, head_ ? "after_first_byte" : reason}];
    }
    if (auto n = ctx_.stats->failure_log.admit(decision_.replica + "/" + reason))
      LLMGW_LOG(warning, "gateway", "replica {} failed a request ({}){}{}", decision_.replica,
                log::printable(err.message), head_ ? ": the response is cut short" : "",
                burst_note(n));
    if (head_) {
      if (streaming_) {
        // A stream that cannot finish must not look finished: an error
        // event in OpenAI's shape (the openai client raises on it), then
        // the connection drops without the last chunk.
        stream_->write("data: "
                       + wire::openai_error_json("replica " + decision_.replica
                                                   + " failed mid-response: " + err.message,
                                                 "BadGatewayError", 502)
                       + "\n\n");
        stream_->fail();
        auto status = status_; // what the client was told (the failure is counted above)
        g.unlock();
        count(status);
      } else {
        g.unlock();
        finish_error(502, "BadGatewayError",
                     "replica " + decision_.replica + " failed mid-response: " + err.message);
      }
      return;
    }
    // Nothing was relayed: avoid this replica for a while and try the next.
    // One that refused a connection is back at its first good health probe;
    // one that accepted and then failed (it may answer probes and hang on
    // requests) stays avoided for mark_down_ms.
    // An abandoned attempt's replica is down already, until a probe succeeds.
    if (!abandoned)
      ctx_.plane.shared_router->mark_down(decision_.replica, ctx_.topo->gateway.down_for,
                                          err.kind == http_failure::connect, decision_.incarnation);
    last_error_ = "replica " + decision_.replica + ": " + err.message;
    if (tried_.size() >= ctx_.topo->gateway.max_attempts) {
      g.unlock();
      if (relay_held())
        return;
      finish_error(502, "BadGatewayError",
                   "tried " + std::to_string(tried_.size())
                     + " replicas; the last: " + last_error_);
      return;
    }
    {
      std::lock_guard<std::mutex> s(ctx_.stats->mtx);
      ++ctx_.stats->retries;
    }
    g.unlock();
    route();
  }

  /// The replica answered a server error: counted, and the request tried
  /// elsewhere. Returns true when it went to another replica; false when
  /// the answer is to be relayed (no attempt left).
  bool retry_server_error(std::unique_lock<std::mutex>& g) {
    {
      std::lock_guard<std::mutex> s(ctx_.stats->mtx);
      ++ctx_.stats->failures[{decision_.replica, "server_error"}];
    }
    if (auto n = ctx_.stats->failure_log.admit(decision_.replica + "/server_error"))
      LLMGW_LOG(warning, "gateway", "replica {} answered {}{}", decision_.replica, status_,
                burst_note(n));
    server_errors_.emplace_back(decision_.replica, decision_.incarnation);
    last_error_ = "replica " + decision_.replica + " answered " + std::to_string(status_);
    if (tried_.size() >= ctx_.topo->gateway.max_attempts)
      return false;
    {
      std::lock_guard<std::mutex> s(ctx_.stats->mtx);
      ++ctx_.stats->retries;
    }
    // Relayed if no other replica is left to try.
    held_ = http_reply{status_, content_type_, std::move(body_), std::move(relay_headers_)};
    g.unlock();
    route();
    return true;
  }

  /// Another replica answered what the ones in server_errors_ failed with a
  /// server error: theirs were their own fault, not the request's. Each
  /// such error counts against its replica; server_errors_to_mark_down in a
  /// row mark it down for mark_down_ms (a health probe does not end that:
  /// the engine is alive and failing). A replica that answers clears its
  /// count.
  void blame_server_errors() {
    std::vector<std::pair<std::string, std::uint64_t>> down;
    {
      std::lock_guard<std::mutex> s(ctx_.stats->mtx);
      auto& in_row = ctx_.stats->server_errors_in_row;
      if (auto it = in_row.find(decision_.replica);
          it != in_row.end() && it->second.first == decision_.incarnation)
        in_row.erase(it);
      for (const auto& r : server_errors_) {
        auto& [incarnation, n] = in_row[r.first];
        if (r.second < incarnation)
          continue; // a late error of an entry a reload replaced: not the new one's
        if (r.second > incarnation) { // a changed replica's new entry starts over
          incarnation = r.second;
          n = 0;
        }
        if (++n >= server_errors_to_mark_down) {
          n = 0;
          down.push_back(r);
        }
      }
    }
    for (const auto& [r, incarnation] : down) {
      LLMGW_LOG(warning, "gateway",
                "replica {} answered {} server errors in a row that others did not: avoided for "
                "{} ms",
                r, server_errors_to_mark_down, ctx_.topo->gateway.down_for.count());
      ctx_.plane.shared_router->mark_down(r, ctx_.topo->gateway.down_for, false, incarnation);
    }
  }

  /// Relays an earlier attempt's server error, if there is one: every
  /// replica failed the request, so nobody is blamed.
  bool relay_held() {
    if (!held_)
      return false;
    auto reply = std::move(*held_);
    held_.reset();
    auto status = reply.status;
    {
      std::lock_guard<std::mutex> g(mtx_);
      if (gone_)
        return true;
    }
    respond_(std::move(reply));
    count(status);
    return true;
  }

  bool stopping() const {
    std::lock_guard<std::mutex> s(ctx_.stats->mtx);
    return ctx_.stats->stopping;
  }

  /// The gateway stops before the answer is done (its drain deadline
  /// passed): a stream under way ends as failed, the way a client notices
  /// (an error event, then no last chunk); anything else is answered 503.
  void end_at_stop(std::unique_lock<std::mutex>& g) {
    if (gone_)
      return;
    {
      std::lock_guard<std::mutex> s(ctx_.stats->mtx);
      ++ctx_.stats->cut_at_stop;
    }
    const std::string why = "the gateway stopped before the answer was done (its drain deadline "
                            "passed): send the request again";
    if (head_ && streaming_) {
      stream_->write("data: " + wire::openai_error_json(why, "ServiceUnavailableError", 503)
                     + "\n\n");
      stream_->fail();
      auto status = status_;
      g.unlock();
      count(status);
      return;
    }
    g.unlock();
    finish_error(503, "ServiceUnavailableError", why);
  }

  void client_left() {
    std::lock_guard<std::mutex> g(mtx_);
    if (gone_)
      return;
    gone_ = true;
    {
      std::lock_guard<std::mutex> s(ctx_.stats->mtx);
      ++ctx_.stats->client_disconnects;
    }
    if (auto call = call_.lock())
      call->cancel(); // on_done reports the replica finished
  }

  /// Compares what the engine says it found cached with the index's
  /// prediction (where the index predicted any; engines that do not report
  /// are not counted).
  void note_cache_accuracy() {
    if (decision_.predicted_cached_tokens == 0 || !reported_cached_)
      return;
    std::lock_guard<std::mutex> s(ctx_.stats->mtx);
    auto& a = ctx_.stats->accuracy[decision_.replica];
    ++a.answers;
    a.predicted += decision_.predicted_cached_tokens;
    a.reported += *reported_cached_;
    a.shortfalls += *reported_cached_ < decision_.predicted_cached_tokens;
  }

  void finish_error(int status, const std::string& type, const std::string& message) {
    respond_(error_reply(status, type, message));
    count(status);
  }

  void count(int status) {
    std::lock_guard<std::mutex> s(ctx_.stats->mtx);
    ++ctx_.stats->responses[{path_, status}];
    ctx_.stats->total_seconds.observe(since(started_));
  }

  proxy_context ctx_;
  http_request req_;
  http_responder respond_;
  std::string path_;
  wire::routing_request routing_;
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point sent_; ///< the current attempt went upstream
  bool first_token_ = false;                   ///< its first token came back
  std::mutex mtx_;
  std::vector<std::string> tried_;
  routing::route_decision decision_;
  /// Held weakly: the call's handlers hold this request, and its pending
  /// operations hold the call; a strong reference back would be a cycle
  /// that outlives a loop stopped with the call in flight.
  std::weak_ptr<http_call> call_;
  std::optional<http_stream> stream_;
  std::vector<std::pair<std::string, std::string>> relay_headers_;
  std::string content_type_;
  std::string body_;
  std::string scan_; ///< a streamed answer's last bytes, searched for its cached tokens
  std::optional<std::uint64_t> reported_cached_;
  std::string last_error_;
  int status_ = 0;
  bool head_ = false;
  bool streaming_ = false;
  bool gone_ = false;
  bool server_error_ = false;      ///< the current attempt answered 5xx, held back
  std::uint64_t attempt_ = 0;      ///< the current attempt's id in proxy_stats::attempts
  bool abandoned_ = false;         ///< the current attempt was abandoned (its replica is down)
  std::optional<http_reply> held_; ///< an earlier attempt's server error
  /// Replicas (and which entry of each) that answered this request 5xx.
  std::vector<std::pair<std::string, std::uint64_t>> server_errors_;
};

} // namespace

proxy_stats::proxy_stats()
  : first_byte_seconds(seconds_bounds()), total_seconds(seconds_bounds()) {}

void proxy_stats::append(wire::metrics_text& m) const {
  std::lock_guard<std::mutex> g(mtx);
  for (const auto& [key, n] : responses)
    m.counter("llmgw_gateway_responses_total", "Proxied requests answered, by endpoint and status.",
              static_cast<double>(n),
              {{"endpoint", key.first}, {"code", std::to_string(key.second)}});
  if (responses.empty())
    m.counter("llmgw_gateway_responses_total", "Proxied requests answered, by endpoint and status.",
              0);
  for (const auto& [key, n] : failures)
    m.counter("llmgw_upstream_failures_total",
              "Requests a replica failed: connect, timeout, broken (before any byte), "
              "after_first_byte.",
              static_cast<double>(n), {{"replica", key.first}, {"reason", key.second}});
  m.counter("llmgw_upstream_retries_total", "Requests sent to another replica after a failure.",
            static_cast<double>(retries));
  m.counter("llmgw_client_disconnects_total", "Clients that left before their answer was done.",
            static_cast<double>(client_disconnects));
  m.counter("llmgw_gateway_requests_cut_at_stop_total",
            "Requests still in flight when the gateway stopped at its drain deadline: streams "
            "ended with an error event, others answered 503.",
            static_cast<double>(cut_at_stop));
  m.histogram("llmgw_gateway_first_byte_seconds",
              "From the request to the first byte relayed (time to first token, streamed).",
              first_byte_seconds);
  m.histogram("llmgw_gateway_request_seconds", "From the request to its answer done.",
              total_seconds);
  for (const auto& [replica, a] : accuracy) {
    wire::metric_labels r{{"replica", replica}};
    m.counter("llmgw_kv_checked_answers_total",
              "Answers whose engine reported its cached prompt tokens, where the index "
              "predicted some from the engine's own events.",
              static_cast<double>(a.answers), r);
    m.counter("llmgw_kv_predicted_cached_tokens_total",
              "Prompt tokens the index predicted the engine would find cached (checked answers).",
              static_cast<double>(a.predicted), r);
    m.counter("llmgw_kv_reported_cached_tokens_total",
              "Prompt tokens the engine reported it found cached (checked answers).",
              static_cast<double>(a.reported), r);
    m.counter("llmgw_kv_prediction_shortfalls_total",
              "Checked answers where the engine found fewer cached tokens than the index "
              "predicted: blocks evicted before their event arrived, or events lost.",
              static_cast<double>(a.shortfalls), r);
  }
}

void cut_in_flight(proxy_stats& stats) {
  std::vector<std::function<void()>> ends;
  {
    std::lock_guard<std::mutex> g(stats.mtx);
    stats.stopping = true;
    for (const auto& [id, attempt] : stats.attempts)
      ends.push_back(attempt.second);
  }
  for (const auto& end : ends) // outside the lock: each takes its request's
    end();
}

void abandon_attempts(proxy_stats& stats, const std::string& replica) {
  std::vector<std::function<void()>> ends;
  {
    std::lock_guard<std::mutex> g(stats.mtx);
    for (const auto& [id, attempt] : stats.attempts)
      if (attempt.first == replica)
        ends.push_back(attempt.second);
  }
  for (const auto& end : ends) // outside the lock: each takes its request's
    end();
}

void proxy_request(const proxy_context& ctx, http_request&& req, http_responder respond,
                   const std::string& path, wire::request_kind kind) {
  auto parsed = wire::parse_routing_request(req.body, kind);
  if (!parsed) {
    auto body = wire::openai_error_json(parsed.err().message, "BadRequestError", 400);
    respond(http_reply{400, "application/json", std::move(body), {}});
    std::lock_guard<std::mutex> s(ctx.stats->mtx);
    ++ctx.stats->responses[{path, 400}];
    return;
  }
  std::make_shared<proxied>(ctx, std::move(req), std::move(respond), path, std::move(*parsed))
    ->start();
}

} // namespace llmgw
