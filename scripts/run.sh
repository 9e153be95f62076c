#!/usr/bin/env bash
# The README's run command: installs the dependencies, builds, and runs the inventory demo:
# PostgreSQL 15 and NATS JetStream (in .outlive-dev/, kept between runs), two outlive replicas, the
# demo app and nginx as the gateway on http://localhost:8080/. Ctrl-C stops everything.
# Arguments go to outlive_demo_run, e.g. `scripts/run.sh --port 9090`, `scripts/run.sh --check` or
# `scripts/run.sh --gateway haproxy`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
echo "building (the first build takes a while) ..."
scripts/build.sh >/dev/null
exec "${BUILD_DIR:-build}/examples/inventory/outlive_demo_run" "$@"
