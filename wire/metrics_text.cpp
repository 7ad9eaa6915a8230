#include "wire/metrics_text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace llmgw::wire {

histogram::histogram(std::vector<double> bounds)
  : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1, 0) {
  std::sort(bounds_.begin(), bounds_.end());
}

void histogram::observe(double value) {
  auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  ++buckets_[static_cast<std::size_t>(it - bounds_.begin())];
  sum_ += value;
  ++count_;
}

bool histogram::merge(const histogram& other) {
  if (other.bounds_ != bounds_)
    return false;
  for (std::size_t i = 0; i < buckets_.size(); ++i)
    buckets_[i] += other.buckets_[i];
  sum_ += other.sum_;
  count_ += other.count_;
  return true;
}

double histogram::quantile(double q) const {
  if (count_ == 0)
    return 0;
  auto rank = q * static_cast<double>(count_);
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    if (static_cast<double>(seen + buckets_[i]) >= rank && buckets_[i] > 0) {
      if (i == bounds_.size()) // +Inf: the largest finite bound is all we know
        return bounds_.empty() ? 0 : bounds_.back();
      double lo = i == 0 ? 0 : bounds_[i - 1];
      double hi = bounds_[i];
      return lo + (hi - lo) * (rank - static_cast<double>(seen)) / static_cast<double>(buckets_[i]);
    }
    seen += buckets_[i];
  }
  return bounds_.empty() ? 0 : bounds_.back();
}

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

namespace {

std::string render_labels(const metric_labels& labels, const char* extra_name = nullptr,
                          const std::string& extra_value = {}) {
  if (labels.empty() && !extra_name)
    return {};
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    out += fmt::format("{}{}=\"{}\"", first ? "" : ",", k, escape_label_value(v));
    first = false;
  }
  if (extra_name)
    out += fmt::format("{}{}=\"{}\"", first ? "" : ",", extra_name, extra_value);
  return out + "}";
}

std::string number(double v) {
  if (std::isinf(v))
    return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v))
    return "NaN";
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    return fmt::format("{:.0f}", v);
  return fmt::format("{}", v);
}

} // namespace

metrics_text::family& metrics_text::family_of(const std::string& name, const std::string& help,
                                              const char* type) {
  for (auto& f : families_)
    if (f.name == name)
      return f;
  families_.push_back({name, help, type, {}});
  return families_.back();
}

void metrics_text::counter(const std::string& name, const std::string& help, double value,
                           const metric_labels& labels) {
  family_of(name, help, "counter")
    .lines.push_back(name + render_labels(labels) + " " + number(value));
}

void metrics_text::gauge(const std::string& name, const std::string& help, double value,
                         const metric_labels& labels) {
  family_of(name, help, "gauge")
    .lines.push_back(name + render_labels(labels) + " " + number(value));
}

void metrics_text::histogram(const std::string& name, const std::string& help,
                             const class histogram& h, const metric_labels& labels) {
  auto& f = family_of(name, help, "histogram");
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < h.buckets().size(); ++i) {
    cumulative += h.buckets()[i];
    auto le = i < h.bounds().size() ? number(h.bounds()[i]) : std::string("+Inf");
    f.lines.push_back(name + "_bucket" + render_labels(labels, "le", le) + " "
                      + std::to_string(cumulative));
  }
  f.lines.push_back(name + "_sum" + render_labels(labels) + " " + number(h.sum()));
  f.lines.push_back(name + "_count" + render_labels(labels) + " " + std::to_string(h.count()));
}

std::string metrics_text::str() const {
  std::string out;
  for (const auto& f : families_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", f.name, f.help, f.name, f.type);
    for (const auto& l : f.lines)
      out += l + "\n";
  }
  return out;
}

} // namespace llmgw::wire
