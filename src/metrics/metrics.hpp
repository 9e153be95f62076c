#pragma once
// Prometheus text exposition of the replica's counters and gauges (SPEC 6). Counters are atomics
// owned by the registry; gauges are read through callbacks when /metrics is scraped.
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace outlive::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Registry {
 public:
  // The same (name, labels) always returns the same counter.
  std::atomic<uint64_t>& counter(const std::string& name, const std::string& help,
                                 const Labels& labels = {});
  void gauge(const std::string& name, const std::string& help, const Labels& labels,
             std::function<double()> read);
  // Observations in seconds; exposed as a summary with p50/p99 over the last 1,024 observations.
  void observe(const std::string& name, const std::string& help, const Labels& labels,
               double seconds);
  std::string render() const;

 private:
  struct Family {
    std::string help;
    std::string type;
    std::map<std::string, std::unique_ptr<std::atomic<uint64_t>>> counters;
    std::map<std::string, std::function<double()>> gauges;
    std::map<std::string, std::vector<double>> samples;
    std::map<std::string, std::pair<uint64_t, double>> totals;  // count, sum
  };
  Family& family(const std::string& name, const std::string& help, const std::string& type);
  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
};

std::string label_text(const Labels& labels);

}  // namespace outlive::metrics
