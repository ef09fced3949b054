// Test helpers for the metrics GoogleTests: read one series back from a Metrics collection.
#pragma once

#include <prometheus/metric_family.h>

#include <map>
#include <optional>
#include <string>

#include "metrics/metrics.h"

namespace rdmalab::metrics::testing {

using LabelMap = std::map<std::string, std::string>;

struct Series {
  prometheus::MetricType type;
  prometheus::ClientMetric metric;
};

// The first series of family `name` whose labels include every pair of `labels`.
inline std::optional<Series> find(const Metrics& m, const std::string& name,
                                  const LabelMap& labels) {
  for (const prometheus::MetricFamily& f : m.collectable()->Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& c : f.metric) {
      size_t matched = 0;
      for (const auto& l : c.label) {
        auto it = labels.find(l.name);
        if (it != labels.end() && it->second == l.value) ++matched;
      }
      if (matched == labels.size()) return Series{f.type, c};
    }
  }
  return std::nullopt;
}

// A counter's or gauge's value, a histogram's sample count; nullopt when no series matches.
inline std::optional<double> sample(const Metrics& m, const std::string& name,
                                    const LabelMap& labels) {
  auto s = find(m, name, labels);
  if (!s) return std::nullopt;
  switch (s->type) {
    case prometheus::MetricType::Counter:
      return s->metric.counter.value;
    case prometheus::MetricType::Gauge:
      return s->metric.gauge.value;
    case prometheus::MetricType::Histogram:
      return static_cast<double>(s->metric.histogram.sample_count);
    default:
      return std::nullopt;
  }
}

// A histogram's sum of observations (seconds); nullopt when no series matches.
inline std::optional<double> histogram_sum(const Metrics& m, const std::string& name,
                                           const LabelMap& labels) {
  auto s = find(m, name, labels);
  if (!s) return std::nullopt;
  return s->metric.histogram.sample_sum;
}

}  // namespace rdmalab::metrics::testing
