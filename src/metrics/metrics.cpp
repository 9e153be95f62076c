#include "metrics/metrics.hpp"

#include <algorithm>
#include <sstream>

namespace outlive::metrics {

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

Registry::Family& Registry::family(const std::string& name, const std::string& help,
                                   const std::string& type) {
  auto& f = families_[name];
  if (f.type.empty()) {
    f.help = help;
    f.type = type;
  }
  return f;
}

std::atomic<uint64_t>& Registry::counter(const std::string& name, const std::string& help,
                                         const Labels& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = family(name, help, "counter").counters[label_text(labels)];
  if (!slot) slot = std::make_unique<std::atomic<uint64_t>>(0);
  return *slot;
}

void Registry::gauge(const std::string& name, const std::string& help, const Labels& labels,
                     std::function<double()> read) {
  std::lock_guard lock(mutex_);
  family(name, help, "gauge").gauges[label_text(labels)] = std::move(read);
}

void Registry::observe(const std::string& name, const std::string& help, const Labels& labels,
                       double seconds) {
  std::lock_guard lock(mutex_);
  auto& f = family(name, help, "summary");
  const auto key = label_text(labels);
  auto& samples = f.samples[key];
  if (samples.size() >= 1024) samples.erase(samples.begin(), samples.begin() + 512);
  samples.push_back(seconds);
  auto& [count, sum] = f.totals[key];
  count++;
  sum += seconds;
}

std::string Registry::render() const {
  std::lock_guard lock(mutex_);
  std::ostringstream out;
  for (const auto& [name, f] : families_) {
    out << "# HELP " << name << " " << f.help << "\n# TYPE " << name << " " << f.type << "\n";
    for (const auto& [labels, value] : f.counters)
      out << name << labels << " " << value->load() << "\n";
    for (const auto& [labels, read] : f.gauges) out << name << labels << " " << read() << "\n";
    for (const auto& [labels, samples] : f.samples) {
      auto sorted = samples;
      std::sort(sorted.begin(), sorted.end());
      auto quantile = [&](double q) {
        return sorted.empty() ? 0.0 : sorted[static_cast<size_t>(q * (sorted.size() - 1))];
      };
      const std::string inner = labels.empty() ? "" : labels.substr(1, labels.size() - 2) + ",";
      out << name << "{" << inner << "quantile=\"0.5\"} " << quantile(0.5) << "\n";
      out << name << "{" << inner << "quantile=\"0.99\"} " << quantile(0.99) << "\n";
      const auto& [count, sum] = f.totals.at(labels);
      out << name << "_sum" << labels << " " << sum << "\n"
          << name << "_count" << labels << " " << count << "\n";
    }
  }
  return out.str();
}

}  // namespace outlive::metrics
