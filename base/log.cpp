#include "base/log.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace llmgw::log {

namespace {

const char* name_of(level lvl) {
  switch (lvl) {
  case level::debug:
    return "debug";
  case level::info:
    return "info";
  case level::warning:
    return "warning";
  case level::error:
    return "error";
  }
  return "?";
}

std::mutex write_mutex; // one line at a time, whole

} // namespace

void write(level lvl, std::string_view who, std::string_view text) {
  auto now = std::chrono::system_clock::now();
  auto secs = std::chrono::system_clock::to_time_t(now);
  auto millis =
    std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  auto line = fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z {} {}: {}\n",
                          tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                          tm.tm_sec, millis, name_of(lvl), who, text);
  std::lock_guard<std::mutex> guard(write_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

std::string printable(std::string_view text, std::size_t max) {
  std::string out;
  out.reserve(std::min(text.size(), max) + 8);
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (i == max) {
      out += "...";
      break;
    }
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\')
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out;
}

} // namespace llmgw::log
