#include "replica/replica.hpp"

#include <pqxx/pqxx>

#include "common/log.hpp"
#include "outbox/migrate.hpp"
#include "publisher/publisher.hpp"
#include "topic/client.hpp"

namespace outlive::replica {

struct Replica::Impl {
  config::Config config;
  std::unique_ptr<topic::Client> nats;
  std::unique_ptr<publisher::Publisher> publisher;
};

Replica::Replica(config::Config config) : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  const auto& c = impl_->config;
  {
    pqxx::connection conn(c.database);
    for (const auto& app : c.app_ids()) outbox::require_outbox(conn, app);
  }
  impl_->nats = std::make_unique<topic::Client>(c.nats, "outlive-" + c.replica);
  topic::StreamSettings settings;
  settings.replicas = c.topic_replicas;
  for (const auto& app : c.app_ids()) {
    const auto state = impl_->nats->ensure_stream(app, settings);
    log::info("topic ready", {{"app", app}, {"stream", topic::stream_name_for(app)},
                              {"last_sequence", state.last_sequence}, {"replica", c.replica}});
  }
  publisher::Options o;
  o.replica = c.replica;
  o.apps = c.app_ids();
  o.lease = c.publisher.lease;
  o.poll_interval = c.publisher.poll;
  o.publish_timeout = c.publisher.publish_timeout;
  o.batches_in_flight = c.publisher.batches_in_flight;
  o.backoff_base = c.publisher.backoff_base;
  o.backoff_cap = c.publisher.backoff_cap;
  o.waiting_threshold = c.publisher.waiting_threshold;
  o.waiting_log_interval = c.publisher.waiting_log_interval;
  impl_->publisher = std::make_unique<publisher::Publisher>(c.database, *impl_->nats, o);
  impl_->publisher->start();
  log::info("replica started", {{"replica", c.replica}, {"apps", c.app_ids()}});
}

void Replica::stop() {
  if (impl_->publisher) impl_->publisher->stop();
  log::info("replica stopped", {{"replica", impl_->config.replica}});
}

Replica::~Replica() { stop(); }

}  // namespace outlive::replica
