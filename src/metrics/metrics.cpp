#include "metrics/metrics.hpp"

#include <prometheus/check_names.h>
#include <prometheus/client_metric.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <stdexcept>

namespace outlive::metrics {

const std::vector<double>& latency_buckets() {
  static const std::vector<double> bounds{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                          0.25,  0.5,    1,     2.5,  5,     10};
  return bounds;
}

Histogram::Histogram(const std::vector<double>& upper_bounds)
    : impl_(std::make_unique<prometheus::Histogram>(upper_bounds)) {}
Histogram::~Histogram() = default;
void Histogram::observe(double value) { impl_->Observe(value); }

std::string label_text(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) out += ",";
    out += labels[i].first + "=\"";
    for (char c : labels[i].second) {
      if (c == '"' || c == '\\') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    out += "\"";
  }
  return out + "}";
}

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Series& Registry::series(const std::string& name, const std::string& help, Type type,
                                   const Labels& labels) {
  auto family = families_.find(name);
  if (family != families_.end() && family->second.type != type)
    throw std::logic_error("metrics: " + name + " is registered as another type");
  const auto key = label_text(labels);
  if (family != families_.end()) {
    if (auto s = family->second.series.find(key); s != family->second.series.end())
      return s->second;
  }
  // A new series: checked before anything is kept, so a refused one leaves no empty family.
  if (family == families_.end() && !prometheus::CheckMetricName(name))
    throw std::logic_error("metrics: \"" + name + "\" is not a metric name");
  for (const auto& [label, value] : labels) {
    // (a histogram's `le` is its own; prometheus-cpp 1.0's check does not know the type)
    if (!prometheus::CheckLabelName(label) || (type == Type::histogram && label == "le"))
      throw std::logic_error("metrics: " + name + ": \"" + label + "\" is not a label name");
  }
  if (family == families_.end()) family = families_.emplace(name, Family{help, type, {}}).first;
  return family->second.series.emplace(key, Series{labels, nullptr, nullptr, nullptr})
      .first->second;
}

std::atomic<uint64_t>& Registry::counter(const std::string& name, const std::string& help,
                                         const Labels& labels) {
  std::lock_guard lock(mutex_);
  auto& s = series(name, help, Type::counter, labels);
  if (!s.count) {
    if (s.read) throw std::logic_error("metrics: " + name + " is read through a function");
    s.count = std::make_unique<std::atomic<uint64_t>>(0);
  }
  return *s.count;
}

void Registry::counter(const std::string& name, const std::string& help, const Labels& labels,
                       std::function<double()> read) {
  std::lock_guard lock(mutex_);
  auto& s = series(name, help, Type::counter, labels);
  if (s.count) throw std::logic_error("metrics: " + name + " is counted by the registry");
  s.read = std::move(read);
}

void Registry::gauge(const std::string& name, const std::string& help, const Labels& labels,
                     std::function<double()> read) {
  std::lock_guard lock(mutex_);
  series(name, help, Type::gauge, labels).read = std::move(read);
}

Histogram& Registry::histogram(const std::string& name, const std::string& help,
                               const Labels& labels, const std::vector<double>& upper_bounds) {
  std::lock_guard lock(mutex_);
  auto& s = series(name, help, Type::histogram, labels);
  if (!s.histogram) s.histogram = std::make_unique<Histogram>(upper_bounds);
  return *s.histogram;
}

void Registry::observe(const std::string& name, const std::string& help, const Labels& labels,
                       double seconds) {
  histogram(name, help, labels).observe(seconds);
}

std::string Registry::render() const {
  std::vector<prometheus::MetricFamily> families;
  {
    std::lock_guard lock(mutex_);
    families.reserve(families_.size());
    for (const auto& [name, f] : families_) {
      auto& out = families.emplace_back();
      out.name = name;
      out.help = f.help;
      out.type = f.type == Type::counter ? prometheus::MetricType::Counter
                 : f.type == Type::gauge ? prometheus::MetricType::Gauge
                                         : prometheus::MetricType::Histogram;
      out.metric.reserve(f.series.size());
      for (const auto& [key, s] : f.series) {
        prometheus::ClientMetric m;
        if (s.histogram) m = s.histogram->impl_->Collect();
        for (const auto& [label, value] : s.labels) m.label.push_back({label, value});
        const double value = s.count  ? double(s.count->load(std::memory_order_relaxed))
                             : s.read ? s.read()
                                      : 0.0;
        if (f.type == Type::counter) m.counter.value = value;
        if (f.type == Type::gauge) m.gauge.value = value;
        out.metric.push_back(std::move(m));
      }
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace outlive::metrics
