#pragma once
// keyed_bench's workloads on shared keys (issue 46): W2 (access churn) and the reconnect storm.
// Each runs on its own services and prints its markdown report; 0 when every check held.
#include "bench/keyed_harness.hpp"

namespace outlive::bench::keyed {

int run_w2(const Flags& flags);
int run_storm(const Flags& flags);

}  // namespace outlive::bench::keyed
