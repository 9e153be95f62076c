#pragma once
// The smoke check of outlive_demo_run --check, against a running demo.

namespace inventory {

// Drives the demo through its gateway on 127.0.0.1:`gateway_port` (check.cpp says what it does);
// prints each step, throws std::runtime_error at the first that fails.
void check_demo(int gateway_port);

}  // namespace inventory
