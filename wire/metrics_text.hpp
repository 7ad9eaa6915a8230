// Prometheus' text exposition format (version 0.0.4), written from plain
// values: families with HELP and TYPE, samples with escaped labels, and
// histograms with cumulative buckets, _sum and _count. No client library for
// C++ is packaged in Debian 12; the format is small.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace llmgw::wire {

/// Label name/value pairs of one sample.
using metric_labels = std::vector<std::pair<std::string, std::string>>;

/// A histogram with fixed upper bounds (the +Inf bucket is implied).
class histogram {
public:
  explicit histogram(std::vector<double> bounds);

  /// Counts one observation.
  void observe(double value);
  /// Adds `other`'s observations; false (and nothing added) when its bounds
  /// differ.
  bool merge(const histogram& other);

  const std::vector<double>& bounds() const noexcept { return bounds_; }
  /// Observations per bucket (not cumulative), the last one being +Inf.
  const std::vector<std::uint64_t>& buckets() const noexcept { return buckets_; }
  double sum() const noexcept { return sum_; }
  std::uint64_t count() const noexcept { return count_; }

  /// An estimate of the q-quantile (0..1) by linear interpolation within the
  /// bucket, as Prometheus' histogram_quantile does.
  double quantile(double q) const;

private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> buckets_;
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

/// Builds one exposition. Samples of one family may be added in any order;
/// they are written together, families in the order first seen.
class metrics_text {
public:
  void counter(const std::string& name, const std::string& help, double value,
               const metric_labels& labels = {});
  void gauge(const std::string& name, const std::string& help, double value,
             const metric_labels& labels = {});
  void histogram(const std::string& name, const std::string& help, const class histogram& h,
                 const metric_labels& labels = {});

  /// The exposition text.
  std::string str() const;

private:
  struct family {
    std::string name;
    std::string help;
    const char* type;
    std::vector<std::string> lines;
  };
  family& family_of(const std::string& name, const std::string& help, const char* type);
  std::vector<family> families_;
};

/// A label value escaped for the text format (backslash, quote, newline).
std::string escape_label_value(const std::string& value);

} // namespace llmgw::wire
