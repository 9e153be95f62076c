#pragma once
#include <memory>

#include "config/config.hpp"

namespace outlive::replica {

// A running replica. The constructor does every startup check (fatal errors throw
// outlive::Error with a clear message); stop() is the SIGTERM path.
class Replica {
 public:
  explicit Replica(config::Config config);
  ~Replica();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outlive::replica
