#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, runs every test (unit tests and the
# integration tests against real PostgreSQL 15 and nats-server, which the tests start themselves).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build} scripts/build.sh "$@"
built=$(date +%s)
echo "build took $((built - start)) s"
cd "${BUILD_DIR:-build}"
ctest --output-on-failure --timeout 600 -j"${TEST_JOBS:-2}"
cd ..
# The browser client's unit tests (Node's built-in runner, no npm packages).
clients/js/test.sh
echo "tests took $(( $(date +%s) - built )) s"
