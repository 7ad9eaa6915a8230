// A reader of the few samples a router needs from Prometheus' text format
// (0.0.4): `name{labels} value [timestamp]` lines; comments and every other
// family are skipped without being parsed further.
#include "wire/engine_gauges.hpp"

#include "base/log.hpp"

#include <cmath>
#include <cstdlib>
#include <string>

namespace llmgw::wire {

namespace {

enum class gauge : std::uint8_t { running, waiting, kv_usage, gpu_usage, other };

gauge which(std::string_view name) {
  // vLLM's names, then SGLang's (--enable-metrics; one sample per DP rank).
  if (name == "vllm:num_requests_running" || name == "sglang:num_running_reqs")
    return gauge::running;
  if (name == "vllm:num_requests_waiting" || name == "sglang:num_queue_reqs")
    return gauge::waiting;
  if (name == "vllm:kv_cache_usage_perc" || name == "sglang:token_usage")
    return gauge::kv_usage;
  if (name == "vllm:gpu_cache_usage_perc")
    return gauge::gpu_usage;
  return gauge::other;
}

/// The position just past a `{...}` label set starting at `i` (a `{`), or
/// npos if it does not close on the line; quoted values may hold `}`.
std::size_t past_labels(std::string_view line, std::size_t i) {
  bool quoted = false;
  for (++i; i < line.size(); ++i) {
    char ch = line[i];
    if (quoted && ch == '\\')
      ++i; // an escaped character
    else if (ch == '"')
      quoted = !quoted;
    else if (!quoted && ch == '}')
      return i + 1;
  }
  return std::string_view::npos;
}

struct sums {
  double running = 0, waiting = 0, kv = 0, gpu = 0;
  std::uint32_t n_running = 0, n_waiting = 0, n_kv = 0, n_gpu = 0;
};

} // namespace

result<engine_gauges> read_engine_gauges(std::string_view text) {
  sums s;
  std::size_t line_no = 0;
  while (!text.empty()) {
    auto end = text.find('\n');
    auto line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    ++line_no;
    if (line.empty() || line[0] == '#')
      continue;
    auto name_end = line.find_first_of("{ \t");
    if (name_end == std::string_view::npos)
      continue; // a name alone: not a sample we read
    auto g = which(line.substr(0, name_end));
    if (g == gauge::other)
      continue;
    auto at = name_end;
    auto where =
      "line " + std::to_string(line_no) + " (" + std::string(line.substr(0, name_end)) + ")";
    if (line[at] == '{') {
      at = past_labels(line, at);
      if (at == std::string_view::npos)
        return error{errc::truncated, where + ": the label set does not close"};
    }
    auto start = line.find_first_not_of(" \t", at);
    if (start == std::string_view::npos)
      return error{errc::truncated, where + ": no value"};
    auto value_end = line.find_first_of(" \t", start);
    auto token = std::string(line.substr(
      start, value_end == std::string_view::npos ? std::string_view::npos : value_end - start));
    char* parsed_to = nullptr;
    double v = std::strtod(token.c_str(), &parsed_to);
    if (parsed_to != token.c_str() + token.size() || !std::isfinite(v) || v < 0)
      return error{errc::bad_value,
                   where + ": '" + log::printable(token, 40) + "' is not a finite number >= 0"};
    bool usage = g == gauge::kv_usage || g == gauge::gpu_usage;
    if (usage ? v > 1 : v > max_engine_requests)
      return error{errc::bad_value, where + ": " + log::printable(token, 40)
                                      + " is out of range (at most "
                                      + (usage ? std::string("1") : std::string("1e6")) + ")"};
    switch (g) {
    case gauge::running:
      s.running += v;
      ++s.n_running;
      break;
    case gauge::waiting:
      s.waiting += v;
      ++s.n_waiting;
      break;
    case gauge::kv_usage:
      s.kv += v;
      ++s.n_kv;
      break;
    case gauge::gpu_usage:
      s.gpu += v;
      ++s.n_gpu;
      break;
    case gauge::other:
      break;
    }
  }
  if (s.n_running == 0 || s.n_waiting == 0)
    return error{errc::truncated, std::string("no vllm:num_requests_")
                                    + (s.n_running == 0 ? "running" : "waiting")
                                    + " sample: not a vLLM engine, or one that does not log "
                                      "stats (--disable-log-stats)"};
  if (s.running > max_engine_requests || s.waiting > max_engine_requests)
    return error{errc::bad_value, "the ranks' request counts add up to more than 1e6"};
  engine_gauges out;
  out.running = static_cast<std::uint32_t>(std::lround(s.running));
  out.waiting = static_cast<std::uint32_t>(std::lround(s.waiting));
  out.ranks = s.n_running;
  if (s.n_kv > 0)
    out.kv_usage = s.kv / s.n_kv;
  else if (s.n_gpu > 0)
    out.kv_usage = s.gpu / s.n_gpu;
  return out;
}

} // namespace llmgw::wire
