// outlive::Replica (include/outlive/replica.hpp) over the replica `outlive serve` runs.
#include <outlive/replica.hpp>

#include "config/config.hpp"
#include "replica/replica.hpp"

namespace outlive {

Replica::Replica(std::unique_ptr<replica::Replica> impl) : impl_(std::move(impl)) {}

Replica Replica::from_file(const std::string& config_path, std::vector<CodeChannel> channels) {
  return Replica(
      std::make_unique<replica::Replica>(config::load_file(config_path), std::move(channels)));
}

Replica::Replica(const nlohmann::json& config, std::vector<CodeChannel> channels,
                 const std::string& source)
    : impl_(std::make_unique<replica::Replica>(config::parse(config, source), std::move(channels))) {}

Replica::Replica(Replica&&) noexcept = default;
Replica& Replica::operator=(Replica&&) noexcept = default;
Replica::~Replica() = default;

unsigned short Replica::port() const { return impl_->port(); }
std::string Replica::cursor(const std::string& app) const { return impl_->head_cursor(app); }
void Replica::stop() {
  if (impl_) impl_->stop();
}

}  // namespace outlive
