#pragma once
// The smoke check of outlive_demo_run --check, against a running demo.

namespace inventory {

// Drives the demo through its gateway on 127.0.0.1:`gateway_port` (check.cpp says what it does);
// prints each step, throws std::runtime_error at the first that fails. `jwt`: the demo runs with
// --auth jwt, so the sockets authenticate with the app's tokens, and sockets without one are
// refused.
void check_demo(int gateway_port, bool jwt = false);

}  // namespace inventory
