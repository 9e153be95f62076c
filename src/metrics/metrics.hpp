#pragma once
// The replica's series (SPEC 6) in Prometheus' text format. prometheus-cpp supplies the data model,
// the histogram and the text serializer; the counts the hot path keeps stay plain relaxed atomics
// (a prometheus::Counter is a CAS loop on a double) and are read when /metrics is scraped.
// prometheus-cpp stays inside metrics.cpp: this header is plain.
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace prometheus {
class Histogram;
}

namespace outlive::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Upper bounds in seconds of the latency histograms: 1 ms to 10 s, about x2.5 a step; what lies
// above 10 s only counts in +Inf (docs/OPERATING.md).
const std::vector<double>& latency_buckets();

class Histogram {
 public:
  explicit Histogram(const std::vector<double>& upper_bounds);
  ~Histogram();
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;
  void observe(double value);

 private:
  friend class Registry;
  std::unique_ptr<prometheus::Histogram> impl_;
};

class Registry {
 public:
  Registry();
  ~Registry();

  // A counter the registry owns, for the caller to add to (relaxed is enough). The same (name,
  // labels) always returns the same counter.
  std::atomic<uint64_t>& counter(const std::string& name, const std::string& help,
                                 const Labels& labels = {});
  // A counter kept elsewhere, read when /metrics is scraped; `read` must only grow.
  void counter(const std::string& name, const std::string& help, const Labels& labels,
               std::function<double()> read);
  void gauge(const std::string& name, const std::string& help, const Labels& labels,
             std::function<double()> read);
  // Observations (seconds for latencies), exposed with cumulative buckets, _sum and _count. The
  // same (name, labels) always returns the same histogram; `upper_bounds` counts at its first use.
  Histogram& histogram(const std::string& name, const std::string& help, const Labels& labels,
                       const std::vector<double>& upper_bounds = latency_buckets());
  // histogram(name, help, labels).observe(seconds), looked up on each call.
  void observe(const std::string& name, const std::string& help, const Labels& labels,
               double seconds);
  // The text exposition format (version 0.0.4), families sorted by name.
  std::string render() const;

  enum class Type { counter, gauge, histogram };

 private:
  struct Series {
    Labels labels;
    std::unique_ptr<std::atomic<uint64_t>> count;
    std::function<double()> read;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    std::string help;
    Type type;
    std::map<std::string, Series> series;  // by label_text
  };
  // Throws std::logic_error for a name or label Prometheus rejects, or a name registered as
  // another type: both are mistakes in the code, which the tests must see.
  Series& series(const std::string& name, const std::string& help, Type type, const Labels& labels);
  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
};

std::string label_text(const Labels& labels);

}  // namespace outlive::metrics
